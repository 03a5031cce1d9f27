"""Deployment planner: admissible deployments, evaluation through replicas, a non-dominated frontier."""
from __future__ import annotations

import numpy as np

from sim.goodput import SLO
from sim.parallel import load_node
from sim.pareto import pareto_mask_bruteforce
from sim.planner import Deployment, deployments, evaluate, frontier
from sim.profiles import load_hardware, load_model
from tests.test_replicas import _shared_jobs


def test_deployments_respect_budget_heads_and_memory():
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    deps = list(deployments(m, hw, node, 8, ["exact-prefix"], pp_sizes=(1, 2)))
    assert deps and all(d.gpus <= 8 for d in deps)
    assert not any(d.tensor_parallel_size * d.pipeline_parallel_size == 1 for d in deps)   # 70B needs 2 GPUs
    assert Deployment(2, 1, 4, 256, 2048, "exact-prefix") in deps
    assert Deployment(2, 1, 5, 256, 2048, "exact-prefix") not in deps


def test_planner_frontier_is_non_dominated_and_best_per_policy():
    m, hw, node = load_model("llama-3-8b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    shared = _shared_jobs(12)
    alone = _shared_jobs(12, reuse=0)
    work = {"exact-prefix": {"jobs": shared}, "no-kv": {"jobs": alone, "caching": False}}
    rows = [evaluate(d, m, hw, node, work.__getitem__, slo=SLO(e2e_s=0.4), concurrency=6, gpu_hour_cost=2.0)
            for d in deployments(m, hw, node, 4, list(work), tp_sizes=(1, 2), pp_sizes=(1,))]
    assert len(rows) == 2 * (4 + 2)       # TP 1: 1..4 replicas, TP 2: 1..2, two policies
    df, front, best = frontier(rows)
    g = df["goodput_problems_per_s"].to_numpy(float)
    want = pareto_mask_bruteforce(df["gpus"].to_numpy(float), g)
    assert sorted(map(tuple, front[["gpus", "goodput_problems_per_s"]].to_numpy())) == \
        sorted(map(tuple, df[want][["gpus", "goodput_problems_per_s"]].to_numpy()))
    for _, r in front.iterrows():   # nothing on the frontier is dominated
        assert not ((df["gpus"] <= r["gpus"]) & (df["goodput_problems_per_s"] >= r["goodput_problems_per_s"])
                    & ((df["gpus"] < r["gpus"]) | (df["goodput_problems_per_s"] > r["goodput_problems_per_s"]))).any()
    assert set(best["policy"]) == {"exact-prefix", "no-kv"}
    for _, b in best.iterrows():
        sub = df[df["policy"] == b["policy"]]
        assert b["goodput_problems_per_s"] == sub["goodput_problems_per_s"].max()
    assert (df["cost_per_million_output_tokens"] > 0).all()
    # the reuse policy serves more within the SLO on the same deployment
    one = df[(df["gpus"] == 1)].set_index("policy")["throughput_tokens_per_s"]
    assert one["exact-prefix"] > one["no-kv"]
    assert np.isfinite(g).all()
