"""``rksim plan``: deployments (TP x PP x replicas x scheduler limits x policy) within a GPU budget,
served on a trace's problems and judged on SLO goodput (docs/parallelism.md)."""
from __future__ import annotations

import json
import math
import os
import time


def _ints(flag: str, text: str) -> list[int]:
    out = []
    for part in str(text).split(","):
        try:
            v = int(part)
        except ValueError:
            raise ValueError(f"{flag}: {part.strip()!r} is not an integer (a comma-separated list)") from None
        if v < 1:
            raise ValueError(f"{flag}: {v} must be >= 1")
        out.append(v)
    return out


def _plan_flags(args):
    """``plan``'s flags checked before any deployment is served (each error names its flag): the parallel layouts
    and scheduler limits to try, the SLO, the knee's rates (None without ``--knee``) and the policies."""
    from sim.cost.parallel import TP_SIZES
    from sim.serving.goodput import SLO
    from sim.serving.router import ROUTERS

    if args.gpus < 1:
        raise ValueError(f"--gpus: must be >= 1, got {args.gpus}")
    tps = _ints("--tensor-parallel-size", args.tensor_parallel_size)
    bad = [t for t in tps if t not in TP_SIZES]
    if bad:
        raise ValueError(f"--tensor-parallel-size: {bad[0]} is not one of {', '.join(map(str, TP_SIZES))}")
    pps = _ints("--pipeline-parallel-size", args.pipeline_parallel_size)
    dps = _ints("--data-parallel-size", args.data_parallel_size) if args.data_parallel_size else None
    mns = _ints("--max-num-seqs", args.max_num_seqs) if args.max_num_seqs is not None else None
    mnbt = (_ints("--max-num-batched-tokens", args.max_num_batched_tokens)
            if args.max_num_batched_tokens is not None else None)
    if args.router not in ROUTERS:
        raise ValueError(f"--router: {args.router!r} is not one of {', '.join(ROUTERS)}")
    slo = SLO.parse(args.slo)
    knee_rates = None
    if args.knee is not None:   # checked here, before any deployment is served
        from sim.search.knee import KneeSLO, parse_rates
        knee_rates = parse_rates(args.knee, "--knee")
        KneeSLO.parse(args.knee_slo, "--knee-slo")
        if not 0 <= args.knee_refine <= 20:
            raise ValueError(f"--knee-refine: must be in 0..20, got {args.knee_refine}")
    if args.problem_rate is not None and (not math.isfinite(args.problem_rate) or args.problem_rate <= 0):
        raise ValueError(f"--problem-rate: must be a positive number of problems/s, got {args.problem_rate}")
    if args.gpu_hour_cost is not None and (not math.isfinite(args.gpu_hour_cost) or args.gpu_hour_cost < 0):
        raise ValueError(f"--gpu-hour-cost: must be a number >= 0, got {args.gpu_hour_cost}")
    from sim.workload.decisions import make_config
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not pols:
        raise ValueError("--policies: give at least one policy")
    for pol in pols:
        try:
            make_config(pol, {}, None)
        except ValueError as exc:
            raise ValueError(f"--policies: {exc}") from None
    return tps, pps, dps, mns, mnbt, slo, knee_rates, pols


