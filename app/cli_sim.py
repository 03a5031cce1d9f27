"""``rksim simulate``, ``rksim compare`` and ``rksim demo`` (the simulator's commands)."""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

DEFAULT_HARDWARE = "local-cpu"
DEMO_TARGETS = ((None, "local-cpu"), ("qwen2.5-7b", "h100-sxm"))

# Columns of the printed comparison table (all in the JSON too).
TABLE_COLS = ["latency_mean_s", "speedup_vs_no_kv", "speedup_vs_exact_prefix", "kv_reuse", "asks_gate_auc",
              "skip_rate", "mean_exit_layer", "cgee_error_rate", "cgee_branch_disagreement_rate", "accuracy",
              "peak_kv_bytes", "evictions",
              "recompute_tokens", "attn_output_rel_error", "attn_mass_recall", "kv_capacity_bytes", "kv_budget_blocks"]


# One parser for --set/--workload values, shared with the dashboard (app/params.py).
from app.params import parse_sets, parse_value  # noqa: E402,F401


def _trace_arg(p) -> None:
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace directory (default: the bundled examples/trace-gsm8k-persona)")


def _target_args(p) -> None:
    p.add_argument("--model-preset", default=None, metavar="NAME",
                   help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE, metavar="NAME",
                   help=f"hardware preset name or YAML/JSON file (default {DEFAULT_HARDWARE})")
    p.add_argument("--mode", choices=("isolated", "serving"), default="isolated",
                   help="isolated: one problem at a time (per-problem latency); serving: arrivals and contention")
    p.add_argument("--workload", action="append", default=[], metavar="KEY=VALUE",
                   help="workload option, repeatable (verify_reuses_kv, concurrency, block_size, kv_budget_frac, ...; "
                        "see docs/simulator.md; default: the defaults listed there)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed: arrivals and stochastic policies (default 0)")
    _reshape_arg(p)


def _reshape_arg(p) -> None:
    p.add_argument("--reshape", default=None, metavar="SPEC",
                   help="replay the trace's problems reshaped, prefix_tokens=N,branches=B,gen_tokens=T[,seed=S]: "
                        "root prompt N tokens, B branches, generation cap T, draws seeded by S; omitted keys keep the trace's own (docs/simulator.md, Workload reshaping; "
                        "default: the trace's own shape)")


def _serving_args(p, with_arrival: bool = False) -> None:
    """The serving-at-capacity options (validated in :func:`serving_options`, errors name the flag)."""
    g = p.add_argument_group("serving (mode serving)")
    g.add_argument("--requests", default=None, metavar="N",
                   help="problems submitted, cycling over the trace's (default: each selected problem once)")
    if with_arrival:
        x = g.add_mutually_exclusive_group()
        x.add_argument("--arrival-rate", default=None, metavar="R", help="Poisson arrivals, problems/s (default: closed loop, --concurrency)")
        x.add_argument("--concurrency", default=None, metavar="C", help="closed loop: problems in flight (default 4)")
    else:
        g.add_argument("--concurrency", default=None, metavar="C", help="closed loop: problems in flight (default 4)")
    g.add_argument("--decode-tokens", default=None, metavar="T",
                   help="token policies: extend the long decodes to T tokens (results say length_extrapolated; default: the recorded length)")
    g.add_argument("--scheduler", default=None, metavar="NAME",
                   help="vllm-v1 (default: running decodes first, chunked prefill) or prefill-first")
    g.add_argument("--max-num-seqs", default=None, metavar="S", help="running sequences cap (default: the hardware's)")
    g.add_argument("--max-num-batched-tokens", default=None, metavar="M",
                   help="tokens per iteration (default: the hardware's vLLM default)")
    g.add_argument("--gpu-memory-utilization", default=None, metavar="U",
                   help="share of device memory for weights + activations + KV, in (0, 1] (default 0.90)")
    g.add_argument("--kv-capacity-bytes", default=None, metavar="B",
                   help="KV capacity in bytes (default: memory x utilisation - weights - activation reserve)")
    g.add_argument("--activation-reserve-bytes", default=None, metavar="B",
                   help="activation reserve in bytes (default: estimated, docs/simulator.md)")


