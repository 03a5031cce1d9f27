"""The discrete-event simulator (simpy): problems, branches, one accelerator, a KV block pool.

* Problems arrive closed-loop (``concurrency`` users, each submitting its next
  problem when the previous one is answered; ``concurrency = 1`` is isolated
  mode) or as a seeded Poisson process (``arrival_rate`` problems/s).
* Admission: a problem enters when its unconstrained KV peak fits in the KV
  memory left (accelerator capacity minus weights), FIFO.
* Each branch is a simpy process: (ASKS gate) → wait for its KV source →
  prefill → decode steps → done. The problem's process waits for all its
  branches, then submits the verification passes (unless CGEE skipped them).
* The accelerator is one process doing iteration-level (continuous)
  batching with vLLM's default prefill-first rule: an iteration batches every
  waiting prefill-class item (gate, prefill, KV copy, verification) if there
  is one, else every waiting decode step. An iteration's time is
  :class:`sim.cost.ScalarCost` of its items.
* KV memory: per-branch blocks (shared blocks counted once), or a
  ``policies.BlockPool`` under the block policy, touched through
  :class:`sim.workload.BlockLedger`; misses on evicted blocks are recomputed
  in the iteration that needed them.

Iteration time is split among its items in proportion to their stand-alone
times (prefill-class iterations) or equally (decode iterations) to give
per-problem phase breakdowns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .cost import ScalarCost
from .workload import KIND_DECODE, KIND_GATE, KIND_NAMES, KIND_PREFILL, KIND_VERIFY, Job, blocks


class _Item:
    __slots__ = ("kind", "pseq", "b", "n", "c", "layers", "probes", "logits", "copy", "step", "done", "prob")

    def __init__(self, kind, prob, b, n, c, layers=None, probes=0.0, logits=1.0, copy=0.0, step=0):
        self.kind, self.prob, self.pseq, self.b = kind, prob, prob.pseq, b
        self.n, self.c, self.layers, self.probes, self.logits, self.copy, self.step = (
            float(n), float(c), layers, float(probes), float(logits), float(copy), step)
        self.done = None


@dataclass
class _Prob:
    pseq: int
    pos: int
    job: Job
    ledger: object = None
    need_bytes: float = 0.0
    arrival: float = 0.0
    admitted: float = 0.0
    end: float = float("nan")
    first: np.ndarray = None
    stored: np.ndarray = None      # generated tokens whose KV is written, per branch
    alloc: np.ndarray = None       # blocks per branch
    phase: dict = field(default_factory=lambda: {k: 0.0 for k in KIND_NAMES})
    verify_bytes: float = 0.0
    live: bool = False
    peak: float = 0.0
    times: list = field(default_factory=list)
    mem: list = field(default_factory=list)
    iterations: int = 0


class Engine:
    """One simulation run. ``jobs``: list of ``(pos, Job)`` in submission order; ``ledgers`` optional per job."""

    def __init__(self, model, hw, jobs, *, concurrency: int = 1, arrival_rate: float | None = None,
                 seed: int = 0, ledger_factory=None, need_bytes=None, kv_capacity: float | None = None,
                 shared_pool=None, max_batch: int | None = None, hw_name: str = ""):
        self.m, self.hw = model, hw
        self.cost = ScalarCost(model, hw)
        self.kvtok = float(model.kv_bytes_per_token)
        self.env = simpy.Environment()
        self.jobs = jobs
        self.concurrency = int(concurrency)
        self.arrival_rate = arrival_rate
        self.rng = np.random.default_rng(seed)
        self.ledger_factory = ledger_factory
        self.need = need_bytes
        self.capacity = kv_capacity
        self.shared_pool = shared_pool
        self.max_batch = max_batch  # a calibrated profile's fitted batch: larger iterations are refused
        self.hw_name = hw_name or getattr(hw, "name", "")
        self.prefill_q: list = []
        self.decode_q: list = []
        self._wake = None
        self.reserved = 0.0
        self.waiting: list = []
        self._admit_ev = None
        self.live: list = []
        self.probs: list[_Prob] = []
        self.timeline_t: list = []
        self.timeline_b: list = []
        self.events = 0
        self.iterations = 0
        self.busy = 0.0
        self.tokens = [0.0, 0.0, 0.0, 0.0]  # new tokens computed, by item kind (token conservation checks)

    # ------------------------------------------------------------------ submission
    def _submit(self, item: _Item):
        item.done = self.env.event()
        (self.decode_q if item.kind == KIND_DECODE else self.prefill_q).append(item)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        return item.done

    # ------------------------------------------------------------------ accelerator
    def _accelerator(self):
        env = self.env
        while True:
            if not self.prefill_q and not self.decode_q:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            # Let every submission made at this instant arrive before forming the batch.
            while env.peek() == env.now:
                yield env.timeout(0)
            if self.prefill_q:
                batch, self.prefill_q = self.prefill_q, []
            else:
                batch, self.decode_q = self.decode_q, []
            if self.max_batch is not None and len(batch) > self.max_batch:
                from .profiles import OutOfCalibrationError
                raise OutOfCalibrationError(
                    f"hardware {self.hw_name}: an iteration batched {len(batch)} sequences at t = {env.now:.3f} s, "
                    f"outside the calibrated range (fitted_range.max_batch = {self.max_batch}); refusing to "
                    f"extrapolate (lower the arrival rate or concurrency)")
            batch.sort(key=lambda it: (it.pseq, it.b, it.kind))
            for it in batch:
                self._pool_hook(it)
            tup = [(it.n, it.c, it.layers, it.probes, it.logits, it.copy) for it in batch]
            dt = self.cost.seconds(tup)
            for it in batch:
                self.tokens[it.kind] += it.n
            yield env.timeout(dt)
            self.iterations += 1
            self.busy += dt
            self._attribute(batch, tup, dt)
            self._account(batch)
            for it in batch:
                it.done.succeed()

    def _pool_hook(self, it: _Item) -> None:
        led = it.prob.ledger
        if led is None:
            return
        r = 0
        if it.kind == KIND_PREFILL and it.prob.job.has_prefill[it.b]:
            r = led.on_prefill(it.b)
        elif it.kind == KIND_DECODE and led.is_boundary(it.b, it.step):
            r = led.on_decode(it.b, it.step)
        elif it.kind == KIND_VERIFY and it.prob.job.v_reuse:
            r = led.on_verify(it.b)
        if r:
            it.n += r
            it.c -= r

    def _attribute(self, batch, tup, dt) -> None:
        if batch[0].kind == KIND_DECODE:
            share = dt / len(batch)
            for it in batch:
                it.prob.phase["decode"] += share
            return
        alone = [self.cost.seconds([t]) for t in tup]
        tot = sum(alone)
        for it, a in zip(batch, alone):
            it.prob.phase[KIND_NAMES[it.kind]] += dt * a / tot if tot > 0 else dt / len(batch)

    def _account(self, batch) -> None:
        bs = None
        for it in batch:
            p = it.prob
            j = p.job
            bs = j.bs
            if it.kind == KIND_PREFILL:
                p.alloc[it.b] = blocks(int(j.own[it.b]), bs)
            elif it.kind == KIND_DECODE:
                p.stored[it.b] = it.step
                p.alloc[it.b] = blocks(int(j.own[it.b]) + it.step, bs)
            elif it.kind == KIND_VERIFY:
                b = it.b
                stored = int(j.decode_steps[b])
                if j.v_reuse:
                    extra = blocks(int(j.own[b]) + stored + int(j.v_new[b]), bs) - blocks(int(j.own[b]) + stored, bs)
                else:
                    extra = blocks(int(j.v_new[b]), bs)
                p.verify_bytes += extra * bs * self.kvtok * float(j.v_layers[b]) / j.L
        now = self.env.now
        total = 0.0
        pools_seen = set()
        for p in self.live:
            if p.ledger is not None:
                pool = p.ledger.pool
                if id(pool) not in pools_seen:
                    pools_seen.add(id(pool))
                    total += pool.size * p.job.bs * self.kvtok
                mine = p.ledger.pool.size * p.job.bs * self.kvtok + p.verify_bytes
            else:
                mine = float(p.alloc.sum()) * p.job.bs * self.kvtok + p.verify_bytes
                total += float(p.alloc.sum()) * p.job.bs * self.kvtok
            total += p.verify_bytes
        for p in {id(it.prob): it.prob for it in batch}.values():
            p.iterations += 1
            if p.ledger is not None:
                mine = p.ledger.pool.size * p.job.bs * self.kvtok + p.verify_bytes
            else:
                mine = float(p.alloc.sum()) * p.job.bs * self.kvtok + p.verify_bytes
            p.times.append(now - p.admitted)
            p.mem.append(mine)
            if mine > p.peak:
                p.peak = mine
        self.timeline_t.append(now)
        self.timeline_b.append(total)

    # ------------------------------------------------------------------ problems
    def _branch(self, p: _Prob, b: int, first_evs, done_ev):
        env, j = self.env, p.job
        waits = []
        if j.gate[b] > 0:
            waits.append(self._submit(_Item(KIND_GATE, p, b, j.gate[b], 0, logits=0.0)))
        s = int(j.source[b])
        if s >= 0:
            waits.append(first_evs[s])
        if waits:
            yield env.all_of(waits) if len(waits) > 1 else waits[0]
        if j.has_prefill[b]:
            yield self._submit(_Item(KIND_PREFILL, p, b, j.computed[b], j.reused[b],
                                     logits=1.0 if j.computed[b] > 0 else 0.0, copy=j.copy[b]))
        p.first[b] = env.now - p.admitted
        first_evs[b].succeed()
        ctx = float(j.ctx[b])
        for step in range(1, int(j.decode_steps[b]) + 1):
            yield self._submit(_Item(KIND_DECODE, p, b, 1, ctx + step - 1, step=step))
        done_ev.succeed()

    def _problem(self, p: _Prob):
        env, j = self.env, p.job
        p.first = np.zeros(j.B)
        p.stored = np.zeros(j.B, np.int64)
        p.alloc = np.zeros(j.B, np.int64)
        first_evs = [env.event() for _ in range(j.B)]
        done = [env.event() for _ in range(j.B)]
        for b in range(j.B):
            env.process(self._branch(p, b, first_evs, done[b]))
        if done:
            yield env.all_of(done)
        if j.verify_on and j.B:
            evs = [self._submit(_Item(KIND_VERIFY, p, b, j.v_new[b], j.v_cached[b], layers=float(j.v_layers[b]),
                                      probes=j.v_probes[b], logits=j.v_head[b])) for b in range(j.B)]
            yield env.all_of(evs)
        p.end = env.now
        p.live = False
        self.live.remove(p)
        self.reserved -= p.need_bytes
        if p.ledger is not None and self.shared_pool is not None:
            p.ledger.release()
        if self.waiting:
            self._try_admit()

    def _try_admit(self) -> None:
        while self.waiting:
            p = self.waiting[0]
            if self.capacity is not None and self.live and self.reserved + p.need_bytes > self.capacity:
                return
            self.waiting.pop(0)
            self._start(p)

    def _start(self, p: _Prob) -> None:
        p.admitted = self.env.now
        p.live = True
        self.reserved += p.need_bytes
        self.live.append(p)
        if self.ledger_factory is not None:
            p.ledger = self.ledger_factory(p.pseq, p.pos, p.job)
        proc = self.env.process(self._problem(p))
        p_done = getattr(p, "_user_done", None)
        if p_done is not None:
            proc.callbacks.append(lambda _ev, e=p_done: e.succeed())

    def _arrive(self, p: _Prob, user_done=None) -> None:
        p.arrival = self.env.now
        p._user_done = user_done  # type: ignore[attr-defined]
        self.probs.append(p)
        self.waiting.append(p)
        self._try_admit()

    def _closed_loop_user(self, mine):
        for pseq in mine:
            pos, job = self.jobs[pseq]
            p = _Prob(pseq=pseq, pos=pos, job=job, need_bytes=self.need[pseq] if self.need is not None else 0.0)
            ev = self.env.event()
            self._arrive(p, ev)
            yield ev

    def _poisson(self):
        for pseq, (pos, job) in enumerate(self.jobs):
            if pseq:
                yield self.env.timeout(float(self.rng.exponential(1.0 / self.arrival_rate)))
            p = _Prob(pseq=pseq, pos=pos, job=job, need_bytes=self.need[pseq] if self.need is not None else 0.0)
            self._arrive(p)

    # ------------------------------------------------------------------ run
    def run(self) -> "EngineResult":
        env = self.env
        env.process(self._accelerator())
        if self.arrival_rate is None:
            n = len(self.jobs)
            for u in range(min(self.concurrency, n)):
                env.process(self._closed_loop_user(list(range(u, n, self.concurrency))))
        else:
            env.process(self._poisson())
        step = env.step
        n_ev = 0
        try:
            while True:
                step()
                n_ev += 1
        except simpy.core.EmptySchedule:
            pass
        self.events = n_ev
        self.probs.sort(key=lambda p: p.pseq)
        return EngineResult(self)


class EngineResult:
    """Per-problem records and the global KV timeline of one engine run."""

    def __init__(self, eng: Engine):
        self.problems = eng.probs
        self.timeline_t = np.asarray(eng.timeline_t)
        self.timeline_b = np.asarray(eng.timeline_b)
        self.events = eng.events
        self.iterations = eng.iterations
        self.makespan = float(eng.env.now)
        self.busy = eng.busy
        self.tokens = dict(zip(KIND_NAMES, eng.tokens))

    def records(self) -> list[dict]:
        out = []
        for p in self.problems:
            led = p.ledger
            out.append({
                "pseq": p.pseq, "pos": p.pos, "arrival_s": p.arrival, "admitted_s": p.admitted, "end_s": p.end,
                "latency_s": p.end - p.arrival, "service_s": p.end - p.admitted, "queue_s": p.admitted - p.arrival,
                **{f"{k}_s": v for k, v in p.phase.items()},
                "ttft_s": float(p.first.mean()) if len(p.first) else 0.0,
                "first_token_times": p.first, "peak_kv_bytes": p.peak, "iterations": p.iterations,
                "kv_times": np.asarray(p.times), "kv_bytes": np.asarray(p.mem),
                "recompute_tokens": int(led.recompute_tokens) if led is not None else 0,
                "evictions": int(led.pool.evictions) if led is not None else 0,
            })
        return out
