"""Speed of the policy library on SmolLM2-135M shapes.

Token eviction: one long decode of 600 positions (prompt 100, 500 decode steps),
4 layers, every token policy, budgets 64/128/256 — run_token_eviction plus the
attention metrics (the full-cache pass computed once per layer, as the simulator
does). Also: ASKS plans, CGEE decisions and block-pool accesses per second.
Inputs are seeded random arrays of the real shapes (H_kv 3, H_q 9, D 64, 30
layers); writes ``DIR/policies.json`` (medians of ``--repeats`` runs).

    .venv/bin/python bench/bench_policies.py --out runs/bench
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one core: a stable, comparable figure

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies import (FullAttention, attention_metrics, get_policy,  # noqa: E402
                      list_policies, run_token_eviction)

T, P, H, HQ, D, LAYERS, L = 600, 100, 3, 9, 64, 4, 30
BUDGETS = (64, 128, 256)


def token_sweep(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    per_policy = {n: 0.0 for n in list_policies("token")}
    t_full = 0.0
    for _ in range(LAYERS):
        K = rng.standard_normal((T, H, D)).astype(np.float16)
        V = rng.standard_normal((T, H, D)).astype(np.float16)
        Q = (2 * rng.standard_normal((T, HQ, D))).astype(np.float16)
        t0 = time.perf_counter()
        full = FullAttention(K, V, Q, P)
        t_full += time.perf_counter() - t0
        for name in per_policy:
            for b in BUDGETS:
                t0 = time.perf_counter()
                res = run_token_eviction(get_policy(name, budget=b), K, V, Q, P, np.random.default_rng(1))
                attention_metrics(res, full=full)
                per_policy[name] += time.perf_counter() - t0
    return {"total_s": t_full + sum(per_policy.values()), "full_attention_s": t_full, "per_policy_s": per_policy}


def decisions(n: int = 2000, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    B = 8
    prompts = [np.concatenate([rng.integers(0, 50, 20), np.arange(200)]) for _ in range(B)]
    cos = rng.uniform(0.5, 1, (B, L))
    spans = np.tile([0, 20], (B, 1))
    asks = get_policy("asks")
    t0 = time.perf_counter()
    for _ in range(n):
        asks.plan(prompts, cos, spans)
    asks_s = (time.perf_counter() - t0) / n
    cgee = get_policy("cgee")
    H = rng.uniform(0, 3, (B, L))
    py, pn = rng.uniform(0, 1, (B, L)), rng.uniform(0, 1, (B, L))
    conf = rng.uniform(0, 1, B)
    t0 = time.perf_counter()
    for _ in range(n):
        cgee.decide(conf, H, py, pn)
    cgee_s = (time.perf_counter() - t0) / n
    # The simulator's block pool under RSBCM: one-block requests over 1,024 contents into 256 blocks
    # (a hit reuses the cached block; a miss evicts RSBCM's first victim).
    from sim.serving.kvcache import BlockManager
    from sim.serving.scheduler import Request
    pool = BlockManager(256, 16, get_policy("rsbcm"))
    ids = rng.integers(0, 1024, 20 * n)
    t0 = time.perf_counter()
    for i, bid in enumerate(ids):
        req = Request((i,), 17, 1, content=lambda k, b=int(bid): ("blk", b), depth=int(bid % 5))
        computed, hit = pool.find_cached(req)
        pool.allocate(req, 17 - hit, computed, hit)
        pool.set_score(pool.key(req, 0), float(bid % 7) / 7)
        pool.free(req)
    pool_s = (time.perf_counter() - t0) / len(ids)
    return {"asks_plans_per_s": 1 / asks_s, "cgee_decisions_per_s": 1 / cgee_s,
            "rsbcm_pool_accesses_per_s": 1 / pool_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sweeps = [token_sweep() for _ in range(args.repeats)]
    dec = [decisions() for _ in range(args.repeats)]
    names = list(sweeps[0]["per_policy_s"])
    result = {
        "token_eviction": {
            "workload": f"{T} positions ({P} prompt), {LAYERS} layers, {len(names)} policies, budgets {list(BUDGETS)}, "
                        f"H_kv={H}, H_q={HQ}, D={D}, loop + metrics",
            "total_s_median": statistics.median(s["total_s"] for s in sweeps),
            "full_attention_s_median": statistics.median(s["full_attention_s"] for s in sweeps),
            "per_policy_s_median": {n: statistics.median(s["per_policy_s"][n] for s in sweeps) for n in names},
        },
        "decisions": {k: statistics.median(d[k] for d in dec) for k in dec[0]},
        "repeats": args.repeats,
    }
    from traces.store import atomic_write_text
    path = args.out / "policies.json"
    atomic_write_text(path, json.dumps(result, indent=2))
    te = result["token_eviction"]
    print(f"token eviction ({te['workload']}): {te['total_s_median']:.2f} s "
          f"(full-cache pass {te['full_attention_s_median']:.2f} s)")
    for n, s in te["per_policy_s_median"].items():
        print(f"  {n:13s} {s:6.3f} s")
    for k, v in result["decisions"].items():
        print(f"{k:28s} {v:10.0f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
