"""Decode fast-forward (``sim.serving.fastforward``): ``rksim bench throughput`` fast vs ``--step-by-step``, side by side.

Usage::

    .venv/bin/python bench/bench_fastforward.py --out runs/bench [--repeats 1]

Each case runs the real command (``python -m app.cli bench throughput ...``) in a child process, once with
the default (windows of decode steps advanced at once) and once with ``--step-by-step`` (every iteration
scheduled and priced alone: the reference), the two interleaved ``--repeats`` times. The child reports the
CPU time of the command itself (``time.process_time`` around ``app.cli.main``: ``app.cli``'s own imports
excluded, the lazy imports inside it -- numpy, simpy, PyYAML, about 0.25 s -- and building the parser included;
the machine is shared, and one core's CPU time is the work, not the neighbours'), the CPU time of the simulation
alone within it (``sim.bench.plain.run``: workload, engine, records; ``sim_cpu_s``), its wall time and its peak
resident memory (``ru_maxrss``). The goal is judged on the command's ratio; the simulation's is stated beside it. The children keep Python's bytecode cache (:func:`child_env`), warmed by one
untimed run first. The two printed results must be identical (the benchmark fails otherwise).
Writes ``DIR/fastforward.json``.

Cases (llama-3-8b on h100-sxm unless named, vLLM's offline ``LLM`` defaults for the device, 1,000 random
prompts):

* ``throughput_128x2048``: 128 prompt / 2,048 output tokens (decode-bound, under KV pressure: preemptions);
* ``throughput_1024x128``: 1,024 / 128 (prefill-heavy: few decode steps between events);
* ``moe_throughput_128x2048``: the first case on qwen3-30b-a3b (a mixture of experts: the experts a decode batch
  reads depend on its rows alone, so its windows have the dense closed form's shape);
* ``tp4_throughput_128x2048``: the first case on llama-3-70b over 4 GPUs of a dgx-h100, tensor parallel (a decode
  step's collectives depend on its batch size alone: one rank's closed form plus them).

And ``rksim bench serve`` cases (vLLM's serve defaults for the device, 3,000 random 1,024/128 prompts, Poisson):

* ``dp3_serve_3rps`` / ``dp3_serve_20rps``: 3 replicas behind the default router (prefix-affinity) at 3 and 20
  req/s (a fleet's windows run to the next arrival; ``sim/serving/fleet_clock.py``).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE = ["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "1000"]
CASES = {
    "throughput_128x2048": ["--input-len", "128", "--output-len", "2048"],
    "throughput_1024x128": ["--input-len", "1024", "--output-len", "128"],
    "moe_throughput_128x2048": ["--model-preset", "qwen3-30b-a3b", "--input-len", "128", "--output-len", "2048"],
    "tp4_throughput_128x2048": ["--model-preset", "llama-3-70b", "--tensor-parallel-size", "4", "--input-len", "128",
                                "--output-len", "2048"],
    "sliding_throughput_128x2048": ["--model-preset", "gpt-oss-20b", "--input-len", "128", "--output-len", "2048"],
}
SERVE = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "3000"]
SERVE_CASES = {
    "dp3_serve_3rps": ["--data-parallel-size", "3", "--request-rate", "3"],
    "dp3_serve_20rps": ["--data-parallel-size", "3", "--request-rate", "20"],
}
GOAL_RATIO = 10.0   # issue 32: the 128 / 2,048 case at least 10x faster than step by step
CHILD = """
import builtins, contextlib, io, json, resource, sys, time
from app.cli import main
sim_s = [0.0]
def timed(run):   # the simulation itself: sim.bench.plain.run (workload, engine, records), as the command calls it
    def inner(*a, **k):
        c = time.process_time()
        try:
            return run(*a, **k)
        finally:
            sim_s[0] += time.process_time() - c
    inner.timed = True
    return inner
imp = builtins.__import__
def hook(*a, **k):   # wrap plain.run once the command imports it (its import stays inside the timed command)
    m = imp(*a, **k)
    plain = sys.modules.get("sim.bench.plain")
    if plain is not None and hasattr(plain, "run") and not hasattr(plain.run, "timed"):   # once (imports nest)
        plain.run = timed(plain.run)
        builtins.__import__ = imp
    return m
builtins.__import__ = hook
buf = io.StringIO()
c0, w0 = time.process_time(), time.perf_counter()
with contextlib.redirect_stdout(buf):
    rc = main(sys.argv[1:])
