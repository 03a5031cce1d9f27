"""A day of traffic: 100,000 ShareGPT-like requests at a Poisson rate near the knee, on one H100 target.

Usage::

    .venv/bin/python bench/bench_day.py --out runs/bench [--num-prompts 100000] [--side-by-side 10000]

The lengths: the 300 (input, output) pairs of LLMServingSim's ShareGPT trace (``sd_in`` / ``sd_out`` in
``docs/validation/published-figures.yaml``, read here as a workload only, never as a fit input: that
file's source line names the trace and its commit), resampled with replacement to ``--num-prompts``
requests (``numpy.random.default_rng(--seed)``) and written as a ``--dataset-path`` CSV under ``--out``.

The rate: ``--load`` (default 0.9) times the saturated request throughput of the first 2,000 of those
requests sent at once (``bench serve --request-rate inf``, the same target): near the knee of the
latency-rate curve, below the rate at which queues grow without bound.

Then, in child processes (``bench/bench_fastforward.py``'s ``run_child``: CPU time of the command itself,
imports excluded, Python's bytecode cache on (the saturation probe, run first, warms it); wall time; peak
resident memory):

* ``day``: ``rksim bench serve`` on all ``--num-prompts`` requests (the default fast path);
* ``side_by_side``: the first ``--side-by-side`` requests, fast vs ``--step-by-step`` (their printed
  results must be identical; the benchmark fails otherwise).

Writes ``DIR/day.json``. Goals: the day under 30 s of CPU on one core and under 1 GB resident.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from bench_fastforward import run_child  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "validation" / "published-figures.yaml"
TARGET = ["--model-preset", "llama-3-8b", "--hardware", "h100-sxm"]
GOAL_CPU_S, GOAL_RSS_MB = 30.0, 1024.0


def write_lengths(path: Path, n: int, seed: int) -> dict:
    """``n`` (input, output) pairs resampled from the ShareGPT trace's 300, as a CSV; their means."""
    from traces.store import atomic_write_text
    doc = yaml.safe_load(FIGURES.read_text())
    inp, out = np.asarray(doc["sd_in"], np.int64), np.asarray(doc["sd_out"], np.int64)
    idx = np.random.default_rng(seed).integers(0, len(inp), n)
    i, o = inp[idx], np.maximum(out[idx], 1)   # vllm bench serve asks for at least one output token
    atomic_write_text(path, "input_len,output_len\n" + "".join(f"{a},{b}\n" for a, b in zip(i.tolist(), o.tolist())))
    return {"requests": n, "mean_input": float(i.mean()), "mean_output": float(o.mean()), "seed": seed}


def _serve(csv: Path, rate, n: int, extra=()) -> dict:
    return run_child(["bench", "serve", *TARGET, "--dataset-path", str(csv), "--num-prompts", str(n),
                      "--request-rate", str(rate), "--save-result", "--result-dir", str(csv.parent),
                      "--result-filename", f"day-{n}-{rate}{'-step' if extra else ''}.json", *extra])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--num-prompts", type=int, default=100_000)
    ap.add_argument("--side-by-side", type=int, default=10_000, help="requests run fast and step by step")
    ap.add_argument("--load", type=float, default=0.9, help="rate as a share of the saturated throughput")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    work = a.out / "day"
    work.mkdir(parents=True, exist_ok=True)
    csv = work / "sharegpt-lengths.csv"
    lengths = write_lengths(csv, a.num_prompts, a.seed)
    probe = min(2000, a.num_prompts)
    sat = _serve(csv, "inf", probe)
    sat_rps = json.loads((work / f"day-{probe}-inf.json").read_text())["request_throughput"]
    rate = round(a.load * sat_rps, 1)
    res = {"what": "rksim bench serve, llama-3-8b on h100-sxm (vLLM serve defaults), ShareGPT-like lengths, "
           "Poisson arrivals; CPU time of the command (imports excluded; bytecode cache on, warmed by the probe)",
           "lengths": lengths,
           "saturated_rps": sat_rps, "saturation_probe_cpu_s": sat["cpu_s"], "load": a.load, "request_rate": rate,
           "goal_cpu_s": GOAL_CPU_S, "goal_maxrss_mb": GOAL_RSS_MB}
    day = _serve(csv, rate, a.num_prompts)
    r = json.loads((work / f"day-{a.num_prompts}-{rate}.json").read_text())
    res["day"] = {"cpu_s": day["cpu_s"], "wall_s": day["wall_s"], "maxrss_mb": day["maxrss_mb"],
                  "simulated_s": r["duration"], "request_throughput": r["request_throughput"],
                  "p99_ttft_ms": r["p99_ttft_ms"], "mean_tpot_ms": r["mean_tpot_ms"],
                  "iterations": r["rksim"]["iterations"], "preemptions": r["rksim"]["preemptions"]}
    print(f"day: {a.num_prompts} requests at {rate} req/s (0.9 x {sat_rps:.1f} saturated): CPU {day['cpu_s']:.1f} s, "
          f"wall {day['wall_s']:.1f} s, RSS {day['maxrss_mb']:.0f} MB, {r['duration']:.0f} s simulated")
    n = min(a.side_by_side, a.num_prompts)
    if n > 0:
        fast, step = _serve(csv, rate, n), _serve(csv, rate, n, ["--step-by-step"])
        # the saved results (every metric, the run's provenance) must be equal; the printed lines name the file
        same = (json.loads((work / f"day-{n}-{rate}.json").read_text())
                == json.loads((work / f"day-{n}-{rate}-step.json").read_text()))
        res["side_by_side"] = {"requests": n, "fast_cpu_s": fast["cpu_s"], "step_cpu_s": step["cpu_s"],
                               "ratio_cpu": step["cpu_s"] / fast["cpu_s"], "identical_output": same}
        print(f"side by side, {n} requests: fast {fast['cpu_s']:.1f} s, step {step['cpu_s']:.1f} s CPU, "
              f"ratio {step['cpu_s'] / fast['cpu_s']:.2f}x, identical: {same}")
        if not same:
            return 1
    res["meets_goal"] = res["day"]["cpu_s"] < GOAL_CPU_S and res["day"]["maxrss_mb"] < GOAL_RSS_MB
    from traces.store import atomic_write_text
    atomic_write_text(a.out / "day.json", json.dumps(res, indent=1))
    print(f"wrote {a.out / 'day.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
