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
              "recompute_tokens", "attn_output_rel_error", "attn_mass_recall"]


def parse_value(text: str):
    """A ``--set`` value: int, float, true/false, none, a comma list of those, else the string."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        v = float(t)
        if math.isfinite(v):
            return v
    except ValueError:
        pass
    if "," in t:
        return [parse_value(x) for x in t.split(",")]
    return t


def parse_sets(items, flag: str) -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ValueError(f"{flag} {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise ValueError(f"{flag} {it!r}: empty key")
        out[k] = parse_value(v)
    return out


def _trace_arg(p) -> None:
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace directory (default: the bundled examples/trace-gsm8k-persona)")


def _target_args(p) -> None:
    p.add_argument("--model-preset", default=None, metavar="X",
                   help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE, metavar="Y",
                   help=f"hardware preset name or YAML/JSON file (default {DEFAULT_HARDWARE})")
    p.add_argument("--mode", choices=("isolated", "serving"), default="isolated",
                   help="isolated: one problem at a time (per-problem latency); serving: arrivals and contention")
    p.add_argument("--workload", action="append", default=[], metavar="K=V",
                   help="workload option, repeatable (verify_reuses_kv, concurrency, block_size, kv_budget_frac, ...; "
                        "see docs/simulator.md)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and stochastic policies (default 0)")
    p.add_argument("--reshape", default=None, metavar="prefix_tokens=N,branches=B,gen_tokens=T[,seed=S]",
                   help="replay the trace's problems reshaped: root prompt N tokens, B branches, generation cap T, "
                        "draws seeded by S; omitted keys keep the trace's own (docs/simulator.md, Workload reshaping)")


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one policy on a trace for a model and hardware",
                       description="Replay a trace under one policy through the cost model and simulator "
                                   "(docs/simulator.md).")
    _trace_arg(p)
    p.add_argument("--policy", required=True, help="policy registry name (see `rksim compare`)")
    p.add_argument("--set", action="append", default=[], metavar="K=V", dest="sets",
                   help="policy parameter, repeatable (e.g. --set tau=0.8)")
    _target_args(p)
    p.add_argument("--arrival-rate", type=float, default=None, metavar="R",
                   help="serving mode: Poisson arrivals, problems/s (default: closed loop)")
    p.add_argument("--engine", action="store_true", help="use the simpy engine in isolated mode too")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("compare", help="every policy at its defaults on one trace and target",
                       description="Compare every registered policy on a trace (JSON: {\"policies\": {NAME: {...}}}).")
    _trace_arg(p)
    _target_args(p)
    p.add_argument("--policies", default=None, metavar="A,B", help="comma list of policies (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("demo", help="compare on the bundled trace for two targets; write runs/demo/report.html",
                       description="`make run`: compare every policy on the bundled trace for local-cpu and for "
                                   "qwen2.5-7b on h100-sxm, print the tables, write an HTML report.")
    _trace_arg(p)
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="output directory (default runs/demo)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("tree", help="RSBCM vs LRU vs FIFO on a trace's tree search under a KV block budget",
                       description="Replay the trace's tree (trees/tNNNNN) with each block policy under one budget "
                                   "(sim/tree.py, docs/simulator.md 'Tree search (RSBCM)').")
    _trace_arg(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-frac", type=float, default=None, metavar="F",
                   help="budget = round(F x the unconstrained peak blocks), at least 1 (default 0.5)")
    g.add_argument("--budget-blocks", type=int, default=None, metavar="N", help="budget in blocks")
    p.add_argument("--tree", type=int, default=0, metavar="I", help="tree index in the trace (default 0)")
    p.add_argument("--block-size", type=int, default=16, metavar="T", help="tokens per KV block (default 16)")
    p.add_argument("--model-preset", default=None, metavar="X",
                   help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE, metavar="Y",
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
    try:
        r = simulate(trace, policy=args.policy, params=params, model_preset=args.model_preset,
                     hardware=args.hardware, mode=args.mode, workload=_workload(args), seed=args.seed,
                     arrival_rate=args.arrival_rate, engine=args.engine, reshape=args.reshape)
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
