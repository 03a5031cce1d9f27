"""Replicas behind a router: ``data_parallel_size`` engines under one clock, fed by one arrival stream.

Each replica is a :class:`sim.serving.engine.Engine` (its own scheduler, KV block pool and prefix cache, priced by
its own cost object, e.g. a :class:`sim.cost.parallel.ParallelCost` of its TP x PP GPUs); all share one simpy
environment. Problems arrive as the single engine's do (closed loop: ``concurrency`` users; or seeded
Poisson at ``arrival_rate``, the same random stream). At a problem's arrival every branch is a request
routed on its own (:mod:`sim.serving.router`, ``outstanding`` = branch requests in flight per replica); the
branches sent to one replica form one sub-problem there (:func:`split_job`). KV sharing happens only
inside one replica's cache: a branch whose KV source (exact-prefix reuse or ASKS's whole-prompt fork)
went to another replica computes its whole prompt, and :func:`sim.serving.router.lost_shares` counts it.

Departures from one engine (named): a problem split over several replicas verifies each part when that
part's branches are done (no barrier across replicas), and its answer time is the last part's; a
replica's ``outstanding`` count drops when its sub-problem is answered.

With one replica the driver is the engine: same arrivals, same order, the same records (test).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from sim.serving import arrivals
from sim.serving.engine import Engine
from sim.serving.fleet_clock import FleetClock
from sim.serving.goodput import SLO, goodput, tpot
from sim.serving.router import Arrival, choose, lost_shares

_BRANCH_FIELDS = ("reused", "computed", "copy", "gate", "source", "share", "ctx", "gen", "own", "v_new", "v_cached",
                  "v_layers", "v_probes", "v_head", "v_kv_tokens")


def split_job(job, keep):
    """The sub-job of branches ``keep`` (bool per branch) on one replica.

    A kept branch whose source is kept keeps its reuse (source index renumbered); one whose source is
    elsewhere loses it: ``reused = copy = 0``, ``computed = own = ctx``, no share, no source.
    """
    keep = np.asarray(keep, bool)
    idx = np.nonzero(keep)[0]
    new_index = -np.ones(job.B, np.int64)
    new_index[idx] = np.arange(idx.size)
    kw = {f: np.asarray(getattr(job, f))[idx].copy() for f in _BRANCH_FIELDS}
    src = np.asarray(job.source)[idx]
    lost = (src >= 0) & ~keep[np.where(src >= 0, src, 0)]
    kw["source"] = np.where(src >= 0, new_index[np.where(src >= 0, src, 0)], -1)
    kw["source"][lost] = -1
    kw["reused"][lost] = 0
    kw["copy"][lost] = 0
    kw["share"][lost] = False
    kw["computed"][lost] = kw["ctx"][lost]
    kw["own"][lost] = kw["ctx"][lost]
    score = None if job.score is None else np.asarray(job.score)[idx].copy()
    # the long decode carries over; the memos of derived values are the sub-job's own
    return job.fresh(B=int(idx.size), score=score, **kw)


def _common_prefix(ids_per_branch) -> np.ndarray:
    if not ids_per_branch:
        return np.zeros(0, np.int64)
    a = [np.asarray(x, np.int64) for x in ids_per_branch]
    n = min(len(x) for x in a)
    first = a[0][:n]
    for x in a[1:]:
        diff = np.nonzero(x[:n] != first)[0]
        n = int(diff[0]) if diff.size else n
        first = first[:n]
    return first


@dataclass
class ReplicaRun:
    """Per replica: its engine's result and records (sub-problems); in total: problem records and routing."""

    results: list
    records: list          # per replica: list of sub-problem records
    problems: list         # per problem: the aggregated record
    routing: list          # per problem: replica of each branch
    lost: dict
    makespan: float
    events: int


