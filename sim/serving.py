"""Serving mode: problems arrive (Poisson or closed loop) and share the target's KV capacity.

The simpy engine runs every request under the vLLM-style scheduler of the target
(``Target.scheduler("serving")``) with one block pool of the server's budget; the summary
adds the serving metrics (TTFT, throughput, running sequences: ``sim.serving_metrics``).
"""
from __future__ import annotations

import math

from .capacity import MAX_BLOCKS
from .jobs import make_engine, prepare
from .metrics import branch_rows, problem_row, summarize
from .records import SimResult
from .serving_metrics import serving_summary, timelines
from .summary import stated_under


def server_budget(ubudget, cap) -> int:
    """Blocks of the server: the user's count, their fraction of the device's KV capacity, else the capacity."""
    if ubudget is None:
        return int(cap["kv_capacity_blocks"])
    if ubudget[0] == "blocks":
        return int(ubudget[1])
    return int(min(math.ceil(ubudget[1] * cap["kv_capacity_blocks"]), MAX_BLOCKS))


def requests(config, items: list) -> list:
    """``items`` cycled to the workload's ``n_requests`` (default: each once)."""
    n_req = config.sim.workload.get("n_requests")
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
    eng = make_engine(target, cfg, [r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs], sched, budget,
                      concurrency=int(cfg.workload["concurrency"]), arrival_rate=config.arrival_rate,
                      seed=config.seed, caching=target.serving.prefix_caching)
    res = eng.run()
    recs = res.records()
    if recs:  # one pool for all problems: its evictions are reported once (on the first record)
        recs[0]["evictions"] = int(res.kv.evictions)
    rows, brows = [], []
    for r in recs:
        f = tf.problems[r["pos"]]
        dec = triples[r["pseq"] % len(triples)][0]
        rows.append(problem_row(f, dec, r, L))
        brows.extend(branch_rows(f, dec, L))
    peak = float(res.timeline_b.max()) if res.timeline_b.size else 0.0
    summary = summarize(rows, brows, cfg=cfg, L=L, makespan=res.makespan, peak_kv_bytes=peak)
    summary.update(serving_summary(recs, res, cap, budget))
    info["kv_budget_blocks"] = budget
    info["timeline"] = timelines(res)
    summary.update(stated_under(session, target, config, cap, sched, info))
    summary["kv_budget_blocks"] = budget
    return SimResult(summary, rows, brows, [(-1, res.timeline_t, res.timeline_b)], info)


__all__ = ["run", "server_budget", "requests"]
