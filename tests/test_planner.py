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


import pytest  # noqa: E402

from app.cli import main  # noqa: E402

BASE = ["plan", "--model-preset", "qwen2.5-32b", "--hardware", "dgx-h100", "--gpus", "2"]


@pytest.mark.parametrize("extra,flag", [(["--tensor-parallel-size", "3"], "--tensor-parallel-size"),
                                        (["--tensor-parallel-size", "x"], "--tensor-parallel-size"),
                                        (["--pipeline-parallel-size", "0"], "--pipeline-parallel-size"),
                                        (["--router", "random"], "--router"),
                                        (["--slo", "ttft"], "--slo"),
                                        (["--policies", "nope"], "--policies"),
                                        (["--problem-rate", "-1"], "--problem-rate"),
                                        (["--gpu-hour-cost", "-2"], "--gpu-hour-cost")])
def test_plan_bad_flags_one_line_naming_the_flag(capsys, extra, flag):
    rc = main(BASE + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0] and err[0].startswith("rksim: error:")


def test_plan_refuses_a_budget_nothing_fits(capsys):
    rc = main(["plan", "--model-preset", "llama-3-70b", "--hardware", "dgx-h100", "--gpus", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--gpus 1: no deployment of llama-3-70b" in err[0]


def test_plan_writes_the_table_with_its_frontier(tmp_path, capsys):
    import pandas as pd
    out = tmp_path / "plan.parquet"
    rc = main(BASE + ["--policies", "exact-prefix,asks", "--tensor-parallel-size", "1,2", "--num-problems", "12",
                      "--max-concurrent-problems", "4", "--slo", "e2e=5", "--out", str(out), "--json"])
    assert rc == 0
    import json
    res = json.loads(capsys.readouterr().out)
    df = pd.read_parquet(out)
    assert len(df) == 2 * 3 and res["meta"]["deployments"] == 6     # TP 1 x 1..2 replicas, TP 2 x 1; two policies
    assert df["on_frontier"].sum() == len(res["frontier"]) >= 1
    assert {r["policy"] for r in res["best_per_policy"]} == {"exact-prefix", "asks"}


@pytest.mark.slow
def test_plan_on_dask_equals_local():
    pytest.importorskip("distributed")
    from sim.planner import run_plan
    m, node = load_model("qwen2.5-32b"), load_node("dgx-h100")
    deps = list(deployments(m, load_hardware(node.gpu), node, 2, ["exact-prefix"], tp_sizes=(1, 2)))
    opts = {"model_preset": "qwen2.5-32b", "node": "dgx-h100", "slo": "e2e=5", "concurrency": 4, "n_requests": 12}
    local = run_plan(None, deps, opts, progress=False)
    on_dask = run_plan(None, deps, opts, backend="dask", workers=2, progress=False)
    assert local == on_dask
