"""``rksim dashboard`` (the Streamlit workbench) and ``rksim policies`` (the policy library as a table)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from app.params import arg_type, port, seed

APP = Path(__file__).resolve().parent / "dashboard.py"


def register(sub) -> None:
    p = sub.add_parser("dashboard", help="start the dashboard (Streamlit) on this machine",
                       description="Serve the rksim workbench (What-if, Serving, Trace explorer, Sweeps, "
                                   "Calibration, Compare) with Streamlit. It reads only traces, sweeps and "
                                   "calibration folders found under the trace roots.")
    p.add_argument("--trace-root", action="append", default=None, metavar="DIR",
                   help="folder searched for traces, sweep Parquet files and calibration folders; repeatable "
                        "(default: the bundled examples/ and ./runs)")
    p.add_argument("--port", type=arg_type(port, "--port"), default=8501, metavar="N",
                   help="TCP port (default 8501)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    p.set_defaults(func=_cmd_dashboard)

    p = sub.add_parser("policies", help="every policy with its kind and parameters (defaults, ranges, choices)",
                       description="List the policy registry: each policy's kind, and each parameter's default, "
                                   "allowed range (the policy's own checks) or choices.")
    p.add_argument("--kind", default=None, choices=("sharing", "exit", "block", "token", "composite"),
                   help="only policies of this kind (default: all)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="a trace: layer parameters are stated in its model's layers (default: none)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_policies)

    _register_reproduce(sub)


def _register_reproduce(sub) -> None:
    p = sub.add_parser("reproduce", help="every headline claim of the RKSC and VASE papers, with a verdict",
                       description="One row per claim of DESIGN §7: the paper's figure, rksim's figure simulated "
                                   "for the paper's model and hardware target, rksim's figure measured on the real "
                                   "module (calibrate runs under --measured), the source, and a verdict. Writes "
                                   "claims.json, report.md and a self-contained report.html (plotly) into --out; "
                                   "the same inputs give the same files byte for byte.")
    p.add_argument("--traces", nargs="+", default=None, metavar="DIR",
                   help="trace folders, or folders of them (default: examples/reproduce)")
    p.add_argument("--measured", default=None, metavar="DIR",
                   help="folder of real-module runs: */speedup.json (calibrate speedup), */quality.json "
                        "(calibrate quality) (default: docs/reproduction/measured)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (e.g. docs/reproduction/)")
    from app.cli_sim import renamed_argument
    renamed_argument(p, "--reshape-seed", "--seed", type=arg_type(seed, "--reshape-seed"), default=0,
                     help="seed of the reshaped problems' draws (default 0)")
    p.add_argument("--quick", action="store_true",
                   help="a first look: a 2x2x2 shape grid and a 2,048-token, 16-request VASE serving run "
                        "(the rows say so)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the claim rows as JSON")
    p.set_defaults(func=_cmd_reproduce)


def _cmd_reproduce(args) -> int:
    from app.reproduce import DEFAULT_MEASURED, Reproducer, ReproduceConfig, discover
    from app.reproduce_report import write_report
    traces, missing = discover(args.traces)
    if not traces:
        raise ValueError("--traces: no complete trace found (kept manifests only: run `make reproduce-traces`)")
    measured = Path(args.measured) if args.measured else DEFAULT_MEASURED
    if args.measured and not measured.is_dir():
        raise ValueError(f"--measured {args.measured!r}: no such folder")
    cfg = ReproduceConfig(traces=traces, measured=measured, expected=missing, seed=args.reshape_seed)
    if args.quick:
        cfg = cfg.quick()
    res = Reproducer(cfg, progress=not args.no_progress).run()
    paths = write_report(res, Path(args.out))
    if args.json:
        print(json.dumps(res["rows"], indent=1))
    else:
        for r in res["rows"]:
            print(f"{r['verdict']:<20} {r['claim']}")
        print(f"wrote {paths['markdown']}, {paths['html']}, {paths['claims']}")
    return 0


def streamlit_argv(roots: list[str] | None, port_: int, host: str) -> list[str]:
    """The ``streamlit run`` command line (the roots travel as the script's own arguments)."""
    argv = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port_),
            "--server.address", host, "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal"]
    if roots:
        argv.append("--")
        for r in roots:
            argv += ["--trace-root", r]
    return argv


