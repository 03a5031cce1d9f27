"""Deployment planner: admissible deployments, evaluation through replicas, a non-dominated frontier."""
from __future__ import annotations

import json

import numpy as np

from sim.serving.goodput import SLO
from sim.cost.parallel import load_node
from sim.search.pareto import pareto_mask_bruteforce
from sim.search.planner import Deployment, deployments, evaluate, frontier
from sim.cost.profiles import load_hardware, load_model
from tests.test_replicas import _shared_jobs


def test_deployments_respect_budget_heads_and_memory():
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    deps = list(deployments(m, hw, node, 8, ["exact-prefix"], pp_sizes=(1, 2)))
    assert deps and all(d.gpus <= 8 for d in deps)
    assert not any(d.tensor_parallel_size * d.pipeline_parallel_size == 1 for d in deps)   # 70B needs 2 GPUs
    # the scheduler limits vllm serve takes on an H100 when neither flag is given
    assert Deployment(2, 1, 4, 1024, 8192, "exact-prefix") in deps
    assert Deployment(2, 1, 5, 1024, 8192, "exact-prefix") not in deps


def test_plan_defaults_are_vllm_serves_limits_for_the_gpu():
    from sim.search.planner import serve_limits
    from sim.serving.capacity import SCHEDULER_DEFAULTS
    m = load_model("llama-3-8b")
    for gpu, node, want in [("h100-sxm", "dgx-h100", (1024, 8192)), ("a100-80gb", "dgx-a100", (256, 2048))]:
        hw = load_hardware(gpu)
        assert serve_limits(hw) == want == tuple(SCHEDULER_DEFAULTS[gpu].values())
        deps = list(deployments(m, hw, load_node(node), 1, ["exact-prefix"], tp_sizes=(1,), pp_sizes=(1,)))
        assert [(d.max_num_seqs, d.max_num_batched_tokens) for d in deps] == [want]
    given = list(deployments(m, load_hardware("h100-sxm"), load_node("dgx-h100"), 1, ["exact-prefix"], tp_sizes=(1,),
                             pp_sizes=(1,), max_num_seqs=(64, 256), max_num_batched_tokens=(2048,)))
    assert [(d.max_num_seqs, d.max_num_batched_tokens) for d in given] == [(64, 2048), (256, 2048)]


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


@pytest.mark.parametrize("hardware, node, words", [
    (["--hardware", "local-cpu"], None, "--hardware local-cpu: no shipped node preset(s) of local-cpu's GPUs; name one with --node"),
    (["--hardware", "a100-80gb", "--node", "dgx-h100"], None, "--node dgx-h100: its GPUs are h100-sxm, not --hardware a100-80gb"),
    (["--hardware", "nope"], None, "--hardware: unknown hardware preset 'nope'"),
    (["--hardware", "a100-80gb"], "dgx-a100", None),
    (["--hardware", "dgx-a100"], "dgx-a100", None),
    (["--hardware", "a100-80gb", "--node", "dgx-a100"], "dgx-a100", None)])
def test_plan_takes_the_gpu_name_as_every_command_does(capsys, hardware, node, words):
    # `--hardware` names the GPU here as everywhere (its shipped node is priced), or a node preset as before
    rc = main(["plan", "--model-preset", "llama-3-8b", *hardware, "--gpus", "1", "--tensor-parallel-size", "1",
               "--num-problems", "4", "--json"])
    out, err = capsys.readouterr()
    if words is not None:
        assert rc == 2 and words in err, err
    else:
        assert rc == 0, err
        meta = json.loads(out)["meta"]
        assert meta["node"] == node and meta["hardware"] == "a100-80gb"


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
    from sim.search.planner import run_plan
    m, node = load_model("qwen2.5-32b"), load_node("dgx-h100")
    deps = list(deployments(m, load_hardware(node.gpu), node, 2, ["exact-prefix"], tp_sizes=(1, 2)))
    opts = {"model_preset": "qwen2.5-32b", "node": "dgx-h100", "slo": "e2e=5", "concurrency": 4, "n_requests": 12}
    local = run_plan(None, deps, opts, progress=False)
    on_dask = run_plan(None, deps, opts, backend="dask", workers=2, progress=False)
    assert local == on_dask


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.parquet"
    assert main(BASE + ["--policies", "exact-prefix,asks", "--tensor-parallel-size", "1,2", "--requests", "12",
                        "--concurrency", "4", "--slo", "e2e=5", "--gpu-hour-cost", "2.5", "--out", str(out),
                        "--json"]) == 0
    return out


