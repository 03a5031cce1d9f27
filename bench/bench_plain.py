"""Plain serving workloads: how long ``rksim bench serve`` of 1,000 prompts takes, end to end (goal: < 10 s on one core).

Usage::

    .venv/bin/python bench/bench_plain.py --out runs/bench [--repeats 3]

Each case runs the real command line (``python -m app.cli bench serve ...``) in a child process,
imports included, ``--repeats`` times, and records the median wall time and the median CPU time
of the child (user + system, ``resource.getrusage(RUSAGE_CHILDREN)``: the engine is single-threaded,
so CPU time is one core's time and not the neighbours' on a shared machine). Writes
``DIR/plain.json``.

Cases (llama-3-8b on h100-sxm, vLLM's serve defaults for the device, random dataset):

* ``burst_1024x128``: 1,000 prompts of 1,024 tokens, 128 output tokens (vllm bench serve's defaults),
  all sent at t = 0;
* ``poisson_2048x128``: 1,000 prompts of 2,048 / 128, Poisson at 8 requests/s;
* ``concurrency64_1024x512``: 1,000 prompts of 1,024 / 512, range ratio 0.5, at most 64 outstanding.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "1000"]
CASES = {
    "burst_1024x128": ["--random-input-len", "1024", "--random-output-len", "128"],
    "poisson_2048x128": ["--random-input-len", "2048", "--random-output-len", "128", "--request-rate", "8"],
    "concurrency64_1024x512": ["--random-input-len", "1024", "--random-output-len", "512", "--random-range-ratio",
                               "0.5", "--max-concurrency", "64"],
}
GOAL_S = 10.0


def _once(args: list[str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"rksim {' '.join(args)} failed: {p.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    res = {"goal_s": GOAL_S, "what": "rksim bench serve, 1,000 prompts, whole command (imports included)",
           "cases": {}}
    for name, extra in CASES.items():
        walls, cpus, out = [], [], ""
        for _ in range(max(1, a.repeats)):
            w, c, out = _once(BASE + extra)
            walls.append(w)
            cpus.append(c)
        prov = [ln for ln in out.splitlines() if ln.startswith("simulated:")]
        dur = [ln for ln in out.splitlines() if ln.startswith("Benchmark duration")]
        res["cases"][name] = {"command": "rksim " + " ".join(BASE + extra), "wall_s_median": statistics.median(walls),
                              "cpu_s_median": statistics.median(cpus), "wall_s": walls, "cpu_s": cpus,
                              "meets_goal": statistics.median(cpus) < GOAL_S,
                              "simulated_duration": dur[0].split(":")[1].strip() if dur else None,
                              "provenance": prov[0] if prov else None}
        print(f"{name:26s} cpu {statistics.median(cpus):6.2f} s  wall {statistics.median(walls):6.2f} s  "
              f"(goal < {GOAL_S:g} s)")
    a.out.mkdir(parents=True, exist_ok=True)
    from traces.store import atomic_write_text
    atomic_write_text(a.out / "plain.json", json.dumps(res, indent=1))
    print(f"wrote {a.out / 'plain.json'}")
    return 0 if all(c["meets_goal"] for c in res["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
