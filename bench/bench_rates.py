"""A latency-rate curve: ``rksim bench sweep`` over 24 request rates of 2,000 requests each, on one H100 target.

Usage::

    .venv/bin/python bench/bench_rates.py --out runs/bench [--side-by-side | --no-side-by-side]

The sweep: llama-3-8b on h100-sxm (vLLM's serve defaults for the device), ``bench serve``'s random dataset
(1,024 prompt / 128 output tokens), 2,000 requests, Poisson arrivals at 1, 3, ..., 47 requests/s (past the
saturation rate, about 37 req/s), one seed: the curve ``rksim bench sweep`` prints and its knee. It runs in
a child process (``bench/bench_fastforward.py``'s ``run_child``: CPU time of the command itself, imports
excluded, bytecode cache on and warmed; wall time; peak resident memory), in this process's backend
(``--backend local``: the sweep's CPU on one core).

``--side-by-side`` (the default) runs the same sweep with ``--step-by-step`` too: the two saved curves must be
equal (the benchmark fails otherwise) and the ratio of their CPU times is reported.

Writes ``DIR/rates.json``. Goal (issue 32): the sweep under 20 s of CPU on one core.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import json  # noqa: E402

from bench_fastforward import run_child, warm_up  # noqa: E402

RATES = ",".join(str(r) for r in range(1, 48, 2))   # 24 rates
SWEEP = ["bench", "sweep", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "2000",
         "--no-progress"]
GOAL_CPU_S = 20.0


def _curve(out: Path) -> dict:
    """The saved curve without the run's own provenance (its date, its wall time)."""
    doc = json.loads((out / "latency-rate.json").read_text())
    for k in ("date", "wall_s", "elapsed_s"):
        doc.pop(k, None)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--side-by-side", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the sweep step by step (identical curve required; default on)")
    a = ap.parse_args(argv)
    work = a.out / "rates"
    warm_up(SWEEP[:-2] + ["20", "--no-progress", "--request-rate", "1,47"])
    fast = run_child(SWEEP + ["--request-rate", RATES, "--out", str(work / "fast")])
    res = {"what": "rksim bench sweep, llama-3-8b on h100-sxm (vLLM serve defaults), 2,000 x 1,024/128 random "
           "prompts at 24 Poisson rates 1..47 req/s, backend local; CPU time of the command (imports excluded; "
           "bytecode cache on, warmed)", "command": "rksim " + " ".join(SWEEP + ["--request-rate", RATES]),
           "goal_cpu_s": GOAL_CPU_S, "fast": {k: fast[k] for k in ("cpu_s", "wall_s", "maxrss_mb")},
           "curve_head": fast["out"].splitlines()[:3]}
    print(f"sweep, 24 rates x 2,000 requests: CPU {fast['cpu_s']:.1f} s, wall {fast['wall_s']:.1f} s, "
          f"RSS {fast['maxrss_mb']:.0f} MB")
    if a.side_by_side:
        step = run_child(SWEEP + ["--request-rate", RATES, "--out", str(work / "step"), "--step-by-step"])
        same = _curve(work / "fast") == _curve(work / "step")
        res["side_by_side"] = {"step_cpu_s": step["cpu_s"], "ratio_cpu": step["cpu_s"] / fast["cpu_s"],
                               "identical_curve": same}
        print(f"side by side: step {step['cpu_s']:.1f} s CPU, ratio {step['cpu_s'] / fast['cpu_s']:.2f}x, "
              f"identical: {same}")
        if not same:
            return 1
    res["meets_goal"] = fast["cpu_s"] < GOAL_CPU_S
    from traces.store import atomic_write_text
    atomic_write_text(a.out / "rates.json", json.dumps(res, indent=1))
    print(f"wrote {a.out / 'rates.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
