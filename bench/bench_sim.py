"""Simulator speed: fast-path configurations/s/core, engine events/s/core (serving), `rksim compare` wall time.

Usage::

    .venv/bin/python bench/bench_sim.py --out runs/bench [--trace PATH] [--repeats 3]

Writes ``DIR/sim.json`` (medians of ``--repeats`` runs) and prints a table.
CPU time (``time.process_time``) is used for the per-core rates; goals:
fast path >= 1,000 configurations/s/core, engine >= 100,000 events/s/core.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _grids():
    """Sweep-like grids (what `rksim sweep` evaluates): one per kind of parameter."""
    taus = [round(x, 4) for x in np.linspace(0.5, 1.0, 101)]
    thetas = [round(x, 3) for x in np.linspace(0.1, 4.0, 20)]
    epss = [0.01, 0.05, 0.1, 0.2, 0.5]
    # The README's CGEE sweep (tau_conf x delta_rel x theta x eps x l_min): 4,480 configurations.
    cgee5 = [{"tau_conf": a, "delta_rel": d, "theta": t, "eps": e, "l_min": lm}
             for a in (0.5, 0.6, 0.7, 0.8, 1.1) for d in (0.3, 0.5)
             for t in [float(round(x, 4)) for x in np.arange(0.25, 2.0 + 1e-9, 0.25)]
             for e in (0.02, 0.05, 0.1, 0.2) for lm in range(16, 30)]
    return {
        "asks_tau": ("asks", [{"tau": t} for t in taus]),
        "cgee_theta_eps": ("cgee", [{"theta": t, "eps": e} for t in thetas for e in epss]),
        "cgee_sweep_5d": ("cgee", cgee5),
        "rksc_tau_theta": ("rksc", [{"tau": t, "theta": th} for t in taus[::10] for th in thetas]),
    }


def bench_fastpath(trace, hardware, repeats: int) -> dict:
    from sim import api
    session = api.Session(trace)  # the benchmark's: it holds the trace features and every memo
    out = {}
    for name, (pol, grid) in _grids().items():
        rates = []
        for _ in range(repeats):
            session.clear()  # every repeat starts cold (only the trace features stay loaded)
            api.evaluate(session, pol, grid[0], hardware=hardware)
            t0 = time.process_time()
            for p in grid:
                api.evaluate(session, pol, p, hardware=hardware)
            dt = time.process_time() - t0
            rates.append(len(grid) / dt)
        out[name] = {"configs": len(grid), "configs_per_s_per_core": float(np.median(rates))}
    out["median_configs_per_s_per_core"] = float(np.median([v["configs_per_s_per_core"] for v in out.values()]))
    return out


def bench_engine(trace, hardware, repeats: int, n_requests: int, concurrency: int) -> dict:
    from sim.api import RunConfig, Session, Target
    from sim.serving.engine import Engine
    from sim.replay.jobs import decided
    session = Session(trace)
    target = Target.resolve(session, None, hardware)
    model, hw = target.model, target.hardware
    config = RunConfig(policy="rksc", workload={"concurrency": concurrency}, mode="serving")
    tf = session.tf
    pairs = decided(session, config.sim, tf.problems, model.n_layers)
    jobs = [(f.pos, j) for f, (_, j, _) in zip(tf.problems, pairs)]
    jobs = [jobs[i % len(jobs)] for i in range(n_requests)]
    rates, evs, its = [], 0, 0
    for _ in range(repeats):
        eng = Engine(model, hw, jobs, concurrency=concurrency)
        t0 = time.process_time()
        res = eng.run()
        dt = time.process_time() - t0
        rates.append(res.events / dt)
        evs, its = res.events, res.iterations
    return {"events_per_s_per_core": float(np.median(rates)), "events": int(evs), "iterations": int(its),
            "requests": n_requests, "concurrency": concurrency, "policy": "rksc", "block_pool": False}


def bench_compare(trace, hardware, repeats: int) -> dict:
    root = Path(__file__).resolve().parent.parent
    import resource
    walls, cpus = [], []
    for _ in range(repeats):
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "app.cli", "compare", "--trace", str(trace), "--hardware", hardware, "--json"], cwd=root,
                           capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
        walls.append(time.perf_counter() - t0)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime))
        if r.returncode != 0:
            raise SystemExit(f"rksim compare failed: {r.stderr.strip().splitlines()[-1] if r.stderr else r.returncode}")
    # Wall time depends on what else the machine runs; CPU time of the child is the stable figure.
    return {"wall_s": float(np.median(walls)), "cpu_s": float(np.median(cpus)), "hardware": hardware}


def main(argv=None) -> int:
    from sim.api import default_trace_path
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--trace", default=str(default_trace_path()))
    ap.add_argument("--hardware", default="local-cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64, help="serving-mode requests for the engine benchmark")
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args(argv)
    if not (Path(a.trace) / "manifest.json").is_file():
        print(f"--trace {a.trace}: no trace there", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    fp = bench_fastpath(a.trace, a.hardware, a.repeats)
    en = bench_engine(a.trace, a.hardware, a.repeats, a.requests, a.concurrency)
    cm = bench_compare(a.trace, a.hardware, max(1, min(a.repeats, 2)))
    result = {"trace": str(a.trace), "hardware": a.hardware, "fastpath": fp, "engine_serving": en,
              "compare": cm, "goals": {"fastpath_configs_per_s_per_core": 1000, "engine_events_per_s_per_core": 100000},
              "cpu": os.cpu_count()}
    from traces.store import atomic_write_text
    path = a.out / "sim.json"
    atomic_write_text(path, json.dumps(result, indent=2))
    import pandas as pd
    rows = [{"metric": f"fast path {k} (configs/s/core)", "value": v["configs_per_s_per_core"]}
            for k, v in fp.items() if isinstance(v, dict)]
    rows.append({"metric": "engine serving (events/s/core)", "value": en["events_per_s_per_core"]})
    rows.append({"metric": "rksim compare wall (s)", "value": cm["wall_s"]})
    rows.append({"metric": "rksim compare CPU (s)", "value": cm["cpu_s"]})
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