class Replicas:
    """``n`` replica engines behind ``router`` (module docstring).

    Parameters
    ----------
    model, hw : the cost target of each replica (the model's KV bytes per token size the blocks)
    jobs : list of (pos, Job) in submission order
    router : a :mod:`sim.serving.router` router for ``n`` replicas
    costs : list of cost objects (one per replica) or None (each replica a ``ScalarCost``)
    kv_blocks : KV blocks of each replica (None: unlimited)
    block_policy : callable returning a fresh block policy per replica (None: LRU)
    fast_forward : the replicas advance quiet decode stretches at once where they can (:mod:`sim.serving.fastforward`):
        under Poisson arrivals as a fleet; in a closed loop one replica as the single engine, several step; False
        steps every iteration (the reference)
    prompt_ids : per job, per branch, token ids (None: the sharing plan's stand-ins)
    prefixes : per job, the key prefix-affinity hashes (None: the branches' common prompt prefix, or the
        problem's position without ``prompt_ids``)
    """

    def __init__(self, model, hw, jobs, router, n: int, *, costs=None, concurrency: int = 1,
                 arrival_rate: float | None = None, seed: int = 0, scheduler=None, kv_blocks: int | None = None,
                 block_policy=None, caching: bool = True, prompt_ids=None, prefixes=None,
                 score_at: str = "generation", max_batch: int | None = None, hw_name: str = "",
                 record_token_times: bool = True, host_step=None, async_scheduling: bool = False,
                 fast_forward: bool = False):
        self.jobs = jobs
        self.n = int(n)
        self.router = router
        # Poisson arrivals: an answer only lowers the router's counts (no user waits to send the next problem), so
        # the replicas take decode windows as a fleet on one FleetClock (sim.serving.fleet_clock, as bench's
        # replicas); a closed loop's answer sends the next problem: one replica takes the single engine's windows
        # (they end before a step that answers), several step
        fleet = bool(fast_forward) and arrival_rate is not None
        self.env = FleetClock() if fleet else simpy.Environment()
        self.concurrency = int(concurrency)
        self.arrival_rate = arrival_rate
        self.arrivals = arrivals.of(len(jobs), concurrency=concurrency, arrival_rate=arrival_rate, seed=seed)
        self.prompt_ids = prompt_ids
        self.prefixes = prefixes
        bs = jobs[0][1].bs if jobs else 16
        # one accelerator settles until no event is due now (the single engine's rule); several must not
        # wait on each other's zero-time steps: one step each
        settle = None if self.n == 1 else 1
        self.engines = [Engine(model, hw, [], scheduler=scheduler, kv_blocks=kv_blocks,
                               block_policy=block_policy() if block_policy is not None else None, caching=caching,
                               score_at=score_at, max_batch=max_batch, hw_name=hw_name, env=self.env,
                               settle=settle, block_size=bs, cost=None if costs is None else costs[i],
                               record_token_times=record_token_times,   # per-request TPOT and ITL
                               host_step=host_step, async_scheduling=async_scheduling,
                               fast_forward=fleet or (bool(fast_forward) and self.n == 1), fleet=fleet)
                        for i in range(self.n)]
        self.outstanding = [0] * self.n
        self.submitted = [0] * self.n
        self.routing: list = [None] * len(jobs)
        self.lost = {"asks_shares": 0, "prefix_reuse": 0, "reused_tokens": 0}

    def _prefix(self, pseq: int, pos: int, job):
        if self.prefixes is not None:
            return self.prefixes[pseq]
        if self.prompt_ids is not None:
            return _common_prefix([np.asarray(x)[: int(job.ctx[b])] for b, x in enumerate(self.prompt_ids[pseq])])
        return (pos,)

    def _arrive(self, pseq: int):
        """Route the problem's branches and submit one sub-problem per replica; returns their done events."""
        pos, job = self.jobs[pseq]
        if job.B == 0:
            ev = self.env.event()
            self.submitted[0] += 1
            self.engines[0].submit(pseq, pos, job, None if self.prompt_ids is None else self.prompt_ids[pseq], ev)
            self.routing[pseq] = np.zeros(0, np.int64)
            return [ev]
        key = self._prefix(pseq, pos, job)
        reps = np.empty(job.B, np.int64)
        for b in range(job.B):
            r = choose(self.router, Arrival(pseq, b, job.B, key), self.outstanding, self.engines)
            if not 0 <= r < self.n:
                raise ValueError(f"router {type(self.router).__name__} returned replica {r} of {self.n}")
            reps[b] = r
            self.outstanding[r] += 1
        self.routing[pseq] = reps
        src = np.asarray(job.source, np.int64)
        share = np.asarray(job.share, bool)
        has = src >= 0
        moved = has & (reps != reps[np.where(has, src, 0)])
        self.lost["asks_shares"] += int(np.sum(moved & share))
        self.lost["prefix_reuse"] += int(np.sum(moved & ~share & (np.asarray(job.reused) > 0)))
        self.lost["reused_tokens"] += int(np.asarray(job.reused)[moved].sum())
        assert lost_shares(reps, src) == int(moved.sum())
        events = []
        for r in np.unique(reps):
            keep = reps == r
            sub = job if keep.all() else split_job(job, keep)
            ids = None
            if self.prompt_ids is not None:
                ids = [x for x, k in zip(self.prompt_ids[pseq], keep) if k]
            ev = self.env.event()
            cnt = int(keep.sum())
            ev.callbacks.append(lambda _e, r=int(r), cnt=cnt: self._done(r, cnt))
            self.submitted[int(r)] += 1
            self.engines[int(r)].submit(pseq, pos, sub, ids, ev)
            events.append(ev)
        return events

    def _done(self, r: int, cnt: int) -> None:
        self.outstanding[r] -= cnt

    def _submit(self, pseq: int, hold: bool):
        """Problem ``pseq`` arrives now (:mod:`sim.serving.arrivals`): routed, submitted; its answered event."""
        evs = self._arrive(pseq)
        if not hold:
            return None   # no user waits (Poisson): no condition event joins the clock
        return evs[0] if len(evs) == 1 else self.env.all_of(evs)

    def run(self) -> ReplicaRun:
        env = self.env
        accs = [e.start() for e in self.engines]
        n = len(self.jobs)
        arrivals.start(env, self.arrivals, n, self._submit)
        n_ev = arrivals.run_until_empty(env, accs)
        items = 0
        results = []
        for e, k in zip(self.engines, self.submitted):
            items += e.items_scheduled
            e.events = 0
            results.append(e.result(n_expected=k))
        recs = [res.records() for res in results]
        return ReplicaRun(results=results, records=recs, problems=_aggregate(recs, n), routing=self.routing,
                          lost=dict(self.lost), makespan=float(env.now), events=n_ev + items)