def _cmd_dashboard(args) -> int:
    roots = None
    if args.trace_root:
        roots = []
        for r in args.trace_root:
            if not Path(r).is_dir():
                raise ValueError(f"--trace-root {r!r}: no such folder")
            roots.append(str(Path(r).resolve()))
    env = dict(os.environ)
    # the app's modules resolve from this checkout even when rksim runs from another folder
    root = str(APP.parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    print(f"rksim dashboard on http://{args.host}:{args.port}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
    argv = streamlit_argv(roots, args.port, args.host)
    # Streamlit replaces this process: a signal to `rksim dashboard` reaches the server itself.
    os.execve(argv[0], argv, env)
    return 0  # pragma: no cover


def domain_text(lo, hi) -> str:
    """``[0, 1]`` / ``[1, inf)`` text of a parameter's domain (``PolicyBase.domains``)."""
    if lo is None and hi is None:
        return "any number"
    return f"[{'-inf' if lo is None else f'{lo:g}'}, {'inf)' if hi is None else f'{hi:g}]'}"


def policy_rows(kind: str | None = None, n_layers: int | None = None) -> list[dict]:
    """One row per (policy, parameter that acts on it): default, unit, domain, the policy's enforced range or
    choices, and a note (policies with no parameter get one row).

    ``n_layers``: the depth of a trace's model, which a layer parameter (``l_min``) counts in.
    """
    from policies import param_applies, param_domains
    from app.ui_backend import param_ranges, policy_table, range_text

    rows = []
    for pol in policy_table():
        if kind is not None and pol["kind"] != kind:
            continue
        ranges = param_ranges(pol["name"])
        doms = param_domains(pol["name"])
        keys = param_applies(pol["name"])
        if not keys:
            why = "" if not pol["defaults"] else " (evicts nothing: no eviction parameter acts)"
            rows.append({"policy": pol["name"], "kind": pol["kind"], "parameter": "", "default": "", "unit": "",
                         "domain": "", "allowed": "(no parameters)", "note": why.strip(" ()")})
            continue
        for k in keys:
            d = pol["defaults"][k]
            lo, hi, unit, note = doms.get(k, (None, None, "", ""))
            if unit == "layer":
                if n_layers is not None:
                    unit, hi = f"layer of the trace's {n_layers}-layer model", n_layers
                else:
                    unit = "layer index (1 = first)"
            allowed = " | ".join(pol["choices"][k]) if k in pol["choices"] else range_text(ranges.get(k)) or "any"
            allowed = "any number" if allowed == "(-inf, inf)" else allowed
            dom = " | ".join(pol["choices"][k]) if k in pol["choices"] else (
                "true | false" if isinstance(d, bool) else domain_text(lo, hi) if k in doms else allowed)
            rows.append({"policy": pol["name"], "kind": pol["kind"], "parameter": k, "default": d, "unit": unit,
                         "domain": dom, "allowed": allowed, "note": note})
    return rows


def _cmd_policies(args) -> int:
    n_layers = None
    if args.trace is not None:
        from traces.store import load_trace
        try:
            n_layers = int(load_trace(args.trace, verify=False).n_layers)
        except (OSError, ValueError) as exc:  # traces.errors.TraceError is a ValueError
            raise ValueError(f"--trace {args.trace!r}: {str(exc).splitlines()[0]}") from None
    rows = policy_rows(args.kind, n_layers)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    import pandas as pd

    df = pd.DataFrame(rows)
    df["default"] = df["default"].map(lambda v: "none" if v is None else str(v))
    with pd.option_context("display.width", 250, "display.max_rows", 1000, "display.max_colwidth", 70):
        print(df.to_string(index=False))
    print("domain: where values differ in effect; allowed: what the policy's own checks accept")
    return 0
