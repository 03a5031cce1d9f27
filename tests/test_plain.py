"""Plain serving workloads (``rksim bench serve|throughput``), ``calibrate vllm-bench`` and ``rksim validate``.

No torch. Small workloads: every test runs in well under a second or two.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import main
from sim.bench import plain
from sim.serving.capacity import ServingConfig
from sim.cost.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parents[1]
FIGS = ROOT / "docs" / "validation" / "published-figures.yaml"


def _err(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("rksim: error:") and "\n" not in err, err
    return err


def _serve(tmp_path, capsys, *extra, name="r.json"):
    argv = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--save-result",
            "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", name, *extra]
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads((tmp_path / name).read_text()), out


# ------------------------------------------------------------------ a reader written for vLLM's keys
VLLM_SCALARS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "max_concurrency", "request_rate", "burstiness",
                "num_prompts")
VLLM_STATS = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "std", "p99")]
VLLM_DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "start_times")


def read_vllm_result(d: dict) -> dict:
    """What a consumer of ``vllm bench serve --save-result --save-detailed`` files reads (vLLM's keys)."""
    for k in VLLM_SCALARS + tuple(VLLM_STATS) + VLLM_DETAILED:
        assert k in d, k
    n = d["completed"]
    assert all(len(d[k]) == n for k in VLLM_DETAILED)
    assert all(isinstance(x, list) for x in d["itls"])
    return {"n": n, "dur": float(d["duration"]), "in": np.array(d["input_lens"]), "out": np.array(d["output_lens"]),
            "ttft": np.array(d["ttfts"]), "itls": d["itls"]}


def test_result_json_is_vllms_schema_and_consistent(tmp_path, capsys):
    d, out = _serve(tmp_path, capsys, "--num-prompts", "30", "--random-input-len", "300", "--random-output-len", "20",
                    "--random-range-ratio", "0.4", "--request-rate", "20", "--seed", "3")
    r = read_vllm_result(d)
    assert d["request_throughput"] == pytest.approx(r["n"] / r["dur"])
    assert d["output_throughput"] == pytest.approx(r["out"].sum() / r["dur"])
    assert d["total_token_throughput"] == pytest.approx((r["in"].sum() + r["out"].sum()) / r["dur"])
    assert d["mean_ttft_ms"] == pytest.approx(r["ttft"].mean() * 1000)
    itl = np.concatenate([np.asarray(x) for x in r["itls"]])
    assert d["p99_itl_ms"] == pytest.approx(np.percentile(itl, 99) * 1000)
    tpot = [(lat - t) / (o - 1) for lat, t, o in zip(d["latencies"], d["ttfts"], d["output_lens"]) if o > 1]
    assert d["median_tpot_ms"] == pytest.approx(np.median(tpot) * 1000)
    assert d["request_rate"] == 20.0 and d["max_concurrency"] is None
    # vLLM's printed block
    assert "============ Serving Benchmark Result ============" in out
    assert "Request rate configured (RPS):           20.00" in out
    assert "simulated: model llama-3-8b on h100-sxm" in out and "max_num_batched_tokens 8192" in out


def test_without_save_detailed_the_per_request_fields_are_dropped(tmp_path, capsys):
    argv = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "5",
            "--save-result", "--result-dir", str(tmp_path)]
    assert main(argv) == 0
    f = tmp_path / "rksim-infqps-llama-3-8b-h100-sxm.json"
    d = json.loads(f.read_text())
    assert "ttfts" not in d and "itls" not in d and "mean_ttft_ms" in d


def test_ignore_eos_yields_exactly_the_requested_lengths(tmp_path, capsys):
    d, _ = _serve(tmp_path, capsys, "--num-prompts", "25", "--random-input-len", "200", "--random-output-len", "40",
                  "--random-range-ratio", "0.5", "--ignore-eos", "--seed", "7", "--max-concurrency", "4")
    wl = plain.random_workload(25, 200, 40, 0.5, 0, 7)
    assert d["input_lens"] == wl.input_lens.tolist()
    assert d["output_lens"] == wl.output_lens.tolist()
    # every request produced exactly its tokens: output_len - 1 gaps after the first
    assert [len(x) + 1 for x in d["itls"]] == wl.output_lens.tolist()
    d2, _ = _serve(tmp_path, capsys, "--num-prompts", "10", "--random-input-len", "64", "--random-output-len", "17",
                   name="fixed.json")
    assert set(d2["output_lens"]) == {17} and set(d2["input_lens"]) == {64}
    assert all(len(x) == 16 for x in d2["itls"])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 5000), st.integers(1, 3000), st.floats(0, 0.99), st.integers(0, 100),
       st.integers(0, 2 ** 32))
