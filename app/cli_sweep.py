"""``rksim sweep``, ``rksim tune``, ``rksim pareto``: thresholds, not just one run (docs/sweeps.md)."""
from __future__ import annotations

from app.dask_flags import backend_flags, check_backend  # noqa: F401

import dataclasses

import json
import math
import os
import sys
import time
from pathlib import Path

from sim.search.grid import DEFAULT_MAX_CONFIGS  # stdlib-only module: keeps `rksim --help` fast


def _print_json(obj) -> None:
    print(json.dumps(_clean(obj), indent=2, sort_keys=True, allow_nan=False))


def _clean(obj):
    """NaN -> None so that --json output is strict JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return _clean(obj.item())
    return obj


def _options(args):
    from app.cli_sim import deployment_kwargs, serving_options, workload_options
    from sim.replay.runconfig import RunConfig
    from sim.search.sweep import SweepOptions
    from sim.replay.target import TargetSpec

    sv, _, rate = serving_options(args)  # the serving flags of `rksim serve`, declared once (app.cli_sim)
    wl = workload_options(args)
    # the deployment flags that differ from their declared defaults (a one-GPU sweep passes none: as before)
    defaults = {f.name: f.default for cls in (TargetSpec, RunConfig) for f in dataclasses.fields(cls)}
    dep = {k: v for k, v in {**deployment_kwargs(args), "router": args.router, "slo": args.slo}.items()
           if v != defaults[k]}
    return SweepOptions(model_preset=args.model_preset, hardware=args.hardware, mode=args.mode,
                        workload=wl or None, seed=args.sim_seed,
                        arrival_rate=rate, serving=sv or None, reshape=args.reshape,
                        deployment=dep or None)


def _check_trace(path: str):
    """The trace, opened cheaply (manifest and sizes; the simulator verifies checksums when it loads it)."""
    from traces.errors import TraceError
    from traces.store import load_trace

    if path is None:  # the bundled trace, as in every command (app.cli_sim.trace_arg)
        from app.cli_sim import check_trace as _bundled
        path = _bundled(None)
    if not Path(path).exists():
        raise ValueError(f"--trace {path!r}: no such file or directory")
    try:
        return load_trace(path, verify=False)
    except TraceError as exc:
        raise ValueError(f"--trace {path!r}: {exc}") from None


def _grid(args, trace):
    """The --grid flags, or the policy's default grid (its l_min values need the trace's depth)."""
    from sim.search.grid import parse_grids

    if args.grid:
        return parse_grids(args.grid, max_configs=args.max_configs)
    from sim.search.tune import default_grid

    return default_grid(args.policy, trace.n_layers)


def _cmd_sweep(args) -> int:
    from sim.search.sweep import default_evaluate, run_sweep, single_thread_blas, validate_params, write_parquet

    trace = _check_trace(args.trace)
    args.trace = str(trace.path)
    check_backend(args)
    out = Path(args.out)
    if out.suffix != ".parquet":
        raise ValueError(f"--out {args.out!r}: the sweep is written as Parquet; name it *.parquet")
    if not out.parent.exists():
        raise ValueError(f"--out {args.out!r}: folder {str(out.parent)!r} does not exist")
    grid = _grid(args, trace)
    configs = list(grid.configs())
    validate_params(args.policy, configs)
    options = _options(args)
    evaluate = default_evaluate()
    # One evaluation here, before any worker starts: a bad trace, preset or mode fails now, in one line.
    # (With one BLAS thread like the sweep itself: the simulator memoises what it computes.)
    with single_thread_blas():
        evaluate(args.trace, policy=args.policy, params=dict(configs[0]), **options.kwargs())
    t0 = time.perf_counter()
    df = run_sweep(args.trace, args.policy, configs, options, evaluate=evaluate, backend=args.backend,
                   workers=args.workers, scheduler=args.dask_scheduler, progress=not args.quiet)
    wall = time.perf_counter() - t0
    meta = {"trace": os.path.abspath(args.trace), "policy": args.policy, "grid": grid.to_json(),
            "options": options.kwargs(), "backend": args.backend, "n_configs": len(df),
            "argv": " ".join(sys.argv)}
    write_parquet(df, out, meta)
    rate = len(df) / max(wall, 1e-9)
    speed = f"{rate:.0f} configs/s" if rate >= 10 else f"{1 / rate:.2f} s/config"
    print(f"wrote {out}: {len(df)} configurations x {df.shape[1]} columns "
          f"({wall:.2f} s, {speed}, backend {args.backend})")
    line = best_line(df, configs, args.trace, args.policy, options)
    if line:
        print(line)
    return 0


BEST_BY = "speedup_vs_no_kv"
BEST_SHOWN = ("speedup_vs_no_kv", "speedup_vs_exact_prefix", "skip_rate", "cgee_error_rate", "accuracy", "kv_reuse",
              "asks_gate_auc")


def best_line(df, configs: list, trace: str, policy: str, options) -> str:
    """The sweep's best configuration by :data:`BEST_BY`, its figures with their 95% intervals (computed for
    this one row only: ``sim.search.sweep.row_intervals``); empty when no row has the figure."""
    import math

    from app.tables import fmt_ci
    from sim.replay.intervals import SUFFIX
    from sim.search.sweep import row_intervals
    if BEST_BY not in df.columns:
        return ""
    col = df[BEST_BY].astype(float)
    if not col.notna().any():
        return ""
    i = int(col.to_numpy().argmax()) if not col.isna().any() else int(col.fillna(-math.inf).to_numpy().argmax())
    ci = row_intervals(trace, policy, [configs[i]], options)[0]
    row = df.iloc[i]
    figs = [f"{k} {fmt_ci(row[k], ci.get(k + SUFFIX))}" for k in BEST_SHOWN
            if k in df.columns and row[k] is not None and row[k] == row[k]]
    params = " ".join(f"{k}={v}" for k, v in configs[i].items())
    over = f" over {int(row['n_problems'])} problems" if "n_problems" in df.columns else ""
    return f"best {BEST_BY}: {params} ({row['config_id']}): " + ", ".join(figs) + f"; [lo, hi]: 95% intervals{over}"


def _cmd_tune(args) -> int:
    from sim.search.tune import TuneSpec, tune

    trace = _check_trace(args.trace)
    args.trace = str(trace.path)
    check_backend(args)
    spec = TuneSpec(objective=args.objective, direction=args.direction,
                    max_cgee_error=args.max_cgee_error, max_accuracy_drop=args.max_accuracy_drop,
                    split=args.split, seed=args.seed, refine=args.refine,
                    refine_maxiter=args.refine_iters, conservative=args.conservative)
    grid = _grid(args, trace)
    res = tune(args.trace, args.policy, spec, grid, _options(args), n_problems=len(trace.problems),
               n_layers=trace.n_layers, backend=args.backend,
               workers=args.workers, scheduler=args.dask_scheduler, progress=not args.quiet and not args.json)
    js = _clean(res.to_json())
    for line in res.held_out_breaks:
        print(f"rksim: warning: {line}", file=sys.stderr)
    if args.out:
        _atomic_write_text(Path(args.out), json.dumps(js, indent=2, sort_keys=True) + "\n", "--out")
    if args.json:
        _print_json(js)
        return 0
    import pandas as pd

    cons = []
    if spec.max_cgee_error is not None:
        cons.append(f"cgee_error_rate <= {spec.max_cgee_error}")
    if spec.max_accuracy_drop is not None:
        cons.append(f"accuracy >= accuracy(no-kv) - {spec.max_accuracy_drop}")
    if cons and spec.conservative:
        cons[-1] += " (each at its 95% Wilson bound)"
    print(f"policy {res.policy}: {'maximise' if spec.maximize else 'minimise'} {spec.objective}"
          f"{' subject to ' + ' and '.join(cons) if cons else ''}")
    print(f"split (seed {spec.seed}): tune problems {res.tune_problems}, held-out {res.held_problems}")
    print(f"searched {res.grid_size} grid configurations{' + refinement' if res.refinement_ran else ''}, "
          f"{res.n_evaluations} evaluations; "
          f"chosen from the {res.source} search{'' if res.feasible else ' — NO configuration met the constraints on the tune split'}")
    print("chosen: " + "  ".join(f"{k}={v}" for k, v in res.params.items()))
    for note in res.notes:
        print(f"note: {note}")
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(res.table().to_string(float_format=lambda v: f"{v:.4g}"))
    return 0


def _cmd_pareto(args) -> int:
    from app.frontier_plot import frontier_figure
    from sim.search.pareto import collapse_ties, frontier
    from sim.search.sweep import param_columns, read_sweep

    df, meta = read_sweep(args.file)
    if meta.get("command") == "plan":  # a `rksim plan --out` table: its deployments' frontier per policy
        from app.cli_plan import pareto_plan
        return pareto_plan(args, df, meta)
    args.x, args.y = args.x or "cgee_error_rate", args.y or "speedup_vs_no_kv"
    front = frontier(df, args.x, args.y, minimize_x=args.minimize_x, maximize_y=args.maximize_y)
    cols = (["config_id"] if "config_id" in front.columns else []) + param_columns(front) + [args.x, args.y]
    table = front[cols] if args.all_ties else collapse_ties(front[cols], args.x, args.y)
    if args.out:
        title = None
        if meta.get("policy"):
            title = f"{meta['policy']}: {args.y} against {args.x} ({len(df)} configurations)"
        fig = frontier_figure(df, front, args.x, args.y, title=title)
        _atomic_write_text(Path(args.out), fig.to_html(include_plotlyjs=True, full_html=True), "--out")
    if args.json:
        _print_json({"x": args.x, "y": args.y, "n_configs": int(len(df)), "n_frontier_configs": int(len(front)),
                     "n_frontier_points": int(front[[args.x, args.y]].drop_duplicates().shape[0]),
                     "frontier": _clean(table.to_dict("records"))})
        return 0
    import pandas as pd

    shown = table.drop(columns=["tied_config_ids"], errors="ignore")
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_rows", 500):
        print(shown.to_string(index=False))
    n_distinct = int(front[[args.x, args.y]].drop_duplicates().shape[0])
    print(f"{len(front)} of {len(df)} configurations on the frontier ({n_distinct} distinct point{'s' if n_distinct != 1 else ''}"
          f"{'' if args.all_ties else '; each shown once with n_tied, --all-ties lists every configuration'})"
          + (f"; figure: {args.out}" if args.out else ""))
    return 0


def _atomic_write_text(path: Path, text: str, flag: str) -> None:
    from traces.store import atomic_write_bytes

    if not path.parent.exists():
        raise ValueError(f"{flag} {str(path)!r}: folder {str(path.parent)!r} does not exist")
    atomic_write_bytes(path, text.encode())


def _positive_int(text: str) -> int:
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def _sim_flags(p) -> None:
    from app.cli_sim import add_declared, serving_args, trace_arg, workload_arg
    from sim.replay.target import TargetSpec
    trace_arg(p)
    p.add_argument("--policy", required=True, help="policy registry name (asks, cgee, vase-dkv, ...; see `rksim policies`)")
    p.add_argument("--grid", action="append", metavar="KEY=SPEC",
                   help="a parameter's values: key=start:stop:step (stop inclusive) or key=v1,v2,...; repeat per key "
                        "(default: the policy's default grid, sim/search/tune.py)")
    p.add_argument("--max-configs", type=_positive_int, default=DEFAULT_MAX_CONFIGS, metavar="N",
                   help=f"refuse grids larger than N configurations (default {DEFAULT_MAX_CONFIGS:,})")
    from sim.replay.runconfig import RunConfig
    add_declared(p, RunConfig, only=("mode",))
    add_declared(p, TargetSpec)
    add_declared(p, RunConfig, only=("router", "slo"))
    workload_arg(p)
    add_declared(p, RunConfig, only=("seed",))
    p.add_argument("--reshape", default=None, metavar="SPEC",
                   help="evaluate on the trace's problems reshaped (docs/simulator.md, Workload reshaping; "
                        "default: the trace's own shape)")
    backend_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    serving_args(p)  # the serving flags of `rksim serve`, from the same declarations


def register(sub) -> None:
    p = sub.add_parser("sweep", help="evaluate a policy over a parameter grid into a Parquet file",
                       description="Evaluate a policy at every configuration of a grid (docs/sweeps.md).")
    _sim_flags(p)
    p.add_argument("--out", required=True, metavar="FILE", help="output FILE.parquet (written atomically)")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("tune", help="choose thresholds on one split of the problems, report on the held-out split",
                       description="Grid search then scipy refinement on a tune split; metrics on a held-out split.")
    _sim_flags(p)
    p.add_argument("--objective", default="speedup_vs_no_kv", metavar="METRIC",
                   help="metric to optimise (default speedup_vs_no_kv)")
    p.add_argument("--direction", choices=("max", "min"), default=None,
                   help="maximise or minimise the objective (default: from its name)")
    p.add_argument("--max-cgee-error", type=float, default=None, metavar="E",
                   help="constraint: cgee_error_rate <= E (default: none)")
    p.add_argument("--max-accuracy-drop", type=float, default=None, metavar="X",
                   help="constraint: accuracy >= accuracy(no-kv) - X on the same split (default: none)")
    p.add_argument("--conservative", action="store_true",
                   help="read the constraints at their 95%% Wilson bound (error rate: upper; accuracy: lower) "
                        "instead of the point estimate (default: point estimate)")
    p.add_argument("--split", type=float, default=0.5, metavar="F", help="share of problems in the tune split (default 0.5)")
    p.add_argument("--split-seed", type=int, default=0, dest="seed", metavar="N",
                   help="seed of the split and of the refinement (the simulator's is --sim-seed)")
    rg = p.add_mutually_exclusive_group()
    rg.add_argument("--refine", dest="refine", action="store_const", const=True, default=None,
                    help="refine the grid winner with differential evolution (default, except token-eviction policies)")
    rg.add_argument("--no-refine", dest="refine", action="store_const", const=False, help="grid search only")
    p.add_argument("--refine-iters", type=int, default=20, metavar="N", help="differential evolution generations (default 20)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the JSON result to this file (default: none)")
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser("pareto", help="Pareto frontier of a sweep or a plan: plotly figure and table",
                       description="Non-dominated configurations of a sweep file (docs/sweeps.md).")
    p.add_argument("file", help="sweep FILE.parquet, or a `rksim plan --out` file (docs/parallelism.md)")
    p.add_argument("--x", default=None, metavar="METRIC",
                   help="x metric (default cgee_error_rate; a plan file: gpus (default) or cost)")
    p.add_argument("--y", default=None, metavar="METRIC",
                   help="y metric (default speedup_vs_no_kv; a plan file: goodput (default) or throughput)")
    gx = p.add_mutually_exclusive_group()
    gx.add_argument("--minimize-x", dest="minimize_x", action="store_const", const=True, default=None,
                    help="smaller x is better (default: from the metric's name)")
    gx.add_argument("--maximize-x", dest="minimize_x", action="store_const", const=False, help="larger x is better")
    gy = p.add_mutually_exclusive_group()
    gy.add_argument("--maximize-y", dest="maximize_y", action="store_const", const=True, default=None,
                    help="larger y is better (default: from the metric's name)")
    gy.add_argument("--minimize-y", dest="maximize_y", action="store_const", const=False, help="smaller y is better")
    p.add_argument("--out", default=None, metavar="FILE", help="write the figure to this HTML file (default: none)")
    p.add_argument("--all-ties", action="store_true",
                   help="list every configuration on the frontier (default: one row per distinct point)")
    p.add_argument("--json", action="store_true", help="print the frontier as JSON")
    p.set_defaults(func=_cmd_pareto)
