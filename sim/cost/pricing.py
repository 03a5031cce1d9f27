"""What one engine step costs: the scheduled items' cost tuples, the GPU seconds and the host time.

:class:`StepPricer` is the pricing half of :class:`sim.serving.engine.Engine` (the engine keeps the
schedule, the clock and the problems' lifecycle). An item's cost tuples are
``(n, c, layers, probes, logits, copy)`` of :meth:`sim.cost.terms.ScalarCost.seconds` (a verification
chunk adds a 7th field 0: no sampling; a shared-KV price adds ``h_i`` as the 8th, computed on the
serving side from the block manager and passed in as ``shared``). A step's seconds with its host time
are ``sim.cost.overheads.step_seconds(gpu_s, host_s, async_scheduling, host_serial_s)``
(sync: ``gpu_s + host_s``; async: ``max(gpu_s + serial, host_s)``).

The items are duck-typed: ``it.req.data == (problem, kind, branch)`` with ``problem.job`` a
:class:`sim.workload.job.Job` and ``problem.vstart`` / ``problem.ext`` the verification-extension marks;
kinds 0 gate, 1 branch, 2 decode, 3 verification (``sim.workload.job.KIND_NAMES``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from sim.cost.overheads import step_seconds
from sim.base.errors import OutOfCalibrationError


HOST_MEMO_STEPS = 16   # window_host: up to this many steps read each batch size's remembered floats


def attribution(dt: float, alone) -> np.ndarray:
    """Each item's share of a step's ``dt`` seconds by its stand-alone seconds ``alone`` (item order)::

        share_i = dt a_i / sum_j a_j      (the sum left to right; dt / n each where every a_i is 0)
    """
    a = np.asarray(alone, np.float64)
    tot = float(np.cumsum(a)[-1]) if a.size else 0.0
    return dt * a / tot if tot > 0 else np.full(a.size, dt / max(a.size, 1))


def step_counts(items, decodes: int = 0) -> tuple:
    """``(running, scheduled_tokens, sampled, admitted, admitted_tokens)`` of a step of ``items`` and ``decodes``
    more one-token decodes (:meth:`StepPricer.host_of`'s counts: admitted = scheduled for the first time, not
    after a preemption)."""
    new = [it.req for it in items if it.new_admission and it.req.num_preemptions == 0]
    return (decodes + len(items), decodes + sum(it.num_new for it in items),
            decodes + sum(1 for it in items if it.samples), len(new), sum(q.prompt_tokens for q in new))


def equal_shares(priced) -> bool:
    """Whether a step's ``priced`` items ``(cost tuples, kind)`` share its seconds equally (``Engine._attribute``):
    every one with work is of the decode kind; else each gets its share by its stand-alone seconds
    (:func:`attribution`)."""
    return all(kind == 2 or not ts for ts, kind in priced)


class _Sub:
    """A sub-range of a scheduled item (pricing the part of a chunk before a verification prompt)."""

    def __init__(self, req, n, c):
        self.req, self.num_new, self.num_cached = req, n, c
        self.samples = False


class StepPricer:
    """Prices the engine's steps (module docstring).

    Parameters
    ----------
    cost : anything with :class:`sim.cost.terms.ScalarCost`'s ``seconds(items)``
        (e.g. :class:`sim.cost.parallel.ParallelCost` for a TP x PP replica).
    host_step : sim.cost.overheads.HostStepCost, optional
        Host time per step (None: not priced, the policies' replay).
    async_scheduling : bool
        vLLM's ``--async-scheduling``: host work of a step beside the GPU's.
    max_batch, hw_name : the profile's fitted batch range (None: any) and the hardware named in its error.
    shared : callable, optional
        ``shared(items, priced) -> priced`` adding the shared-KV field when the cost prices it.
    """

    def __init__(self, cost, *, host_step=None, async_scheduling: bool = False, max_batch: int | None = None,
                 hw_name: str = "", shared=None):
        self.cost = cost
        self.host_step = host_step
        self.async_scheduling = bool(async_scheduling)
        self.max_batch = max_batch
        self.hw_name = hw_name
        self.prices_shared = bool(getattr(cost, "prices_shared", False))
        self.shared = shared
        self.host = (0.0, 0.0)        # (host_s, host_serial_s) of the batch priced last
        self.host_seconds = 0.0       # host seconds priced over the run (sync: all on the critical path)
        self.host_extrapolated = 0    # steps beyond the sizes host_step was measured at (priced linearly, counted)
        self.extra_dt = 0.0           # eviction-scoring seconds the batch priced last adds
        self._open = (None, None)     # (host_step, the same without its measured-range bounds), made once
        self._alone_memo: dict = {}
        self._host_memo = (None, {})  # (host_step, batch size -> a decode step's host floats): _decode_host

    def item(self, it):
        """Cost tuples ``(n, c, layers, probes, logits, copy)`` and the phase kind of one scheduled item."""
        req = it.req
        p, kind, b = req.data
        n, c = it.num_new, it.num_cached
        j = p.job
        if kind == 0:
            return [(float(n), float(c), None, 0.0, 0.0, 0.0)], 0
        if kind == 3:
            last = c + n == req.num_tokens
            # verification reads p(Yes)/p(No) off its LM-head row: no sampling (7th field 0)
            return [(float(n), float(c), float(j.v_layers[b]), float(j.v_probes[b]) if last else 0.0,
                     float(j.v_head[b]) if last else 0.0, 0.0, 0.0)], 3
        if n == 0:
            return [], 1   # a zero-copy fork admitted on its source's KV: no forward work
        ctx = int(j.ctx[b])
        vs = int(p.vstart[b]) if p.ext[b] else None
        end = c + n
        out = []
        if vs is not None and end > vs:
            lo = max(c, vs)
            if c < vs:
                out += self.item(_Sub(req, vs - c, c))[0]
            last = end == req.num_tokens
            out.append((float(end - lo), float(lo), float(j.v_layers[b]), float(j.v_probes[b]) if last else 0.0,
                        float(j.v_head[b]) if last else 0.0, 0.0, 0.0))
            return out, 3
        if c < ctx:
            cp = 0
            if j.share[b] and j.copy[b] > 0:
                cp = max(0, min(end, ctx) - max(c, ctx - int(j.copy[b])))
            # the chunk completing the prompt pays the LM head if the branch computes prompt tokens of its own
            # (a copy-only fork's first token is its source's), or if it recomputes past the prompt
            logits = 1.0 if end >= ctx and (end > ctx or j.computed[b] > 0) else 0.0
            return [(float(n - cp), float(c), None, 0.0, logits, float(cp))], 1
        long = j.long
        if long is not None and n == 1:
            # token eviction: the step attends over the policy's cache, not every token so far
            self.extra_dt += long.extra_s(c)
            return [(1.0, float(long.context(c)), None, 0.0, 1.0 if it.samples else 0.0, 0.0)], 2
        return [(float(n), float(c), None, 0.0, 1.0 if it.samples else 0.0, 0.0)], 2

    def batch(self, items, now: float):
        """Price one scheduled batch: ``(per item (cost tuples, kind), all cost tuples)``; refuses a batch of
        more sequences than the profile was fitted on. Resets the eviction-scoring time the items add."""
        n = len(items)
        if self.max_batch is not None and n > self.max_batch:
            raise OutOfCalibrationError(
                f"hardware {self.hw_name}: an iteration batched {n} sequences at t = {now:.3f} s, "
                f"outside the calibrated range (fitted_range.max_batch = {self.max_batch}); refusing to "
                f"extrapolate (lower the arrival rate, the concurrency or --max-num-seqs)")
        self.extra_dt = 0.0
        if self.host_step is not None:
            self.host = self.host_of(items)
        priced = [self.item(it) for it in items]
        if self.prices_shared and self.shared is not None:
            priced = self.shared(items, priced)
        return priced, [t for ts, _ in priced for t in ts]

    @property
    def _host_open(self):
        """``host_step`` without its measured-range bounds (steps past them are priced on the same lines and
        counted), made once per ``host_step``."""
        if self._open[0] is not self.host_step:
            self._open = (self.host_step, dataclasses.replace(self.host_step, max_running=None, max_tokens=None))
        return self._open[1]

    def host_of(self, items) -> tuple:
        """``(host_s, host_serial_s)`` of the step scheduling ``items`` (:class:`sim.cost.overheads.HostStepCost`).

        ``running`` = the requests in the step, ``scheduled_tokens`` = their new tokens, ``sampled`` = those
        sampling a token, ``admitted`` / ``admitted_tokens`` = requests scheduled for the first time (not
        after a preemption) and their prompt tokens: vLLM's ``EngineCore.add_request`` runs once per
        request between steps; it is charged to the step that first schedules it (the same total). Sizes
        beyond the measured range are priced on the same lines and counted (``host_extrapolated``).
        """
        out, extrapolated = self.host_counts(*step_counts(items))
        self.host_extrapolated += extrapolated
        return out

    def host_counts(self, r: int, t: int, smp: int, a: int, at: int) -> tuple:
        """``((host_s, host_serial_s), extrapolated)`` of a step of ``r`` requests, ``t`` scheduled tokens, ``smp``
        sampled, ``a`` admitted with ``at`` prompt tokens (:meth:`host_of`'s counts); ``extrapolated``: 1 where a
        size is past the measured range (priced on the same lines), else 0. Changes nothing."""
        hs = self.host_step
        if (hs.max_running is not None and r > hs.max_running) or (hs.max_tokens is not None and t > hs.max_tokens):
            return self._host_open.seconds_and_serial(r, t, smp, a, at), 1
        return hs.seconds_and_serial(r, t, smp, a, at), 0

    def stepped(self, gpu_s: float) -> float:
        """The step's first (or only) stage with its host time: ``step_seconds(gpu_s, host_s,
        async_scheduling, host_serial_s)`` of the batch priced last (module docstring)."""
        if self.host_step is None:
            return gpu_s
        h, s = self.host
        self.host_seconds += h
        return step_seconds(gpu_s, h, self.async_scheduling, s)

    def window_seconds(self, B, S, cmax, Ssw=None):
        """Seconds of decode iterations of a fast-forward window (:mod:`sim.serving.fastforward`), one per entry:
        ``B`` requests decoding one token each over ``S`` cached tokens in all, the longest ``cmax`` (arrays; ``B``
        may be one number, the batch of every entry).
        The cost's per-step vector (:meth:`sim.cost.terms.ScalarCost.decode_batch_seconds`); a per-step host
        term, a function of the same running requests and scheduled tokens (both ``B``), joins here element by
        element. ``Ssw``: each entry's sliding-window key sum (a sliding-window shape's closed form)."""
        return self.with_host(self.cost.decode_batch_seconds(B, S, cmax, Ssw), B)

    def with_host(self, gpu, B):
        """Decode steps of ``B`` requests (one number, or one per step) whose GPU seconds are ``gpu``, with the
        per-step host term (:meth:`window_seconds`' second half: ``step_seconds`` element by element)."""
        if self.host_step is None or gpu is None:
            return gpu
        h, sr = self.window_host(B)
        return step_seconds(gpu, h, self.async_scheduling, sr)

    def window_host(self, B):
        """``(host_s, host_serial_s)`` of decode steps of ``B`` requests (arrays): every request computes and
        samples one token, none is admitted -- :meth:`host_of` of such a step, element by element (the same
        floating-point operations, so the same floats). Sizes past the measured range are priced on the same
        lines (counted by the window's close: ``host_extrapolated``). One batch size as a number: Python floats."""
        if np.ndim(B) == 0:
            return self._decode_host(int(B))
        B = np.asarray(B)
        if len(B) > HOST_MEMO_STEPS:
            return self._host_open.seconds_and_serial(B, B, B, 0, 0)
        # a window of a few steps: each batch size's floats once (they repeat from window to window)
        hs = [self._decode_host(b) for b in B.tolist()]
        return np.array([h for h, _ in hs], np.float64), np.array([s for _, s in hs], np.float64)

    def _decode_host(self, b: int) -> tuple:
        """``(host_s, host_serial_s)`` of a decode step of ``b`` requests, in Python floats, remembered per ``b``
        (a pure function of ``b`` and the host coefficients)."""
        memo = self._host_memo
        if memo[0] is not self.host_step:
            memo = self._host_memo = (self.host_step, {})
        v = memo[1].get(b)
        if v is None:
            if len(memo[1]) > 1 << 16:
                memo[1].clear()
            v = memo[1][b] = self._host_open.seconds_and_serial(b, b, b, 0, 0)
        return v

    def alone(self, ts) -> float:
        """``cost.seconds(ts)``, memoised: a pure function of the item's cost tuples, priced for every item of
        every mixed iteration (the decodes beside a prefill chunk repeat their contexts across iterations)."""
        key = tuple(ts)
        v = self._alone_memo.get(key)
        if v is None:
            if len(self._alone_memo) > 1 << 16:
                self._alone_memo.clear()
            v = self._alone_memo[key] = self.cost.seconds(ts)
        return v


def served_costs(model, hw, node, par, max_num_seqs: int, *, enforce_eager: bool = False, host_time: bool = True,
                 async_scheduling: bool = True, schedule: str = "overlapped", routing=None) -> dict:
    """The engine keywords of a served replica (``cost``, ``host_step``, ``async_scheduling``), as vLLM serves it:
    its cost with vLLM's CUDA graphs (:func:`sim.cost.graphs.engine_graphs`: the profile's ``cuda_graphs`` unless
    ``enforce_eager``), :func:`sim.cost.parallel.replica_cost`, and each step's host time (the profile's
    ``host_step`` where it has one, unless ``host_time`` is False) under ``async_scheduling`` (vLLM 0.33's default:
    on). The policies' serving mode and ``rksim plan`` price their engines so; ``rksim bench`` adds the front end."""
    from sim.cost.graphs import engine_graphs
    from sim.cost.parallel import replica_cost
    graphs = engine_graphs(hw, max_num_seqs, enforce_eager)
    return {"cost": replica_cost(model, hw, node, par, schedule, graphs, routing),
            "host_step": getattr(hw, "host_step", None) if host_time else None,
            "async_scheduling": bool(async_scheduling)}


def served_overheads(hw, costs: dict, results, host_time: bool, fe_why: str) -> dict:
    """``info["overheads"]`` of a run whose engines :func:`served_costs` priced
    (:func:`sim.cost.overheads.overheads_info`; no API server: ``fe_why`` says why) and whether its steps replayed
    CUDA graphs (``cuda_graphs``: the cost's ``graphs``); ``results``: the engines' results (their host seconds)."""
    from sim.cost.overheads import overheads_info
    out = overheads_info(hw, costs["host_step"], None, costs["async_scheduling"], False, host_time, results,
                         fe_why=fe_why)
    out["cuda_graphs"] = getattr(costs["cost"], "graphs", None) is not None
    return out