def test_random_lengths_follow_vllms_ranges(n, li, lo, r, pre, seed):
    if pre + math.floor(li * (1 - r)) < 1:   # vLLM refuses a possibly empty prompt too
        with pytest.raises(plain.PlainError, match="--random-input-len"):
            plain.random_workload(n, li, lo, r, pre, seed)
        return
    wl = plain.random_workload(n, li, lo, r, pre, seed)
    assert wl.n == n
    assert (wl.input_lens >= pre + math.floor(li * (1 - r))).all()
    assert (wl.input_lens <= pre + math.ceil(li * (1 + r))).all()
    assert (wl.output_lens >= max(math.floor(lo * (1 - r)), 1)).all()
    assert (wl.output_lens <= max(math.ceil(lo * (1 + r)), 1)).all()
    again = plain.random_workload(n, li, lo, r, pre, seed)
    assert (again.input_lens == wl.input_lens).all() and (again.output_lens == wl.output_lens).all()


def test_random_lengths_are_vllms_draws():
    """vLLM's RandomDataset: default_rng(seed); input lengths, then output lengths (num_special = 0)."""
    rng = np.random.default_rng(11)
    inp = rng.integers(math.floor(1000 * 0.7), math.ceil(1000 * 1.3) + 1, size=8)
    out = rng.integers(math.floor(100 * 0.7), math.ceil(100 * 1.3) + 1, size=8)
    wl = plain.random_workload(8, 1000, 100, 0.3, 0, 11)
    assert wl.input_lens.tolist() == inp.tolist() and wl.output_lens.tolist() == out.tolist()


def test_arrivals_follow_vllm_get_request():
    assert (plain.arrival_times(5, math.inf) == 0).all()
    t = plain.arrival_times(400, 4.0, 1.0, seed=2)
    assert t[-1] == pytest.approx(400 / 4.0)      # rescaled: the last request is sent at N / R
    assert np.all(np.diff(t) >= 0)
    d = np.random.RandomState(2).gamma(shape=0.5, scale=1.0 / (4.0 * 0.5), size=400)
    c = np.cumsum(d)
    assert plain.arrival_times(400, 4.0, 0.5, seed=2) == pytest.approx(c * (100.0 / c[-1]))
    u = plain.arrival_times(10, 2.0, math.inf)
    assert np.diff(u) == pytest.approx(np.full(9, 0.5))
    # burstier arrivals (B < 1) have more variable gaps than Poisson
    assert np.std(np.diff(plain.arrival_times(2000, 4.0, 0.25, 1))) > np.std(np.diff(plain.arrival_times(2000, 4.0, 1, 1)))


def _run(**kw):
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    wl = kw.pop("wl", None) or plain.random_workload(40, 512, 32, 0.2, kw.pop("prefix", 0), 0)
    return plain.run(m, hw, wl, **kw)


def test_max_concurrency_caps_outstanding_requests():
    r = _run(max_concurrency=3)
    res = plain.serve_result(r, max_concurrency=3)
    assert res["max_concurrent_requests"] == 3
    assert r.info["max_running_seqs"] <= 3
    assert min(res["queue_times"]) == 0.0 and max(res["queue_times"]) > 0
    free = plain.serve_result(_run())
    assert free["max_concurrent_requests"] == 40


def test_same_inputs_give_bit_identical_results():
    a = plain.serve_result(_run(request_rate=30.0, burstiness=0.5, seed=4))
    b = plain.serve_result(_run(request_rate=30.0, burstiness=0.5, seed=4))
    assert json.dumps(a) == json.dumps(b)


def test_the_one_scheduler_binds_kv_and_preempts():
    from sim.serving.capacity import ServingConfig
    m = load_model("llama-3-8b")
    cap = 100 * 16 * m.kv_bytes_per_token   # 100 blocks: three ~34-block requests, no room to grow
    tight = _run(serving=ServingConfig(kv_capacity_bytes=cap))
    assert tight.info["kv_capacity_blocks"] == 100 and tight.info["preemptions"] > 0
    assert tight.info["max_running_seqs"] == 3
    assert plain.serve_result(tight)["completed"] == 40
    roomy = _run()
    assert roomy.info["preemptions"] == 0 and tight.duration > roomy.duration


