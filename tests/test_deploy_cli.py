"""The deployment flags end to end through ``app.cli.main``: tensor/pipeline parallelism, replicas behind a
router, SLO goodput on ``serve``, ``simulate --mode serving``, ``sweep --mode serving`` and ``bench serve``.

Every run uses the bundled trace (SmolLM2-135M's decisions, 12 problems of 8 branches).
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from app.cli import main
from sim.api import simulate

H100 = ["--hardware", "h100-sxm"]


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("rksim: error: ")
    return err.removeprefix("rksim: error: ")


@pytest.mark.parametrize("cmd", [["serve", "--policy", "exact-prefix", "--num-problems", "2"],
                                 ["bench", "serve", "--num-prompts", "2"],
                                 ["bench", "throughput", "--num-prompts", "2", "--input-len", "64", "--output-len", "4"]])
def test_a_gpu_left_without_one_kv_block_is_refused_naming_the_flag(capsys, cmd):
    """One GPU whose weights fit its memory but leave no block of KV under --gpu-memory-utilization is refused naming
    the layout, the fraction and the smallest layout that fits (not a request the engine cannot place); a
    --kv-capacity-bytes smaller than one block is refused naming that flag."""
    base = [*cmd, "--model-preset", "llama-3-8b", *H100]
    err = _err(capsys, [*base, "--gpu-memory-utilization", "0.1"])
    assert "llama-3-8b does not fit on h100-sxm" in err and "(x 0.1)" in err
    assert "the smallest that fits: --tensor-parallel-size" in err
    err = _err(capsys, [*base, "--kv-capacity-bytes", "1000000"])
    assert err.startswith("--kv-capacity-bytes: 1e+06 B holds 7.63 tokens") and "fewer than one block of 16" in err


def test_70b_on_one_h100_refused_naming_tp2_and_runs_at_tp2(capsys):
    err = _err(capsys, ["serve", "--policy", "asks", "--model-preset", "llama-3-70b", *H100])
    assert "llama-3-70b does not fit on h100-sxm" in err
    assert "the smallest that fits: --tensor-parallel-size 2 --pipeline-parallel-size 1" in err
    s = _json(capsys, ["serve", "--policy", "asks", "--model-preset", "llama-3-70b", *H100,
                       "--tensor-parallel-size", "2", "--json"])
    assert (s["tensor_parallel_size"], s["pipeline_parallel_size"], s["node"], s["gpus"]) == (2, 1, "dgx-h100", 2)
    assert s["n_problems"] == 12 and s["throughput_tokens_per_s"] > 0 and s["kv_budget_blocks"] > 0
    # TP 4 holds more KV per replica and prices a smaller shard per GPU
    s4 = _json(capsys, ["serve", "--policy", "asks", "--model-preset", "llama-3-70b", *H100,
                        "--tensor-parallel-size", "4", "--json"])
    assert s4["kv_budget_blocks"] > 2 * s["kv_budget_blocks"]
    assert s4["prefill_s_mean"] < s["prefill_s_mean"]


def test_pipeline_parallel_serves_priced_by_stages(capsys):
    # sync scheduling on both: async scheduling's intake lag (sim.serving.intake) applies at PP 1 only, and would
    # move the batches this compares
    a = _json(capsys, ["simulate", "--policy", "exact-prefix", "--mode", "serving", "--model-preset", "llama-3-70b",
                       *H100, "--tensor-parallel-size", "2", "--no-async-scheduling", "--json"])
    b = _json(capsys, ["simulate", "--policy", "exact-prefix", "--mode", "serving", "--model-preset", "llama-3-70b",
                       *H100, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--no-async-scheduling",
                       "--json"])
    assert b["pipeline_parallel_size"] == 2 and b["gpus"] == 4
    # a decode step still passes through both stages in turn and adds the send/recv: never faster per step
    # (overlap helps only when the token budget splits the running requests into several batches)
    assert b["decode_s_mean"] > a["decode_s_mean"]


def test_one_gpu_one_replica_is_todays_result():
    base = simulate(policy="asks", mode="serving", model_preset="qwen2.5-7b", hardware="h100-sxm").summary
    same = simulate(policy="asks", mode="serving", model_preset="qwen2.5-7b", hardware="h100-sxm",
                    tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, node=None,
                    router="round-robin").summary
    assert json.dumps(base, sort_keys=True, default=str) == json.dumps(same, sort_keys=True, default=str)
    assert "tensor_parallel_size" not in base and "per_replica" not in base


def test_routers_keep_or_lose_reuse_on_the_bundled_trace(capsys):
    out = {}
    for router in ("prefix-affinity", "round-robin"):
        out[router] = _json(capsys, ["serve", "--policy", "asks", "--model-preset", "qwen2.5-7b", *H100,
                                     "--data-parallel-size", "4", "--router", router, "--json"])
    one = _json(capsys, ["serve", "--policy", "asks", "--model-preset", "qwen2.5-7b", *H100, "--json"])
    pa, rr = out["prefix-affinity"], out["round-robin"]
    assert pa["replicas"] == rr["replicas"] == 4 and len(pa["per_replica"]) == 4
    assert pa["lost_asks_shares"] == 0 and pa["split_problems"] == 0
    assert rr["lost_asks_shares"] > 50 and rr["split_problems"] == 12
    assert abs(pa["prefix_hit_rate"] - one["prefix_hit_rate"]) < 0.01
    assert rr["prefix_hit_rate"] < 0.7 * one["prefix_hit_rate"]
    # every problem answered once in total; per replica the sub-problems it served
    assert pa["n_problems"] == 12 and sum(r["problems"] for r in pa["per_replica"]) == 12
    assert sum(r["problems"] for r in rr["per_replica"]) == 48


def test_slo_prints_goodput_beside_throughput(capsys):
    tight = _json(capsys, ["serve", "--policy", "asks", "--model-preset", "qwen2.5-7b", *H100,
                           "--slo", "e2e=0.5", "--json"])
    loose = _json(capsys, ["serve", "--policy", "asks", "--model-preset", "qwen2.5-7b", *H100,
                           "--slo", "ttft=1,e2e=100", "--json"])
    assert loose["slo"] == "ttft=1,e2e=100" and loose["slo_attainment"] == 1.0
    assert loose["goodput_problems_per_s"] == pytest.approx(loose["throughput_problems_per_s"])
    assert tight["goodput_problems_per_s"] < tight["throughput_problems_per_s"]
    assert tight["goodput_problems_per_s"] == pytest.approx(tight["slo_attainment"] * tight["throughput_problems_per_s"])
    # the SLO does not move the run itself
    assert tight["throughput_tokens_per_s"] == loose["throughput_tokens_per_s"]
    assert main(["serve", "--policy", "asks", "--model-preset", "qwen2.5-7b", *H100, "--data-parallel-size", "2",
                 "--slo", "ttft=1,e2e=100"]) == 0
    text = capsys.readouterr().out
    assert "goodput_problems_per_s" in text and "per replica (router prefix-affinity, SLO ttft=1,e2e=100)" in text


@pytest.mark.parametrize("argv, flag, words", [
    (["--model-preset", "qwen2.5-7b", "--tensor-parallel-size", "8"], "--tensor-parallel-size",
     "does not divide qwen2.5-7b's 28 attention heads"),
    (["--model-preset", "qwen2.5-7b", "--tensor-parallel-size", "3"], "--tensor-parallel-size", "one of 1, 2, 4, 8"),
    (["--model-preset", "qwen2.5-7b", "--tensor-parallel-size", "4", "--data-parallel-size", "4"],
     "--data-parallel-size", "more than the 8 available on one dgx-h100 node"),
    (["--model-preset", "qwen2.5-7b", "--data-parallel-size", "2", "--router", "random"], "--router",
     "is not one of round-robin"),
    (["--model-preset", "qwen2.5-7b", "--slo", "ttft:1"], "--slo", "is not KEY=SECONDS"),
    (["--model-preset", "qwen2.5-7b", "--slo", "ttft=-1"], "--slo", "positive number"),
    (["--model-preset", "qwen2.5-7b", "--node", "dgx-a100", "--tensor-parallel-size", "2"], "--node",
     "its GPUs are a100-80gb, not --hardware h100-sxm"),
    (["--model-preset", "qwen2.5-7b", "--node", "no-such-node"], "--node", "no-such-node"),
])
def test_bad_combinations_one_line_naming_the_flag(capsys, argv, flag, words):
    err = _err(capsys, ["serve", "--policy", "asks", *H100, *argv])
    assert err.startswith(flag) and words in err, err


def test_isolated_mode_refuses_parallel_by_name(capsys):
    # one problem alone runs on one tensor-parallel group (tests/test_tp_replays.py), not over stages or replicas
    err = _err(capsys, ["simulate", "--policy", "asks", "--model-preset", "llama-3-70b", *H100,
                        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2"])
    assert err.startswith("--pipeline-parallel-size: 2 is not supported in isolated mode")
    err = _err(capsys, ["simulate", "--policy", "asks", *H100, "--data-parallel-size", "2"])
    assert err.startswith("--data-parallel-size: 2 is not supported in isolated mode")
    err = _err(capsys, ["simulate", "--policy", "asks", *H100, "--slo", "e2e=1"])
    assert err.startswith("--slo: only meaningful")


def test_tp_without_a_node_of_that_gpu_names_node(capsys):
    err = _err(capsys, ["serve", "--policy", "asks", "--hardware", "local-cpu", "--tensor-parallel-size", "2"])
    assert err.startswith("--node: ") and "name one with --node" in err
    assert "no node preset of local-cpu is shipped" in err and "a node file whose gpu is local-cpu" in err


def test_sweep_serving_takes_the_deployment_flags(tmp_path, capsys):
    out = tmp_path / "s.parquet"
    assert main(["sweep", "--policy", "asks", "--grid", "tau=0.5,0.9", "--mode", "serving", "--model-preset",
                 "llama-3-70b", *H100, "--tensor-parallel-size", "2", "--data-parallel-size", "2", "--router",
                 "round-robin", "--slo", "e2e=100", "--out", str(out), "--quiet"]) == 0
    df = pd.read_parquet(out)
    assert len(df) == 2
    assert set(df["tensor_parallel_size"]) == {2} and set(df["replicas"]) == {2}
    assert (df["goodput_problems_per_s"] > 0).all() and (df["lost_asks_shares"] > 0).all()
    capsys.readouterr()
    err = _err(capsys, ["sweep", "--policy", "asks", "--grid", "tau=0.5", "--mode", "serving", *H100,
                        "--router", "nope", "--out", str(tmp_path / "t.parquet"), "--quiet"])
    assert "--router: 'nope' is not one of" in err


def test_bench_serve_takes_tp(capsys):
    base = ["bench", "serve", "--model-preset", "llama-3-70b", *H100, "--num-prompts", "20", "--request-rate", "4"]
    err = _err(capsys, base)
    assert "the smallest that fits: --tensor-parallel-size 2" in err
    assert main(base + ["--tensor-parallel-size", "2"]) == 0
    two = capsys.readouterr().out
    assert "on h100-sxm x TP 2 x PP 1 on dgx-h100" in two
    assert main(base + ["--tensor-parallel-size", "4"]) == 0
    four = capsys.readouterr().out

    def mean_tpot(text):
        line = next(x for x in text.splitlines() if x.startswith("Mean TPOT"))
        return float(line.split()[-1])
    assert mean_tpot(four) < mean_tpot(two)
    err = _err(capsys, base + ["--tensor-parallel-size", "2", "--node", "l4-pcie"])
    assert err.startswith("--node l4-pcie: its GPUs are l4")


def test_one_session_keeps_layouts_apart():
    """Baselines are memoised per session: a replica count or a layout is part of their key."""
    from sim.api import Session
    s = Session()
    kw = dict(policy="asks", mode="serving", model_preset="qwen2.5-7b", hardware="h100-sxm")
    one = simulate(s, **kw).summary
    four = simulate(s, data_parallel_size=4, **kw).summary
    fresh = simulate(Session(), data_parallel_size=4, **kw).summary
    assert four["speedup_vs_no_kv"] == fresh["speedup_vs_no_kv"] != one["speedup_vs_no_kv"]
    tp2 = simulate(s, tensor_parallel_size=2, **kw).summary
    assert tp2["speedup_vs_no_kv"] == simulate(Session(), tensor_parallel_size=2, **kw).summary["speedup_vs_no_kv"]
