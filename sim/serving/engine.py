"""The discrete-event simulator (simpy): problems arrive, a vLLM-style scheduler batches them.

* Problems arrive closed-loop (``concurrency`` users; 1 is isolated mode), as a seeded Poisson process
  (``arrival_rate``), or at given times (``arrival_times``) through at most ``max_concurrency`` outstanding problems,
  FIFO (``vllm bench serve``'s semaphore: a problem is *sent*, and its latencies start, when it gets a slot).
* Every branch is a :class:`sim.serving.scheduler.Request` of the one scheduler (the module a real runner calls
  too): its prompt, then ``gen_b`` sampled tokens. A branch enters once its ASKS gate pass (its own request, no
  cached KV) finished and its KV source produced its first token (``Job.source``); exact-prefix sharing comes from
  the block manager's hash chain (:mod:`sim.serving.kvcache`); an ASKS-shared branch carries its root's block
  contents and takes the whole cached prompt (zero-copy fork), copying the partial last block.
* Verification (unless CGEE skipped it) starts when every branch is done: with ``verify_reuses_kv`` the branch's
  request was held (KV referenced) and is extended by the verification prompt; else each pass is a new request.
* The accelerator is one process: ``schedule()`` -> price the iteration (:class:`sim.cost.terms.ScalarCost`) ->
  advance time -> ``update()``. Admission waits for free blocks, a running request that needs a block preempts the
  newest (recompute); nothing fails for lack of memory unless one request alone cannot fit (:class:`CapacityError`).
  With async scheduling an arrival is held back to the schedule that sees it (:mod:`sim.serving.intake`).

Iteration time is split among its items in proportion to their stand-alone times, or equally in a pure decode
iteration, for per-problem phases. RSBCM's block scores are set when they become known (``score_at``): a branch's
generation confidence when it finishes, the vote share when all finished, the verification score when verified.
"""
from __future__ import annotations

import numpy as np
from dataclasses import dataclass

import simpy

from sim.serving import arrivals
from sim.serving.capacity import CapacityError  # noqa: F401  (raised here: one request alone exceeds the capacity)
from sim.cost.pricing import StepPricer, attribution, equal_shares
from sim.cost.terms import ScalarCost, with_shared
from sim.serving.fleet_clock import StepTimeout
from sim.serving.fastforward import token_times
from sim.serving.intake import AsyncIntake
from sim.serving.kvcache import UNLIMITED, BlockManager, group_blocks
from sim.serving.kvshare import shared_tokens
from sim.serving.lifecycle import ProblemLifecycle
from sim.serving.scheduler import Request, Scheduler, SchedulerConfig
from sim.workload.job import KIND_NAMES, Job

SCORE_AT = {"mean_prob": "generation", "vote_share": "branches", "verify_score": "verification"}


@dataclass(frozen=True)
class StepRecord:
    """One engine iteration as an observer sees it (``Engine(on_step=...)``), after the scheduler's update:
    it started at ``t0`` and took ``dt`` simulated seconds; ``out`` is what ``Scheduler.schedule`` returned
    (items, preemptions), ``finished`` the requests the update finished; the queue and KV after it."""
    t0: float
    dt: float
    out: object
    finished: list
    running: int
    waiting: int
    kv_blocks_used: int