def test_prefix_caching_on_and_off():
    from sim.serving.capacity import ServingConfig
    on = _run(prefix=256)
    off = _run(prefix=256, serving=ServingConfig(prefix_caching=False))
    assert on.info["prefix_hit_tokens"] >= 39 * 256 and off.info["prefix_hit_tokens"] == 0
    assert on.ttft.mean() < off.ttft.mean()


def test_a_token_policy_bounds_each_requests_kv():
    from policies import get_policy
    from sim.serving.capacity import ServingConfig
    m = load_model("llama-3-8b")
    wl = plain.random_workload(16, 128, 1024, 0, 0, 0)
    cap = 200 * 16 * m.kv_bytes_per_token
    sv = ServingConfig(kv_capacity_bytes=cap)
    full = _run(wl=wl, serving=sv)
    pol = _run(wl=wl, serving=sv, token_policy=get_policy("streamingllm", budget=128, buffer=16))
    assert full.info["preemptions"] > 0 and pol.info["preemptions"] == 0
    assert pol.info["token_policy"] == "streamingllm" and not pol.info["prefix_caching"]
    assert [len(x) + 1 for x in pol.itls] == wl.output_lens.tolist()


def test_bench_throughput_is_offline_with_vllms_llm_defaults(capsys, tmp_path):
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--input-len", "256",
                 "--output-len", "16", "--num-prompts", "50", "--output-json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Throughput: ") and "max_num_batched_tokens 16384" in text
    d = json.loads(out.read_text())
    assert d["num_requests"] == 50 and d["total_num_tokens"] == 50 * 272
    assert d["requests_per_second"] == pytest.approx(50 / d["elapsed_time"])
    assert plain.scheduler_defaults("a100-80gb", offline=True) == {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    assert plain.scheduler_defaults("a100-80gb", offline=False)["max_num_batched_tokens"] == 2048


def test_vllm_memory_rules_size_the_kv_as_that_generation(capsys):
    """``--vllm-memory-rules GEN`` (``ServingConfig.memory_rules``): the run's KV blocks are vLLM GEN's (its activation
    peak, non-torch and CUDA-graph terms, ``sim.serving.capacity.vllm_kv_budget``), and the provenance line says so;
    the default (``v1``) says nothing extra. Qwen3-32B on one H100: vLLM 0.11 leaves about 4.5 GiB of KV."""
    import re

    from sim.serving.capacity import CUDA_TOTAL_BYTES, vllm_kv_budget
    base = ["bench", "throughput", "--model-preset", "qwen3-32b", "--hardware", "h100-sxm", "--input-len", "64",
            "--output-len", "4", "--num-prompts", "4"]
    m = load_model("qwen3-32b")
    blocks = {}
    for rules in ("v1", "v0.11", "v0.19"):
        assert main(base + ["--vllm-memory-rules", rules]) == 0
        out = capsys.readouterr().out
        blocks[rules] = int(re.search(r"KV capacity (\d+) blocks", out).group(1))
        want = vllm_kv_budget(m, CUDA_TOTAL_BYTES["h100-sxm"], 0.9, 16384, 1024, 1, 1, rules)   # offline defaults
        assert blocks[rules] == want["num_gpu_blocks"], (rules, blocks[rules], want["num_gpu_blocks"])
        assert (f"sized as vLLM {rules} sizes it" in out) == (rules != "v1"), out
    assert len(set(blocks.values())) == 3 and blocks["v0.11"] * 16 * m.kv_bytes_per_token < 4.6 * 2 ** 30
    assert main(base + ["--kv-capacity-bytes", "1e9", "--vllm-memory-rules", "v0.11"]) == 0   # given bytes: no rules
    assert "sized as vLLM" not in capsys.readouterr().out


def test_a_prompt_past_the_fitted_range_needs_allow_extrapolation(capsys, tmp_path):
    """h100-sxm's profiles measured up to 4,096 new tokens per item; a 6,000-token prompt under vllm serve's 8,192-token
    budget is one 6,000-token chunk. Every bench command refuses it naming the dimension and the flag that prices
    it; with ``--allow-extrapolation`` it is priced, and the provenance line and the JSON say what lay outside."""
    base = ["--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--input-len", "6000", "--output-len", "4",
            "--num-prompts", "2"]
    for cmd in (["bench", "serve", "--no-progress"], ["bench", "throughput"],
                ["bench", "sweep", "--no-progress", "--request-rate", "1,2"]):
        err = _err(capsys, cmd + base)
        assert "new tokens of one forward item 6000 is outside the fitted range [1, 4096]" in err, (cmd, err)
        assert "--allow-extrapolation prices it anyway" in err
        assert main(cmd + base + ["--allow-extrapolation"]) == 0, cmd
        assert "extrapolated: hardware h100-sxm: new tokens of one forward item 6000" in capsys.readouterr().out
    assert main(["bench", "serve", "--no-progress", *base, "--allow-extrapolation", "--save-result", "--result-dir",
                 str(tmp_path), "--result-filename", "x.json"]) == 0
    capsys.readouterr()
    ext = json.loads((tmp_path / "x.json").read_text())["rksim"]["extrapolated"]
    assert len(ext) == 1 and "fitted_range.max_new_tokens" in ext[0]
    assert main(["bench", "serve", "--no-progress", *base[:5], "3000", *base[6:], "--allow-extrapolation"]) == 0
    assert "extrapolated" not in capsys.readouterr().out   # inside the range: nothing to say
    # vLLM V1 chunks the prompt to the budget (2,048 <= 4,096: inside); prefill-first runs it whole (outside)
    assert main(["bench", "serve", "--no-progress", *base, "--max-num-batched-tokens", "2048"]) == 0
    assert "extrapolated" not in capsys.readouterr().out
    assert "item 6000 is outside" in _err(capsys, ["bench", "serve", "--no-progress", *base, "--max-num-batched-tokens",
                                                   "2048", "--scheduler", "prefill-first"])


def test_dataset_path_of_lengths(tmp_path, capsys):
    f = tmp_path / "mix.csv"
    f.write_text("input_len,output_len\n100,5\n2000,40\n7,300\n")
    d, _ = _serve(tmp_path, capsys, "--dataset-path", str(f))
    assert d["input_lens"] == [100, 2000, 7] and d["output_lens"] == [5, 40, 300]
    j = tmp_path / "mix.json"
    j.write_text(json.dumps([{"input_len": 3, "output_len": 2}, [9, 1]]))
    assert plain.file_workload(j).input_lens.tolist() == [3, 9]
    # a vllm bench --save-detailed file replays its own lengths
    assert plain.file_workload(tmp_path / "r.json").output_lens.tolist() == [5, 40, 300]


def test_bad_flags_give_one_line_errors_naming_the_flag(capsys, tmp_path):
    base = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "3"]
    assert "--request-rate" in _err(capsys, base + ["--request-rate", "-1"])
    assert "--request-rate" in _err(capsys, base + ["--request-rate", "fast"])
    assert "--burstiness" in _err(capsys, base + ["--burstiness", "0"])
    assert "--random-range-ratio" in _err(capsys, base + ["--random-range-ratio", "1"])
    assert "--num-prompts" in _err(capsys, base + ["--num-prompts", "0"])
    assert "--max-concurrency" in _err(capsys, base + ["--max-concurrency", "1.5"])
    assert "--metric-percentiles" in _err(capsys, base + ["--metric-percentiles", "50,x"])
    assert "--percentile-metrics" in _err(capsys, base + ["--percentile-metrics", "ttft,speed"])
    assert "--dataset-path" in _err(capsys, base + ["--dataset-path", str(tmp_path / "none.csv")])
    assert "--dataset-path" in _err(capsys, base + ["--dataset-name", "random", "--dataset-path", str(FIGS)])
    assert "--policy" in _err(capsys, base + ["--policy", "asks"])
    assert "--hardware" in _err(capsys, ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "tpu9"])
    bad = tmp_path / "bad.csv"
    bad.write_text("input_len,output_len\n10,x\n")
    assert "row 0" in _err(capsys, base[:-2] + ["--dataset-path", str(bad)])
    assert "--input-len" in _err(capsys, ["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware",
                                          "h100-sxm"])