def _num(flag: str, text, kind=int, lo=None, hi=None):
    """A numeric flag value, else ValueError naming the flag (one line)."""
    if text is None:
        return None
    try:
        v = kind(text) if kind is float else int(str(text), 10)
    except (TypeError, ValueError):
        raise ValueError(f"{flag}: expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(v):
        raise ValueError(f"{flag}: expected a finite number, got {text!r}")
    if lo is not None and v < lo or hi is not None and v > hi:
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{flag}: must be {rng}, got {text!r}")
    return v


def serving_options(args) -> tuple[dict, dict, float | None]:
    """``(serving settings, workload additions, arrival_rate)`` from the serving flags."""
    sv, wl = {}, {}
    u = _num("--gpu-memory-utilization", getattr(args, "gpu_memory_utilization", None), float)
    if u is not None and not 0 < u <= 1:
        raise ValueError(f"--gpu-memory-utilization: must be in (0, 1], got {args.gpu_memory_utilization!r}")
    for key, flag, val in (("max_num_seqs", "--max-num-seqs", _num("--max-num-seqs", args.max_num_seqs, int, 1, 1 << 20)),
                           ("max_num_batched_tokens", "--max-num-batched-tokens",
                            _num("--max-num-batched-tokens", args.max_num_batched_tokens, int, 1, 1 << 24)),
                           ("decode_tokens", "--decode-tokens", _num("--decode-tokens", args.decode_tokens, int, 1, 1 << 20)),
                           ("gpu_memory_utilization", "--gpu-memory-utilization", u),
                           ("kv_capacity_bytes", "--kv-capacity-bytes",
                            _num("--kv-capacity-bytes", args.kv_capacity_bytes, float, 0, 1e18)),
                           ("activation_reserve_bytes", "--activation-reserve-bytes",
                            _num("--activation-reserve-bytes", args.activation_reserve_bytes, float, 0, 1e18))):
        if val is not None:
            sv[key] = val
    if args.scheduler is not None:
        from sim.scheduler import POLICIES
        if args.scheduler not in POLICIES:
            raise ValueError(f"--scheduler: {args.scheduler!r} is not one of {', '.join(POLICIES)}")
        sv["scheduler"] = args.scheduler
    n = _num("--requests", args.requests, int, 1, 10_000_000)
    if n is not None:
        wl["n_requests"] = n
    c = _num("--concurrency", getattr(args, "concurrency", None), int, 1, 1 << 20)
    if c is not None:
        wl["concurrency"] = c
    rate = getattr(args, "arrival_rate", None)
    if isinstance(rate, str):
        rate = _num("--arrival-rate", rate, float)
        if not rate > 0:
            raise ValueError(f"--arrival-rate: must be > 0, got {args.arrival_rate!r}")
    return sv, wl, rate


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one policy on a trace for a model and hardware",
                       description="Replay a trace under one policy through the cost model and simulator "
                                   "(docs/simulator.md).")
    _trace_arg(p)
    p.add_argument("--policy", required=True, help="policy registry name (see `rksim compare`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="policy parameter, repeatable (e.g. --set tau=0.8; default: the policy's defaults, see `rksim policies`)")
    _target_args(p)
    p.add_argument("--arrival-rate", type=float, default=None, metavar="R",
                   help="serving mode: Poisson arrivals, problems/s (default: closed loop)")
    p.add_argument("--engine", action="store_true", help="use the simpy engine in isolated mode too")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _serving_args(p)
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("serve", help="serve one policy at the target's KV capacity (vLLM-style scheduler)",
                       description="Serving mode at capacity: problems arrive (Poisson or closed loop), a vLLM V1 "
                                   "scheduler batches them, KV memory is the target's real capacity "
                                   "(docs/simulator.md, 'Serving at capacity').")
    _trace_arg(p)
    p.add_argument("--policy", required=True, help="policy registry name (see `rksim compare`)")
    p.add_argument("--set", action="append", default=[], metavar="K=V", dest="sets",
                   help="policy parameter, repeatable (e.g. --set tau=0.8; default: the policy's defaults, see `rksim policies`)")
    p.add_argument("--model-preset", default=None, metavar="X",
                   help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE, metavar="Y",
                   help=f"hardware preset name or YAML/JSON file (default {DEFAULT_HARDWARE})")
    p.add_argument("--workload", action="append", default=[], metavar="K=V",
                   help="workload option, repeatable (see docs/simulator.md; default: the defaults listed there)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed: arrivals and stochastic policies (default 0)")
    _reshape_arg(p)
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _serving_args(p, with_arrival=True)
    p.set_defaults(func=_cmd_serve, mode="serving", engine=False)

    p = sub.add_parser("compare", help="every policy at its defaults on one trace and target",
                       description="Compare every registered policy on a trace (JSON: {\"policies\": {NAME: {...}}}).")
    _trace_arg(p)
    _target_args(p)
    p.add_argument("--policies", default=None, metavar="NAME,NAME", help="comma list of policies (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("demo", help="compare on the bundled trace for two targets; write runs/demo/report.html",
                       description="`make run`: compare every policy on the bundled trace for local-cpu and for "
                                   "qwen2.5-7b on h100-sxm, print the tables, write an HTML report.")
    _trace_arg(p)
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="output directory (default runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed: arrivals and stochastic policies")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("tree", help="RSBCM vs LRU vs FIFO on a trace's tree search under a KV block budget",
                       description="Replay the trace's tree (trees/tNNNNN) with each block policy under one budget "
                                   "(sim/tree.py, docs/simulator.md 'Tree search (RSBCM)').")
    _trace_arg(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-frac", type=float, default=None, metavar="F",
                   help="budget = round(F x the unconstrained peak blocks), at least 1 (default 0.5)")
    g.add_argument("--budget-blocks", type=int, default=None, metavar="N", help="budget in blocks (default: from --budget-frac)")
    p.add_argument("--tree", type=int, default=0, metavar="I", help="tree index in the trace (default 0)")
    p.add_argument("--block-size", type=int, default=16, metavar="T", help="tokens per KV block (default 16)")
    p.add_argument("--model-preset", default=None, metavar="NAME",
                   help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE, metavar="NAME",
                   help=f"hardware preset name or YAML/JSON file (default {DEFAULT_HARDWARE})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_tree)


def _workload(args) -> dict:
    return parse_sets(args.workload, "--workload")


def _check_trace(path):
    if path is None:
        from sim.api import default_trace_path
        path = default_trace_path()
        if not (Path(path) / "manifest.json").is_file():
            raise ValueError(f"--trace: the bundled trace {path} is missing (run `make capture`) ; pass --trace PATH")
    elif not Path(path).exists():
        raise ValueError(f"--trace {path}: no such directory")
    return str(path)


def _trace_model_note(summaries) -> str:
    """The footnote for figures marked * (the trace model's own: sim.metrics.TRACE_MODEL_FIGURES)."""
    for m in summaries:
        if m.get("trace_model_figures"):
            return (f"* the trace model's own figures ({m.get('decisions_model')}), not {m.get('cost_model')}'s: "
                    "replay keeps its answers, confidences, entropies and generation lengths")
    return ""


def _fmt_table(policies: dict):
    import pandas as pd
    df = pd.DataFrame({k: {c: v.get(c) for c in TABLE_COLS} for k, v in policies.items()}).T
    df = df.apply(pd.to_numeric, errors="coerce")
    if "peak_kv_bytes" in df:
        df["peak_kv_MB"] = df.pop("peak_kv_bytes") / 1e6
    if "kv_capacity_bytes" in df:
        # the KV capacity each policy ran under (block and token policies: the budget too)
        df["kv_capacity_GB"] = df.pop("kv_capacity_bytes") / 1e9
    marked = {k for v in policies.values() for k in (v.get("trace_model_figures") or [])}
    return df.rename(columns={c: c + "*" for c in df.columns if c in marked})


def _flagged(msg: str) -> str:
    """Prefix a library error with the command-line flag it is about."""
    if msg.startswith("unknown hardware preset") or msg.startswith("hardware preset"):
        flag = "--hardware"
    elif msg.startswith("unknown model preset") or msg.startswith("model preset"):
        flag = "--model-preset"
    elif msg.startswith("unknown policy"):
        flag = "--policy"
    elif msg.startswith("workload option"):
        flag = "--workload"
    elif msg.startswith("arrival_rate"):
        flag = "--arrival-rate"
    elif msg.startswith("mode"):
        flag = "--mode"
    elif msg.startswith("reshape: "):
        return "--reshape: " + msg[len("reshape: "):]
    elif msg.startswith("policy '"):
        flag = "--set"
    elif msg.startswith("--") or msg.startswith("problem "):
        return msg
    else:
        return msg
    return f"{flag}: {msg}"


def _cmd_simulate(args) -> int:
    from sim.api import simulate
    from sim.decisions import ConfigError
    from sim.profiles import PresetError
    from sim.metrics import clean

    trace = _check_trace(args.trace)
    params = parse_sets(args.sets, "--set")
    sv, wl, rate = serving_options(args)
    workload = {**_workload(args), **wl}
    if args.mode != "serving" and wl:
        raise ValueError(f"--{'requests' if 'n_requests' in wl else 'concurrency'}: only with --mode serving")
    try:
        r = simulate(trace, policy=args.policy, params=params, model_preset=args.model_preset,
                     hardware=args.hardware, mode=args.mode, workload=workload, seed=args.seed,
                     arrival_rate=rate, engine=args.engine, serving=sv, reshape=getattr(args, "reshape", None))
    except (ConfigError, PresetError) as exc:
        raise ValueError(_flagged(str(exc))) from None
    if args.json:
        print(json.dumps(r.to_json_dict(), indent=2, sort_keys=True))
    else:
        import pandas as pd
        s = clean(r.summary)
        print(f"{args.policy} on {r.info['cost_model']} / {r.info['hardware']} ({args.mode}); {r.info['note']}; "
              f"verify_reuses_kv={r.info['verify_reuses_kv']}")
        marked = set(s.get("trace_model_figures") or [])
        print(pd.Series({k + ("*" if k in marked else ""): v for k, v in s.items()
                         if not isinstance(v, (dict, list))}).to_string())
        if marked:
            print(_trace_model_note([s]))
    return 0


def _cmd_serve(args) -> int:
    return _cmd_simulate(args)


def run_compare(trace, model_preset, hardware, mode="isolated", workload=None, seed=0, policies=None,
                progress=True, reshape=None) -> dict:
    from sim.api import compare_policies
    from sim.decisions import ConfigError
    from sim.profiles import PresetError
    try:
        return compare_policies(trace, model_preset=model_preset, hardware=hardware, mode=mode, workload=workload,
                                seed=seed, policies=policies, progress=progress, reshape=reshape)
    except (ConfigError, PresetError) as exc:
        raise ValueError(_flagged(str(exc))) from None


def _cmd_compare(args) -> int:
    trace = _check_trace(args.trace)
    pols = None
    if args.policies:
        from policies import list_policies
        pols = [p.strip() for p in args.policies.split(",") if p.strip()]
        bad = [p for p in pols if p not in list_policies()]
        if bad:
            raise ValueError(f"--policies: unknown policy {bad[0]!r}; valid: {', '.join(list_policies())}")
    out = run_compare(trace, args.model_preset, args.hardware, args.mode, _workload(args), args.seed, pols,
                      progress=not args.json and sys.stderr.isatty(), reshape=args.reshape)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        import pandas as pd
        with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
            print(_fmt_table(out["policies"]).to_string())
        note = _trace_model_note(out["policies"].values())
        if note:
            print(note)
    return 0


def _cmd_demo(args) -> int:
    import pandas as pd

    from app.report import write_report
    from sim.api import simulate

    trace = _check_trace(args.trace)
    out_dir = Path(args.out)
    t0 = time.perf_counter()
    results = {}
    for model, hw in DEMO_TARGETS:
        label = f"{model or 'trace model'} on {hw}"
        comp = run_compare(trace, model, hw, seed=args.seed, progress=sys.stderr.isatty())
        results[label] = {"model": model, "hardware": hw, "compare": comp}
        any_m = next((m for m in comp["policies"].values() if m.get("decisions_model")), {})
        print(f"\n== {label} (isolated; verify_reuses_kv=True; decisions from the trace's model "
              f"{any_m.get('decisions_model', '?')}, costs from {any_m.get('cost_model', '?')} on {hw})")
        with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
            print(_fmt_table(comp["policies"]).to_string())
        note = _trace_model_note(comp["policies"].values())
        if note:
            print(note)
    # Detail runs for the figures (the first target).
    details = {}
    for pol in ("no-kv", "exact-prefix", "asks", "cgee", "rksc", "lru", "rsbcm"):
        details[pol] = simulate(trace, policy=pol, hardware=DEMO_TARGETS[0][1], model_preset=DEMO_TARGETS[0][0],
                                seed=args.seed)
    path = write_report(out_dir / "report.html", trace, results, details)
    print(f"\nwrote {path} in {time.perf_counter() - t0:.1f} s")
    return 0


def _cmd_tree(args) -> int:
    from sim.profiles import PresetError
    from sim.tree import compare_tree

    trace = _check_trace(args.trace)
    frac = 0.5 if args.budget_blocks is None and args.budget_frac is None else args.budget_frac
    try:
        df = compare_tree(trace, budget_blocks=args.budget_blocks, budget_frac=frac, model_preset=args.model_preset,
                          hardware=args.hardware, tree=args.tree, block_size=args.block_size)
    except PresetError as exc:
        raise ValueError(_flagged(str(exc))) from None
    if args.json:
        from sim.metrics import clean
        print(json.dumps(clean({"policies": df.to_dict(orient="index")}), indent=2, sort_keys=True))
    else:
        import pandas as pd
        r = df.iloc[0]
        print(f"tree {r['tree']} ({r['n_nodes']} nodes), budget {r['budget_blocks']} blocks of {r['block_size']} tokens; "
              f"costs: {r['cost_model']} on {r['hardware']}")
        cols = ["latency_s", "latency_vs_rsbcm", "verify_s", "prefill_s", "decode_s", "recompute_s", "evictions",
                "refetches", "recompute_tokens", "peak_blocks", "peak_kv_bytes"]
        with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
            print(df[cols].to_string())
    return 0