def test_pareto_of_a_plan_file_per_policy_end_to_end(plan_file, tmp_path, capsys):
    import json

    import pandas as pd
    capsys.readouterr()
    html = tmp_path / "front.html"
    assert main(["pareto", str(plan_file), "--out", str(html), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    df = pd.read_parquet(plan_file)
    assert res["x"] == "gpus" and res["y"] == "goodput_problems_per_s"
    # the frontier over all policies is the plan's own (its on_frontier rows), non-dominated
    front = res["frontier"]
    assert sorted((r["gpus"], r["goodput_problems_per_s"]) for r in front) == \
        sorted(df[df["on_frontier"]][["gpus", "goodput_problems_per_s"]].itertuples(index=False, name=None))
    assert set(res["per_policy"]) == {"exact-prefix", "asks"}
    for pol, rows in res["per_policy"].items():
        mine = df[df["policy"] == pol]
        for r in rows:  # no deployment of the policy has fewer-or-equal GPUs and more goodput
            assert r["policy"] == pol
            assert not ((mine["gpus"] <= r["gpus"]) & (mine["goodput_problems_per_s"] > r["goodput_problems_per_s"])).any()
        best = mine["goodput_problems_per_s"].max()
        assert max(r["goodput_problems_per_s"] for r in rows) == best
    text = html.read_text()
    assert "<html>" in text[:100] and "plotly" in text and "asks: frontier" in text and "dgx-h100" in text
    assert main(["pareto", str(plan_file), "--x", "cost"]) == 0
    out = capsys.readouterr().out
    assert "frontier of asks:" in out and "cost_per_million_output_tokens" in out


@pytest.mark.parametrize("extra,flag", [(["--x", "speed"], "--x"), (["--y", "latency"], "--y"),
                                        (["--out", "f.png"], "--out"), (["--maximize-x"], "--maximize-x")])
def test_pareto_of_a_plan_bad_flags_one_line(plan_file, capsys, extra, flag):
    capsys.readouterr()
    rc = main(["pareto", str(plan_file)] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"rksim: error: {flag}")


def test_pareto_cost_axis_needs_a_price(tmp_path, capsys):
    import pandas as pd

    from sim.search.planner import read_plan
    from sim.search.sweep import write_parquet
    out = tmp_path / "plan.parquet"
    assert main(BASE + ["--policies", "exact-prefix", "--tensor-parallel-size", "2", "--requests", "4",
                        "--concurrency", "2", "--out", str(out), "--json"]) == 0
    df, meta = read_plan(out)
    assert meta["concurrency"] == 2 and meta["model_preset"] == "qwen2.5-32b" and meta["node_preset"] == "dgx-h100"
    capsys.readouterr()
    assert main(["pareto", str(out), "--x", "cost"]) == 2
    assert "--gpu-hour-cost" in capsys.readouterr().err
    write_parquet(pd.DataFrame({"a": [1]}), tmp_path / "other.parquet", {"command": "plan"})
    with pytest.raises(ValueError, match="not a `rksim plan --out` table"):
        read_plan(tmp_path / "other.parquet")


def test_plan_with_expert_parallel_runs_dp_attention_where_the_ep_size_divides_the_experts():
    """--enable-expert-parallel on an MoE model: DP > 1 is vLLM's DP attention + EP (EP size D x TP), so a DP that does
    not divide the 128 experts (3) is left out, and the row says it ran DP attention."""
    from sim.cost.parallel import load_node
    from sim.cost.profiles import load_hardware, load_model
    from sim.search.planner import deployments
    m, hw, node = load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    deps = list(deployments(m, hw, node, 4, ["no-kv"], tp_sizes=(1,), pp_sizes=(1,), enable_expert_parallel=True))
    assert sorted(d.data_parallel_size for d in deps) == [1, 2, 4]
    plain = list(deployments(m, hw, node, 4, ["no-kv"], tp_sizes=(1,), pp_sizes=(1,)))
    assert sorted(d.data_parallel_size for d in plain) == [1, 2, 3, 4]   # replicas: any count


def test_a_plan_deployment_serves_its_experts_as_the_flag_places_them():
    """Deployment.layout: --enable-expert-parallel on an MoE model places whole experts on each TP rank, and under
    sampled routing the busiest rank sets the step (sim.cost.terms.SampledRouting), so a TP 2 deployment serves its
    problems more slowly than with every expert split over both ranks; a dense model's layout is unchanged."""
    from sim.cost.parallel import load_node
    from sim.cost.profiles import load_hardware, load_model
    m, hw, node = load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    dep = Deployment(2, 1, 1, 1024, 8192, "no-kv")
    assert dep.layout(m, True).enable_expert_parallel and not dep.layout(m, False).enable_expert_parallel
    assert not dep.layout(load_model("llama-3-8b"), True).enable_expert_parallel
    work = {"jobs": _shared_jobs(16), "caching": False}
    rows = [evaluate(dep, m, hw, node, lambda _p: work, concurrency=4, enable_expert_parallel=ep,
                     moe_routing="sampled") for ep in (False, True)]
    assert rows[1]["enable_expert_parallel"] and "enable_expert_parallel" not in rows[0]
    assert rows[1]["throughput_tokens_per_s"] < rows[0]["throughput_tokens_per_s"]


def test_plan_prices_a_quantized_release_as_released_unless_told(capsys):
    """gpt-oss-20b is served in its MXFP4 release by default (13.7 GB: one H100 holds it with room for KV);
    --quantization none plans its 16-bit shape; the header and the meta say which was priced; a GPU that cannot
    price the flag is refused, naming it, before any deployment runs."""
    from app.cli import main
    base = ["plan", "--model-preset", "gpt-oss-20b", "--hardware", "dgx-h100", "--gpus", "1", "--policies",
            "no-kv", "--num-problems", "8"]
    out = {}
    for q in (None, "none"):
        assert main([*base, *(["--quantization", q] if q else []), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        out[q] = doc
    assert out[None]["meta"]["quantization"] == "mxfp4" and out["none"]["meta"]["quantization"] is None
    assert out[None]["meta"]["target_options"] == {"enable_expert_parallel": False, "moe_routing": "expected"}
    assert main(base) == 0
    assert "deployments of gpt-oss-20b (mxfp4 experts) on dgx-h100" in capsys.readouterr().out
    assert main([*base[:4], "dgx-a100", *base[5:], "--quantization", "nvfp4"]) == 2
    assert "--quantization 'nvfp4' is not priced" in capsys.readouterr().err


def test_plan_prices_each_step_as_vllm_serves_it_and_says_so(capsys):
    """A plan's steps carry their host time (async scheduling on) and CUDA graphs by default, as ``bench`` prices
    them (``sim.cost.pricing.served_costs``); ``--no-async-scheduling`` adds every step's host time to it (slower),
    ``--no-host-time --enforce-eager`` prices the kernels alone; the header, the meta and each row say which, and
    the meta's ``target_options`` keep only what is not vLLM's default (what a knee re-runs under)."""
    base = ["plan", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "1", "--policies",
            "exact-prefix", "--num-problems", "12", "--max-concurrent-problems", "4"]
    docs = {}
    for name, extra in (("served", []), ("sync", ["--no-async-scheduling"]),
                        ("kernels", ["--no-host-time", "--enforce-eager"])):
        assert main([*base, *extra, "--json"]) == 0
        docs[name] = json.loads(capsys.readouterr().out)
    e2e = {k: d["frontier"][0]["e2e_p99_s"] for k, d in docs.items()}
    assert e2e["sync"] > e2e["served"] and e2e["sync"] > e2e["kernels"]
    assert docs["served"]["meta"]["target_options"] == {}
    assert docs["sync"]["meta"]["target_options"] == {"async_scheduling": False}
    assert docs["kernels"]["meta"]["target_options"] == {"host_time": False, "enforce_eager": True}
    assert docs["served"]["meta"]["overheads"].startswith("host time per step priced (async scheduling on")
    assert docs["served"]["meta"]["overheads"].endswith("CUDA graphs")
    assert docs["kernels"]["meta"]["overheads"].startswith("no host time per step (turned off")
    assert docs["kernels"]["meta"]["overheads"].endswith("eager kernels")
    assert main(base) == 0
    assert "host time per step priced (async scheduling on" in capsys.readouterr().out


def test_plan_sizes_the_kv_as_the_named_vllm_generation(capsys):
    """``rksim plan --vllm-memory-rules GEN``: every deployment's KV blocks are vLLM GEN's (``kv_blocks`` under
    ``ServingConfig(memory_rules=GEN)``; vLLM 0.6.5's 1.79 GiB of non-torch memory leaves fewer than the default),
    each row and the meta's ``target_options`` say so, a knee re-runs under it and its caption says so, and the
    dashboard's Serving page gets it with the deployment."""
    from app.ui_backend.deployments import serving_load
    from sim.search.planner import deployment_knee, evaluate_deployment
    from sim.serving.capacity import ServingConfig, kv_blocks

    base = ["plan", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "1", "--policies",
            "exact-prefix", "--num-problems", "6", "--max-concurrent-problems", "2", "--json"]
    assert main([*base, "--vllm-memory-rules", "v0.6.5"]) == 0
    meta = json.loads(capsys.readouterr().out)["meta"]
    assert meta["target_options"] == {"memory_rules": "v0.6.5"}
    params = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1, "max_num_seqs": 256,
              "max_num_batched_tokens": 2048, "policy": "exact-prefix"}
    m, hw, node = load_model("llama-3-8b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    rows = {r: evaluate_deployment(None, params=params, model_preset="llama-3-8b", node="dgx-h100", n_requests=6,
                                   memory_rules=r) for r in ("v1", "v0.6.5")}
    want = {r: kv_blocks(m, hw, ServingConfig(max_num_seqs=256, max_num_batched_tokens=2048, memory_rules=r),
                         None, 16, node)[1] for r in rows}
    assert {r: x["kv_capacity_blocks_per_replica"] for r, x in rows.items()} == want
    assert want["v0.6.5"] < want["v1"] and rows["v0.6.5"]["memory_rules"] == "v0.6.5" and "memory_rules" not in rows["v1"]
    knee = deployment_knee(None, params, [1.0], model_preset="llama-3-8b", node="dgx-h100", n_requests=6,
                           memory_rules="v0.6.5")
    assert f"KV capacity {want['v0.6.5']} blocks per replica (sized as vLLM v0.6.5 sizes it)" in knee["provenance"]
    load = serving_load({**params, "gpus": 1}, {**meta, "model_preset": "llama-3-8b", "hardware": "h100-sxm"})
    assert load["serving"]["memory_rules"] == "v0.6.5"
    assert serving_load({**params, "gpus": 1}, {"target_options": {}})["serving"]["memory_rules"] == "v1"


def test_a_plan_refuses_a_workload_past_the_fitted_range_unless_extrapolation_is_allowed():
    """A plan checks its problems against the GPU profile's fitted range as bench checks a plain workload: a
    3,000-token prompt is one 3,000-token chunk at rtx-pro-6000's vllm serve budget of 8,192, past the 2,048 new tokens
    its profiles measured (refused, naming the flag that prices it); at a 2,048-token budget the chunks fit; with
    ``allow_extrapolation`` the row is priced and says what lay outside."""
    from sim.base.errors import OutOfCalibrationError
    from sim.bench.plain import plain_job
    from sim.search.planner import check_plan_range
    m, hw, node = load_model("llama-3-8b"), load_hardware("rtx-pro-6000"), load_node("rtx-pro-6000-pcie")
    jobs = [(0, plain_job(3000, 8, m.n_layers, 16)), (1, plain_job(200, 8, m.n_layers, 16))]
    wide, narrow = Deployment(1, 1, 1, 1024, 8192, "no-kv"), Deployment(1, 1, 1, 1024, 2048, "no-kv")
    with pytest.raises(OutOfCalibrationError, match=r"new tokens of one forward item 3000 .*--allow-extrapolation"):
        check_plan_range(wide, m, hw, jobs)
    assert check_plan_range(narrow, m, hw, jobs) == []
    work = {"jobs": jobs, "caching": False}
    with pytest.raises(OutOfCalibrationError):
        evaluate(wide, m, hw, node, lambda _p: work)
    row = evaluate(wide, m, hw, node, lambda _p: work, allow_extrapolation=True)
    assert row["goodput_problems_per_s"] > 0 and "new tokens of one forward item 3000" in row["extrapolated"]
    assert "extrapolated" not in evaluate(narrow, m, hw, node, lambda _p: work)