# ------------------------------------------------------------------ goodput, replicas and routers on bench serve
SMALL = ("--num-prompts", "24", "--random-input-len", "300", "--random-output-len", "20", "--random-range-ratio",
         "0.5", "--seed", "2")


def test_goodput_is_vllms_rule_and_both_slo_spellings_agree(tmp_path, capsys):
    base, _ = _serve(tmp_path, capsys, *SMALL, "--request-rate", "40", name="base.json")
    assert base["request_goodput"] is None                      # no SLO stated
    d, out = _serve(tmp_path, capsys, *SMALL, "--request-rate", "40", "--slo", "ttft=0.015,tpot=0.008", name="s.json")
    # the same run: the SLO only adds the figure
    for k in ("duration", "ttfts", "latencies", "request_throughput", "p99_ttft_ms"):
        assert d[k] == base[k], k
    ttft, e2e, n = np.array(d["ttfts"]), np.array(d["latencies"]), np.array(d["output_lens"])
    tpot = np.where(n > 1, (e2e - ttft) / np.maximum(n - 1, 1), 0.0)  # vLLM: 0 for one output token
    good = int(np.sum((ttft <= 0.015) & (tpot <= 0.008)))
    assert 0 < good < d["completed"]                             # the SLO bites on some requests, not all
    assert d["request_goodput"] == pytest.approx(good / d["duration"], rel=1e-12)
    assert f"Request goodput (req/s):                 {good / d['duration']:<10.2f}" in out
    v, _ = _serve(tmp_path, capsys, *SMALL, "--request-rate", "40", "--goodput", "ttft:15", "tpot:8", name="v.json")
    assert v["request_goodput"] == d["request_goodput"] and v["rksim"]["slo"] == d["rksim"]["slo"]