def _cmd_plan(args) -> int:
    from sim.replay.target import node_for
    from sim.search.planner import deployments, frontier, plan_model, run_plan
    from sim.cost.profiles import load_hardware
    from sim.search.sweep import write_parquet

    tps, pps, dps, mns, mnbt, slo, knee_rates, pols = _plan_flags(args)
    m = plan_model(args.model_preset, args.quantization, args.kv_cache_dtype)
    node = node_for(args.hardware, args.node)
    hw = load_hardware(node.gpu)
    hw.check_precision(m)   # refused here, naming the flag, before any deployment runs
    node_spec = args.node or (args.hardware if args.hardware == node.name or os.path.exists(args.hardware)
                              else node.name)
    deps = list(deployments(m, hw, node, args.gpus, pols, tp_sizes=tps, pp_sizes=pps, replicas=dps,
                            max_num_seqs=mns, max_num_batched_tokens=mnbt,
                            enable_expert_parallel=args.enable_expert_parallel,
                            memory_rules=args.vllm_memory_rules))
    if not deps:
        raise ValueError(f"--gpus {args.gpus}: no deployment of {m.name} on {node.name} fits in {args.gpus} GPU(s) "
                         f"with --tensor-parallel-size {args.tensor_parallel_size} --pipeline-parallel-size "
                         f"{args.pipeline_parallel_size}")
    opts = {"model_preset": args.model_preset, "node": node_spec, "router": args.router, "slo": str(slo) if
            slo.stated else None, "arrival_rate": args.problem_rate, "concurrency": args.max_concurrent_problems,
            "n_requests": args.num_problems, "seed": args.sim_seed, "gpu_hour_cost": args.gpu_hour_cost}
    opts.update(target_options(args, m))
    t0, c0 = time.perf_counter(), time.process_time()
    from app.dask_flags import check_backend
    check_backend(args)
    rows = run_plan(args.trace, deps, opts, backend=args.backend, workers=args.workers, progress=not args.json,
                    scheduler=args.dask_scheduler)
    band_fits = _band_rows(args, rows, deps, opts, hw, m) if args.band else None
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    df, front, best = frontier(rows)
    meta = {"command": "plan", "model": m.name, "node": node.name, "hardware": hw.name, "gpus": args.gpus,
            "slo": str(slo), "router": args.router, "policies": pols, "deployments": len(deps),
            "backend": args.backend, "wall_s": wall,
            "decisions_model": df["decisions_model"].iloc[0] if len(df) else None,
            # what a deployment loaded into the dashboard's Serving page is re-run under
            "model_preset": args.model_preset, "node_preset": node_spec, "trace": args.trace,
            "arrival_rate": args.problem_rate,
            "concurrency": None if args.problem_rate is not None else args.max_concurrent_problems,
            "n_requests": args.num_problems, "seed": args.sim_seed, "gpu_hour_cost": args.gpu_hour_cost,
            "target_options": target_options(args, m),
            # what each step was priced at beyond its kernels (every row alike: the plan's flags)
            "overheads": str(df["overheads"].iloc[0]) if len(df) and "overheads" in df else None,
            # what the weights and KV were priced at: a release's own format unless --quantization says otherwise
            "quantization": m.quantization or None, "kv_cache_dtype": m.kv_cache_dtype or "auto"}
    if band_fits is not None:
        meta["band_fits"] = band_fits
    knees = _knees(args, best, knee_rates, node_spec, m) if knee_rates is not None else None
    if knees is not None:
        meta["knees"] = knees
    if args.out:
        write_parquet(_mark(df, front), args.out, meta)
    cols = ["gpus", "policy", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs",
            "max_num_batched_tokens", "goodput_problems_per_s", "slo_attainment", "e2e_p99_s"]
    if band_fits:
        cols += [f"{c}_{e}" for c in BANDED for e in ("lo", "hi")]
    if args.gpu_hour_cost is not None:
        cols.append("cost_per_million_output_tokens")
    if args.json:
        print(json.dumps({"meta": meta, "frontier": front[cols].to_dict("records"),
                          "best_per_policy": best[cols].to_dict("records")}, indent=2, default=float))
        return 0
    print(f"{len(deps)} deployments of {m.priced_name} on {node.name} (<= {args.gpus} GPUs), SLO {slo}, router "
          f"{args.router}; decisions of {meta['decisions_model']}; {meta['overheads']}; {wall:.1f} s ({args.backend})")
    print("frontier (fewest GPUs against most goodput):")
    print(front[cols].to_string(index=False))
    print("best per policy:")
    print(best[cols].to_string(index=False))
    if knees is not None:
        import pandas as pd
        print(f"knee of the best deployment per policy (problems/s; SLO {knees[0]['slo'] if knees else ''}):")
        print(pd.DataFrame([{k: x[k] for k in ("policy", "deployment", "knee_rate", "first_failing_rate",
                                               "saturation_rate", "capacity_rps")} for x in knees]).to_string(index=False))
        for x in knees:
            print(f"{x['policy']}: {x['caption']}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def pareto_plan(args, df, meta) -> int:
    """``rksim pareto PLAN.parquet [--x gpus|cost] [--y goodput|throughput] [--out FILE.html] [--json]``: the
    frontier over all policies and per policy, printed; the figure written as self-contained HTML."""
    from app.frontier_plot import plan_figure
    from sim.search.planner import plan_axes, plan_caption, plan_frontiers

    x, y = plan_axes(df, args.x or "gpus", args.y or "goodput")
    if getattr(args, "minimize_x", None) is False or getattr(args, "maximize_y", None) is False:
        raise ValueError(f"--{'maximize-x' if args.minimize_x is False else 'minimize-y'}: a plan's frontier is "
                         "fewer GPUs (or cost) against more goodput (or throughput); the directions are fixed")
    if args.out is not None and not str(args.out).endswith(".html"):
        raise ValueError(f"--out {args.out!r}: the figure is written as self-contained HTML; name it *.html")
    overall, per = plan_frontiers(df, x, y)
    cols = [c for c in ("policy", "gpus", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                        "max_num_seqs", "max_num_batched_tokens", "goodput_problems_per_s", "throughput_tokens_per_s",
                        "slo_attainment", "e2e_p99_s", "cost_per_million_output_tokens") if c in df.columns]
    if args.json:
        print(json.dumps({"meta": meta, "x": x, "y": y, "frontier": overall[cols].to_dict("records"),
                          "per_policy": {p: f[cols].to_dict("records") for p, f in per.items()}},
                         indent=2, default=float))
    else:
        print(f"{args.file}: {len(df)} deployments; {plan_caption(meta)}")
        print(f"frontier, all policies (fewer {x}, more {y}):")
        print(overall[cols].to_string(index=False))
        for pol, f in per.items():
            print(f"frontier of {pol}:")
            print(f[cols].to_string(index=False))
    if args.out is not None:
        import plotly.io as pio

        from traces.store import atomic_write_text

        fig, _ = plan_figure(df, meta, x, y)
        atomic_write_text(args.out, pio.to_html(fig, full_html=True, include_plotlyjs="inline"))
        if not args.json:
            print(f"wrote {args.out}")
    return 0


def target_options(args, m) -> dict:
    """:func:`sim.search.planner.target_options` of the command's flags."""
    from sim.search.planner import target_options as of
    return of(m, args.enable_expert_parallel, args.moe_routing, args.quantization, args.kv_cache_dtype,
              host_time=not args.no_host_time, async_scheduling=not args.no_async_scheduling,
              enforce_eager=args.enforce_eager, step_by_step=args.step_by_step, memory_rules=args.vllm_memory_rules,
              allow_extrapolation=args.allow_extrapolation)


def _knees(args, best, rates, node_spec: str, m) -> list[dict]:
    """``sim.search.planner.deployment_knee`` of each policy's best deployment (``--knee``): knee, first failing and
    saturation rates, capacity, and the caption of what they hold under (no per-point arrays: they go to meta)."""
    from tqdm.auto import tqdm

    from sim.search.knee import caption
    from sim.search.planner import deployment_knee
    from sim.replay.session import Session
    from sim.api import default_trace_path

    session = Session(str(args.trace or default_trace_path()))
    out = []
    for row in best.to_dict("records"):
        params = {k: row[k] for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                                      "max_num_seqs", "max_num_batched_tokens", "policy")}
        c = deployment_knee(session, params, rates, model_preset=args.model_preset, node=node_spec,
                            router=args.router, slo=args.knee_slo, n_requests=args.num_problems, seed=args.sim_seed,
                            refine=args.knee_refine,
                            progress=lambda it, **kw: tqdm(it, disable=bool(args.json), leave=False, **kw),
                            **target_options(args, m))
        out.append({"policy": row["policy"], "deployment": c["deployment"], "slo": c["slo"],
                    "knee_rate": c["knee_rate"], "first_failing_rate": c["first_failing_rate"],
                    "knee_bounded": c["knee_bounded"], "saturation_rate": c["saturation_rate"],
                    "capacity_rps": c["capacity_rps"], "provenance": c["provenance"],
                    "caption": caption({"provenance": c["provenance"]}, c, unit="problems/s"),
                    "points": [{k: p.get(k) for k in ("rate", "refined", "p99_ttft_ms", "mean_tpot_ms",
                                                      "p99_e2el_ms", "growth_s_per_s", "saturated", "meets_slo")}
                               for p in c["points"]]})
    return out


