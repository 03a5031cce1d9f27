"""Interleaved A/B of one rksim command on two checkouts: CPU time of the command in child processes, medians.

Usage::

    .venv/bin/python bench/ab.py BASE_DIR NEW_DIR ROUNDS -- bench throughput --model-preset llama-3-8b ...

Each round runs the command once in ``BASE_DIR`` and once in ``NEW_DIR``, so the machine's drift falls on both
alike. Each run is ``bench/bench_fastforward.py``'s ``run_child`` with that checkout as its root (working directory,
first on the path, its own bytecode cache): ``app.cli``'s imports excluded, lazy imports inside ``main`` included
(a user's command pays them), after one untimed warm-up per checkout. The before/after tables in
``docs/benchmarks/fastforward.md`` come from it.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import statistics  # noqa: E402

from bench_fastforward import run_child  # noqa: E402


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
        run_child(args, root)   # warm-up: the bytecode cache, untimed
    times = {root: [] for root in roots}
    for _ in range(max(1, a.rounds)):
        for root in roots:
            times[root].append(run_child(args, root)["cpu_s"])
    med = [statistics.median(times[r]) for r in roots]
    for root, m in zip(roots, med):
        print(f"{root}: {', '.join(f'{x:.2f}' for x in times[root])} s CPU, median {m:.3f} s")
    print(f"new / base: {med[1] / med[0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
