"""``rksim simulate``, ``rksim compare`` and ``rksim demo`` (the simulator's commands)."""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

DEFAULT_HARDWARE = "local-cpu"
DEMO_TARGETS = ((None, "local-cpu"), ("qwen2.5-7b", "h100-sxm"))

# One parser for --set/--workload values, shared with the dashboard (app/params.py).
from app.params import parse_sets, parse_value  # noqa: E402,F401


def trace_arg(p) -> None:
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace directory (default: the bundled examples/trace-gsm8k-persona)")


def add_declared(p, cls, only=None, text: bool = False, rename: dict | None = None) -> None:
    """One flag per declared option of ``cls`` (``sim.base.options.option`` fields; ``only``: these names;
    ``rename``: field -> another flag spelling, same destination). A declared option's ``aliases`` are
    accepted too, each with a one-line deprecation warning on stderr (:func:`deprecating`).

    ``text``: the value stays text (parsed by :func:`declared_values`, errors naming the flag);
    else argparse converts it with the declared type.
    """
    import argparse

    from sim.base.options import declared
    for f, opt in declared(cls):
        if opt.flag is None or (only is not None and f.name not in only):
            continue
        flag = (rename or {}).get(f.name, opt.flag)
        names = [flag] + [a for a in opt.aliases if a != flag]
        helptext = opt.help + (f" (also {', '.join(names[1:])}: deprecated)" if len(names) > 1 else "")
        kw = {"dest": dest(flag), "metavar": opt.metavar, "help": helptext}
        if opt.choices is not None:
            kw.update(choices=opt.choices, metavar=opt.metavar)
        if opt.kind is bool:  # a switch: off by default
            p.add_argument(*names, action=deprecating(argparse._StoreTrueAction, flag, names[1:]), dest=kw["dest"],
                           help=helptext)
            continue
        if text:
            kw["default"] = None
        else:
            kw["default"] = f.default
            if opt.kind in (int, float) and opt.choices is None:
                kw["type"] = opt.kind
        p.add_argument(*names, action=deprecating(argparse._StoreAction, flag, names[1:]), **kw)


def deprecating(action, flag: str, old) -> type:
    """``action`` that warns in one line on stderr when the flag is spelt one of its deprecated ``old`` names."""
    if not old:
        return action

    class Deprecated(action):
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string in old:
                warn_renamed(option_string, flag)
            super().__call__(parser, namespace, values, option_string)
    return Deprecated


def warn_renamed(old: str, new: str) -> None:
    """The one-line warning for a deprecated spelling (kept for one release)."""
    print(f"rksim: warning: {old} is deprecated; use {new}", file=sys.stderr)


def renamed_argument(p, flag: str, old: str, **kw) -> None:
    """A hand-declared flag with a deprecated old spelling (``add_argument(flag, old, ...)`` that warns on ``old``)."""
    import argparse
    store_true = kw.pop("action", None) == "store_true"
    base = argparse._StoreTrueAction if store_true else argparse._StoreAction
    kw["help"] = kw.get("help", "") + f" (also {old}: deprecated)"
    p.add_argument(flag, old, action=deprecating(base, flag, (old,)), **kw)


def dest(flag: str) -> str:
    """The argparse attribute of a flag (``--model-preset`` -> ``model_preset``)."""
    return flag.lstrip("-").replace("-", "_")


def declared_values(args, cls, only=None) -> dict:
    """The declared options of ``cls`` given as text flags, parsed and checked (errors name the flag)."""
    from sim.base.options import check_value, declared
    out = {}
    for f, opt in declared(cls):
        if only is not None and f.name not in only:
            continue
        text = getattr(args, dest(opt.flag), None) if opt.flag is not None else None
        if text is None:
            continue
        v = text if opt.kind is str or not isinstance(text, str) else _num(opt.flag, text, opt.kind)
        out[f.name] = check_value(opt.flag, opt, v)  # a ConfigError (a ValueError) naming the flag
    return out


def _target_args(p) -> None:
    from sim.replay.runconfig import RunConfig
    from sim.replay.target import TargetSpec
    add_declared(p, TargetSpec)
    add_declared(p, RunConfig, only=("mode",))
    add_declared(p, RunConfig, only=("router",))
    workload_arg(p)
    add_declared(p, RunConfig, only=("seed",))
    _reshape_arg(p)


