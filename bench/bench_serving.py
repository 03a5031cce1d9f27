"""Serving at capacity: the scheduler's realism and the engine's speed.

Usage::

    .venv/bin/python bench/bench_serving.py --out runs/bench [--quick]

Writes ``DIR/serving.json`` and prints a table. Cases:

* ``vidur_poisson``: 1,000 single-sequence requests, prompt uniform in 1,024 +- 256 tokens, 256 output
  tokens, Poisson arrivals (Vidur's synthetic workload shape), llama-3-8b on a100-80gb, vLLM V1 scheduler;
  wall and CPU time, events/s/core; TTFT and E2E percentiles.
* ``burst_32x1024``: 32 requests of 1,024 tokens arriving together, 16 output tokens,
  ``max_num_batched_tokens = 4096``, prefill-first (and vLLM V1 chunked for contrast): number of prefill
  iterations, mean and last TTFT (Vidur's vLLM scheduler: 8 prefill batches, mean TTFT 1.29 s, last 2.30 s).
* ``vase_shape``: qwen3-4b and qwen3-14b on h100-sxm, the trace's long decodes extended to 16,384 tokens
  (``--decode-tokens``), full cache against vase-dkv and vase-attnv at 4x compression, served closed-loop:
  throughput ratio (the VASE paper: 3.1x) and the running sequences that explain it.
* ``block_policies``: RSBCM vs LRU vs FIFO vs no prefix caching at a KV capacity that binds (0.6 and 0.3 of
  the unconstrained run's peak), on the bundled trace: throughput, preemptions, recompute, evictions,
  prefix hit rate.
* ``scale_10k``: 10,000 problems x 8 branches served (goal: <= 60 s on one core).

Times are ``time.process_time`` (one core: the engine is single-threaded) and wall clock.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _single_jobs(n: int, prompt_lo: int, prompt_hi: int, out_tokens: int, L: int, bs: int, seed: int):
    """Single-sequence requests (no branches, no verification): Vidur's synthetic workload."""
    from sim.workload.job import Job
    rng = np.random.default_rng(seed)
    jobs = []
    z = np.zeros(1, np.int64)
    for i in range(n):
        P = int(rng.integers(prompt_lo, prompt_hi + 1))
        jobs.append((i, Job(B=1, L=L, bs=bs, reused=z, computed=np.array([P]), copy=z, gate=z,
                            source=np.array([-1]), share=np.zeros(1, bool), ctx=np.array([P]),
                            gen=np.array([out_tokens]), own=np.array([P]), verify_on=False, v_new=z, v_cached=z,
                            v_layers=np.array([L]), v_probes=z, v_head=np.ones(1, np.int64), v_kv_tokens=z,
                            v_reuse=False, score=np.zeros(1))))
    return jobs


