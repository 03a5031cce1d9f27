"""``rksim dashboard`` (the Streamlit workbench) and ``rksim policies`` (the policy library as a table)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from app.params import arg_type, port

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
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_policies)


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


def policy_rows(kind: str | None = None) -> list[dict]:
    """One row per (policy, parameter): default, range or choices (policies with no parameter get one row)."""
    from app.ui_backend import param_ranges, policy_table, range_text

    rows = []
    for pol in policy_table():
        if kind is not None and pol["kind"] != kind:
            continue
        ranges = param_ranges(pol["name"])
        if not pol["defaults"]:
            rows.append({"policy": pol["name"], "kind": pol["kind"], "parameter": "", "default": "",
                         "allowed": "(no parameters)"})
        for k, d in pol["defaults"].items():
            allowed = " | ".join(pol["choices"][k]) if k in pol["choices"] else range_text(ranges.get(k)) or "any"
            rows.append({"policy": pol["name"], "kind": pol["kind"], "parameter": k, "default": d, "allowed": allowed})
    return rows


def _cmd_policies(args) -> int:
    rows = policy_rows(args.kind)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    import pandas as pd

    df = pd.DataFrame(rows)
    df["default"] = df["default"].map(lambda v: "none" if v is None else str(v))
    with pd.option_context("display.width", 200, "display.max_rows", 1000, "display.max_colwidth", 60):
        print(df.to_string(index=False))
    return 0