def workload_arg(p) -> None:
    p.add_argument("--workload", action="append", default=[], metavar="KEY=VALUE",
                   help="workload option, repeatable (verify_reuses_kv, block_size, kv_budget_frac, batching, ...; "
                        "see docs/simulator.md; default: the defaults listed there)")


def _calibration_args(p) -> None:
    """A fitted profile's limits: its host and its fitted range (sim.cost.fingerprint, sim.cost.ranges; RunConfig's declarations)."""
    from sim.replay.runconfig import RunConfig
    add_declared(p, RunConfig, only=("strict", "allow_extrapolation", "step_by_step"))


def _reshape_arg(p) -> None:
    p.add_argument("--reshape", default=None, metavar="SPEC",
                   help="replay the trace's problems reshaped, prefix_tokens=N,branches=B,gen_tokens=T[,seed=S]: "
                        "root prompt N tokens, B branches, generation cap T, draws seeded by S; omitted keys keep the trace's own (docs/simulator.md, Workload reshaping; "
                        "default: the trace's own shape)")


def serving_args(p, with_mode: bool = True) -> None:
    """The one set of serving flags (``serve``, ``simulate``/``compare``/``sweep``/``tune`` ``--mode serving``).

    Declared once: the load (``RunConfig.arrival_rate`` or ``Workload.concurrency``, exclusive; and
    ``Workload.n_requests``) and the server (``sim.serving.capacity.ServingConfig``). ``with_mode``: the command has a
    ``--mode`` and the group's title says these apply under ``--mode serving``.
    """
    from sim.serving.capacity import ServingConfig
    from sim.replay.runconfig import RunConfig
    from sim.workload.config import Workload
    g = p.add_argument_group("serving (with --mode serving)" if with_mode else "serving")
    x = g.add_mutually_exclusive_group()
    add_declared(x, RunConfig, only=("arrival_rate",), text=True)
    add_declared(x, Workload, only=("concurrency",), text=True)
    add_declared(g, Workload, only=("n_requests",), text=True)
    add_declared(g, ServingConfig, text=True)


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
    """``(serving settings, workload additions, arrival_rate)`` from the serving flags (:func:`serving_args`)."""
    from sim.serving.capacity import ServingConfig
    from sim.replay.runconfig import RunConfig
    from sim.workload.config import Workload
    sv = declared_values(args, ServingConfig)
    wl = declared_values(args, Workload)
    return sv, wl, declared_values(args, RunConfig, only=("arrival_rate",)).get("arrival_rate")


def workload_options(args) -> dict:
    """``--workload KEY=VALUE`` items and the serving flags' workload options; a key with a flag of its own
    given as ``--workload`` is deprecated (one line naming the flag), and the flag wins."""
    from sim.base.options import declared
    from sim.workload.config import Workload
    wl = parse_sets(args.workload or [], "--workload")
    flags = {f.name: opt.flag for f, opt in declared(Workload) if opt.flag is not None}
    for k in wl:
        if k in flags:
            warn_renamed(f"--workload {k}=...", flags[k])
    own = serving_options(args)[1] if hasattr(args, dest(flags["n_requests"])) else {}
    if getattr(args, "mode", "serving") != "serving" and own:
        flag = flags["n_requests" if "n_requests" in own else "concurrency"]
        raise ValueError(f"{flag}: only with --mode serving")
    return {**wl, **own}


def flagged(exc) -> str:
    """A simulator error as the CLI says it: the flag of the error's field, then the message."""
    from sim.serving.capacity import ServingConfig
    from sim.base.options import flag_for
    from sim.replay.runconfig import RunConfig
    from sim.replay.target import TargetSpec
    msg = str(exc)
    field = getattr(exc, "field", None)
    from sim.workload.config import Workload
    flag = "--reshape" if field == "reshape" else flag_for(field, RunConfig, TargetSpec, ServingConfig, Workload)
    if flag is None or msg.startswith(flag):
        return msg
    return f"{flag}: {msg.removeprefix(field + ': ') if field in ('reshape',) else msg}"


