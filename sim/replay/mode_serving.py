"""Serving mode: problems arrive (Poisson or closed loop) and share the target's KV capacity.

The simpy engine runs every request under the vLLM-style scheduler of the target
(``Target.scheduler("serving")``) with one block pool of the server's budget; the summary
adds the serving metrics (TTFT, throughput, running sequences: ``sim.serving.metrics``).

A target of TP x PP GPUs prices each iteration with its :class:`sim.cost.parallel.ParallelCost`
(``Target.cost``) and holds the replica's KV capacity; ``data_parallel_size > 1`` serves through
:class:`sim.serving.replicas.Replicas` behind ``config.router`` (one arrival stream, each replica its own
scheduler and block pool of that capacity) and reports per replica and in total, with the ASKS
shares and prefix reuse the routing made impossible. ``config.slo`` adds goodput (problems/s
meeting every stated SLO, ``sim.serving.goodput``) beside throughput. One GPU, one replica, no SLO: the
engine's results and keys exactly as before.
"""
from __future__ import annotations

import math

import numpy as np

from sim.serving.capacity import MAX_BLOCKS
from sim.replay.jobs import kv_ids, make_engine, prepare
from sim.replay.problem_metrics import branch_rows, problem_row, summarize
from sim.replay.records import SimResult
from sim.serving.metrics import request_summary, serving_summary, timelines
from sim.replay.summary import served, stated_under


def server_budget(ubudget, cap) -> int:
    """Blocks of the server: the user's count, their fraction of the device's KV capacity, else the capacity."""
    if ubudget is None:
        return int(cap["kv_capacity_blocks"])
    if ubudget[0] == "blocks":
        return int(ubudget[1])
    return int(min(math.ceil(ubudget[1] * cap["kv_capacity_blocks"]), MAX_BLOCKS))


def requests(config, items: list) -> list:
    """``items`` cycled to the workload's ``n_requests`` (default: each once)."""
    n_req = config.sim.workload.n_requests
    if n_req is None:
        return list(items)
    return [items[i % len(items)] for i in range(int(n_req))]


def run(session, target, config) -> SimResult:
    """The selected problems served on ``target`` under ``config`` (mode ``serving``)."""
    cfg = config.sim
    tf = session.tf
    prep = prepare(session, target, config)
    sched, cap, info, probs, L, triples = prep.sched, prep.cap, prep.info, prep.probs, prep.L, prep.triples
    budget = server_budget(config.budget, cap)
    reqs = requests(config, [((f.pos, job), f, dec) for f, (dec, job, _) in zip(probs, triples)])
    if target.data_parallel_size > 1:
        return _run_replicas(session, target, config, prep, budget, reqs)
    costs = target.serving_costs(sched)
    eng = make_engine(target, cfg, [r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs], sched, budget,
                      concurrency=int(cfg.workload.concurrency), arrival_rate=config.arrival_rate,
                      seed=config.seed, caching=target.serving.prefix_caching, record_tokens=True, costs=costs,
                      fast_forward=not config.step_by_step)
    res = eng.run()
    served(info, target.overheads(costs, [res]))
    recs = res.records()
    if recs:  # one pool for all problems: its evictions are reported once (on the first record)
        recs[0]["evictions"] = int(res.kv.evictions)
    rows, brows = _rows(tf, recs, triples, L)
    peak = float(res.timeline_b.max()) if res.timeline_b.size else 0.0
    summary = summarize(rows, brows, cfg=cfg, L=L, makespan=res.makespan, peak_kv_bytes=peak)
    summary.update(serving_summary(recs, res, cap, budget))
    info["kv_budget_blocks"] = budget
    info["timeline"] = timelines(res)
    if res.pipeline is not None:   # PP > 1: the schedule and each stage's idle share of the makespan
        info["pipeline"] = res.pipeline
    summary.update(stated_under(session, target, config, cap, sched, info))
    summary["kv_budget_blocks"] = budget
    if config.slo is not None:
        from sim.serving.replicas import ReplicaRun
        one = ReplicaRun(results=[res], records=[recs], problems=recs, routing=[None] * len(recs),
                         lost={"asks_shares": 0, "prefix_reuse": 0, "reused_tokens": 0}, makespan=res.makespan,
                         events=int(res.events))
        _add_goodput(summary, one, [r[0] for r in reqs], config)
    return SimResult(summary, rows, brows, [(-1, res.timeline_t, res.timeline_b)], info)


def _rows(tf, recs, triples, L: int) -> tuple[list, list]:
    """Per-problem and per-branch rows of the engine's records (a repeated problem: its trace decision)."""
    rows, brows = [], []
    for r in recs:
        f = tf.problems[r["pos"]]
        dec = triples[r["pseq"] % len(triples)][0]
        rows.append(problem_row(f, dec, r, L))
        brows.extend(branch_rows(f, dec, L))
    return rows, brows


def _add_goodput(summary: dict, run, jobs, config) -> dict:
    """Goodput under ``config.slo`` beside throughput, in total and (``per_replica``) per replica
    (``sim.serving.replicas.summary``: a problem's TTFT the mean of its branches' first tokens, its TPOT over its
    longest branch)."""
    from sim.serving.replicas import summary as replica_summary
    rs = replica_summary(run, jobs, config.slo_spec)
    tot = rs["total"]
    summary.update({"slo": rs["slo"], "goodput_problems_per_s": tot["goodput_problems_per_s"],
                    "slo_attainment": tot["slo_attainment"], "tpot_p50_s": tot["tpot_p50_s"],
                    "tpot_p99_s": tot["tpot_p99_s"],
                    "per_replica": [{"replica": i, **b} for i, b in enumerate(rs["per_replica"])]})
    return rs


