"""Float sums in the stepped path's order, for a fast-forward window (:mod:`sim.serving.ff_window`): a counter's
running sum over the window's steps, each request's share of every step added in turn, a per-step count filled
forward from the steps that changed it, and the engine's run counters after a window (:func:`window_counters`)."""
from __future__ import annotations

import numpy as np

FOLD_STEPS = 8   # a window of up to this many steps sums its per-step counters in Python floats


def fold(x0: float, xs) -> float:
    """``x0 + xs[0] + xs[1] + ...``, left to right: the stepped path's running sums (a list: Python floats, the
    same IEEE additions as ``numpy.cumsum``'s without its per-call cost; an array: one ``cumsum``)."""
    if isinstance(xs, list):
        for x in xs:
            x0 += x
        return float(x0)
    return float(np.cumsum(np.concatenate(([x0], xs)))[-1])


def add_in_turn(ph, mask, xs, cells: int = 1 << 20) -> None:
    """``ph[i] += xs[0]``, then ``xs[1]``, ... where ``mask``: left to right, the stepped path's float sums (a step's
    share at a time), as sequential ``numpy.cumsum`` runs down the columns of ``[ph[mask]; xs; xs; ...]`` (at most
    ``cells`` entries at once) rather than one numpy call per step."""
    if len(xs) == 1:
        np.add(ph, xs[0], out=ph, where=mask)
        return
    sub = ph[mask]
    rows = max(1, cells // max(1, len(sub)))
    for a in range(0, len(xs), rows):
        x = xs[a:a + rows]
        acc = np.empty((len(x) + 1, len(sub)))
        acc[0] = sub
        acc[1:] = x[:, None]
        sub = np.cumsum(acc, axis=0)[-1]
    ph[mask] = sub


def forward_fill(marks, k: int, start: int) -> np.ndarray:
    """A count after each of steps ``1..k``: the latest of ``marks`` (``(step, count)`` where a step changed it, in
    step order) at or before each step; before any, the first mark's count (``start`` without one)."""
    cur = marks[0][1] if marks else start
    if k > FOLD_STEPS and marks:
        # the marks are in step order: each step's count is the last mark at or before it (one searchsorted)
        st = np.fromiter((m[0] for m in marks), np.int64, len(marks))
        keep = (st >= 1) & (st <= k)
        st, v = st[keep], np.fromiter((m[1] for m in marks), np.int64, len(marks))[keep]
        i = np.searchsorted(st, np.arange(1, k + 1, dtype=np.int64), side="right") - 1
        return np.where(i >= 0, v[np.maximum(i, 0)] if len(v) else cur, cur).astype(np.int64)
    at = {st: v for st, v in marks if 1 <= st <= k}
    out = []
    for st in range(1, k + 1):
        cur = at.get(st, cur)
        out.append(cur)
    return np.array(out, np.int64)


def window_counters(eng, adm, segs, k: int, dt, idle=None):
    """The engine ``eng``'s run counters after a window's ``k`` steps of seconds ``dt`` (its segments ``segs``' decodes;
    ``adm``: its first step's plan, or None; ``idle``: the held requests idle in the running list at each step, or
    None), added in the stepped path's order: ``(decodes in all, requests running at each step)``."""
    lens, Bseg = [len(sg[0]) for sg in segs], [sg[1] for sg in segs]   # each segment: one batch
    few = k <= FOLD_STEPS
    # the per-step counters, as lists for a window of a few steps (numpy's per-call cost dominates them)
    if few:
        dts, run = dt.tolist(), [b for n, b in zip(lens, Bseg) for _ in range(n)]
        nB = sum(run)
    else:
        dts, run = dt, np.repeat(np.array(Bseg, np.int64), lens)
        nB = int(run.sum())
    if adm is not None:   # step 1 also ran the tail and the admitted requests (their items, the host time: planned)
        run[0] += len(adm.items) + (adm.tail is not None)
    eng.items_scheduled += int(sum(run)) if few else int(run.sum())
    eng.busy = fold(eng.busy, dts)
    if eng.host_step is not None:
        # the host seconds the stepped path adds one step at a time (Engine._stepped), left to right: each
        # segment's batch priced once (a decode step's host floats are a function of its batch size)
        hs = [eng.window_host(b)[0] for b in Bseg]
        h = [x for n, x in zip(lens, hs) for _ in range(n)] if few else np.repeat(np.array(hs, np.float64), lens)
        d0 = 0
        if adm is not None:
            h[0] = adm.host[0]
            d0 = 1
            eng.host_extrapolated += adm.extrapolated
        eng.host_seconds = fold(eng.host_seconds, h)
        mr, mt = eng.host_step.max_running, eng.host_step.max_tokens
        if mr is not None or mt is not None:   # steps past the measured sizes (priced on the same lines)
            over = [(mr is not None and b > mr) or (mt is not None and b > mt) for b in Bseg]
            eng.host_extrapolated += sum(n for n, o in zip(lens, over) if o) - (d0 if over[0] else 0)
    if idle is not None:   # running, not scheduled (Engine._accelerator's nrun)
        run = [r + h for r, h in zip(run, idle.tolist())] if few else run + idle
    eng.run_time = fold(eng.run_time, [x * b for x, b in zip(dts, run)] if few else dt * run)
    return nB, run


def shared_problems(probs) -> list:
    """The members' indices (running order) of each problem with more than one member among ``probs``."""
    at: dict = {}
    for i, p in enumerate(probs):
        at.setdefault(id(p), []).append(i)
    return [idx for idx in at.values() if len(idx) > 1]


def problem_figures(groups, probs, segs, ph0, ph, iters, last) -> None:
    """A problem whose several branches are members (``groups``: :func:`shared_problems`) adds every share of every
    step to its one decode phase in the stepped path's order -- step by step, its members in running order; each
    decode step's share is the same ``dt / B`` for all -- and counts a step once (``Engine._complete``'s touched
    problems): written onto it now, from the members' first value ``ph0`` (theirs, all equal: the problem's), and
    left in ``ph`` for every member with no iterations of its own (``iters``; ``last``: each one's steps, from 1).

    ``phase = ph0 + x_1 + ... + x_1 + x_2 + ...`` (``x_j`` added once per member alive at step ``j``), left to
    right as one ``numpy.cumsum``; ``iterations += max(last)`` (every member runs from the window's step 1)."""
    for idx in groups:
        if not np.all(ph0[idx] == ph0[idx[0]]):   # pragma: no cover - a problem's members share its phase
            raise RuntimeError("fast-forward: the members of one problem start from different decode phases")
        parts = [np.array([ph0[idx[0]]])]
        for sg in segs:
            d, b, mask = sg[:3]
            if len(sg) > 3:   # the admitting step: each decode's own share, in running order
                parts.append(np.array([sg[3][i] for i in idx if mask[i]], np.float64))
            else:
                n = int(np.count_nonzero(mask[idx]))
                if n:
                    parts.append(np.repeat(d / b, n))
        val = float(np.cumsum(np.concatenate(parts))[-1])
        p = probs[idx[0]]
        p.phase["decode"] = val
        p.iterations += int((iters[idx] - last[idx]).sum()) + int(last[idx].max())   # (carried: none)
        ph[idx] = val
        iters[idx] = 0