BANDED = ("goodput_problems_per_s", "e2e_p99_s")   # the figures a plan row carries a band of (--band)


def _band_rows(args, rows, deps, opts, hw, m) -> list[str]:
    """``--band``: every deployment run again with each public fit of the node's GPU (sim.cost.bands); each row
    gains ``<figure>_lo`` / ``<figure>_hi`` over the central run and those. Returns the fits' labels."""
    from sim.cost.bands import band_of, band_profiles
    from sim.search.planner import run_plan
    labels = [label for label, _ in band_profiles(hw, host_time=opts.get("host_time", True),
                                                  fp8=m.quantization == "fp8")]
    others = [run_plan(args.trace, deps, {**opts, "band_fit": label}, backend=args.backend, workers=args.workers,
                       progress=not args.json, scheduler=args.dask_scheduler) for label in labels]
    for i, row in enumerate(rows):
        for c in BANDED:
            b = band_of([row.get(c)] + [o[i].get(c) for o in others])
            row[f"{c}_lo"], row[f"{c}_hi"] = (None, None) if b is None else b
    return ["central"] + labels


def _mark(df, front):
    key = ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs",
           "max_num_batched_tokens", "policy"]
    on = set(map(tuple, front[key].to_numpy().tolist()))
    return df.assign(on_frontier=[tuple(r) in on for r in df[key].to_numpy().tolist()])