def test_replicas_behind_a_router(tmp_path, capsys):
    one, _ = _serve(tmp_path, capsys, *SMALL, "--request-rate", "0.5", name="one.json")
    # a request that overlaps no other on one replica is alone on its replica too: the same timings; one that
    # waited for another on one replica does not on two
    two, out = _serve(tmp_path, capsys, *SMALL, "--request-rate", "0.5", "--data-parallel-size", "2",
                      "--router", "round-robin", "--slo", "e2e=1", name="two.json")
    st_, end = np.array(one["start_times"]), np.array(one["start_times"]) + np.array(one["latencies"])
    alone = np.array([not np.any((st_ < end[i]) & (end > st_[i]) & (np.arange(len(st_)) != i))
                      for i in range(len(st_))])
    assert alone.sum() >= 18 and (~alone).any()
    np.testing.assert_allclose(np.array(two["ttfts"])[alone], np.array(one["ttfts"])[alone], rtol=1e-12)
    np.testing.assert_allclose(np.array(two["latencies"])[alone], np.array(one["latencies"])[alone], rtol=1e-12)
    assert np.all(np.array(two["latencies"]) <= np.array(one["latencies"]) + 1e-12)
    assert np.sum(np.array(two["latencies"]) < np.array(one["latencies"]) - 1e-6) >= 1
    reps = two["rksim"]["per_replica"]
    assert [r["completed"] for r in reps] == [12, 12]              # round-robin alternates
    assert sum(r["request_goodput"] for r in reps) == pytest.approx(two["request_goodput"])
    assert "------------Per replica (round-robin)-------------" in out and "2 replicas behind round-robin" in out
    # under load, replicas serve faster than one; least-outstanding balances the in-flight counts
    busy1, _ = _serve(tmp_path, capsys, *SMALL, name="b1.json")
    busy4, _ = _serve(tmp_path, capsys, *SMALL, "--data-parallel-size", "4", "--router", "least-outstanding",
                      name="b4.json")
    assert busy4["duration"] < busy1["duration"] and busy4["mean_ttft_ms"] < busy1["mean_ttft_ms"]
    assert [r["completed"] for r in busy4["rksim"]["per_replica"]] == [6, 6, 6, 6]   # all sent at t = 0
    # a shared prefix: prefix-affinity sends every request to one replica (its cache), below the imbalance rule
    pre, _ = _serve(tmp_path, capsys, "--num-prompts", "8", "--random-input-len", "300", "--random-output-len", "20",
                    "--random-prefix-len", "256", "--request-rate", "2", "--data-parallel-size", "2", name="pre.json")
    assert sorted(r["completed"] for r in pre["rksim"]["per_replica"]) == [0, 8]


def test_bench_serve_deployment_flags_bad_values(capsys):
    base = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "3"]
    assert "--router" in _err(capsys, base + ["--data-parallel-size", "2", "--router", "random"])
    assert "--data-parallel-size" in _err(capsys, base + ["--data-parallel-size", "0"])
    assert "--slo" in _err(capsys, base + ["--slo", "ttft"])
    assert "--goodput" in _err(capsys, base + ["--goodput", "ttft=5"])
    assert "--goodput" in _err(capsys, base + ["--goodput", "ttft:-5"])
    assert "--goodput" in _err(capsys, base + ["--goodput", "ttft:5", "--slo", "ttft=1"])