class Engine(ProblemLifecycle):
    """One simulation run. ``jobs``: list of ``(pos, Job)`` in submission order.

    Parameters
    ----------
    model, hw : cost target
    jobs : list of (pos, Job)
    concurrency, arrival_rate : closed loop users, or Poisson arrivals (problems/s)
    scheduler : SchedulerConfig (default: prefill-first, no token/sequence cap = isolated batching)
    kv_blocks : int, optional -- KV capacity in blocks (None: unlimited)
    block_policy : block policy of :mod:`policies.blocks` (default LRU)
    caching : bool -- prefix caching (False for No-KV: nothing is reused, not even within a problem)
    prompt_ids : list, optional -- per job, per branch, the token ids its KV holds (ASKS-shared: its root's)
    score_at : {"generation", "branches", "verification"} -- when ``Job.score`` becomes known to the block policy
    per_problem_timeline : bool -- record each problem's KV after every iteration it took part in (isolated mode)
    arrival_times : sequence of float, optional
        Arrival time of each job (seconds, submission order); replaces ``concurrency`` /
        ``arrival_rate``. With ``max_concurrency`` at most that many are outstanding; the
        others wait FIFO and arrive (are sent) when a slot frees.
    record_token_times : bool -- record the time of every sampled token of every branch (the records' ``token_times``)
    cost : optional
        Prices an iteration (``seconds(items)``); default :class:`sim.cost.terms.ScalarCost` of ``model`` on ``hw``.
        A :class:`sim.cost.parallel.ParallelCost` with ``pp > 1`` and ``pipeline_schedule == "overlapped"`` runs
        vLLM's pipeline: the next batch is formed as soon as stage 0 is free and fewer than PP batches are
        in flight, from requests in no in-flight batch (module docstring).
    record_pipeline : bool -- PP > 1: every batch's formation, stage seconds and ends, request ids (``pp_batches``)
    on_step : callable, optional
        Called with a :class:`StepRecord` after every iteration's scheduler update (an observer: it decides
        nothing). With one, the engine steps every iteration (no fast-forward window skips one).
    log_evictions : bool -- keep every evicted block's key in order (``kv.evicted_log``); off, only the last
    fleet : bool
        A replica on a :class:`sim.serving.fleet_clock.FleetClock` whose answers only lower its router's counts: its
        windows run to the next event no engine made and answer requests (:mod:`sim.serving.fastforward`).
    """

    def __init__(self, model, hw, jobs, *, concurrency: int = 1, arrival_rate: float | None = None, seed: int = 0,
                 scheduler: SchedulerConfig | None = None, kv_blocks: int | None = None, block_policy=None,
                 caching: bool = True, prompt_ids=None, score_at: str = "generation", max_batch: int | None = None,
                 hw_name: str = "", per_problem_timeline: bool = False, kv_bytes_per_block: float | None = None,
                 arrival_times=None, max_concurrency: int | None = None, record_token_times: bool = False,
                 cost=None, env: simpy.Environment | None = None, settle: int | None = None,
                 block_size: int | None = None, record_pipeline: bool = False, host_step=None,
                 async_scheduling: bool = False, client_delays=None, api_servers: int = 1,
                 fast_forward: bool = False, on_step=None, log_evictions: bool = False, fleet: bool = False):
        self.m, self.hw = model, hw
        # the API server in front (arrival_times only; None: none): per job (before_s, after_s), the seconds
        # from send to the engine (HTTP, tokenisation; api_servers requests at a time, FIFO) and from the
        # engine's last token to the client (its chunk's delivery); sent[pseq] = when the client sent it
        self.client_delays = client_delays
        self.api_servers = int(api_servers)
        self.sent: dict = {}
        # pricing (sim.cost.pricing.StepPricer): the cost (anything with ScalarCost's seconds(items), e.g.
        # sim.cost.parallel.ParallelCost for a TP x PP replica), the host time per step (a
        # sim.cost.overheads.HostStepCost; None: not priced, the policies' replay) and vLLM's --async-scheduling
        self.pricer = StepPricer(ScalarCost(model, hw) if cost is None else cost, host_step=host_step,
                                 async_scheduling=async_scheduling, max_batch=max_batch,
                                 hw_name=hw_name or getattr(hw, "name", ""), shared=self._with_shared)
        # env: a shared environment (several replicas' engines under one clock, sim.serving.replicas)
        self.env = simpy.Environment() if env is None else env
        self.fleet = bool(fleet)
        self.peek_next = self._next_event()
        # settle: before forming a batch, yield zero-time steps while events are due now (None: until none are;
        # k: at most k, which several accelerators sharing one clock need so they do not wait on each other)
        self.settle = settle
        self.jobs = jobs
        self.concurrency = int(concurrency)
        self.arrival_rate = arrival_rate
        self.arrival_times = None if arrival_times is None else [float(t) for t in arrival_times]
        self.max_concurrency = max_concurrency
        # how problems arrive (sim.serving.arrivals: the one driver of the engine, replicas and bench)
        self.arrivals = arrivals.of(len(jobs), concurrency=concurrency, arrival_rate=arrival_rate, seed=seed,
                                    arrival_times=arrival_times, max_concurrency=max_concurrency,
                                    client_delays=client_delays, api_servers=api_servers)
        self.record_tokens = bool(record_token_times)
        bs = int(block_size) if block_size is not None else (jobs[0][1].bs if jobs else 16)
        self.bs = bs
        self.cfg = scheduler or SchedulerConfig(max_num_seqs=1 << 20, max_num_batched_tokens=1 << 24,
                                                policy="prefill-first")
        self.kv = BlockManager(UNLIMITED if kv_blocks is None else int(kv_blocks), bs, policy=block_policy,
                               caching=caching, log_evictions=log_evictions)
        self.sched = Scheduler(self.cfg, self.kv)
        self.caching = caching
        self.prompt_ids = prompt_ids
        self.score_at = score_at
        self.per_problem = per_problem_timeline
        self.block_bytes = float(kv_bytes_per_block if kv_bytes_per_block is not None
                                 else bs * model.kv_bytes_per_token)
        self.probs: list = []
        self._wake = None
        self.timeline_t: list = []
        self.timeline_b: list = []
        self.timeline_run: list = []
        self.events = 0
        self.iterations = 0
        self.busy = 0.0
        self.run_time = 0.0       # sum of running-seqs x iteration time (time-weighted mean)
        self.tokens = [0.0, 0.0, 0.0, 0.0]
        self.gen_tokens = 0
        self.items_scheduled = 0   # (request, iteration) pairs: one scheduling event each
        # pipeline parallelism: the cost's stages; "overlapped" keeps up to PP batches in flight (vLLM)
        self.pp_stages = int(getattr(self.cost, "pp", 1)) if hasattr(self.cost, "stage_seconds") else 1
        self.pp_schedule = getattr(self.cost, "pipeline_schedule", "serial") if self.pp_stages > 1 else "serial"
        self.stage_busy = [0.0] * self.pp_stages   # seconds each stage computed
        self.record_pipeline = bool(record_pipeline)
        self.pp_batches: list = []  # with record_pipeline: per batch (formed at, stage seconds, stage ends)
        self._in_flight: set = set()   # ids of requests in a batch still in the pipeline
        self._n_flight = 0
        # decode fast-forward (sim.serving.fastforward): quiet decode windows advanced at once, exactly; off: stepped
        from sim.serving.fastforward import FastForward
        # an iteration observer sees every iteration, so it keeps the engine stepping (a window skips them)
        self.on_step = on_step
        self._ff = (FastForward(self) if fast_forward and on_step is None and FastForward.supports(self)
                    else None)
        self._intake, self._arriving = self._make_intake(), False

    def _make_intake(self):
        """Arrivals held back a step under async scheduling (:mod:`sim.serving.intake`) where a host_step is priced."""
        on = self.async_scheduling and self.host_step is not None and self.pp_stages == 1
        return AsyncIntake() if on else None

    def _next_event(self):
        """The reader of the next event a step's schedule can see: the clock's next (one engine: its own step has no
        pending event while it plans), or on a fleet's clock the next one no engine made."""
        if not self.fleet:
            return self.env.peek
        if not hasattr(self.env, "peek_foreign"):
            raise ValueError("engine: fleet=True needs env to be a sim.serving.fleet_clock.FleetClock")
        return self.env.peek_foreign

    # the pricing state, on the engine (sim.serving.fastforward and callers read and add to these)
    cost = property(lambda self: self.pricer.cost)
    host_step = property(lambda self: self.pricer.host_step)
    async_scheduling = property(lambda self: self.pricer.async_scheduling)
    max_batch = property(lambda self: self.pricer.max_batch)
    hw_name = property(lambda self: self.pricer.hw_name)
    prices_shared = property(lambda self: self.pricer.prices_shared)
    host_seconds = property(lambda self: self.pricer.host_seconds,
                            lambda self, v: setattr(self.pricer, "host_seconds", v))
    host_extrapolated = property(lambda self: self.pricer.host_extrapolated,
                                 lambda self, v: setattr(self.pricer, "host_extrapolated", v))

    # ------------------------------------------------------------------ requests
    def _add(self, req: Request) -> None:
        self._intake.hold(req, self.env.now) if self._arriving else self.sched.add(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _arrive(self, p, user_done=None) -> None:
        self._arriving = self._intake is not None   # its requests wait for the schedule that sees them
        super()._arrive(p, user_done)
        self._arriving = False

    # ------------------------------------------------------------------ pricing (sim.cost.pricing.StepPricer)
    def _price(self, it):
        return self.pricer.item(it)

    def _price_batch(self, items, now: float):
        """:meth:`StepPricer.batch` of the scheduled batch (``items_scheduled`` counts its items)."""
        out = self.pricer.batch(items, now)
        self.items_scheduled += len(items)
        return out

    def _host_seconds(self, items) -> tuple:
        return self.pricer.host_of(items)

    def _stepped(self, gpu_s: float) -> float:
        return self.pricer.stepped(gpu_s)

    def _window_seconds(self, B, S, cmax, Ssw=None):
        return self.pricer.window_seconds(B, S, cmax, Ssw)

    def window_host(self, B):
        return self.pricer.window_host(B)

    def _alone(self, ts) -> float:
        return self.pricer.alone(ts)

    # ------------------------------------------------------------------ accelerator
    def _settle(self):
        """Let every arrival at this instant be queued before a batch is formed (``settle``: at most that
        many zero-time steps; None: until nothing else is due now)."""
        env = self.env
        if self.settle is None:
            while env.peek() == env.now:
                yield StepTimeout(env, 0)
        else:
            for _ in range(self.settle):
                if env.peek() != env.now:
                    break
                yield StepTimeout(env, 0)

    def _accelerator(self):
        env, sched, kv, cost = self.env, self.sched, self.kv, self.cost
        intake = self._intake
        while True:
            if not sched.has_unfinished() and not (intake and intake.held):
                self._wake = env.event()
                yield self._wake
                self._wake = None
            yield from self._settle()  # every arrival at this instant is queued before the batch forms
            held = intake is not None and intake.release(env.now, sched)
            if self._ff is not None:
                self._ff.cap = 1 if held else None   # a held arrival is seen at the next step: a one-step window
                ds = self._ff.advance()   # a quiet decode window, applied; its end is the next step's start
                if ds is not None:
                    for d in ds:
                        yield StepTimeout(env, d)
                    if intake is not None:
                        intake.began(self._ff.last_start, env.now)
                    continue
            out = sched.schedule()
            items = out.items
            nrun = len(sched.running)
            if not items:
                if held:
                    intake.release(env.now, sched, force=True)
                    continue
                if sched.waiting and not sched.running:
                    raise self._no_fit(sched.waiting[0], kv)
                if sched.has_unfinished():
                    # only held requests are left, waiting for an event (an arrival): wait for it
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                continue
            priced, tup = self._price_batch(items, env.now)
            if self.pp_stages > 1:
                st = cost.stage_seconds(tup)
                if self.host_step is not None:
                    st[0] = self._stepped(st[0])   # host time: with stage 0 (the engine core feeds rank 0)
                dt = float(sum(st)) + self.pricer.extra_dt     # == cost.seconds(tup): one batch through every stage
                st[-1] += self.pricer.extra_dt
                self._record_batch(env.now, st, list(env.now + np.cumsum(st)), items)
            else:
                dt = self._stepped(cost.seconds(tup) + self.pricer.extra_dt)
            self._admitted(items, env.now)
            if intake is not None:
                intake.began(env.now, env.now + dt)
            if dt > 0:
                yield StepTimeout(env, dt)
            self.busy += dt
            self.run_time += dt * nrun
            self._complete(out, items, priced, tup, dt, nrun)

    # a window's steps carry the host term (window_host): fast-forward may replace them (sim.serving.fastforward)
    windows_price_host = True

    def _record_batch(self, start, st, ends, items) -> None:
        for k, t in enumerate(st):
            self.stage_busy[k] += t
        if self.record_pipeline:
            self.pp_batches.append({"formed_s": start, "stage_s": list(st), "end_s": list(ends),
                                    "requests": [it.req.req_id for it in items]})

    def _accelerator_pp(self):
        """vLLM's pipeline (``pipeline_schedule="overlapped"``): up to PP batches in flight, one per stage.

        A batch is formed when stage 0 is free and fewer than PP batches are in flight, from requests in
        no in-flight batch; it runs its stages in order, each when the batch before it left the stage::

            end_k = max(end_{k-1}, free_k) + t_k,   free_k := end_k    (end_{-1} = formation time)

        and its requests advance (:meth:`Scheduler.update`) when it leaves the last stage.
        """
        env, sched, kv, cost = self.env, self.sched, self.kv, self.cost
        S = self.pp_stages
        free = [0.0] * S          # when each stage is done with the batches already formed
        last_end = 0.0
        while True:
            if self._n_flight >= S or not (sched.has_unfinished() or self._n_flight):
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if free[0] > env.now:
                yield env.timeout(free[0] - env.now)
            yield from self._settle()
            if self._n_flight >= S:
                continue
            out = sched.schedule(busy=self._in_flight)
            items = out.items
            nrun = len(sched.running)
            if not items:
                if sched.waiting and not sched.running and not self._n_flight:
                    raise self._no_fit(sched.waiting[0], kv)
                if sched.has_unfinished() or self._n_flight:
                    # wait for a batch to leave the pipeline or an arrival
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                continue
            priced, tup = self._price_batch(items, env.now)
            st = cost.stage_seconds(tup)
            st[-1] += self.pricer.extra_dt     # eviction scoring: with the sampling, on the last stage
            if self.host_step is not None:
                st[0] = self._stepped(st[0])   # host time: with stage 0 (the engine core feeds rank 0)
            start = env.now
            ends, e = [], start
            for k in range(S):
                e = max(e, free[k]) + st[k]
                free[k] = e
                ends.append(e)
            end = ends[-1]
            self._record_batch(start, st, ends, items)
            self._admitted(items, start)
            # busy: time with a batch in the pipeline (the union of the batches' spans)
            add = max(0.0, end - max(start, last_end))
            last_end = max(last_end, end)
            self.busy += add
            self.run_time += add * nrun
            ids = [it.req.req_id for it in items]
            self._in_flight.update(ids)
            self._n_flight += 1
            env.process(self._leave(out, items, priced, tup, end - start, nrun, end, ids))

    def _leave(self, out, items, priced, tup, dt, nrun, end, ids):
        """A batch leaves the last stage at ``end``: its requests advance."""
        if end > self.env.now:
            yield self.env.timeout(end - self.env.now)
        self._n_flight -= 1
        self._in_flight.difference_update(ids)
        self._complete(out, items, priced, tup, dt, nrun)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _complete(self, out, items, priced, tup, dt, nrun) -> None:
        """A batch's forward is done (now): advance the scheduler, the branches and the records."""
        env, sched, kv = self.env, self.sched, self.kv
        worked = bool(tup) and any(t[0] > 0 or t[5] > 0 for t in tup)
        if worked:
            self.iterations += 1
        self._attribute(items, priced, dt, worked)
        used = kv.num_used * self.block_bytes
        done = sched.update(out)
        now = env.now
        if self.on_step is not None:
            self.on_step(StepRecord(t0=now - dt, dt=dt, out=out, finished=list(done), running=len(sched.running),
                                    waiting=len(sched.waiting), kv_blocks_used=int(kv.num_used)))
        touched = {}
        for it, (ts, kind) in zip(items, priced):
            req = it.req
            p, rkind, b = req.data
            touched[p.pseq] = p
            # one tuple (a decode): its tokens, as the sum over one adds them (0 + x is x)
            self.tokens[kind] += ts[0][0] if len(ts) == 1 else sum(t[0] for t in ts)
            p.recompute += it.recompute
            if rkind == 1:
                if self.record_tokens and it.samples:
                    p.tok[b].append(now)
                f = p.first[b]
                if f != f and it.num_cached + it.num_new >= int(p.job.ctx[b]):   # NaN: no first token yet
                    p.first[b] = now - p.arrival   # the prompt is in: its first token is out
                    p.src_ready[b] = True
                    self._try_start(p)
                if req.done_sampling and req.pending == 0 and not p.gen_done[b]:
                    self.gen_tokens += int(p.job.gen[b])
                    self._gen_finished(p, b)
            elif rkind == 0 and req.status == "finished":
                p.gate_left[b] = False
                self._try_start(p)
        for req in done:
            p, rkind, b = req.data
            if rkind == 3 or (rkind == 1 and p.gen_done[b] and p.job.verify_on and p.job.v_reuse):
                self._verify_done(p, b)
        if worked:
            self.timeline_t.append(now)
            self.timeline_b.append(used)
            self.timeline_run.append(nrun)
            for p in touched.values():
                p.iterations += 1
                if self.per_problem:
                    p.times.append(now - p.admitted)
                    p.mem.append(used)
                if used > p.peak:
                    p.peak = used

    def _attribute(self, items, priced, dt, worked) -> None:
        if not worked or dt <= 0:
            return
        if equal_shares(priced):
            live = [it for it, (ts, _) in zip(items, priced) if ts]
            share = dt / len(live)
            for it in live:
                it.req.data[0].phase["decode"] += share
            return
        shares = attribution(dt, [self._alone(ts) if ts else 0.0 for ts, _ in priced]).tolist()
        for it, (_, kind), x in zip(items, priced, shares):
            it.req.data[0].phase[KIND_NAMES[kind]] += x

    # ------------------------------------------------------------------ arrivals
    def _no_fit(self, head, kv) -> CapacityError:
        """The request at the head of the queue can never fit the KV capacity, even alone."""
        need = -(-head.num_tokens // self.bs)   # its prompt's blocks, in every KV-cache group (nothing computed)
        need += 0 if kv.kv_groups is None else group_blocks(kv.kv_groups, self.bs, need, 0)
        return CapacityError(
            f"request {head.req_id} (problem {head.data[0].pos}) needs {need} KV blocks "
            f"({need * self.block_bytes / 1e9:.3f} GB) but the KV capacity is {kv.num_blocks} blocks "
            f"({kv.num_blocks * self.block_bytes / 1e9:.3f} GB): {need - kv.num_blocks} blocks "
            f"({(need - kv.num_blocks) * self.block_bytes / 1e9:.3f} GB) short", field="kv_capacity_bytes")

    def _with_shared(self, items, priced):
        """Each item's first cost tuple carries ``h_i`` (:func:`sim.serving.kvshare.shared_tokens` over the block
        manager's physical blocks) as its 8th field. A token-eviction decode attends over the policy's
        cache, not its blocks in order: it shares nothing."""
        if len(items) < 2:
            return priced
        kvb, bs = self.kv.req_blocks, self.bs
        lists, ctxs = [], []
        for it, (ts, _) in zip(items, priced):
            c = it.num_cached
            blks = kvb.get(it.req.req_id)
            ids = []
            # only a block held by two requests (ref >= 2) can be read by two items, and a request's shared
            # blocks are a prefix of its table (prefix-cache hits and forks share leading blocks only)
            if ts and blks and blks[0].ref > 1 and c >= bs and not (
                    it.req.data[1] == 1 and it.num_new == 1 and it.req.data[0].job.long is not None):
                for b in blks[: c // bs]:
                    if b.ref < 2:
                        break
                    ids.append(b.block_id)
            lists.append(ids)
            ctxs.append(c)
        out = []
        for h, (ts, kind) in zip(shared_tokens(lists, ctxs, self.bs), priced):
            if h and ts:
                ts = [with_shared(ts[0], h)] + ts[1:]
            out.append((ts, kind))
        return out

    def _submit_own(self, pseq: int, hold: bool):
        """Job ``pseq`` of ``self.jobs`` arrives now (:mod:`sim.serving.arrivals`); ``hold``: an event for its answer."""
        done = self.env.event() if hold else None
        pos, job = self.jobs[pseq]
        self.submit(pseq, pos, job, None, done)
        return done

    # ------------------------------------------------------------------ driven from outside (sim.serving.replicas)
    def start(self):
        """Start the accelerator process (once); arrivals then come through :meth:`submit`."""
        overlapped = self.pp_stages > 1 and self.pp_schedule == "overlapped"
        self._acc = self.env.process(self._accelerator_pp() if overlapped else self._accelerator())
        return self._acc

    def submit(self, pseq: int, pos: int, job: Job, prompt_ids=None, user_done=None) -> None:
        """A problem arrives now: ``pseq`` its key (unique per engine), ``pos`` its trace position,
        ``prompt_ids`` its branches' token ids (per branch), ``user_done`` an event succeeded when it is answered."""
        if prompt_ids is not None:
            if self.prompt_ids is None:
                self.prompt_ids = {}
            self.prompt_ids[pseq] = prompt_ids
        self._arrive(self._prob(pseq, pos, job), user_done)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def result(self, n_expected: int | None = None) -> "EngineResult":
        """The run's result once the environment is exhausted (raises if a problem is unfinished)."""
        if self._ff is not None:
            self._ff.flush()   # the last window's members, written onto their objects
        stuck = [p.pos for p in self.probs if not p.end == p.end]
        if stuck or len(self.probs) < (len(self.jobs) if n_expected is None else n_expected):
            raise RuntimeError(f"engine: the run stopped with problems {stuck[:5]} unfinished "
                               f"({len(self.sched.waiting)} waiting, {len(self.sched.running)} running requests)")
        self.probs.sort(key=lambda p: p.pseq)
        return EngineResult(self)

    # ------------------------------------------------------------------ run
    def run(self) -> "EngineResult":
        acc = self.start()
        arrivals.start(self.env, self.arrivals, len(self.jobs), self._submit_own, self.sent)
        n_ev = arrivals.run_until_empty(self.env, [acc])
        # events: simpy events plus one per request scheduled in an iteration (what a per-step event loop
        # such as Vidur's processes); the branches' bookkeeping runs as callbacks, not as simpy processes
        self.events = n_ev + self.items_scheduled
        return self.result()


class EngineResult:
    """Per-problem records, the global KV and running-sequence timelines, scheduler counters."""

    def __init__(self, eng: Engine):
        self.problems = eng.probs
        self.timeline_t = np.asarray(eng.timeline_t)
        self.timeline_b = np.asarray(eng.timeline_b)
        self.timeline_running = np.asarray(eng.timeline_run)
        self.events = eng.events
        self.iterations = eng.iterations
        self.makespan = float(eng.env.now)
        self.busy = eng.busy
        self.mean_running = eng.run_time / eng.busy if eng.busy > 0 else 0.0
        self.tokens = dict(zip(KIND_NAMES, eng.tokens))
        self.stats = eng.sched.stats()
        self.kv = eng.kv
        self.gen_tokens = eng.gen_tokens
        self.host_seconds, self.host_extrapolated = eng.host_seconds, eng.host_extrapolated
        # pipeline parallelism: per stage, the share of the makespan it computed nothing (its bubbles)
        span = self.makespan
        self.pipeline = None if eng.pp_stages == 1 else {
            "pipeline_schedule": eng.pp_schedule, "stages": eng.pp_stages, "stage_busy_s": list(eng.stage_busy),
            "bubble_fraction": [1.0 - b / span if span > 0 else 0.0 for b in eng.stage_busy],
            **({"batches": eng.pp_batches} if eng.record_pipeline else {})}

    # what a vllm bench-shaped run reads of each record (sim.bench.plain): a day of traffic's records are small
    PLAIN_FIELDS = ("pseq", "arrival_s", "latency_s", "first_token_times", "prefix_hit_tokens", "token_times")

    def records(self, fields: tuple | None = None) -> list[dict]:
        """One dict per problem, in arrival order; ``fields``: only these keys of each (e.g. :data:`PLAIN_FIELDS`:
        a long run's records are then small; each full record lives only while it is cut)."""
        if fields is None:
            return [self._record(p) for p in self.problems]
        if set(fields) <= set(self.PLAIN_FIELDS):   # only those: made alone (a day's records, cheaply)
            return [{k: v for k, v in self._plain(p).items() if k in fields} for p in self.problems]
        return [{k: v for k, v in self._record(p).items() if k in fields} for p in self.problems]

    @staticmethod
    def _plain(p) -> dict:
        """A record's :data:`PLAIN_FIELDS` (``token_times`` where token times were recorded)."""
        out = {"pseq": p.pseq, "arrival_s": p.arrival, "latency_s": p.end - p.arrival, "first_token_times": p.first,
               "prefix_hit_tokens": int(p.hit_tokens)}
        if p.tok is not None:
            out["token_times"] = [token_times(x) for x in p.tok]
        return out

    @classmethod
    def _record(cls, p) -> dict:
        adm = p.admitted if p.admitted is not None else p.arrival
        first = p.first
        pl = cls._plain(p)
        return {
            "pseq": p.pseq, "pos": p.pos, "arrival_s": p.arrival, "admitted_s": adm, "end_s": p.end,
            "latency_s": pl["latency_s"], "service_s": p.end - adm,
            # waiting for the scheduler (memory, sequence or token caps): the problem's first admission
            # after arrival plus its branches' mean wait between ready and first scheduled
            "queue_s": (adm - p.arrival) + (p.qsum / p.qn if p.qn else 0.0),
            **{f"{k}_s": v for k, v in p.phase.items()},
            "ttft_s": float(np.nanmean(first)) if len(first) and not np.isnan(first).all() else 0.0,
            "first_token_times": first, "peak_kv_bytes": p.peak, "iterations": p.iterations,
            "kv_times": np.asarray(p.times), "kv_bytes": np.asarray(p.mem),
            "recompute_tokens": int(p.recompute), "evictions": 0,
            "prefix_hit_tokens": pl["prefix_hit_tokens"], "prompt_tokens_admitted": int(p.prompt_tokens),
            **({"token_times": pl["token_times"]} if "token_times" in pl else {}),
        }