def _server_timeline(results) -> tuple:
    """KV bytes of all replicas together after each iteration of any (each replica's last value held)."""
    ts = [np.asarray(r.timeline_t, np.float64) for r in results]
    t = np.unique(np.concatenate(ts)) if ts else np.zeros(0)
    b = np.zeros(t.size)
    for ti, r in zip(ts, results):
        if ti.size:
            idx = np.searchsorted(ti, t, side="right") - 1
            b += np.where(idx >= 0, np.asarray(r.timeline_b, np.float64)[np.maximum(idx, 0)], 0.0)
    return t, b


def _run_replicas(session, target, config, prep, budget: int, reqs) -> SimResult:
    """``target.data_parallel_size`` replicas behind ``config.router`` (module docstring)."""
    from sim.workload.decisions import make_config
    from sim.serving.engine import SCORE_AT
    from sim.serving.replicas import Replicas
    from sim.serving.router import make_router
    cfg, tf = config.sim, session.tf
    sched, cap, info, L, triples = prep.sched, prep.cap, prep.info, prep.L, prep.triples
    n = target.data_parallel_size
    jobs = [r[0] for r in reqs]
    costs = target.serving_costs(sched)     # stateless: one cost object prices every replica
    block = (lambda: make_config(config.policy, config.params, config.workload).block) if cfg.block is not None \
        else None            # each replica its own block policy state
    run_ = Replicas(target.model, target.hardware, jobs, make_router(config.router, n), n,
                    costs=[costs["cost"]] * n, host_step=costs["host_step"],
                    async_scheduling=costs["async_scheduling"], concurrency=int(cfg.workload.concurrency),
                    arrival_rate=config.arrival_rate, seed=config.seed, scheduler=sched, kv_blocks=budget,
                    block_policy=block, caching=target.serving.prefix_caching and not cfg.no_kv,
                    prompt_ids=[kv_ids(r[1], r[2]) for r in reqs], score_at=SCORE_AT[cfg.workload.score],
                    max_batch=target.max_batch, hw_name=target.hardware.name,
                    fast_forward=not config.step_by_step).run()
    recs = run_.problems
    served(info, target.overheads(costs, run_.results))
    rows, brows = _rows(tf, recs, triples, L)
    t, b = _server_timeline(run_.results)
    summary = summarize(rows, brows, cfg=cfg, L=L, makespan=run_.makespan,
                        peak_kv_bytes=float(b.max()) if b.size else 0.0)
    rs = _add_goodput(summary, run_, jobs, config) if config.slo is not None else None
    if rs is None:
        from sim.serving.replicas import summary as replica_summary
        rs = replica_summary(run_, jobs, None)
        summary["per_replica"] = [{"replica": i, **x} for i, x in enumerate(rs["per_replica"])]
    tot = rs["total"]
    res = run_.results
    queue = [r["queue_s"] for r in recs]
    ttft = [r["ttft_s"] for r in recs]
    e2e = [r["latency_s"] for r in recs]
    summary.update({
        "throughput_tokens_per_s": tot["throughput_tokens_per_s"],
        "throughput_problems_per_s": tot["throughput_problems_per_s"],
        "ttft_p50_s": tot["ttft_p50_s"], "ttft_p99_s": tot["ttft_p99_s"],
        "ttft_mean_s": float(np.mean(ttft)) if ttft else None,
        "e2e_p50_s": tot["e2e_p50_s"], "e2e_p99_s": tot["e2e_p99_s"], "e2e_mean_s": float(np.mean(e2e)) if e2e else None,
        "queue_p50_s": float(np.percentile(queue, 50)) if queue else None,
        "queue_mean_s": float(np.mean(queue)) if queue else None,
        "preemptions": tot["preemptions"], "recompute_tokens": int(sum(r["recompute_tokens"] for r in recs)),
        "max_running_seqs": int(max(x.stats["max_running_seqs"] for x in res)),   # of any one replica
        "mean_running_seqs": float(sum(x.mean_running for x in res)),            # all replicas together
        "kv_capacity_bytes": float(cap["kv_capacity_bytes"]), "kv_budget_blocks": int(budget),  # per replica
        "prefix_hit_rate": tot["prefix_hit_rate"], "length_extrapolated": False,
        "makespan_s": float(run_.makespan), "iterations": int(sum(x.iterations for x in res)),
        "events": int(run_.events), "evictions": int(sum(x.kv.evictions for x in res)),
        "gpu_utilisation": tot["gpu_utilisation"], "replicas": n, "router": config.router,
        "lost_asks_shares": rs["lost_asks_shares"], "lost_prefix_reuse": rs["lost_prefix_reuse"],
        "lost_reused_tokens": rs["lost_reused_tokens"], "split_problems": rs["split_problems"],
        **request_summary(recs)})
    info["kv_budget_blocks"] = budget
    info["router"] = config.router
    if res[0].pipeline is not None:   # PP > 1, per replica
        info["pipeline"] = [x.pipeline for x in res]
    summary.update(stated_under(session, target, config, cap, sched, info))
    summary["kv_budget_blocks"] = budget
    return SimResult(summary, rows, brows, [(-1, t, b)], info)


__all__ = ["run", "server_budget", "requests"]