# ------------------------------------------------------------------ calibrate vllm-bench
TRUE = {"eff_c": 0.52, "eff_m": 0.61, "per_kernel_s": 7e-6}


def _known_files(d: Path, cases, host_step=None, name="syn") -> list:
    """vllm bench serve files written by rksim itself from a known profile (``TRUE``), one per ``(rate,
    max_concurrency, input_len, output_len)``; ``host_step``: None, a sync-intake server, or a zero-cost one, an
    async server (sim.serving.intake)."""
    m = load_model("llama-3-8b")
    # sm_count None: the fitter prices the plain per-operator roofline (calibrate.fit drops wave quantisation,
    # whose matrix shapes its terms do not carry), so the known profile is of that form
    true_hw = dataclasses.replace(load_hardware("h100-sxm"), per_layer_s=0.0, host_per_iter_s=0.0,
                                  sample_s_per_vocab=0.0, sm_count=None, host_step=host_step, frontend=None, **TRUE)
    files = []
    for j, (rate, conc, il, ol) in enumerate(cases):
        wl = plain.random_workload(30, il, ol, 0.5, 0, seed=j)
        # eager: calibrate.vllm_bench replays the files' iterations without CUDA-graph padding (sim.cost.graphs)
        r = plain.run(m, true_hw, wl, request_rate=rate, max_concurrency=conc, seed=j,
                      serving=ServingConfig(enforce_eager=True))
        f = d / f"{name}{j}.json"
        f.write_text(json.dumps(plain.serve_result(r, request_rate=rate, max_concurrency=conc)))
        files.append(f)
    return files


@pytest.fixture(scope="module")
def syn_files(tmp_path_factory):
    """Three files from a known profile (idle gaps, a burst, a cap)."""
    return _known_files(tmp_path_factory.mktemp("syn"),
                        [(1.5, None, 800, 32), (math.inf, 8, 400, 24), (10.0, 16, 1500, 12)])


def test_calibrate_vllm_bench_recovers_a_known_profile(syn_files):
    from calibrate import vllm_bench as vb
    m, base = load_model("llama-3-8b"), load_hardware("h100-sxm")
    out = vb.fit_files(syn_files, m, base, async_scheduling=False)   # the files' server: no host_step, sync intake
    c = out["coefficients"]
    for k, v in TRUE.items():
        assert c[k] == pytest.approx(v, rel=0.05), (k, c[k])
    assert c["per_iteration_s"] == pytest.approx(TRUE["per_kernel_s"] * (11 * m.n_layers + 4), rel=0.05)
    assert all(f["mismatched"] == 0 and f["matched"] > 0 for f in out["per_file"])
    # the held-out file is predicted, not fitted
    assert out["holdout"] == str(syn_files[-1])
    assert [f["file"] for f in out["per_file"]] == [str(f) for f in syn_files[:2]]
    for k in ("request_throughput", "median_ttft_ms", "median_tpot_ms", "p99_e2el_ms"):
        assert abs(out["errors"][k]) < 0.05, (k, out["errors"][k])


def test_calibrate_vllm_bench_replays_an_async_servers_sends_a_step_later(tmp_path):
    """Files from a server under async scheduling (arrivals first scheduled a step later, sim.serving.intake): the
    fitter's replay takes them by the same rule (the default) and recovers the profile; replayed as sync, the
    iterations it places do not match the measured ones."""
    from calibrate import vllm_bench as vb
    from sim.cost.overheads import HostStepCost
    m = load_model("llama-3-8b")
    files = _known_files(tmp_path, [(1.5, None, 800, 32), (10.0, 16, 1500, 12)], HostStepCost(base_s=0.0), "async")
    out = vb.fit_files(files, m, load_hardware("h100-sxm"))
    for k, v in TRUE.items():
        assert out["coefficients"][k] == pytest.approx(v, rel=0.05), k
    assert all(f["mismatched"] == 0 for f in out["per_file"])
    assert abs(out["errors"]["median_ttft_ms"]) < 0.05
    sync = vb.fit_files(files, m, load_hardware("h100-sxm"), async_scheduling=False)
    assert sum(f["mismatched"] for f in sync["per_file"]) > 0


