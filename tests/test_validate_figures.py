"""The shipped published-figure file (``docs/validation/published-figures.yaml``) and ``rksim validate``'s schema:
how many checks of each kind the file holds, FP8 listed rather than priced, online rates replayed from seeds or
from a run's own send times."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

from sim.bench import plain
from sim.bench.validate import FigureError, load_figures, predict, refusal, run_figures, summary

FIGS = Path(__file__).resolve().parents[1] / "docs" / "validation" / "published-figures.yaml"


def _publisher(url: str) -> str:
    u = urlparse(url)
    return "/".join(u.path.split("/")[1:3]) if u.netloc == "github.com" else u.netloc


@pytest.fixture(scope="module")
def figs():
    return load_figures(FIGS)


@pytest.fixture(scope="module")
def table(figs):
    return run_figures(figs)


def test_the_file_holds_the_checks_the_issue_asks_for(figs):
    """rksim issue 30 item 9: >= 40 figures from >= 4 publishers, >= 10 at TP > 1, >= 6 FP8, and each of TTFT,
    TPOT/ITL, E2E and throughput >= 8 times; every figure names its engine and the exact place it was read."""
    assert len(figs) >= 40
    pubs = {_publisher(f["source"]["url"]) for f in figs}
    assert {"LambdaLabsML/vllm-benchmark", "buildkite.com", "NVIDIA/TensorRT-LLM", "casys-kaist/LLMServingSim",
            "gpustack/gpustack"} <= pubs
    assert sum((f.get("parallelism") or {}).get("tp", 1) > 1 for f in figs) >= 10
    assert sum(str(f.get("quantization", "")).lower() == "fp8" or str(f.get("kv_cache_dtype", "")).lower() == "fp8"
               for f in figs) >= 6
    fam = {}
    for f in figs:
        k = f["metric"].split("_")[1] if f["metric"].endswith("_ms") else "throughput"
        fam[{"itl": "tpot"}.get(k, k)] = fam.get({"itl": "tpot"}.get(k, k), 0) + 1
    assert all(fam.get(k, 0) >= 8 for k in ("ttft", "tpot", "e2el", "throughput")), fam
    # online rates (not only maximum load): three published runs (LLMServingSim's SD, SM and MD scenarios, 10 req/s)
    # state their trace and send times; MD's two replicas are refused by name (dp 2), so six are priced
    online = [f for f in figs if str(f["workload"].get("request_rate", "inf")) != "inf"]
    assert len(online) >= 9 and all("arrival_times_ns" in f["workload"] or "seed" in f["workload"] for f in online)
    assert sum((f.get("parallelism") or {}).get("dp", 1) == 1 for f in online) >= 6
    for f in figs:
        assert f.get("engine") and f["source"].get("where"), f["id"]
        u = f["source"]["url"]
        if "github.com" in u:   # pinned to a commit, not a branch
            assert any(len(part) == 40 and all(c in "0123456789abcdef" for c in part) for part in u.split("/")), u


@pytest.mark.slow
def test_fp8_is_priced_and_every_figure_but_the_refused_has_a_ratio(table):
    fp8 = table[table["quantization"].astype(str).str.lower() == "fp8"]
    assert len(fp8) >= 6
    # FP8 is never refused for its dtype; a prompt beyond the preset's fitted range is refused for that alone
    assert not fp8["status"].astype(str).str.contains("not priced").any(), fp8[["id", "status"]]
    inside = fp8[~fp8["status"].astype(str).str.contains("outside the fitted range")]
    assert len(inside) >= 6 and inside["ratio"].notna().all() and (inside["ratio"] > 0).all(), fp8[["id", "status"]]
    priced = table[table["ratio"].notna()]
    assert len(priced) >= 40 and (priced["ratio"] > 0).all()
    # the TP figures on H200 are priced on dgx-h200 (the DGX H100's fabric and NCCL lines)
    h200 = table[table["id"] == "vllm-ci-h200-tp4-llama3-70b-latency-b8-32-128"].iloc[0]
    assert h200["ratio"] > 0 and h200["status"] in ("ok", "off by more than 25%"), h200["status"]
    fams = {s["family"]: s for s in summary(table)}
    assert all(fams[k]["priced"] >= 3 and 0 <= fams[k]["median_abs_dev"] < 1 for k in ("ttft", "tpot", "e2el",
                                                                                       "throughput"))


def test_by_source_groups_each_publisher_and_summarises_its_ratios():
    import pandas as pd
    from sim.bench.validate import by_source, source_of
    assert source_of("https://github.com/gpustack/gpustack/blob/abc/docs/x.md") == "github.com/gpustack/gpustack"
    assert source_of("https://buildkite.com/vllm/performance-benchmark/builds/9513") == \
        "buildkite.com/vllm/performance-benchmark"
    df = pd.DataFrame({"source": ["https://github.com/a/b/blob/1/x", "https://github.com/a/b/blob/2/y",
                                  "https://github.com/a/b/tree/3", "https://github.com/a/b/x",
                                  "https://github.com/c/d/x"],
                       "family": ["throughput", "ttft", "tpot", "e2el", "ttft"],
                       "ratio": [2.0, 0.5, None, 1.25, 0.8]})
    rows = by_source(df)
    assert [r["source"] for r in rows] == ["github.com/a/b", "github.com/c/d"]   # most figures first
    a, c = rows
    assert a["figures"] == 4 and a["priced"] == 3
    # speed ratios: a throughput's ratio, a latency's inverse: 2.0, 2.0, 0.8 -> median 2.0 (rksim faster)
    assert a["median_speed_ratio"] == 2.0 and c["median_speed_ratio"] == 1.25
    assert abs(a["median_abs_dev"] - 0.5) < 1e-12 and abs(c["median_abs_dev"] - 0.2) < 1e-12   # medians, not means
    from app.validate_table import markdown_table
    md = markdown_table(df.assign(id=["v", "w", "x", "y", "z"], hardware="h", metric="mean_ttft_ms", published=1.0,
                                  predicted=[2.0, 0.5, None, 1.25, 0.8], status=""), "F")
    assert "| github.com/a/b | 4 | 3 | 2.00 | 0.50 |" in md and "| github.com/c/d | 1 | 1 | 1.25 | 0.20 |" in md
    from app.validate_table import summaries_text   # what `rksim validate` prints after its rows
    txt = summaries_text(df.assign(family=["throughput", "ttft", "tpot", "e2el", "ttft"]))
    line = next(x for x in txt.splitlines() if "github.com/a/b" in x).split()
    assert line == ["github.com/a/b", "4", "3", "2.00", "0.50"], txt
    assert "by metric family" in txt and "by source" in txt


def test_refusal_names_what_is_not_priced():
    base = {"id": "x", "dtype": "bfloat16", "parallelism": {"tp": 1}}
    assert refusal(base) is None
    assert refusal({**base, "quantization": "none", "kv_cache_dtype": "auto"}) is None
    assert refusal({**base, "quantization": "fp8"}) is None and refusal({**base, "kv_cache_dtype": "fp8_e4m3"}) is None
    assert "fp8 not priced" in refusal({**base, "dtype": "fp8"})   # an fp8 *dtype* names no vLLM flag
    why = refusal({**base, "quantization": "awq"})
    assert "awq" in why and "fp8" not in why
    assert "int8" in refusal({**base, "kv_cache_dtype": "int8"})


def test_fp8_figure_priced_with_one_byte_weights_and_kv():
    """The same workload as an fp8 figure (weights and KV) predicts a shorter run than in bf16 on an H100."""
    f16 = {**_fig(), "metric": "duration"}
    f8 = {**f16, "quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert predict(f8)["duration"] < predict(f16)["duration"]


def _fig(**workload):
    w = {"input_lens": [200] * 6, "output_lens": [40] * 6, **workload}
    return {"id": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "dtype": "bfloat16", "parallelism": {"tp": 1},
            "workload": w, "metric": "mean_ttft_ms", "value": 1.0, "source": {"url": "x", "where": "y"}}


def _write(tmp_path, fig) -> str:
    import yaml
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump({"figures": [fig]}))
    return str(p)


def test_a_run_s_own_send_times_are_replayed(tmp_path):
    """arrival_times_ns: requests 10 s apart never queue (TTFT = one prefill); all at 0 they do."""
    apart = predict(_fig(arrival_times_ns=[int(i * 10e9) for i in range(6)], request_rate=0.1))
    together = predict(_fig(arrival_times_ns=[0] * 6, request_rate=0.1))
    assert together["mean_ttft_ms"] > 1.5 * apart["mean_ttft_ms"]
    assert apart["duration"] > 50          # the last request is sent at 50 s
    assert load_figures(_write(tmp_path, _fig(arrival_times_ns=[0, 1, 2, 3, 4, 5])))
    for bad, msg in (([0, 2, 1, 3, 4, 5], "non-decreasing"), ([0, 1, 2], "3 times for 6 requests"),
                     ([-1, 0, 1, 2, 3, 4], "non-decreasing")):
        with pytest.raises(FigureError, match=msg):
            load_figures(_write(tmp_path, _fig(arrival_times_ns=bad)))


def test_a_poisson_rate_is_vllms_seeded_draw(tmp_path):
    """request_rate R, seed S: the arrivals are vllm bench serve's draw (sim.bench.plain.arrival_times: gamma(1, 1/R)
    gaps from np.random.RandomState(S), cumulated, the last sent at K / R); the same seed is the same run,
    another seed another run, and replaying those send times as arrival_times_ns gives the same figure."""
    f = _fig(request_rate=2.0, seed=7)
    a = predict(f)
    assert predict(f) == a
    t = np.cumsum(np.random.RandomState(7).gamma(shape=1.0, scale=0.5, size=6))
    np.testing.assert_allclose(plain.arrival_times(6, 2.0, 1.0, 7), t * (3.0 / t[-1]), rtol=1e-12)
    sent = plain.arrival_times(6, 2.0, 1.0, 7)
    explicit = predict(_fig(arrival_times_ns=[int(round(x * 1e9)) for x in sent], request_rate=2.0))
    assert explicit["mean_ttft_ms"] == pytest.approx(a["mean_ttft_ms"], rel=1e-6)
    assert explicit["duration"] == pytest.approx(a["duration"], rel=1e-6)
    other = predict(_fig(request_rate=2.0, seed=8))
    assert other["duration"] != a["duration"] or other["mean_ttft_ms"] != a["mean_ttft_ms"]
    assert predict(_fig(request_rate="inf"))["mean_ttft_ms"] > a["mean_ttft_ms"]
    for bad, msg in (({"request_rate": 0}, "request_rate"), ({"request_rate": -2}, "request_rate"),
                     ({"burstiness": 0}, "burstiness"), ({"seed": 1.5}, "seed")):
        with pytest.raises(FigureError, match=msg):
            load_figures(_write(tmp_path, _fig(**bad)))


def test_mixture_of_experts_figures_are_priced_within_30_percent(figs):
    """rksim issue 33 item 6: published end-to-end MoE figures (Mixtral-8x7B at TP 2 on two GPUs, two publishers)
    are checks in the file; each priced one within 30% (the issue's bound), the H200 row too (on dgx-h200).
    The bound is the issue's, for those TP 2 figures; LLMServingSim's Mixtral run at TP 4 (10 req/s) is a later
    check with no bound here: rksim prices it about 2x too fast (docs/validation/ratios.md states each ratio)."""
    moe = [f for f in figs if f["model"] == "mixtral-8x7b" and (f.get("parallelism") or {}).get("tp", 1) == 2]
    assert len(moe) >= 5 and {_publisher(f["source"]["url"]) for f in moe} >= {"LambdaLabsML/vllm-benchmark",
                                                                                   "buildkite.com"}
    t = run_figures(moe)
    priced = t[t["ratio"].notna()]
    assert len(priced) >= 5 and ((priced["ratio"] - 1).abs() <= 0.30).all(), priced[["id", "ratio"]]
    assert t[t["hardware"] == "h200"]["ratio"].notna().all()


def test_mixture_of_experts_figures_span_models_layouts_and_publishers(figs):
    """rksim issue 33 item 6: MoE end-to-end figures beyond Mixtral (gpt-oss-20b in MXFP4, Qwen3-235B-A22B in bf16
    and FP8) at TP 1, 2, 4 and 8 from three publishers; checks only, so no bound on their ratios here (the
    validation table states each, and docs/calibration.md what the misses point at)."""
    from sim.cost.profiles import load_model
    moe = [f for f in figs if load_model(f["model"]).num_experts]
    assert len(moe) >= 20
    assert {f["model"] for f in moe} >= {"mixtral-8x7b", "gpt-oss-20b", "qwen3-235b-a22b"}
    assert {(f.get("parallelism") or {}).get("tp", 1) for f in moe} >= {1, 2, 4, 8}
    assert len({_publisher(f["source"]["url"]) for f in moe}) >= 3
    assert {str(f.get("quantization", "")) for f in moe} >= {"mxfp4", "fp8"}


def test_dp_attention_with_expert_parallelism_is_one_engine_priced():
    """parallelism {dp: 2, ep: true} on an MoE model is vLLM's DP attention + EP (one deployment, two engine cores
    sharing the experts): priced as plain.run(data_parallel_size=2, enable_expert_parallel=True, router='vllm-dp');
    dp 2 without ep, or on a dense model, stays refused as replicas; a non-boolean ep is an error naming it."""
    moe = {**_fig(), "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "metric": "duration"}
    dp = {**moe, "parallelism": {"tp": 1, "dp": 2, "ep": True}}
    assert refusal(dp) is None
    assert "dp=2" in refusal({**moe, "parallelism": {"tp": 1, "dp": 2}})
    assert "dp=2" in refusal({**_fig(), "parallelism": {"tp": 1, "dp": 2, "ep": True}})   # dense: replicas
    with pytest.raises(FigureError, match="ep must be true or false"):
        refusal({**moe, "parallelism": {"tp": 1, "dp": 2, "ep": "yes"}})
    two = predict(dp)
    one = predict({**moe, "parallelism": {"tp": 1}})
    # two engine cores split the six requests: each batch half as large, so the run ends sooner than on one GPU
    assert two["rksim"]["dp_attention"]["expert_parallel_size"] == 2 and two["duration"] < one["duration"]


def test_a_figure_s_memory_rules_size_its_kv_as_that_vllm_generation(tmp_path):
    """``serving.memory_rules`` (``ServingConfig.memory_rules``, the CLI's ``--vllm-memory-rules``) sizes the run's KV
    as that vLLM generation does: Qwen3-32B on one H100 keeps about 4.5 GiB of KV under vLLM 0.11's sizing, 6.5
    under the default, and a workload bound by it runs longer; every layout takes it (PP 2's stages each subtract
    the generation's reserve); an unknown generation is refused by name, the figure file's when it is read."""
    from sim.cost.profiles import load_hardware, load_model
    from sim.cost.parallel import ParallelConfig
    from sim.serving.capacity import CUDA_TOTAL_BYTES, CapacityError, ServingConfig, kv_capacity, vllm_kv_budget
    m, hw = load_model("qwen3-32b"), load_hardware("h100-sxm")
    sv = ServingConfig(memory_rules="v0.11")
    want = vllm_kv_budget(m, CUDA_TOTAL_BYTES["h100-sxm"], 0.9, 8192, 1024, 1, 1, "v0.11")
    assert kv_capacity(m, hw, sv)["num_gpu_blocks"] == want["num_gpu_blocks"]
    assert kv_capacity(m, hw, sv)["memory_rules"] == "v0.11"
    assert want["num_gpu_blocks"] < 0.8 * kv_capacity(m, hw, ServingConfig())["num_gpu_blocks"]
    pp2 = ParallelConfig(pipeline_parallel_size=2)
    want2 = vllm_kv_budget(m, CUDA_TOTAL_BYTES["h100-sxm"], 0.9, 8192, 1024, 1, 2, "v0.11")
    assert kv_capacity(m, hw, sv, pp2)["num_gpu_blocks"] == want2["num_gpu_blocks"] != \
        kv_capacity(m, hw, ServingConfig(), pp2)["num_gpu_blocks"]
    fig = {**_fig(), "model": "qwen3-32b", "metric": "duration",
           "workload": {"input_lens": [2048] * 32, "output_lens": [64] * 32}}
    assert predict({**fig, "serving": {"memory_rules": "v0.11"}})["duration"] > predict(fig)["duration"]
    with pytest.raises(FigureError, match="figure 't': serving: memory_rules 'v9' unknown"):
        load_figures(_write(tmp_path, {**fig, "serving": {"memory_rules": "v9"}}))
    with pytest.raises(CapacityError, match="--vllm-memory-rules"):
        predict({**fig, "serving": {"memory_rules": "v9"}})

def test_a_figure_beyond_the_fitted_range_is_refused_unless_extrapolation_is_allowed():
    """A 6,000-token prompt is one 6,000-token chunk under vllm serve's 8,192-token budget on an H100, past the
    4,096 new tokens per item that h100-sxm's profiles measured: refused by default (the reason names the flag),
    priced with ``allow_extrapolation``, its status saying what lay outside."""
    fig = {**_fig(input_lens=[6000] * 2, output_lens=[8] * 2), "value": 100.0}
    (refused,) = run_figures([fig]).to_dict(orient="records")
    assert refused["predicted"] is None and "new tokens of one forward item 6000" in refused["status"]
    assert refused["status"].startswith("refused: ") and "--allow-extrapolation" in refused["status"]
    (priced,) = run_figures([fig], allow_extrapolation=True).to_dict(orient="records")
    assert priced["predicted"] > 0 and priced["ratio"] == pytest.approx(priced["predicted"] / 100.0)
    assert "(extrapolated: hardware h100-sxm: new tokens of one forward item 6000" in priced["status"]
    inside = {**_fig(input_lens=[3000] * 2, output_lens=[8] * 2), "value": 100.0}
    (row,) = run_figures([inside], allow_extrapolation=True).to_dict(orient="records")
    assert "extrapolated" not in row["status"] and predict(inside)["rksim"].get("extrapolated") is None
