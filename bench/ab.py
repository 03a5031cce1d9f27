"""Interleaved A/B of one rksim command on two checkouts: CPU time of the command in child processes, medians.

Usage::

    .venv/bin/python bench/ab.py BASE_DIR NEW_DIR ROUNDS -- bench throughput --model-preset llama-3-8b ...

Each round runs the command once in ``BASE_DIR`` and once in ``NEW_DIR`` (each checkout's root is the child's
working directory and first on its path), so the machine's drift falls on both alike. A child imports
``app.cli`` first and times ``main`` with ``time.process_time``: imports at the top of ``app.cli`` are excluded,
lazy imports inside ``main`` are not (a user's command pays them). The children run with a fixed hash seed and
Python's bytecode cache on, under ``runs/pycache`` of each checkout, after one untimed warm-up run each. The
benchmark entries in ``docs/benchmarks/fastforward.md`` use it for their before/after tables.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import contextlib, io, json, sys, time
from app.cli import main
buf = io.StringIO()
c0 = time.process_time()
with contextlib.redirect_stdout(buf):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "cpu_s": time.process_time() - c0, "out": buf.getvalue()[-2000:]}))
"""


def run(root: Path, args: list[str]) -> float:
    """The command's CPU seconds in a child process run in checkout ``root``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONHASHSEED="0", PYTHONPATH=str(root), PYTHONPYCACHEPREFIX=str(root / "runs" / "pycache"))
    p = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=root, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{root}: rksim {' '.join(args)} failed: {p.stderr.strip()[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        raise SystemExit(f"{root}: rksim {' '.join(args)} exited {r['rc']}: {(r['out'] + p.stderr).strip()[-2000:]}")
    return float(r["cpu_s"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: bench/ab.py BASE_DIR NEW_DIR ROUNDS -- <rksim arguments>")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("rounds", type=int)
    a = ap.parse_args(argv[:cut])
    args = argv[cut + 1:]
    roots = [a.base.resolve(), a.new.resolve()]
    for root in roots:
        if not (root / "app" / "cli.py").is_file():
            raise SystemExit(f"{root}: not an rksim checkout (no app/cli.py)")
        run(root, args)   # warm-up: the bytecode cache, untimed
    times = {root: [] for root in roots}
    for _ in range(max(1, a.rounds)):
        for root in roots:
            times[root].append(run(root, args))
    med = [statistics.median(times[r]) for r in roots]
    for root, m in zip(roots, med):
        print(f"{root}: {', '.join(f'{x:.2f}' for x in times[root])} s CPU, median {m:.3f} s")
    print(f"new / base: {med[1] / med[0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
