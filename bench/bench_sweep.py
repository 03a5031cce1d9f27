"""Sweep throughput: configurations per second, local on one core and on Dask with 2 workers.

Runs the real ``sim.api.evaluate`` (isolated mode, the fast path) on the
bundled trace over ASKS and CGEE grids, and writes ``DIR/sweep.json``:
medians of ``--repeats`` timed runs, after one untimed warm-up (trace loading
and the workers' start are reported separately). Also checks that the Dask
rows equal the local rows exactly, and times a bare loop of ``evaluate`` calls
on the same grid (the sweep layer's own overhead is the difference). Goal:
>= 1,000 configurations/s locally on one core.

    .venv/bin/python bench/bench_sweep.py --out runs/bench
"""
from __future__ import annotations

import os

# One core for the local measurement: no BLAS/OpenMP thread pools (set before numpy loads).
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.search.grid import parse_grids  # noqa: E402
from sim.search.sweep import SweepOptions, run_sweep  # noqa: E402

GRIDS = {
    "asks": ["tau=0.5:1.0:0.01", "alpha=0:4:0.5"],                       # 51 x 9 = 459
    "cgee": ["tau_conf=0.5:1.0:0.1", "delta_rel=0:0.5:0.1", "theta=0,0.5,1,2",
             "eps=0.05,0.1", "l_min=8,15"],                                # 6x6x4x2x2 = 576
}


def _pin_one_core() -> str:
    try:
        cpu = sorted(os.sched_getaffinity(0))[0]
        os.sched_setaffinity(0, {cpu})
        return f"pinned to cpu {cpu}"
    except (AttributeError, OSError):  # not Linux
        return "not pinned"


def _local_once(trace: str, policy: str, grid_args: list[str], hardware: str):
    """In a fresh process pinned to one core: load the trace (untimed), then time one sweep.

    A fresh process per run, because the simulator memoises decisions across
    calls: a second sweep of the same grid in one process would be a cache read.
    """
    pin = _pin_one_core()
    from sim.api import Session, evaluate

    opts = SweepOptions(mode="isolated", hardware=hardware)
    session = Session(trace)
    evaluate(session, policy=policy, params={}, **opts.kwargs())  # trace load, outside the timing
    grid = parse_grids(grid_args)
    t0 = time.perf_counter()
    df = run_sweep(session, policy, grid, opts, evaluate=evaluate, progress=False)
    dt = time.perf_counter() - t0
    return dt, pin, df


def _direct_once(trace: str, policy: str, grid_args: list[str], hardware: str) -> float:
    """Same as :func:`_local_once` but calling ``evaluate`` in a bare loop: the sweep layer's overhead."""
    _pin_one_core()
    from sim.api import Session, evaluate

    kw = SweepOptions(mode="isolated", hardware=hardware).kwargs()
    session = Session(trace)
    evaluate(session, policy=policy, params={}, **kw)
    configs = list(parse_grids(grid_args).configs())
    t0 = time.perf_counter()
    for c in configs:
        evaluate(session, policy=policy, params=c, **kw)
    return time.perf_counter() - t0


def _warm_worker(trace: str, policy: str, hardware: str) -> bool:
    from sim.api import evaluate

    evaluate(trace, policy=policy, params={}, **SweepOptions(mode="isolated", hardware=hardware).kwargs())
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="folder for sweep.json")
    ap.add_argument("--trace", default=str(ROOT / "examples" / "trace-gsm8k-persona"))
    ap.add_argument("--hardware", default="local-cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask measurement")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import pandas as pd

    from sim.api import evaluate

    opts = SweepOptions(mode="isolated", hardware=args.hardware)
    t0 = time.perf_counter()
    evaluate(args.trace, policy="no-kv", params={}, **opts.kwargs())
    load_s = time.perf_counter() - t0
    trace_label = os.path.relpath(args.trace, ROOT) if args.trace.startswith(str(ROOT)) else args.trace
    result: dict = {"trace": trace_label, "mode": "isolated", "hardware": opts.hardware,
                    "goal_local_configs_per_s": 1000, "trace_load_s": round(load_s, 3),
                    "repeats": args.repeats, "cpus_visible": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "policies": {}}
    rows = []
    ctx = mp.get_context("spawn")
    local_df: dict[str, pd.DataFrame] = {}
    for policy, g in GRIDS.items():
        n = parse_grids(g).size
        times = []
        pin = ""
        for _ in range(args.repeats):
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as ex:
                dt, pin, df = ex.submit(_local_once, args.trace, policy, g, args.hardware).result()
            times.append(dt)
            local_df[policy] = df
        med = statistics.median(times)
        direct = []
        for _ in range(args.repeats):
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as ex:
                direct.append(ex.submit(_direct_once, args.trace, policy, g, args.hardware).result())
        result["policies"][policy] = {"n_configs": n, "grid": g, "local_1_core": {
            "seconds": [round(t, 4) for t in times], "configs_per_s": round(n / med, 1), "pinning": pin},
            "evaluate_loop_1_core": {"seconds": [round(t, 4) for t in direct],
                                     "configs_per_s": round(n / statistics.median(direct), 1)}}

    if not args.no_dask:
        from sim.search.dist import open_client

        starts = []
        for policy, g in GRIDS.items():
            grid = parse_grids(g)
            times = []
            df = None
            for _ in range(args.repeats):
                # A new cluster per run: fresh worker processes, no memoised decisions from the last run.
                t0 = time.perf_counter()
                with open_client(workers=2) as client:
                    client.run(_warm_worker, args.trace, policy, args.hardware)  # each worker loads the trace
                    starts.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    df = run_sweep(args.trace, policy, grid, opts, evaluate=evaluate, backend="dask",
                                   client=client, progress=False)
                    times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            entry = result["policies"][policy]
            entry["dask_2_workers"] = {"seconds": [round(t, 4) for t in times],
                                       "configs_per_s": round(grid.size / med, 1)}
            try:
                pd.testing.assert_frame_equal(local_df[policy], df, check_exact=True)
                entry["dask_equals_local"] = True
            except AssertionError:
                entry["dask_equals_local"] = False
        result["dask_cluster_start_and_trace_load_s_median"] = round(statistics.median(starts), 3)
    for policy, entry in result["policies"].items():
        rows.append({"policy": policy, "configs": entry["n_configs"],
                     "local 1 core (configs/s)": entry["local_1_core"]["configs_per_s"],
                     "bare evaluate loop (configs/s)": entry["evaluate_loop_1_core"]["configs_per_s"],
                     "dask 2 workers (configs/s)": entry.get("dask_2_workers", {}).get("configs_per_s"),
                     "dask == local": entry.get("dask_equals_local")})
    local_rates = [v["local_1_core"]["configs_per_s"] for v in result["policies"].values()]
    result["local_configs_per_s_min"] = min(local_rates)
    result["meets_local_goal"] = min(local_rates) >= 1000
    if not args.no_dask:
        result["dask_configs_per_s_min"] = min(v["dask_2_workers"]["configs_per_s"]
                                               for v in result["policies"].values())

    from traces.store import atomic_write_json

    atomic_write_json(args.out / "sweep.json", result)
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"trace load {load_s:.2f} s; wrote {args.out / 'sweep.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