def _aggregate(recs_per_replica, n_problems: int) -> list:
    """One record per problem from its sub-problems' (answer time: the last part's)."""
    parts: list = [[] for _ in range(n_problems)]
    for recs in recs_per_replica:
        for r in recs:
            parts[r["pseq"]].append(r)
    out = []
    for ps in parts:
        if len(ps) == 1:
            out.append(ps[0])
            continue
        first = np.concatenate([np.asarray(p["first_token_times"], np.float64) for p in ps])
        end = max(p["end_s"] for p in ps)
        arr = ps[0]["arrival_s"]
        adm = min(p["admitted_s"] for p in ps)
        rec = {"pseq": ps[0]["pseq"], "pos": ps[0]["pos"], "arrival_s": arr, "admitted_s": adm, "end_s": end,
               "latency_s": end - arr, "service_s": end - adm, "queue_s": max(p["queue_s"] for p in ps),
               "ttft_s": float(np.nanmean(first)) if first.size and not np.isnan(first).all() else 0.0,
               "first_token_times": first, "parts": len(ps)}
        for k in ("recompute_tokens", "prefix_hit_tokens", "prompt_tokens_admitted", "iterations", "evictions"):
            rec[k] = int(sum(p[k] for p in ps))
        for k in ps[0]:
            if k.endswith("_s") and k not in rec:
                rec[k] = float(sum(p[k] for p in ps))
        rec["peak_kv_bytes"] = float(max(p["peak_kv_bytes"] for p in ps))
        out.append(rec)
    return out


def _pct(x, q):
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else None


def summary(run: ReplicaRun, jobs, slo: SLO | None = None) -> dict:
    """Metrics per replica and in total: throughput, TTFT/TPOT/E2E percentiles, prefix hit rate, preemptions,
    utilisation (busy / makespan), goodput under ``slo``, and the shares the routing made impossible.

    A problem's TPOT is ``(e2e - ttft) / (gen - 1)`` with ``gen`` its longest branch's generated tokens
    (:func:`sim.serving.goodput.tpot`).
    """
    span = run.makespan
    slo = slo or SLO()
    gen_of = {pseq: (int(np.max(j.gen)) if j.B else 0) for pseq, (_, j) in enumerate(jobs)}

    def block(recs, gen_tokens, busy, stats):
        ttft = np.array([r["ttft_s"] for r in recs], np.float64)
        e2e = np.array([r["latency_s"] for r in recs], np.float64)
        tp = tpot(ttft, e2e, [gen_of[r["pseq"]] for r in recs])
        hit = sum(r["prefix_hit_tokens"] for r in recs)
        prompt = sum(r["prompt_tokens_admitted"] for r in recs)
        g = goodput(slo, ttft, tp, e2e, span)
        return {"problems": len(recs), "throughput_tokens_per_s": gen_tokens / span if span > 0 else None,
                "throughput_problems_per_s": g["throughput_rps"], "goodput_problems_per_s": g["goodput_rps"],
                "slo_attainment": g["slo_attainment"],
                "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99), "tpot_p50_s": _pct(tp, 50),
                "tpot_p99_s": _pct(tp, 99), "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99),
                "prefix_hit_rate": hit / prompt if prompt else 0.0, "preemptions": int(stats),
                "gpu_utilisation": busy / span if span > 0 else 0.0}

    per = [block(recs, res.gen_tokens, res.busy, res.stats["preemptions"])
           for recs, res in zip(run.records, run.results)]
    tot = block(run.problems, sum(r.gen_tokens for r in run.results),
                float(np.mean([r.busy for r in run.results])) if run.results else 0.0,
                sum(r.stats["preemptions"] for r in run.results))
    return {"replicas": len(per), "per_replica": per, "total": tot, "slo": str(slo), "makespan_s": span,
            "events": run.events, "lost_asks_shares": run.lost["asks_shares"],
            "lost_prefix_reuse": run.lost["prefix_reuse"], "lost_reused_tokens": run.lost["reused_tokens"],
            "split_problems": int(sum(1 for r in run.routing if r is not None and np.unique(r).size > 1))}