c1, w1 = time.process_time(), time.perf_counter()
print(json.dumps({"rc": rc, "cpu_s": c1 - c0, "sim_cpu_s": sim_s[0], "wall_s": w1 - w0,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "out": buf.getvalue()}))
"""


def child_env(root: Path = ROOT) -> dict:
    """The children's environment: fixed hash seed, checkout ``root`` first, and Python's bytecode cache on (kept
    under ``root/runs/pycache``, git-ignored) even where the shell turns it off (``PYTHONDONTWRITEBYTECODE``, as on
    the machine this was measured on): otherwise every command compiles the ~90 modules it imports lazily, about
    0.1-0.2 s of CPU that is the interpreter's, not the simulator's, and a user's installed Python caches."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": str(root / "runs" / "pycache")}


def warm_up(args: list[str]) -> None:
    """Run ``args`` once, untimed, so the bytecode cache holds every module the timed runs import."""
    run_child(args)


def run_child(args: list[str], root: Path = ROOT) -> dict:
    """``rksim args`` in a child process run in checkout ``root``: its exit code, CPU and wall seconds (``app.cli``'s
    own imports excluded, lazy imports inside ``main`` included), peak RSS and printed output."""
    p = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=root, capture_output=True, text=True,
                       env=child_env(root))
    if p.returncode != 0:
        raise RuntimeError(f"{root}: rksim {' '.join(args)} failed: {p.stderr.strip()[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        raise RuntimeError(f"{root}: rksim {' '.join(args)} exited {r['rc']}: "
                           f"{(r['out'] + p.stderr).strip()[-2000:]}")
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args(argv)
    res = {"goal_ratio": GOAL_RATIO, "what": "rksim bench throughput / serve, fast-forward vs --step-by-step, CPU time of the "
           "command (imports excluded; bytecode cache on, warmed), median of the repeats", "cases": {}}
    ok = True
    warm_up(BASE[:-1] + ["20"] + CASES["throughput_128x2048"])
    cases = [(name, BASE + extra) for name, extra in CASES.items()]
    cases += [(name, SERVE + extra) for name, extra in SERVE_CASES.items()]
    for name, cmd in cases:
        runs = {"fast": [], "step": []}
        outs = {}
        for _ in range(max(1, a.repeats)):
            for mode, flag in (("fast", []), ("step", ["--step-by-step"])):
                r = run_child(cmd + flag)
                runs[mode].append(r)
                outs[mode] = r["out"]
        same = outs["fast"] == outs["step"]
        cpu = {m: statistics.median(x["cpu_s"] for x in v) for m, v in runs.items()}
        sim = {m: statistics.median(x["sim_cpu_s"] for x in v) for m, v in runs.items()}
        wall = {m: statistics.median(x["wall_s"] for x in v) for m, v in runs.items()}
        rss = {m: max(x["maxrss_mb"] for x in v) for m, v in runs.items()}
        ratio = cpu["step"] / cpu["fast"]
        res["cases"][name] = {
            "command": "rksim " + " ".join(cmd), "fast_cpu_s": cpu["fast"], "step_cpu_s": cpu["step"],
            "ratio_cpu": ratio, "fast_sim_cpu_s": sim["fast"], "step_sim_cpu_s": sim["step"],
            "ratio_sim_cpu": sim["step"] / sim["fast"], "fast_wall_s": wall["fast"], "step_wall_s": wall["step"],
            "ratio_wall": wall["step"] / wall["fast"], "fast_maxrss_mb": rss["fast"], "step_maxrss_mb": rss["step"],
            "identical_output": same, "result": outs["fast"].splitlines()[0] if outs["fast"] else None,
            "fast_cpu_s_all": [x["cpu_s"] for x in runs["fast"]], "step_cpu_s_all": [x["cpu_s"] for x in runs["step"]]}
        ok = ok and same
        print(f"{name:24s} fast {cpu['fast']:6.2f} s  step {cpu['step']:6.2f} s  ratio {ratio:5.2f}x  "
              f"(simulation alone {sim['fast']:.2f} / {sim['step']:.2f} s: {sim['step'] / sim['fast']:5.2f}x)  "
              f"(CPU; wall {wall['fast']:.2f} / {wall['step']:.2f} s; RSS {rss['fast']:.0f} / {rss['step']:.0f} MB)"
              f"  identical: {same}")
    res["meets_goal"] = res["cases"]["throughput_128x2048"]["ratio_cpu"] >= GOAL_RATIO
    a.out.mkdir(parents=True, exist_ok=True)
    from traces.store import atomic_write_text
    atomic_write_text(a.out / "fastforward.json", json.dumps(res, indent=1))
    print(f"wrote {a.out / 'fastforward.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