def test_calibrate_vllm_bench_cli_writes_a_loadable_preset(syn_files, tmp_path, capsys):
    preset = tmp_path / "fit.yaml"
    assert main(["calibrate", "vllm-bench", *map(str, syn_files[:2]), "--model-preset", "llama-3-8b", "--hardware",
                 "h100-sxm", "--no-async-scheduling", "--out", str(preset)]) == 0
    text = capsys.readouterr().out
    assert "held-out file" in text and "eff_m 0.61" in text
    hw = load_hardware(str(preset))
    assert hw.calibrated and hw.eff_m == pytest.approx(TRUE["eff_m"], rel=0.05)
    assert hw.fitted_range["models"] == ["llama-3-8b"]


def test_calibrate_vllm_bench_refuses_files_without_per_request_data(tmp_path, capsys):
    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"duration": 1.0, "completed": 3, "mean_ttft_ms": 5.0}))
    e = _err(capsys, ["calibrate", "vllm-bench", str(f), "--model-preset", "llama-3-8b", "--hardware", "h100-sxm"])
    assert str(f) in e and "--save-detailed" in e
    g = tmp_path / "bundled.json"
    g.write_text(json.dumps({"input_lens": [5], "output_lens": [20], "ttfts": [0.01], "itls": [[0.1, 0.1]],
                             "start_times": [0.0]}))
    assert "bundled" in _err(capsys, ["calibrate", "vllm-bench", str(g), "--model-preset", "llama-3-8b",
                                      "--hardware", "h100-sxm"])


def test_calibrate_serve_run_folder_as_a_vllm_result(tmp_path):
    """``calibrate serve --save-result``'s conversion: token times from the measured iteration clocks."""
    import pandas as pd

    from calibrate.vllm_bench import load_bench_file, serve_run_result
    it = pd.DataFrame({"iteration": [0, 1, 2, 3], "seqs": [[0, 1], [0, 1], [1], [2]],
                       "sample": [[True, True], [True, True], [True], [True]],
                       "wall_s": [0.5, 0.1, 0.1, 0.4], "sched_wall_s": [0.0, 0.0, 0.0, 0.0]})
    rq = pd.DataFrame({"rid": [0, 1, 2], "prompt_len": [30, 40, 12], "arrival_iter": [0, 0, 3]})
    it.to_parquet(tmp_path / "iterations.parquet")
    rq.to_parquet(tmp_path / "requests.parquet")
    (tmp_path / "serve.json").write_text(json.dumps({"clock": "wall", "config": {"concurrency": 2, "model": "m"}}))
    d = serve_run_result(tmp_path)
    read_vllm_result(d)
    assert d["output_lens"] == [2, 3, 1] and d["start_times"] == [0.0, 0.0, pytest.approx(0.7)]
    assert d["max_concurrency"] is None and d["rksim"]["closed_loop_users"] == 2
    assert d["ttfts"] == [0.5, 0.5, pytest.approx(0.4)]
    assert d["itls"][1] == [pytest.approx(0.1), pytest.approx(0.1)]
    f = tmp_path / "v.json"
    f.write_text(json.dumps(d))
    assert load_bench_file(f).token_times[1].tolist() == pytest.approx([0.5, 0.6, 0.7])


# ------------------------------------------------------------------ validate
def test_validate_the_shipped_figures(capsys, tmp_path):
    from sim.bench.validate import load_figures, run_figures
    figs = load_figures(FIGS)
    assert len(figs) >= 10
    # the 3,000-request offline runs are priced by tests/test_validate_figures.py; here the rest
    df = run_figures([f for f in figs if int(f["workload"].get("num_prompts", 0) or 0) <= 1000])
    ok = df[df["ratio"].notna()]
    assert len(ok) >= 6
    assert (ok["ratio"] > 0).all()
    fp8 = df[df["quantization"] == "fp8"]
    # --quantization fp8 is priced (sim.cost.profiles.with_precision); a prompt beyond the fitted range is refused
    # for that alone
    inside = fp8[~fp8["status"].astype(str).str.contains("outside the fitted range")]
    assert len(inside) and inside["ratio"].notna().all() and not fp8["status"].astype(str).str.contains("not priced").any()
    # tensor parallelism is priced (sim.cost.parallel), with the node's measured all-reduce
    tp2 = df[df["id"] == "lambda-2xa100-tp2-llama3-8b-median-tpot"].iloc[0]
    assert tp2["ratio"] > 0 and tp2["status"] in ("ok", "off by more than 25%")
    # figures from more than one publisher, each with the exact place it was read
    from urllib.parse import urlparse
    pubs = {"/".join(urlparse(f["source"]["url"]).path.split("/")[1:3]) if "github.com" in f["source"]["url"]
            else urlparse(f["source"]["url"]).netloc for f in figs}
    assert {"LambdaLabsML/vllm-benchmark", "buildkite.com", "NVIDIA/TensorRT-LLM"} <= pubs
    assert all(f["source"].get("where") for f in figs)
    md = tmp_path / "r.md"
    assert main(["validate", str(FIGS), "--markdown", str(md)]) == 0
    assert "rksim validate" in md.read_text() and "| lambda-h100-llama3-8b-median-tpot |" in md.read_text()


