"""Isolated mode: each problem alone on the target (per-problem latency), fast path or engine.

Sharing and exit policies run on the closed-form fast path (``sim.replay.fastpath``); block
policies, and any policy with ``engine=True``, run one problem at a time through the simpy
engine under their block budget. Results are memoised in the :class:`sim.replay.session.Session`
per (decision, target): a threshold sweep prices each distinct decision once.
"""
from __future__ import annotations

import math

from sim.serving.capacity import MAX_BLOCKS, CapacityError
from sim.workload.decisions import freeze, fields_of
from sim.replay.fastpath import FastPath
from sim.replay.jobs import make_engine, prepare
from sim.replay.problem_metrics import branch_rows, problem_row, summarize
from sim.replay.records import SimResult
from sim.replay.summary import served, stated_under


def refuse_if_too_big(peaks, positions, cap: dict, target, what: str = "problem") -> None:
    """A problem whose KV peak exceeds the capacity is refused, saying by how much."""
    kvcap = cap["kv_capacity_bytes"]
    model, hw = target.model, target.hardware
    for pos, peak in zip(positions, peaks):
        if peak > kvcap:
            raise CapacityError(
                f"{what} {pos}: needs {peak / 1e9:.3f} GB of KV at its peak but {model.name} on {hw.name} has "
                f"{kvcap / 1e9:.3f} GB of KV capacity ("
                + ("given" if cap["capacity_source"].startswith("given") else
                   f"{cap['mem_capacity_bytes'] / 1e9:.3f} GB x {cap['gpu_memory_utilization']:g} - "
                   f"{cap['weight_bytes'] / 1e9:.3f} GB weights - {cap['activation_reserve_bytes'] / 1e9:.3f} GB "
                   f"activation reserve") + f"): {(peak - kvcap) / 1e9:.3f} GB "
                f"short (use --mode serving to queue, a smaller model, or a larger --gpu-memory-utilization)", field="kv_capacity_bytes")


def fastpath(session, target) -> FastPath:
    """The session's closed form of ``target`` (one GPU, or a tensor-parallel replica priced by its cost)."""
    fp = session.fastpaths.get(target.key)
    if fp is None:
        fp = session.fastpaths[target.key] = FastPath(target.model, target.hardware, target.cost())
    return fp


def _budget(ubudget, job, cap, fp=None) -> int:
    """Blocks of one problem: the user's count, their fraction of the problem's unconstrained peak
    blocks (:meth:`FastPath.peak_blocks`: every KV-cache group's), else the device's KV capacity in blocks."""
    if ubudget is None:
        return int(cap["kv_capacity_blocks"])
    if ubudget[0] == "blocks":
        return int(ubudget[1])
    if job is None:
        return -1
    peak = float(fp.peak_blocks(job) if fp is not None else job.peak_blocks())
    return int(min(math.ceil(ubudget[1] * peak), MAX_BLOCKS))


def _fast(session, target, config, prep):
    cfg, probs, triples, cap, L = config.sim, prep.probs, prep.triples, prep.cap, prep.L
    fp = fastpath(session, target)
    hk = session.target_id(target.key)
    rows, brows, timeline = [], [], []
    for f, (dec, job, dkey) in zip(probs, triples):
        rkey = (dkey, hk)
        hit = session.rows.get(rkey)
        if hit is None:
            res = fp.run(job)
            hit = session.rows[rkey] = (problem_row(f, dec, res, L), branch_rows(f, dec, L), res)
        row, br, res = hit
        rows.append(row)
        brows.extend(br)
        timeline.append((f.pos, res["kv_times"], res["kv_bytes"]))
    refuse_if_too_big([r["peak_kv_bytes"] for r in rows], [f.pos for f in probs], cap, target)
    # Rows are memoised objects: the same rows (by identity) give the same summary.
    skey = (tuple(map(id, rows)), cfg.exit is not None, getattr(cfg.sharing, "name", ""), L)
    summary = session.summaries.get(skey)
    if summary is None:
        summary = session.summaries[skey] = (summarize(rows, brows, cfg=cfg, L=L), rows)
    return dict(summary[0]), rows, brows, timeline, None


def _engine(session, target, config, prep):
    cfg, ubudget, probs, triples, cap, L = config.sim, config.budget, prep.probs, prep.triples, prep.cap, prep.L
    fp = fastpath(session, target)
    bkey = (cfg.block.name, freeze(fields_of(cfg.block))) if cfg.block is not None else None
    rows, brows, timeline = [], [], []
    for f, (dec, job, dkey) in zip(probs, triples):
        unc = fp.run(job)
        if cfg.block is None:
            refuse_if_too_big([unc["peak_kv_bytes"]], [f.pos], cap, target)
        budget = _budget(ubudget, job, cap, fp)
        rkey = ("engine", dkey, session.target_id(target.key), budget, bkey)
        hit = session.rows.get(rkey)
        if hit is None:
            # prep.sched: the isolated scheduler, with a hybrid model's KV-cache groups (Target.scheduler)
            eng = make_engine(target, cfg, [(f.pos, job)], [f], [dec], prep.sched, budget,
                              concurrency=1, arrival_rate=None, seed=config.seed, per_problem=True)
            res = eng.run()
            r = res.records()[0]
            r["evictions"] = int(res.kv.evictions)
            r["preemptions"] = int(res.stats["preemptions"])
            hit = session.rows[rkey] = (problem_row(f, dec, r, L), branch_rows(f, dec, L), r)
        row, br, r = hit
        rows.append(row)
        brows.extend(br)
        timeline.append((f.pos, r["kv_times"], r["kv_bytes"]))
    kv_budget = (None if ubudget is None and cfg.block is None else
                 "per problem" if ubudget is not None and ubudget[0] == "frac" else _budget(ubudget, None, cap))
    return summarize(rows, brows, cfg=cfg, L=L, makespan=None, peak_kv_bytes=None), rows, brows, timeline, kv_budget


def run(session, target, config) -> SimResult:
    """Every selected problem alone on ``target`` under ``config`` (mode ``isolated``)."""
    prep = prepare(session, target, config)
    fast = not config.engine and config.sim.block is None
    summary, rows, brows, timeline, kv_budget = (_fast if fast else _engine)(session, target, config, prep)
    info = prep.info
    info["kv_budget_blocks"] = kv_budget
    served(info, target.kernels_only())   # what it priced: the GPU's kernels alone (the note says so)
    summary.update(stated_under(session, target, config, prep.cap, prep.sched, info))
    summary["kv_budget_blocks"] = kv_budget if isinstance(kv_budget, int) else None
    return SimResult(summary, rows, brows, timeline, info)


__all__ = ["run", "refuse_if_too_big", "fastpath"]