def register(sub) -> None:
    from sim.replay.runconfig import RunConfig
    p = sub.add_parser("simulate", help="simulate one policy on a trace for a model and hardware",
                       description="Replay a trace under one policy through the cost model and simulator "
                                   "(docs/simulator.md).")
    trace_arg(p)
    p.add_argument("--policy", required=True, help="policy registry name (see `rksim compare`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="policy parameter, repeatable (e.g. --set tau=0.8; default: the policy's defaults, see `rksim policies`)")
    _target_args(p)
    add_declared(p, RunConfig, only=("slo",))
    p.add_argument("--engine", action="store_true", help="use the simpy engine in isolated mode too")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _calibration_args(p)
    serving_args(p)
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("serve", help="serve one policy at the target's KV capacity (vLLM-style scheduler)",
                       description="Serving mode at capacity: problems arrive (Poisson or closed loop), a vLLM V1 "
                                   "scheduler batches them, KV memory is the target's real capacity "
                                   "(docs/simulator.md, 'Serving at capacity').")
    trace_arg(p)
    p.add_argument("--policy", required=True, help="policy registry name (see `rksim compare`)")
    p.add_argument("--set", action="append", default=[], metavar="K=V", dest="sets",
                   help="policy parameter, repeatable (e.g. --set tau=0.8; default: the policy's defaults, see `rksim policies`)")
    from sim.replay.runconfig import RunConfig
    from sim.replay.target import TargetSpec
    add_declared(p, TargetSpec)
    add_declared(p, RunConfig, only=("router", "slo"))
    workload_arg(p)
    add_declared(p, RunConfig, only=("seed",))
    _reshape_arg(p)
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _calibration_args(p)
    serving_args(p, with_mode=False)
    p.set_defaults(func=_cmd_serve, mode="serving", engine=False)

    p = sub.add_parser("compare", help="every policy at its defaults on one trace and target",
                       description="Compare every registered policy on a trace (JSON: {\"policies\": {NAME: {...}}}).")
    trace_arg(p)
    _target_args(p)
    p.add_argument("--policies", default=None, metavar="NAME,NAME", help="comma list of policies (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    serving_args(p)
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("demo", help="compare on the bundled trace for two targets; write runs/demo/report.html",
                       description="`make run`: compare every policy on the bundled trace for local-cpu and for "
                                   "qwen2.5-7b on h100-sxm, print the tables, write an HTML report.")
    trace_arg(p)
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="output directory (default runs/demo)")
    add_declared(p, RunConfig, only=("seed",))
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("tree", help="RSBCM vs LRU vs FIFO on a trace's tree search under a KV block budget",
                       description="Replay the trace's tree (trees/tNNNNN) with each block policy under one budget "
                                   "(sim/replay/tree.py, docs/simulator.md 'Tree search (RSBCM)').")
    trace_arg(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-frac", type=float, default=None, metavar="F",
                   help="budget = round(F x the unconstrained peak blocks), at least 1 (default 0.5)")
    g.add_argument("--budget-blocks", type=int, default=None, metavar="N", help="budget in blocks (default: from --budget-frac)")
    p.add_argument("--tree", type=int, default=0, metavar="I", help="tree index in the trace (default 0)")
    p.add_argument("--block-size", type=int, default=16, metavar="T", help="tokens per KV block (default 16)")
    add_declared(p, TargetSpec, only=("model", "hardware"))  # one problem's tree on one GPU
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_tree)


def check_trace(path):
    if path is None:
        from sim.api import default_trace_path
        path = default_trace_path()
        if not (Path(path) / "manifest.json").is_file():
            raise ValueError(f"--trace: the bundled trace {path} is missing (run `make capture`) ; pass --trace PATH")
    elif not Path(path).exists():
        raise ValueError(f"--trace {path}: no such directory")
    return str(path)


def _cmd_simulate(args) -> int:
    from sim.api import simulate
    from sim.base.errors import ConfigError
    from sim.replay.problem_metrics import clean
    from app.tables import trace_model_note

    trace = check_trace(args.trace)
    params = parse_sets(args.sets, "--set")
    sv, _, rate = serving_options(args)
    workload = workload_options(args)
    try:
        r = simulate(trace, policy=args.policy, params=params, model_preset=args.model_preset,
                     hardware=args.hardware, mode=args.mode, workload=workload, seed=args.sim_seed,
                     arrival_rate=rate, engine=args.engine, serving=sv, reshape=getattr(args, "reshape", None),
                     strict=args.strict, allow_extrapolation=args.allow_extrapolation,
                     router=args.router, slo=args.slo, step_by_step=args.step_by_step, **deployment_kwargs(args))
    except ConfigError as exc:
        raise ValueError(flagged(exc)) from None
    for line in [r.info.get("host_note")] + list(r.info.get("extrapolated") or []):
        if line:
            print(f"rksim: note: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(r.to_json_dict(), indent=2, sort_keys=True))
    else:
        import pandas as pd
        s = clean(r.summary)
        print(f"{args.policy} on {r.info['cost_model']} / {r.info['hardware']} ({args.mode}); {r.info['note']}; "
              f"verify_reuses_kv={r.info['verify_reuses_kv']}")
        from app.tables import fmt_ci
        from sim.replay.intervals import SUFFIX
        ci = clean(r.intervals())
        marked = set(s.get("trace_model_figures") or [])
        print(pd.Series({k + ("*" if k in marked else ""): (fmt_ci(v, ci[k + SUFFIX]) if ci.get(k + SUFFIX) else v)
                         for k, v in s.items() if not isinstance(v, (dict, list))}).to_string())
        if ci:
            print("[lo, hi]: 95% intervals over the problems (Wilson for rates, paired bootstrap for ratios)")
        if s.get("request_ttft_p50_s") is not None:
            print("ttft_*, e2e_*, queue_*, tpot_*: per problem (B branch requests; its TTFT the mean over its "
                  "branches); request_*: per request (one branch), as vllm bench serve reports them")
        if marked:
            print(trace_model_note([s]))
        print_replicas(s)
    return 0


def deployment_kwargs(args) -> dict:
    """The deployment flags (``sim.replay.target.TargetSpec``'s node and parallel sizes) as ``simulate`` keywords."""
    from sim.base.options import declared
    from sim.replay.target import TargetSpec
    return {f.name: getattr(args, dest(opt.flag)) for f, opt in declared(TargetSpec)
            if f.name not in ("model", "hardware") and hasattr(args, dest(opt.flag))}


def print_replicas(s: dict) -> None:
    """Per-replica metrics (and goodput under the SLO) as a table, when the run has them."""
    per = s.get("per_replica")
    if not per:
        return
    import pandas as pd
    cols = ["replica", "problems", "throughput_tokens_per_s", "throughput_problems_per_s", "goodput_problems_per_s",
            "slo_attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "e2e_p99_s", "prefix_hit_rate",
            "preemptions", "gpu_utilisation"]
    df = pd.DataFrame(per)
    df = df[[c for c in cols if c in df.columns]].set_index("replica")
    print(f"\nper replica (router {s.get('router', '-')}, SLO {s.get('slo') or 'none'}):")
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(df.to_string())


def _cmd_serve(args) -> int:
    return _cmd_simulate(args)


def run_compare(trace, model_preset, hardware, mode="isolated", workload=None, seed=0, policies=None,
                progress=True, reshape=None, **deployment) -> dict:
    """``compare_policies`` with its errors as the CLI says them; ``deployment``: its other keywords."""
    from sim.api import compare_policies
    from sim.base.errors import ConfigError
    try:
        return compare_policies(trace, model_preset=model_preset, hardware=hardware, mode=mode, workload=workload,
                                seed=seed, policies=policies, progress=progress, reshape=reshape, **deployment)
    except ConfigError as exc:
        raise ValueError(flagged(exc)) from None


def _cmd_compare(args) -> int:
    trace = check_trace(args.trace)
    pols = None
    if args.policies:
        from policies import list_policies
        pols = [p.strip() for p in args.policies.split(",") if p.strip()]
        bad = [p for p in pols if p not in list_policies()]
        if bad:
            raise ValueError(f"--policies: unknown policy {bad[0]!r}; valid: {', '.join(list_policies())}")
    sv, _, rate = serving_options(args)
    out = run_compare(trace, args.model_preset, args.hardware, args.mode, workload_options(args), args.sim_seed, pols,
                      progress=not args.json and sys.stderr.isatty(), reshape=args.reshape, router=args.router,
                      serving=sv or None, arrival_rate=rate, **deployment_kwargs(args))
    from sim.cost.fingerprint import host_fields
    from sim.cost.profiles import load_hardware
    note = host_fields(load_hardware(args.hardware))["host_note"]
    if note:
        print(f"rksim: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        from app.tables import print_table
        print_table(out["policies"])
    return 0


def _cmd_demo(args) -> int:
    from app.report import write_report
    from app.tables import HEADLINE_WIDTH, print_headline, wrap
    from sim.api import simulate

    from sim.cost.fingerprint import profile_line
    from sim.cost.profiles import load_hardware

    trace = check_trace(args.trace)
    out_dir = Path(args.out)
    t0 = time.perf_counter()
    # does the shipped CPU profile belong to this host?
    print(wrap(profile_line(load_hardware(DEMO_TARGETS[0][1])), HEADLINE_WIDTH))
    results = {}
    for model, hw in DEMO_TARGETS:
        label = f"{model or 'trace model'} on {hw}"
        comp = run_compare(trace, model, hw, seed=args.sim_seed, progress=sys.stderr.isatty())
        results[label] = {"model": model, "hardware": hw, "compare": comp}
        any_m = next((m for m in comp["policies"].values() if m.get("decisions_model")), {})
        print("\n" + wrap(f"== {label} (isolated; verify_reuses_kv=True; decisions from the trace's model "
                          f"{any_m.get('decisions_model', '?')}, costs from {any_m.get('cost_model', '?')} on {hw})",
                          HEADLINE_WIDTH))
        print_headline(comp["policies"])
    # Detail runs for the figures (the first target).
    details = {}
    for pol in ("no-kv", "exact-prefix", "asks", "cgee", "rksc", "lru", "rsbcm"):
        details[pol] = simulate(trace, policy=pol, hardware=DEMO_TARGETS[0][1], model_preset=DEMO_TARGETS[0][0],
                                seed=args.sim_seed)
    path = write_report(out_dir / "report.html", trace, results, details)
    print("\n" + wrap(f"every figure with its interval: {path} and `rksim compare --json` (one target per run)",
                      HEADLINE_WIDTH))
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s")
    return 0


def _cmd_tree(args) -> int:
    from sim.base.errors import PresetError
    from sim.cost.profiles import load_hardware, load_model
    from sim.replay.tree import compare_tree

    trace = check_trace(args.trace)
    for flag, load, name in (("--model-preset", load_model, args.model_preset), ("--hardware", load_hardware,
                                                                                   args.hardware)):
        try:
            if name is not None:
                load(name)
        except PresetError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    frac = 0.5 if args.budget_blocks is None and args.budget_frac is None else args.budget_frac
    try:
        df = compare_tree(trace, budget_blocks=args.budget_blocks, budget_frac=frac, model_preset=args.model_preset,
                          hardware=args.hardware, tree=args.tree, block_size=args.block_size)
    except PresetError as exc:
        raise ValueError(str(exc)) from None
    if args.json:
        from sim.replay.problem_metrics import clean
        print(json.dumps(clean({"policies": df.to_dict(orient="index")}), indent=2, sort_keys=True))
    else:
        import pandas as pd
        r = df.iloc[0]
        print(f"tree {r['tree']} ({r['n_nodes']} nodes), budget {r['budget_blocks']} blocks of {r['block_size']} tokens; "
              f"costs: {r['cost_model']} on {r['hardware']}")
        if r.get("kv_note"):
            print(f"note: {r['kv_note']}")
        cols = ["latency_s", "latency_vs_rsbcm", "verify_s", "prefill_s", "decode_s", "recompute_s", "evictions",
                "refetches", "recompute_tokens", "peak_blocks", "peak_kv_bytes"]
        with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
            print(df[cols].to_string())
    return 0