def test_validate_refuses_unpriced_dtypes_by_name(tmp_path):
    from sim.bench.validate import refusal
    f = {"id": "x", "dtype": "int4-awq", "parallelism": {"tp": 1}}
    assert "int4-awq" in refusal(f)
    assert refusal({"id": "y", "dtype": "bf16", "parallelism": {"tp": 1, "pp": 1}}) is None
    assert refusal({"id": "z", "dtype": "fp16", "parallelism": {"tp": 2, "pp": 2}}) is None
    assert "dp=2" in refusal({"id": "z", "dtype": "fp16", "parallelism": {"dp": 2}})


def test_validate_bad_file_one_line(tmp_path, capsys):
    f = tmp_path / "f.yaml"
    f.write_text("figures:\n  - id: a\n    model: llama-3-8b\n")
    assert "missing field" in _err(capsys, ["validate", str(f)])
    f.write_text("figures:\n  - {id: a, model: llama-3-8b, hardware: h100-sxm, dtype: bf16, workload: {input_len: 8},"
                 " metric: speed, value: 1, source: {url: x}}\n")
    assert "metric 'speed'" in _err(capsys, ["validate", str(f)])


def test_token_counts_a_chunk_of_requests_at_a_time_are_the_whole_runs(monkeypatch):
    """The peak output tokens per second counted over requests a chunk at a time as the front end's gaps land
    (bounded memory) is the count over every token at once; the front end's gaps (8-byte arrays) read back as the
    lists they were."""
    import sim.bench.plain_results as pr
    r = _run(request_rate=40.0, seed=2)
    assert isinstance(r.itls, pr.Gaps) and isinstance(r.itls[0], list)
    whole = plain.serve_result(r)
    t = np.concatenate([whole["start_times"][i] + whole["ttfts"][i] + np.concatenate([[0.0], np.cumsum(g)])
                        for i, g in enumerate(whole["itls"])])
    t0 = min(whole["start_times"])
    assert whole["max_output_tokens_per_s"] == float(np.bincount((t - t0).astype(np.int64)).max())
    monkeypatch.setattr(plain, "FRONTEND_CHUNK", 3)   # 40 requests in 14 chunks, the last one short
    assert json.dumps(plain.serve_result(_run(request_rate=40.0, seed=2))) == json.dumps(whole)


def test_a_run_holds_nothing_per_answered_request_but_its_figures():
    """Memory grows with requests, not with their tokens or evictions: once every request is answered the block
    manager holds no chain keys, the fast-forward memos no request, the eviction log nothing (only the last key);
    requests of the same lengths share one job; prompt ids are made when read, as they were written."""
    from sim.serving.engine import Engine
    from sim.serving.scheduler import SchedulerConfig
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    wl = plain.PlainWorkload(np.array([64, 64, 100, 64] * 10, np.int64), np.array([40, 40, 7, 40] * 10, np.int64), 16)
    jobs, ids, pre = plain._jobs(m, hw, wl, 16, None)
    assert len({id(j) for _, j in jobs}) == 2 and len(ids) == 40
    want = np.concatenate([pre, -(1 + 5 * 10 ** 9 + np.arange(64 - 16, dtype=np.int64))])
    assert np.array_equal(ids[5][0], want) and ids[5][0][0] == plain.PREFIX_ID_BASE
    eng = Engine(m, hw, jobs, prompt_ids=ids, arrival_times=np.arange(40) * 0.002, kv_blocks=40, fast_forward=True,
                 scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, policy="vllm-v1"),
                 record_token_times=True)
    res = eng.run()
    assert len(res.records()) == 40 and eng._ff.windows > 0
    assert eng.kv.evictions > 0 and eng.kv.evicted_log == [] and eng.kv.last_evicted is not None
    assert eng.kv._chain == {} and eng._ff._static == {} and eng._ff._keys == {}
    assert all(p.reqs == {} for p in res.problems)
