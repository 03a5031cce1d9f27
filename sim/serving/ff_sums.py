"""Float sums in the stepped path's order, for a fast-forward window (:mod:`sim.serving.ff_window`): a counter's
running sum over the window's steps, each request's share of every step added in turn, and a per-step count
filled forward from the steps that changed it."""
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
