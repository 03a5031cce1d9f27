"""Replicas behind a router: does routing keep the reuse where it should, and how fast is the driver.

Usage::

    .venv/bin/python bench/bench_replicas.py --out runs/bench [--quick] [--scale-problems N]

Writes ``DIR/replicas.json`` and prints a table. Cases:

* ``routing_unique`` / ``routing``: the bundled multi-branch trace (8 branches per problem; decisions of its model, costs of
  qwen2.5-7b on h100-sxm), exact-prefix and ASKS, served closed-loop (its 12 problems once by 4 users;
  64 problems, the 12 repeated, by 16 users) by one
  replica and by 4 replicas behind each router (prefix-affinity also without its load fallback): prefix hit rate, the shares and reuse each routing made
  impossible, throughput. Goal: prefix-affinity keeps the single-replica reuse; round-robin loses most.
* ``scale``: N problems (default 10,000) x 8 branches on 16 replicas behind prefix-affinity, Poisson
  arrivals; CPU seconds (one core: the driver is single-threaded) and events per second (goal: 16 x
  10,000 x 8 in <= 120 s).

The problems' jobs and token ids come from the simulator's decision code (``sim.api``'s per-problem
decisions, the same the ``serve`` command uses).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _workload(policy: str, params: dict, model):
    from sim.api import default_trace_path
    from sim.search.planner import trace_workload
    w = trace_workload(default_trace_path(), policy, model, params=params)
    return w["jobs"], w["prompt_ids"], w["decisions_model"]


def bench_routing(n_requests: int = 64, concurrency: int = 16) -> dict:
    from sim.cost.profiles import load_hardware, load_model
    from sim.serving.replicas import Replicas, summary
    from sim.serving.router import ROUTERS, make_router
    m, hw = load_model("qwen2.5-7b"), load_hardware("h100-sxm")
    out = {"model_costs": m.name, "hardware": hw.name, "problems": n_requests, "concurrency": concurrency,
           "kv": "unlimited per replica (no eviction: reuse is what routing allows)", "cases": []}
    for policy, params in (("exact-prefix", {}), ("asks", {"tau": 0.8})):
        jobs, ids, dmodel = _workload(policy, params, m)
        out["decisions_model"] = dmodel
        idx = [i % len(jobs) for i in range(n_requests)]
        js, ii = [jobs[i] for i in idx], [ids[i] for i in idx]
        cases = [(1, "round-robin", {})] + [(4, r, {}) for r in ROUTERS] + \
            [(4, "prefix-affinity", {"balance_abs_threshold": None})]
        for n, router, opts in cases:
            t0 = time.process_time()
            run = Replicas(m, hw, js, make_router(router, n, **opts), n, concurrency=concurrency, prompt_ids=ii).run()
            cpu = time.process_time() - t0
            s = summary(run, js)
            shares = int(sum(int(np.sum(np.asarray(j.share))) for _, j in js))
            reuse = int(sum(int(np.sum((np.asarray(j.source) >= 0) & ~np.asarray(j.share, bool)
                                        & (np.asarray(j.reused) > 0))) for _, j in js))
            out["cases"].append({
                "policy": policy, "replicas": n, "router": router + (" (no load fallback)" if opts else ""),
                "prefix_hit_rate": s["total"]["prefix_hit_rate"],
                "planned_asks_shares": shares, "lost_asks_shares": s["lost_asks_shares"],
                "planned_prefix_reuse": reuse, "lost_prefix_reuse": s["lost_prefix_reuse"],
                "lost_reused_tokens": s["lost_reused_tokens"], "split_problems": s["split_problems"],
                "throughput_tokens_per_s": s["total"]["throughput_tokens_per_s"],
                "e2e_p50_s": s["total"]["e2e_p50_s"], "cpu_s": cpu})
    return out


def bench_scale(n_problems: int, replicas: int = 16, branches: int = 8) -> dict:
    from sim.cost.profiles import load_hardware, load_model
    from sim.serving.replicas import Replicas, summary
    from sim.serving.router import make_router
    from sim.workload.job import Job
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    B, ctx, reuse, gen = branches, 256, 192, 64
    z = np.zeros(B, np.int64)
    src = np.r_[-1, np.zeros(B - 1, np.int64)]
    reused = np.r_[0, np.full(B - 1, reuse)]
    c = np.full(B, ctx)
    job = Job(B=B, L=m.n_layers, bs=16, reused=reused, computed=c - reused, copy=z, gate=z, source=src,
              share=np.zeros(B, bool), ctx=c, gen=np.full(B, gen), own=c - reused, verify_on=False, v_new=z,
              v_cached=z, v_layers=np.full(B, m.n_layers), v_probes=z, v_head=np.ones(B, np.int64), v_kv_tokens=z,
              v_reuse=False, score=np.zeros(B))
    jobs = [(i, job) for i in range(n_problems)]
    rate = 40.0 * replicas
    t0, w0 = time.process_time(), time.perf_counter()
    run = Replicas(m, hw, jobs, make_router("prefix-affinity", replicas), replicas, arrival_rate=rate, seed=0,
                   scheduler=None, kv_blocks=None).run()
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    s = summary(run, jobs)
    return {"replicas": replicas, "problems": n_problems, "branches": B, "prompt_tokens": ctx, "output_tokens": gen,
            "arrival_rate": rate, "cpu_s": cpu, "wall_s": wall, "events": run.events,
            "events_per_s_per_core": run.events / cpu if cpu > 0 else None, "makespan_s": run.makespan,
            "throughput_tokens_per_s": s["total"]["throughput_tokens_per_s"], "goal_s": 120.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--quick", action="store_true", help="smaller cases (a smoke run)")
    ap.add_argument("--scale-problems", type=int, default=None)
    a = ap.parse_args(argv)
    from traces.store import atomic_write_text
    res = {"routing_unique": bench_routing(12, 4), "routing": bench_routing(16 if a.quick else 64, 8 if a.quick else 16)}
    for case in ("routing_unique", "routing"):
        print(f"{case}: {res[case]['problems']} problems, {res[case]['concurrency']} users")
        for c in res[case]["cases"]:
            print(f"{c['policy']:13s} x{c['replicas']} {c['router']:38s} hit={c['prefix_hit_rate']:.3f} "
                  f"lost asks={c['lost_asks_shares']}/{c['planned_asks_shares']} "
                  f"lost prefix={c['lost_prefix_reuse']}/{c['planned_prefix_reuse']} "
                  f"split={c['split_problems']} tok/s={c['throughput_tokens_per_s']:.0f}")
    n = a.scale_problems or (500 if a.quick else 10000)
    res["scale"] = bench_scale(n)
    print(json.dumps(res["scale"], indent=1))
    os.makedirs(a.out, exist_ok=True)
    atomic_write_text(a.out / "replicas.json", json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out / 'replicas.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
