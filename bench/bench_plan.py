"""A trace's problems served in windows: ``rksim plan`` and ``rksim serve`` fast vs ``--step-by-step``, side by side.

Usage::

    .venv/bin/python bench/bench_plan.py --out runs/bench [--num-problems 200] [--repeats 1]

The bundled trace's problems (SmolLM2's decisions: eight branches each, verified) priced for llama-3-8b on a
dgx-h100's H100s with vLLM's serve defaults (CUDA graphs, host time per step with async scheduling):

* ``plan_poisson``: ``rksim plan --gpus 4 --problem-rate 4`` -- 21 deployments (TP 1/2/4 x replicas x the three
  default policies ``no-kv``, ``exact-prefix``, ``rksc``), Poisson arrivals: every replica takes windows (as a
  fleet where there are several);
* ``plan_closed``: the same plan in its default closed loop (16 problems in flight): one replica takes windows
  that end before a step that answers a user; several replicas step (an answer sends the next problem);
* ``serve_rksc``: ``rksim serve --policy rksc --problem-rate 4`` (one GPU; the policy's ASKS forks, gate passes,
  CGEE verification that reads the branches' KV and RSBCM's scored block pool).

Each runs in a child process (``bench/bench_fastforward.py``'s ``run_child``: the command's CPU time, imports
excluded, bytecode cache on and warmed; wall time; peak resident memory), once with the default and once with
``--step-by-step``, interleaved ``--repeats`` times (medians). The two printed JSON documents must be equal but
for what names the run itself: a plan's ``wall_s`` and ``target_options`` (which records the flag), and a
replay's ``events`` (the simpy events processed: fewer with windows); the benchmark fails otherwise.
Writes ``DIR/plan.json``.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402

from bench_fastforward import run_child, warm_up  # noqa: E402

TARGET = ["--model-preset", "llama-3-8b", "--hardware", "h100-sxm"]


def cases(n: int) -> dict:
    plan = ["plan", *TARGET, "--gpus", "4", "--num-problems", str(n), "--json"]
    return {"plan_poisson": plan + ["--problem-rate", "4"], "plan_closed": plan,
            "serve_rksc": ["serve", "--policy", "rksc", *TARGET, "--problem-rate", "4", "--workload",
                           f"n_requests={n}", "--json"]}


def _comparable(out: str) -> dict:
    """The printed JSON without what names the run rather than its figures (module docstring)."""
    doc = json.loads(out)
    if "meta" in doc:
        doc["meta"].pop("wall_s", None)
        doc["meta"].pop("target_options", None)
    doc.pop("events", None)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--num-problems", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args(argv)
    all_cases = cases(a.num_problems)
    warm_up(all_cases["serve_rksc"][:-3] + ["--workload", "n_requests=8", "--json"])
    res = {"what": "rksim plan / serve on the bundled trace (SmolLM2's decisions; costs of llama-3-8b on h100-sxm / "
           "dgx-h100 at vLLM's serve defaults, each replica's KV at its own default capacity), windows vs "
           "--step-by-step, CPU time of the command (imports excluded; bytecode cache on, warmed), median of the "
           "repeats", "num_problems": a.num_problems, "cases": {}}
    ok = True
    for name, cmd in all_cases.items():
        runs, outs = {"fast": [], "step": []}, {}
        for _ in range(max(1, a.repeats)):
            for mode, flag in (("fast", []), ("step", ["--step-by-step"])):
                r = run_child(cmd + flag)
                runs[mode].append(r)
                outs[mode] = _comparable(r["out"])
        same = outs["fast"] == outs["step"]
        cpu = {m: statistics.median(x["cpu_s"] for x in v) for m, v in runs.items()}
        res["cases"][name] = {"command": "rksim " + " ".join(cmd), "fast_cpu_s": cpu["fast"],
                              "step_cpu_s": cpu["step"], "ratio_cpu": cpu["step"] / cpu["fast"],
                              "fast_maxrss_mb": max(x["maxrss_mb"] for x in runs["fast"]),
                              "identical_output": same}
        print(f"{name}: fast {cpu['fast']:.2f} s, step by step {cpu['step']:.2f} s CPU, "
              f"ratio {cpu['step'] / cpu['fast']:.2f}x, identical: {same}")
        ok &= same
    from traces.store import atomic_write_text
    atomic_write_text(a.out / "plan.json", json.dumps(res, indent=1))
    print(f"wrote {a.out / 'plan.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