def _timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def bench_vidur(n: int, rate: float) -> dict:
    from sim.serving.capacity import ServingConfig, capacity_blocks, kv_capacity
    from sim.serving.engine import Engine
    from sim.cost.profiles import load_hardware, load_model
    m, hw = load_model("llama-3-8b"), load_hardware("a100-80gb")
    sv = ServingConfig()
    sc = sv.scheduler_config(hw.name)
    cap = kv_capacity(m, hw, sv)
    blocks = capacity_blocks(cap["kv_capacity_bytes"], 16, m.kv_bytes_per_token)
    jobs = _single_jobs(n, 768, 1280, 256, m.n_layers, 16, seed=0)
    eng = Engine(m, hw, jobs, arrival_rate=rate, seed=0, scheduler=sc, kv_blocks=blocks, caching=True)
    res, cpu, wall = _timed(eng.run)
    recs = res.records()
    ttft = np.array([r["ttft_s"] for r in recs])
    e2e = np.array([r["latency_s"] for r in recs])
    return {"model": m.name, "hardware": hw.name, "requests": n, "arrival_rate": rate, **sc.to_dict(),
            "kv_capacity_blocks": blocks, "cpu_s": cpu, "wall_s": wall, "events": res.events,
            "events_per_s_per_core": res.events / cpu, "iterations": res.iterations,
            "ttft_mean_s": float(ttft.mean()), "ttft_p50_s": float(np.median(ttft)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "e2e_p50_s": float(np.median(e2e)), "e2e_p99_s": float(np.percentile(e2e, 99)),
            "preemptions": res.stats["preemptions"], "max_running_seqs": res.stats["max_running_seqs"],
            "vidur_reference": "Vidur's event loop on this workload: about 3 s (quoted for Vidur, not measured here); rksim before: 3.5-3.8 s"}


def bench_burst() -> dict:
    from sim.serving.engine import Engine
    from sim.cost.profiles import load_hardware, load_model
    from sim.serving.scheduler import SchedulerConfig
    m, hw = load_model("llama-3-8b"), load_hardware("a100-80gb")
    out = {"model": m.name, "hardware": hw.name, "requests": 32, "prompt_tokens": 1024, "output_tokens": 16,
           "vidur_reference": {"prefill_batches": 8, "ttft_mean_s": 1.29, "ttft_last_s": 2.30}}
    for pol in ("prefill-first", "vllm-v1", "unlimited"):
        sc = SchedulerConfig(max_num_batched_tokens=4096 if pol != "unlimited" else 1 << 24, max_num_seqs=256,
                             policy="prefill-first" if pol != "vllm-v1" else "vllm-v1")
        jobs = _single_jobs(32, 1024, 1024, 16, m.n_layers, 16, seed=0)
        eng = Engine(m, hw, jobs, concurrency=32, scheduler=sc)
        kinds = []
        orig = eng.sched.schedule

        def spy(orig=orig, kinds=kinds):
            o = orig()
            if o.items:
                kinds.append(sum(it.num_new > 1 for it in o.items))
            return o
        eng.sched.schedule = spy
        res = eng.run()
        ttft = np.array([r["ttft_s"] for r in res.records()])
        out[pol] = {"iterations_with_prefill": int(sum(k > 0 for k in kinds)), "ttft_mean_s": float(ttft.mean()),
                    "ttft_last_s": float(ttft.max()), "max_num_batched_tokens": sc.max_num_batched_tokens}
    return out


def bench_vase(decode_tokens: int, n_requests: int) -> dict:
    from sim import api
    out = {"decode_tokens": decode_tokens, "requests": n_requests, "compression": "4x",
           "paper": "VASE: VASE-DKV 3.1x throughput over full cache at 16K tokens"}
    lt = api.loaded(api.default_trace_path())
    for model in ("qwen3-4b", "qwen3-14b"):
        row = {}
        for pol in ("vase-dkv", "vase-attnv"):
            K = api.token_budgets(lt, pol, [4], decode_tokens)["4x"]
            r = api.simulate(lt, pol, {"budget": K}, model_preset=model, hardware="h100-sxm", mode="serving",
                             baselines=False, workload={"concurrency": n_requests, "n_requests": n_requests},
                             serving={"decode_tokens": decode_tokens})
            s = r.summary
            row[pol] = {"budget": K, "throughput_vs_full": s["throughput_vs_full"],
                        "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                        "full_cache_throughput_tokens_per_s": s["full_cache_throughput_tokens_per_s"],
                        "mean_running_seqs": s["mean_running_seqs"], "max_running_seqs": s["max_running_seqs"],
                        "full_cache_mean_running_seqs": s["full_cache_mean_running_seqs"],
                        "full_cache_max_running_seqs": s["full_cache_max_running_seqs"],
                        "kv_cap_tokens_per_sequence": s["kv_cap_tokens_per_sequence"],
                        "kv_capacity_bytes": s["kv_capacity_bytes"], "preemptions": s["preemptions"],
                        "length_extrapolated": s["length_extrapolated"]}
        out[model] = row
    return out


def bench_blocks(n_requests: int, concurrency: int, frac: float) -> dict:
    from sim import api
    lt = api.loaded(api.default_trace_path())
    common = dict(model_preset="qwen2.5-7b", hardware="h100-sxm", mode="serving", baselines=False,
                  workload={"n_requests": n_requests, "concurrency": concurrency})
    # capacity: a fraction of what the unconstrained run holds at its peak, so the capacity binds
    free = api.simulate(lt, "lru", {}, **common)
    cap = frac * free.summary["peak_kv_bytes"]
    out = {"requests": n_requests, "concurrency": concurrency, "kv_capacity_bytes": cap,
           "unconstrained_peak_kv_bytes": free.summary["peak_kv_bytes"], "model": "qwen2.5-7b", "hardware": "h100-sxm"}
    keys = ("throughput_problems_per_s", "throughput_tokens_per_s", "e2e_p50_s", "preemptions", "recompute_tokens",
            "evictions", "prefix_hit_rate", "peak_kv_bytes", "mean_running_seqs")
    for name, pol, sv in (("rsbcm", "rsbcm", {}), ("lru", "lru", {}), ("fifo", "fifo", {}),
                          ("no_caching", "lru", {"prefix_caching": False})):
        r = api.simulate(lt, pol, {}, serving={"kv_capacity_bytes": cap, **sv}, **common)
        out[name] = {k: r.summary.get(k) for k in keys}
    return out


def bench_scale(n_problems: int) -> dict:
    from sim import api
    lt = api.loaded(api.default_trace_path())
    B = lt.tf.problems[0].B
    fn = lambda: api.simulate(lt, "exact-prefix", {}, model_preset="qwen2.5-7b", hardware="h100-sxm",  # noqa: E731
                              mode="serving", baselines=False,
                              workload={"n_requests": n_problems, "concurrency": 64})
    r, cpu, wall = _timed(fn)
    s = r.summary
    return {"problems": n_problems, "branches": B, "cpu_s": cpu, "wall_s": wall, "events": s["events"],
            "events_per_s_per_core": s["events"] / cpu, "iterations": s["iterations"],
            "throughput_problems_per_s": s["throughput_problems_per_s"], "goal_s": 60.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--quick", action="store_true", help="smaller cases (a smoke run)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    q = a.quick
    from tqdm import tqdm
    steps = [("burst_32x1024", lambda: bench_burst()),
             ("vidur_poisson", lambda: bench_vidur(200 if q else 1000, 10.0)),
             ("block_policies", lambda: {f"capacity_{f}": bench_blocks(48 if q else 192, 16, f) for f in (0.6, 0.3)}),
             ("vase_shape", lambda: bench_vase(2048 if q else 16384, 64 if q else 256)),
             ("scale_10k", lambda: bench_scale(1000 if q else 10_000))]
    result = {"quick": q, "cpu": os.cpu_count()}
    for name, fn in tqdm(steps, desc="bench_serving", unit="case"):
        result[name] = fn()
    path = a.out / "serving.json"
    from traces.store import atomic_write_text
    atomic_write_text(path, json.dumps(result, indent=2, default=float))
    import pandas as pd
    b, v, sc = result["burst_32x1024"], result["vidur_poisson"], result["scale_10k"]
    rows = [("burst prefill-first: prefill iterations / mean TTFT / last TTFT",
             f"{b['prefill-first']['iterations_with_prefill']} / {b['prefill-first']['ttft_mean_s']:.3f} s / "
             f"{b['prefill-first']['ttft_last_s']:.3f} s"),
            ("burst unlimited budget: prefill iterations / mean TTFT",
             f"{b['unlimited']['iterations_with_prefill']} / {b['unlimited']['ttft_mean_s']:.3f} s"),
            (f"vidur-shaped {v['requests']} requests: CPU s / events/s/core", f"{v['cpu_s']:.2f} / {v['events_per_s_per_core']:.0f}"),
            (f"scale {sc['problems']} x {sc['branches']}: CPU s", f"{sc['cpu_s']:.1f}")]
    for model in ("qwen3-4b", "qwen3-14b"):
        for pol, x in result["vase_shape"][model].items():
            rows.append((f"{model} {pol} 4x: throughput vs full / mean running (full)",
                         f"{x['throughput_vs_full']:.2f}x / {x['mean_running_seqs']:.1f} ({x['full_cache_mean_running_seqs']:.1f})"))
    for name in ("rsbcm", "lru", "fifo", "no_caching"):
        for cap, res in result["block_policies"].items():
            x = res[name]
            rows.append((f"blocks {cap} {name}: problems/s / preemptions / recompute / hit rate",
                         f"{x['throughput_problems_per_s']:.2f} / {x['preemptions']} / {x['recompute_tokens']} / "
                         f"{x['prefix_hit_rate']:.3f}"))
    print(pd.DataFrame(rows, columns=["case", "value"]).to_string(index=False))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