def _serve_defaults_words(key: str) -> str:
    """``vllm serve``'s default of ``key`` per GPU preset, as the help words it (from the one table,
    :data:`sim.serving.capacity.SCHEDULER_DEFAULTS`)."""
    from sim.serving.capacity import GENERIC_DEFAULTS, SCHEDULER_DEFAULTS
    by = {}
    for gpu, d in SCHEDULER_DEFAULTS.items():
        by.setdefault(d[key], []).append(gpu)
    return "; ".join(f"{v} on {', '.join(g)}" for v, g in by.items()) + f"; else {GENERIC_DEFAULTS[key]}"


def register(sub) -> None:
    from sim.cost.node import load_node
    from sim.cost.profiles import list_presets
    p = sub.add_parser("plan", help="deployments within a GPU budget, judged on SLO goodput: the frontier",
                       description="Sweep TP x PP x replicas x max_num_seqs x max_num_batched_tokens x policy within "
                                   "--gpus GPUs on a trace's problems; report the frontier of GPUs against goodput "
                                   "(docs/parallelism.md).")
    p.add_argument("--trace", default=None, metavar="PATH", help="trace directory (default: the bundled trace)")
    p.add_argument("--model-preset", required=True, metavar="M", help="model whose costs are simulated")
    nodes = list_presets("nodes")
    p.add_argument("--hardware", required=True, metavar="GPU",
                   help=f"GPU preset with a shipped node ({', '.join(sorted({load_node(n).gpu for n in nodes}))}: "
                        f"that node) or a node preset ({', '.join(nodes)}) or file")
    p.add_argument("--band", action="store_true",
                   help="also run every deployment with each public fit of the GPU, with and without the cited model "
                        "runner's host time, and (FP8) CUTLASS's FP8 rate (sim.cost.bands): goodput and p99 E2E gain "
                        "a [low, high] band (one more plan per profile)")
    p.add_argument("--node", default=None, metavar="NODE",
                   help="node preset or file whose GPUs are --hardware (default: the shipped node of --hardware)")
    p.add_argument("--gpus", required=True, type=int, metavar="G", help="GPU budget")
    p.add_argument("--policies", default="no-kv,exact-prefix,rksc", metavar="P,P",
                   help="policies, each with its default parameters (default no-kv,exact-prefix,rksc)")
    p.add_argument("--tensor-parallel-size", default="1,2,4,8", metavar="N,N", help="TP sizes (default 1,2,4,8)")
    p.add_argument("--pipeline-parallel-size", default="1", metavar="N,N", help="PP sizes (default 1)")
    from app.cli_sim import add_declared
    from sim.replay.target import TargetSpec
    add_declared(p, TargetSpec, only=("enable_expert_parallel", "moe_routing", "quantization",
                                      "kv_cache_dtype"))   # sampled: seeded by --sim-seed
    from sim.serving.capacity import ServingConfig
    add_declared(p, ServingConfig, only=("enforce_eager", "no_host_time", "no_async_scheduling", "memory_rules"))
    from sim.replay.runconfig import RunConfig
    add_declared(p, RunConfig, only=("step_by_step", "allow_extrapolation"))
    p.add_argument("--data-parallel-size", default=None, metavar="N,N",
                   help="replica counts (default: 1 .. GPUs / (TP x PP))")
    for flag, key in (("--max-num-seqs", "max_num_seqs"), ("--max-num-batched-tokens", "max_num_batched_tokens")):
        p.add_argument(flag, default=None, metavar="N,N",
                       help=f"vLLM {key} values (default: vllm serve's for the GPU: {_serve_defaults_words(key)})")
    p.add_argument("--router", default="prefix-affinity", metavar="R",
                   help="round-robin, least-outstanding, prefix-affinity (default) or branch-spread")
    p.add_argument("--slo", default=None, metavar="KEY=S,KEY=S",
                   help="latency SLOs in seconds, KEY one of ttft, tpot, e2e, any subset (default: none)")
    from app.cli_sim import renamed_argument
    g = p.add_mutually_exclusive_group()
    renamed_argument(g, "--problem-rate", "--arrival-rate", type=float, default=None, metavar="R",
                     help="Poisson arrivals of problems per second, each B branch requests (default: closed loop)")
    renamed_argument(g, "--max-concurrent-problems", "--concurrency", type=int, default=16, metavar="C",
                     help="closed loop: problems in flight (default 16)")
    renamed_argument(p, "--num-problems", "--requests", type=int, default=None, metavar="N",
                     help="problems served, the trace's repeated (default: the trace's, once)")
    renamed_argument(p, "--sim-seed", "--seed", type=int, default=0, metavar="N", help="arrival seed (default 0)")
    p.add_argument("--gpu-hour-cost", type=float, default=None, metavar="USD",
                   help="price of one GPU-hour: adds cost per million output tokens (default: none)")
    from sim.search.knee import DEFAULT_SLO
    p.add_argument("--knee", default=None, metavar="R,R",
                   help="also the latency-rate knee of each policy's best deployment: its problems served at each of "
                        "these Poisson rates (problems/s; comma list and/or START:STOP:STEP), one run per rate, so "
                        "off by default (default: none)")
    p.add_argument("--knee-slo", default=DEFAULT_SLO, metavar="KEY=MS,KEY=MS",
                   help="the knee's SLO on each run's per-problem figures, vllm bench serve's keys in ms "
                        "({mean,median,pNN}_{ttft,tpot,e2el}_ms)")
    p.add_argument("--knee-refine", type=int, default=0, metavar="N",
                   help="bisection steps between the knee and the first failing rate")
    from app.dask_flags import backend_flags
    backend_flags(p)
    p.add_argument("--out", default=None, metavar="FILE", help="write the table to FILE.parquet, atomically (default: none)")
    p.add_argument("--json", action="store_true", help="print the frontier and the best per policy as JSON")
    p.set_defaults(func=_cmd_plan)
