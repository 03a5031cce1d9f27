"""The simulator's side of ``calibrate serve``: the run's requests replayed with the cost model.

The replay knows what the real run recorded — each request's prompt ids and
the ids it generated, which user submitted it — and nothing it measured. The
scheduler and block manager (``sim.scheduler``, ``sim.kvcache``, through
:class:`calibrate.serve_sched.SchedulerAdapter`) decide every iteration from
those tokens alone; the hardware profile prices every iteration with
:class:`sim.cost.ScalarCost` over the items it batched (``n`` new tokens over
``c`` cached each, the LM head only on the rows that sample).
"""
from __future__ import annotations

import pandas as pd


def replay(cfg, rq: pd.DataFrame, progress: bool = False):
    """Replay the requests table ``rq`` (see :func:`calibrate.serve.requests_frame`).

    Returns ``(rows, req, info)``: one row per simulated iteration
    (``iteration, seqs, n, c, sample, preempted, finished, sim_s``), the
    simulated arrival/finish iteration of every request, and the target.
    """
    from sim.cost import ScalarCost
    from sim.profiles import load_hardware, load_model

    from calibrate.serve import ClosedLoop, Request, _iter_row
    from calibrate.serve_sched import SchedulerAdapter

    model = load_model(cfg.model_preset or cfg.model)
    hw = load_hardware(cfg.hardware)
    cost = ScalarCost(model, hw)
    reqs = [Request(rid=int(r.rid), problem=int(r.problem), problem_index=int(r.problem_index),
                    branch=int(r.branch), user=int(r.user), prompt=[int(t) for t in r.prompt_ids],
                    max_new=int(r.gen_len)) for r in rq.itertuples(index=False)]
    gen = {int(r.rid): [int(t) for t in r.gen_ids] for r in rq.itertuples(index=False)}
    by_rid = {r.rid: r for r in reqs}
    sched = SchedulerAdapter(cfg)
    loop = ClosedLoop(reqs, cfg.concurrency)
    pending = loop.first()
    rows = []
    it = 0
    while True:
        for r in pending:
            r.arrival_iter = it
            sched.add(r)
        pending = []
        if sched.idle():
            break
        step = sched.schedule()
        if not step.items:
            raise RuntimeError(f"replay: the scheduler scheduled nothing at iteration {it}")
        items, sampled = [], {}
        for rid, start, n, samples in step.items:
            r = by_rid[rid]
            items.append((float(n), float(start), None, 0.0, 1.0 if samples else 0.0, 0.0))
            if samples:
                sampled[rid] = gen[rid][len(r.out)]   # the token the real model sampled
        dt = cost.seconds(items)
        for rid, tok in sampled.items():
            r = by_rid[rid]
            r.out.append(tok)
            if r.first_iter < 0:
                r.first_iter = it
        finished = [by_rid[rid] for rid in sched.update(step)]
        for r in finished:
            r.finish_iter = it
        rows.append(_iter_row(it, step, finished, sched, {"sim_s": float(dt)}))
        pending = loop.finished(finished)
        it += 1
    out = pd.DataFrame(rows)
    # a calibrated profile answers only inside what it was fitted on: the items priced here
    hw.check_query(model, max_context=max(c + n for cs, ns in zip(out["c"], out["n"]) for c, n in zip(cs, ns)),
                   max_new=max(max(ns) for ns in out["n"]), max_batch=max(len(ns) for ns in out["n"]))
    req = pd.DataFrame([{"rid": r.rid, "sim_arrival_iter": r.arrival_iter, "sim_first_iter": r.first_iter,
                         "sim_finish_iter": r.finish_iter, "sim_gen_len": len(r.out)}
                        for r in reqs])
    info = {"hardware": hw.name, "hardware_source": hw.source, "model_preset": model.name,
            "engine": "calibrate.serve_replay (sim.scheduler + sim.kvcache + sim.cost.ScalarCost)"}
    return out, req, info
