"""The simulator's side of ``calibrate serve``: the run's requests replayed by ``sim.serving.engine``.

The replay knows what the real run recorded — each request's prompt ids, how
many tokens it generated, which problem (and so which closed-loop user) it
belongs to — and nothing it measured. Each problem becomes a
:class:`sim.workload.job.Job` of independent branches (no gate, no KV source to
wait for, no verification: what the real loop serves); the simulator's
serving engine (:class:`sim.serving.engine.Engine`: simpy, the closed loop,
``sim.serving.scheduler`` over ``sim.serving.kvcache`` with the same configuration, every
iteration priced by ``sim.cost.terms.ScalarCost`` with the hardware profile) runs
them. Prefix hits come from the engine's own hash chain over the prompt ids.

The replay observes the engine's iterations through its observer hook
(``Engine(on_step=...)``, :class:`sim.serving.engine.StepRecord`: what the
scheduler returned and its state after the update; it decides nothing) and
takes each iteration's seconds from the simulated clock.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd


class StepLog:
    """The engine's iterations (``Engine(on_step=StepLog(...))``) as rows: items, preemptions, sim time, the
    requests each finished and the queue and KV after it."""

    def __init__(self, rid_of):
        self.rid_of = rid_of
        self.iters: list[dict] = []

    def __call__(self, rec) -> None:
        out, rid_of = rec.out, self.rid_of
        self.iters.append({
            "t0": float(rec.t0),
            "seqs": [rid_of(it.req.req_id) for it in out.items],
            "c": [int(it.num_cached) for it in out.items], "n": [int(it.num_new) for it in out.items],
            "sample": [bool(it.samples) for it in out.items],
            "preempted": sorted(rid_of(r.req_id) for r in out.preempted),
            "cache_hit_tokens": int(sum(it.cache_hit for it in out.items if it.new_admission)),
            "recompute_tokens": int(sum(it.recompute for it in out.items)),
            "finished": sorted(rid_of(r.req_id) for r in rec.finished),
            "n_running": int(rec.running), "n_waiting": int(rec.waiting), "kv_blocks_used": int(rec.kv_blocks_used),
        })


def jobs_from_requests(rq: pd.DataFrame, n_layers: int, block_size: int):
    """One ``Job`` per problem: its branches as independent requests (prompt, then ``gen_len`` tokens)."""
    from sim.workload.job import Job

    jobs, ids = [], []
    for j, g in rq.sort_values(["problem", "branch"]).groupby("problem", sort=True):
        B = len(g)
        ctx = g["prompt_len"].to_numpy(np.int64)
        z = np.zeros(B, np.int64)
        jobs.append((int(j), Job(B=B, L=int(n_layers), bs=int(block_size), reused=z.copy(), computed=ctx.copy(),
                                 copy=z.copy(), gate=z.copy(), source=np.full(B, -1, np.int64),
                                 share=np.zeros(B, bool), ctx=ctx, gen=g["gen_len"].to_numpy(np.int64),
                                 own=ctx.copy(), verify_on=False, v_new=z.copy(), v_cached=z.copy(),
                                 v_layers=z.copy(), v_probes=z.copy(), v_head=z.copy(), v_kv_tokens=z.copy())))
        ids.append([np.asarray(p, np.int64) for p in g["prompt_ids"]])
    return jobs, ids


def replay(cfg, rq: pd.DataFrame):
    """Replay the requests table ``rq`` (see :func:`calibrate.serve.requests_frame`) through ``sim.serving.engine``.

    Returns ``(rows, req, info)``: one row per simulated iteration (the columns
    of the real run's, seconds in ``sim_s``), each request's simulated
    arrival/first/finish iteration, and the target.
    """
    from sim.serving.engine import Engine
    from sim.cost.profiles import load_hardware, load_model
    from sim.serving.scheduler import SchedulerConfig

    from calibrate.serve_sched import block_policy

    model = load_model(cfg.model_preset or cfg.model)
    if getattr(cfg, "dtype", ""):
        from sim.cost.model_shape import DTYPE_BYTES
        model = dataclasses.replace(model, dtype=cfg.dtype, dtype_bytes=DTYPE_BYTES.get(cfg.dtype, model.dtype_bytes))
    hw = load_hardware(cfg.hardware)
    B = int(rq.groupby("problem")["branch"].count().max())
    if (rq["rid"] != rq["problem"] * B + rq["branch"]).any():
        raise ValueError("replay: requests.parquet: rid must be problem * branches + branch")
    jobs, ids = jobs_from_requests(rq, model.n_layers, cfg.block_size)

    def rid_of(req_id):
        pseq, kind, b = req_id
        if kind != "b":
            raise RuntimeError(f"replay: the engine ran a {kind!r} request; only branches were submitted")
        return int(jobs[pseq][0]) * B + int(b)

    log = StepLog(rid_of)
    eng = Engine(model, hw, jobs, concurrency=int(cfg.concurrency),
                 scheduler=SchedulerConfig(max_num_seqs=int(cfg.max_num_seqs),
                                           max_num_batched_tokens=int(cfg.max_num_batched_tokens),
                                           policy=cfg.scheduler),
                 kv_blocks=int(cfg.num_blocks), block_policy=block_policy(cfg.block_policy),
                 caching=bool(cfg.prefix_caching), prompt_ids=ids, hw_name=hw.name, on_step=log)
    res = eng.run()
    its = log.iters
    t = [r["t0"] for r in its] + [res.makespan]
    rows = pd.DataFrame([{"iteration": i, **{k: v for k, v in r.items() if k != "t0"},
                          "sim_s": t[i + 1] - t[i]} for i, r in enumerate(its)])
    # a calibrated profile answers only inside what it was fitted on: the iterations priced here
    from sim.cost.ranges import iteration_query
    q = iteration_query([list(zip(ns, cs)) for ns, cs in zip(rows["n"], rows["c"])])
    marks = hw.check_query(model, max_context=q.context, max_new=q.item_tokens, max_batch=q.seqs, tokens=q.tokens,
                           mixed=q.mixed, allow_extrapolation=bool(getattr(cfg, "allow_extrapolation", False)))
    first, last, arrival, n_sampled = {}, {}, {}, {}
    for i, r in enumerate(its):
        for rid, s in zip(r["seqs"], r["sample"]):
            if s:
                first.setdefault(rid, i)
                n_sampled[rid] = n_sampled.get(rid, 0) + 1
        for rid in r["finished"]:
            last[rid] = i
    rec = {int(jobs[p["pseq"]][0]): p for p in res.records()}
    starts = np.asarray([r["t0"] for r in its])
    for rid in rq["rid"]:
        p = rec[int(rid) // B]
        # the iteration scheduled first at or after the problem's arrival (arrivals are at iteration boundaries)
        arrival[int(rid)] = int(np.searchsorted(starts, p["arrival_s"] - 1e-12))
    req = pd.DataFrame([{"rid": int(r), "sim_arrival_iter": arrival[int(r)], "sim_first_iter": first.get(int(r), -1),
                         "sim_finish_iter": last.get(int(r), -1), "sim_gen_len": n_sampled.get(int(r), 0),
                         "sim_e2e_s": float(rec[int(r) // B]["latency_s"])} for r in rq["rid"]])
    info = {"hardware": hw.name, "hardware_source": hw.source, "model_preset": model.name,
            "engine": "sim.serving.engine.Engine (simpy; sim.serving.scheduler + sim.serving.kvcache; sim.cost.terms.ScalarCost)",
            "makespan_s": res.makespan, "engine_iterations": int(res.iterations), "events": int(res.events),
            "extrapolated": marks, "range_query": dataclasses.asdict(q)}
    return rows, req, info
