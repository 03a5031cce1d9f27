"""GPU presets fitted on public per-operator profiles: shipped data and provenance, fits that recover known
coefficients, presets re-created byte for byte, the cross-validation the docs quote, dtypes refused by name."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import llmcompass, llmservingsim, public_profiles as pp, vidur
from calibrate import public_render as prd, public_rows as pr
from sim.cost.hardware import HardwareProfile
from sim.base.errors import OutOfCalibrationError, PresetError
from sim.cost.profiles import load_hardware, load_model, model_from_manifest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data"


@pytest.mark.parametrize("source,license_words", [("vidur", "MIT License"), ("llmservingsim", "MIT License"),
                                                  ("llmcompass", "BSD 3-Clause License")])
def test_shipped_data_has_source_license_and_checksums(source, license_words):
    d = DATA / source
    assert license_words in (d / "LICENSE").read_text()
    src = (d / "SOURCE.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([0-9a-f]{64}) \|$", src, flags=re.M)
    assert len(rows) >= 2
    for name, sha in rows:
        data = (d / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha, name
    assert "commit" in src and "github.com" in src
    total = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    assert total < 6.5e6   # a few MB per source at most (Vidur: 6.3 MB, five mlp.csv and the network profiles)


def test_loaders_read_every_shipped_profile():
    for dev, model in vidur.MLP_FILES:
        prof = vidur.load_mlp(vidur.mlp_path(dev, model))
        assert set(prof["op"]) == set(vidur.OPERATORS) and (prof["seconds"] > 0).all()
    errs = []
    for topo in vidur.NETWORK_TOPOLOGIES:
        for coll in vidur.COLLECTIVES:
            lines = vidur.fit_collective(vidur.load_network(topo, coll))
            assert lines and all(x["alpha_s"] >= 0 and x["beta_bytes_per_s"] > 1e9 for x in lines)
            errs += [x["median_abs_rel_error"] for x in lines]
    # a latency-bandwidth line per group: most within a few percent (NCCL's protocol switches bend some)
    assert len(errs) == 22 and np.median(errs) < 0.06 and max(errs) < 0.5
    lss = llmservingsim.load_layers(llmservingsim.layers_path(1))
    # every shipped row is a prefill over an empty cache: no row constrains decode's KV reads
    assert (lss["kv_cache"] == 0).all() and lss["num_tokens"].max() == 2048
    assert len(llmservingsim.load_layers(llmservingsim.layers_path(2))) == len(lss)
    ops = llmcompass.load_operators()
    assert ops.groupby("op").size().to_dict() == {"gelu": 20, "layernorm": 22, "matmul": 20, "softmax": 22}
    with pytest.raises(ValueError, match="no Vidur mlp profile shipped for device 'h200'"):
        vidur.mlp_path("h200", "llama-2-7b")


def _synthetic_rows(truth: pp.Coefs, peak: float, bw: float, kv: bool, seed: int, sms=None) -> pd.DataFrame:
    """Operator rows of two shapes at 1..8192 tokens timed by ``truth`` (1% lognormal noise)."""
    n = np.unique(np.round(np.geomspace(1, 8192, 60)))
    parts = []
    for key, m in (("a", pr.LLAMA_2_7B), ("b", pr.LLAMA_3_8B)):
        parts += [pr.gemm_rows(key, "qkv", n, 0 * n, m.d, (m.H + 2 * m.Hkv) * m.Dh),
                  pr.gemm_rows(key, "down", n, 0 * n, m.F, m.d),
                  pr.op_rows(key, "norm", "elem", n, 0 * n, 0 * n, pr.S * (2 * n * m.d + m.d)),
                  pr.op_rows(key, "act", "elem", n, 0 * n, 0 * n, pr.S * 3 * n * m.F)]
        c = np.where(np.arange(n.size) % 2, 4096.0, 0.0) if kv else 0.0 * n
        nq = np.where(c > 0, np.maximum(n // 64, 1), n)  # decode-like rows: few queries over a long cache
        parts.append(pr.op_rows(key, "attention", "attn", nq, 0 * nq, 4.0 * m.H * m.Dh * (nq * c + nq * (nq + 1) / 2),
                              pr.S * 2.0 * m.Hkv * m.Dh * (c + nq), c=c))
    rows = pd.concat(parts, ignore_index=True)
    rng = np.random.default_rng(seed)
    rows["seconds"] = pp.predict(rows, truth, peak, bw, sms) * np.exp(rng.normal(0.0, 0.01, len(rows)))
    return rows


@pytest.mark.parametrize("kv", [False, True])
def test_fit_recovers_known_coefficients(kv):
    peak, bw = 989.4e12, 3.35e12
    truth = pp.Coefs(eff_c=0.62, eff_m=0.81, eff_elem=0.45, eff_att=0.27, eff_kv=0.55 if kv else None,
                     per_kernel_s=3.1e-6)
    got = pp.fit_rows(_synthetic_rows(truth, peak, bw, kv, seed=3), peak, bw)
    for f in ("eff_c", "eff_m", "eff_elem", "eff_att", "per_kernel_s"):
        assert getattr(got, f) == pytest.approx(getattr(truth, f), rel=0.03), f
    if kv:
        assert got.eff_kv == pytest.approx(truth.eff_kv, rel=0.03)
    else:
        assert got.eff_kv is None   # no cached tokens in any row: eff_kv is not fitted, eff_m applies


def test_fit_recovers_known_coefficients_under_wave_quantisation():
    """Rows timed with whole waves of CTA tiles (``sm_count`` 132): the fit with the same form recovers the
    coefficients; the plain roofline, fitted to the same rows, cannot (its eff_c absorbs the idle SMs)."""
    peak, bw, sms = 989.4e12, 3.35e12, 132
    truth = pp.Coefs(eff_c=0.85, eff_m=0.8, eff_elem=0.55, eff_att=0.2, eff_kv=None, per_kernel_s=2e-6)
    rows = _synthetic_rows(truth, peak, bw, kv=False, seed=5, sms=sms)
    got = pp.fit_rows(rows, peak, bw, sms)
    for f in ("eff_c", "eff_m", "eff_elem", "eff_att", "per_kernel_s"):
        assert getattr(got, f) == pytest.approx(getattr(truth, f), rel=0.03), f
    plain = pp.fit_rows(rows, peak, bw)
    assert abs(plain.eff_c / truth.eff_c - 1.0) > 0.05
    # quantised flops are never below the exact count, and equal it where the tiles fill whole waves
    from sim.cost.gemm import gemm_wave_flops
    n = np.array([1.0, 64.0, 65.0, 128.0, 4224.0])
    fq = gemm_wave_flops(n, 4096, 4096, sms)
    assert np.all(fq >= 2 * n * 4096 * 4096) and fq[3] == fq[2]     # 65 and 128 rows: one 128-row tile
    assert gemm_wave_flops(4224.0, 4096, 4096, sms) == 2 * 4224 * 4096 * 4096   # 33 x 32 tiles = 8 waves exactly
    assert gemm_wave_flops(0.0, 4096, 4096, sms) == 0.0


def test_simulator_prices_a_layer_as_the_fit_prices_its_rows():
    """One formula: a one-layer model's linear layers in the simulator (vectorised and scalar paths) cost
    what the fit's row model gives its four matrix products, with and without wave quantisation."""
    from sim.cost import terms as C
    from sim.cost.gemm import layer_gemms
    from sim.cost.model_shape import ModelShape

    sh = pr.LLAMA_3_8B
    m = ModelShape("one-layer", 1, sh.d, sh.H, sh.Hkv, sh.Dh, sh.F, sh.V, 2, False)
    base = load_hardware("h100-sxm")
    assert base.sm_count == 132
    for hw in (base, dataclasses.replace(base, sm_count=None)):
        k = pp.Coefs(hw.eff_c, hw.eff_m, hw.eff_elem, hw.eff_att, hw.eff_kv, 0.0)
        for n in (1.0, 48.0, 100.0, 333.0, 2048.0):
            rows = pd.concat([pr.gemm_rows("x", f, [n], [1.0], K, N) for f, (K, N) in
                              zip(("qkv", "o", "gate_up", "down"), layer_gemms(m))], ignore_index=True)
            fit_s = pp.predict(rows, k, hw.peak_flops, hw.mem_bw, hw.sm_count).sum() + 2 * 2.0 * m.hidden_size / (
                hw.mem_bw * hw.eff_m)  # the two norm weights' stream, which no fit row times
            t = C.batch_terms(m, [n], [0.0], logits=[0])
            lin = float(hw.time(dataclasses.replace(t, f_att=0.0, b_att=0.0, b_elem=0.0, kernels=0.0, iters=0.0,
                                                    flops=t.f_lin, bytes=t.b_lin), model=m))
            # exact under wave quantisation; the plain path prices the layer as one roofline whose flops also
            # count the norm weights (2 P n with P = sum K N + 2 d): under 1e-4 of it
            assert lin == pytest.approx(fit_s, rel=1e-12 if hw.sm_count else 1e-4), (hw.sm_count, n)
            items = [(n, 0.0, None, 0, 0, 0)]
            assert C.ScalarCost(m, hw).seconds(items) == pytest.approx(float(hw.time(t, model=m)), rel=1e-12)
    with pytest.raises(ValueError, match="sm_count quantises matrix products"):
        base.time(C.batch_terms(m, [8.0], [0.0]))


def test_fit_leaves_unconstrained_coefficients_null():
    peak, bw = 312e12, 2.039e12
    truth = pp.Coefs(0.7, 0.75, None, None, None, 4e-6)
    rows = _synthetic_rows(truth, peak, bw, kv=False, seed=1)
    rows = rows[rows["kind"] == "gemm"].reset_index(drop=True)
    got = pp.fit_rows(rows, peak, bw)
    assert (got.eff_elem, got.eff_att, got.eff_kv) == (None, None, None)
    assert got.eff_c == pytest.approx(0.7, rel=0.03) and got.eff_m == pytest.approx(0.75, rel=0.03)


def test_presets_and_json_are_recreated_byte_for_byte(capsys):
    assert pp.main(["--check"]) == 0, capsys.readouterr().err
    res = json.loads(prd.FIT_JSON.read_text())
    for preset, fit in res["fits"].items():
        hw = load_hardware(preset)
        k = fit["coefficients"]
        assert hw.eff_c == pytest.approx(k["eff_c"], abs=5e-5) and hw.eff_m == pytest.approx(k["eff_m"], abs=5e-5)
        assert hw.calibration_status == "public-profiles" and not hw.calibrated and hw.roofline == "operator"
        listed = hw.extra["reference"]["sources"]
        assert [s["profile"] for s in listed] == list(pp.PRESETS[preset][0])
        assert sum(s["rows_used"] for s in listed) == fit["rows"] == hw.extra["reference"]["rows"]
        assert all((s["license"] in ("MIT", "BSD-3-Clause") and len(s["commit"]) == 40)
                   or (s["license"] == "Apache-2.0" and "aiconfigurator-core 0.12.0" in s["commit"]) for s in listed)
    # what a fit can and cannot see: prefill attention on H100 (SDPA), none on A100; decode KV reads and attention's
    # own floor (per_layer_s) only where vLLM's FlashAttention 3 is timed whole (H200, aiconfigurator)
    assert load_hardware("h100-sxm").eff_att is not None and load_hardware("a100-80gb").eff_att is None
    assert load_hardware("h100-sxm").eff_kv is None and load_hardware("a100-80gb").eff_kv is None
    h200 = load_hardware("h200")
    assert h200.eff_kv is not None and h200.eff_att is not None and h200.eff_elem is None
    assert h200.per_layer_s > 0 and h200.per_layer_s == pytest.approx(res["fits"]["h200"]["coefficients"]["per_layer_s"], rel=1e-3)
    assert all(load_hardware(p).per_layer_s == 0.0 for p in pp.PRESETS if p != "h200")


def test_check_detects_a_preset_that_is_not_the_fit(tmp_path, monkeypatch, capsys):
    res = json.loads(prd.FIT_JSON.read_text())
    fit = res["fits"]["h100-sxm"]
    text = prd.preset_path("h100-sxm").read_text()
    cross = res["cross_validation"]
    assert prd.render_preset("h100-sxm", fit, text, cross) == text
    bad = dict(fit, coefficients={**fit["coefficients"], "eff_c": fit["coefficients"]["eff_c"] * 1.01})
    assert prd.render_preset("h100-sxm", bad, text, cross) != text
    assert prd.render_preset("h100-sxm", fit, text) != text       # the band (each source alone) is part of it
    with pytest.raises(ValueError, match="no line starting '# Not on a datasheet'"):
        prd.render_preset("h100-sxm", fit, "name: x\n")


def test_docs_quote_the_cross_validation_json():
    res = json.loads(prd.FIT_JSON.read_text())
    doc = (ROOT / "docs" / "calibration.md").read_text()
    assert prd.crossval_markdown(res["cross_validation"]) in doc
    assert prd.fits_markdown(res["fits"]) in doc
    cv = res["cross_validation"]
    assert [(p["fit_on"], p["predict"]) for p in cv["h100"] + cv["a100"]] == list(pp.CROSS["h100"] + pp.CROSS["a100"])
    for p in cv["h100"] + cv["a100"]:
        h = p["held_out"]
        assert h["tokens"][0] == 1 and h["tokens"][1] <= pp.MAX_TOKENS_CV
        assert h["layer"]["rows"] == len(set(range(h["tokens"][0], h["tokens"][1] + 1))
                                         & set(pr.PROFILES[p["predict"]]()["n"].astype(int)))


@pytest.mark.parametrize("preset", ["h100-sxm", "a100-80gb", "h200", "l4", "local-cpu"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "fp8", "float8_e5m2", "int8"])
def test_unpriced_dtypes_are_refused_by_name(preset, dtype):
    hw = load_hardware(preset)
    m = dataclasses.replace(load_model("smollm2-135m"), dtype=dtype, dtype_bytes=1)
    with pytest.raises(OutOfCalibrationError, match=r"dtype float8_e\w+ cannot be priced|dtype int8 cannot be priced"):
        hw.check_query(m, max_context=16)


def test_fp8_manifest_loads_and_is_refused_not_priced_as_bf16():
    man = {"model": {"name": "llama-fp8", "n_layers": 32, "hidden_size": 4096, "n_heads": 32, "n_kv_heads": 8,
                     "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256,
                     "dtype": "torch.float8_e4m3fn"}}
    m = model_from_manifest(man)
    assert m.dtype == "float8_e4m3fn" and m.dtype_bytes == 1
    with pytest.raises(OutOfCalibrationError, match="float8_e4m3fn cannot be priced.*float16/bfloat16"):
        load_hardware("h100-sxm").check_query(m, max_context=16)
    load_hardware("h100-sxm").check_query(load_model("llama-3-8b"), max_context=16)   # bf16: priced


def test_calibration_status_field():
    base = dict(name="x", peak_flops=1e12, mem_bw=1e11, mem_capacity=1e10)
    assert HardwareProfile(**base).calibration_status == "datasheet"
    assert HardwareProfile(**base, calibrated=True).calibration_status == "end-to-end"
    assert HardwareProfile(**base, provisional=True).calibration_status == "provisional"
    hw = HardwareProfile(**base, calibration_status="public-profiles")
    assert hw.calibration_note == "fitted on public per-operator profiles; not end to end"
    assert hw.to_dict()["calibration_status"] == "public-profiles"
    with pytest.raises(PresetError, match="calibration_status"):
        HardwareProfile(**base, calibration_status="public-profiles", calibrated=True)
    with pytest.raises(PresetError, match="calibration_status"):
        HardwareProfile(**base, calibration_status="measured")


def test_cli_hook_runs_the_same_command(monkeypatch):
    from app.cli import main

    seen = []
    monkeypatch.setattr(pp, "main", lambda argv=None: seen.append(argv) or 0)
    assert main(["calibrate", "public-profiles", "--check"]) == 0
    assert main(["calibrate", "public-profiles", "--write"]) == 0
    assert main(["calibrate", "public-profiles"]) == 0
    assert seen == [["--check"], ["--write"], []]


def test_kernel_stacks_count_the_hf_eager_chains_from_the_shape():
    from calibrate import kernel_stacks as ks
    n, d, H, Hkv, Dh, F = 16.0, 4096, 32, 8, 128, 14336
    # vLLM: one fused kernel each, the cost model's bytes
    assert ks.elementwise("vllm", "norm", n, d, H, Hkv, Dh, F) == (1, 2 * (2 * n * d + d))
    assert ks.elementwise("vllm", "rope", n, d, H, Hkv, Dh, F) == (1, 2 * 2 * n * (H + Hkv) * Dh)
    assert ks.elementwise("vllm", "act", n, d, H, Hkv, Dh, F) == (1, 2 * 3 * n * F)
    # HF eager: 8 / 10 / 2 kernels; RMSNorm's float32 round trip is 9x the fused bytes per element, RoPE 5x
    k, B = ks.elementwise("hf-eager", "norm", n, d, H, Hkv, Dh, F)
    assert k == 8 and B == 36 * n * d + 24 * n + 2 * d
    k, B = ks.elementwise("hf-eager", "rope", n, d, H, Hkv, Dh, F)
    assert k == 10 and B == 20 * n * (H + Hkv) * Dh + 8 * n * Dh
    assert ks.elementwise("hf-eager", "act", n, d, H, Hkv, Dh, F) == (2, 10 * n * F)
    with pytest.raises(ValueError, match="unknown kernel stack 'trt'"):
        ks.elementwise("trt", "norm", n, d, H, Hkv, Dh, F)


def test_cross_validation_prices_each_stack_and_same_stack_pairs_exist():
    res = json.loads(prd.FIT_JSON.read_text())["cross_validation"]
    by = {(p["fit_on"], p["predict"]): p for t in res.values() for p in t}
    assert set(res) == set(pp.CROSS)
    hf = pr.PROFILES["llmservingsim-h100-llama-3.1-8b@hf-eager"]()
    el = hf[hf["family"].isin(["norm", "rope", "act"])]
    assert set(el["kind"]) == {"elem"} and sorted(el.groupby("family")["kernels"].first()) == [2.0, 8.0, 10.0]
    # the stack option moves the element-wise prediction, not the GEMMs: same fit, same GEMM errors
    old = by[("vidur-h100-llama-2-7b", "llmservingsim-h100-llama-3.1-8b")]["held_out"]["by_family"]
    new = by[("vidur-h100-llama-2-7b", "llmservingsim-h100-llama-3.1-8b@hf-eager")]["held_out"]["by_family"]
    assert old["gate_up"] == new["gate_up"] and old["norm"]["median"] < -0.8 < new["norm"]["median"]
    for fit_on, predict in pp.CROSS["h100-same-stack"]:
        assert fit_on.startswith("vidur-h100-") and predict.startswith("vidur-h100-")
        assert "layer_shared" in by[(fit_on, predict)]["held_out"]


# ----------------------------------------------------------------------------- FP8 GEMM efficiency (DeepGEMM)
def test_fp8_gemm_source_license_checksum_and_presets_match_the_fit():
    from calibrate import fp8_gemm

    d = DATA / "deepgemm"
    assert "MIT License" in (d / "LICENSE").read_text()
    src = (d / "SOURCE.md").read_text()
    sha = re.search(r"sha256 of `normal_gemm_h800.csv`: ([0-9a-f]{64})", src).group(1)
    assert hashlib.sha256((d / "normal_gemm_h800.csv").read_bytes()).hexdigest() == sha
    assert fp8_gemm.COMMIT in src
    assert fp8_gemm.main(["--check"]) == 0      # the shipped eff_c_fp8 lines are what the table gives
    for p in fp8_gemm.PRESETS:
        f = fp8_gemm.fit(p)
        assert load_hardware(p).eff_c_fp8 == pytest.approx(f["eff_c_fp8"])
        assert f["band"][0] <= f["eff_c_fp8"] <= f["band"][1] and f["range"][0] <= f["eff_c_fp8"] <= f["range"][1]


def test_fp8_gemm_efficiency_recovers_a_known_fraction():
    from calibrate import fp8_gemm
    from sim.cost.gemm import gemm_wave_flops

    peak, sms, e = 1978.9e12, 132, 0.7
    df = pd.DataFrame({"M": [4096, 4096, 64], "N": [7168, 4096, 4096], "K": [16384, 7168, 7168]})
    fq = gemm_wave_flops(df["M"].to_numpy(), df["K"].to_numpy(), df["N"].to_numpy(), sms)
    df["tflops"] = 2.0 * df["M"] * df["N"] * df["K"] / (fq / (peak * e)) / 1e12   # time = F_q / (peak e)
    got = fp8_gemm.efficiencies(df, peak, sms)
    assert len(got) == 2 and np.allclose(got, e)      # the M = 64 (weight-streaming) row is not a compute row
    with pytest.raises(ValueError, match="compute-bound"):
        fp8_gemm.efficiencies(df[df["M"] < 4096], peak, sms)


# ----------------------------------------------------------------------------- aiconfigurator (vLLM's kernels, H200/H100)
def test_aiconfigurator_extract_has_source_license_and_checksums():
    from calibrate import aiconfigurator as aic

    d = DATA / "aiconfigurator"
    assert "Apache License" in (d / "LICENSE").read_text() and "Version 2.0" in (d / "LICENSE").read_text()
    src = (d / "SOURCE.md").read_text()
    assert aic.WHEEL_SHA256 in src and "github.com/ai-dynamo/aiconfigurator" in src and "vLLM 0.24.0" in src
    listed = dict((n, h) for h, n in re.findall(r"^([0-9a-f]{64})  (\S+\.csv\.gz)$", src, flags=re.M))
    shipped = {p.name for p in d.glob("*.csv.gz")}
    assert set(listed) == shipped == {aic.csv_path(dev, t).name for dev, t in aic.shipped()}
    assert ("h100", "moe") in aic.shipped() and ("h200", "moe") not in aic.shipped()
    for name, sha in listed.items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == sha, name
    assert sum(p.stat().st_size for p in d.iterdir()) < 1.5e6   # a compressed extract, not the wheel's 80 MB


def test_aiconfigurator_rows_follow_the_cost_models_accounting():
    from calibrate import aiconfigurator as aic

    g = pr.aiconfigurator_rows("h200", "gemm")
    r = g[(g["n"] == 1) & (g["K"] == 4096) & (g["N"] == 4096)].iloc[0]
    assert (r["F"], r["B"], r["kind"]) == (2.0 * 4096 * 4096, 2.0 * 4096 * 4096, "gemm")
    a, f8 = pr.aiconfigurator_rows("h200", "attention"), pr.aiconfigurator_rows("h200", "attention-kv-fp8")
    dec = a[a["op"] == "attention_decode"]
    raw = aic.load("h200", "generation_attention")
    row = raw[(raw.kv_cache_dtype == "bfloat16") & (raw.batch_size == 64) & (raw.step == 8191)
              & (raw.num_heads == 32) & (raw.num_key_value_heads == 8) & (raw.head_dim == 128)].iloc[0]
    got = dec[(dec["n"] == 64) & (dec["c"] == 8191) & (dec["seconds"] == row["seconds"])].iloc[0]
    assert got["B"] == 2 * 2 * 8 * 128 * 64 * 8192 and got["F"] == 4 * 32 * 128 * 64 * 8192
    # an fp8 cache: the same rows' KV bytes halved exactly; prefill is measured over a bf16 cache only
    assert set(f8["op"]) == {"attention_decode"} and len(f8) == len(dec)
    assert np.array_equal(np.sort(f8["B"].to_numpy() * 2), np.sort(dec["B"].to_numpy()))
    pre = a[a["op"] == "attention_prefill"]
    assert (pre["c"] == 0).all() and pre["n"].max() >= 16384


def test_aiconfigurator_loader_names_a_bad_file(tmp_path, monkeypatch):
    from calibrate import aiconfigurator as aic

    monkeypatch.setattr(aic, "DATA", tmp_path)
    with pytest.raises(FileNotFoundError, match="h200-vllm-0.24.0-gemm.csv.gz: missing"):
        aic.load("h200", "gemm")
    pd.DataFrame({"m": [1], "n": [1024], "k": [1024], "latency": [0.01]}).to_csv(aic.csv_path("h200", "gemm"),
                                                                                     index=False)
    with pytest.raises(ValueError, match=r"gemm.csv.gz: missing column\(s\) \['gemm_dtype'\]"):
        aic.load("h200", "gemm")
    with pytest.raises(KeyError, match="no aiconfigurator table 'b200'"):
        aic.load("b200", "gemm")
    with pytest.raises(KeyError, match="no aiconfigurator table 'h200'/'moe'"):
        aic.load("h200", "moe")
    with pytest.raises(ValueError, match="sha256"):
        aic.extract(aic.csv_path("h200", "gemm"))     # not the wheel


def test_fit_recovers_attentions_own_floor_only_where_attention_is_timed_whole():
    """aiconfigurator's FlashAttention 3 rows carry a fixed time no GEMM has: with profiles named for that source
    the fit recovers it as per_layer_s (one attention a layer) beside per_kernel_s; other sources' rows leave it
    None, so their presets are unchanged."""
    peak, bw = 989.4e12, 4.8e12
    truth = pp.Coefs(eff_c=0.8, eff_m=0.82, eff_elem=None, eff_att=0.48, eff_kv=0.83, per_kernel_s=4e-6,
                     per_layer_s=8.6e-6)
    rows = _synthetic_rows(truth, peak, bw, kv=True, seed=7)
    rows = rows[rows["kind"] != "elem"].reset_index(drop=True)
    rows["profile"] = "aiconfigurator-" + rows["profile"]
    got = pp.fit_rows(rows, peak, bw)
    for f in ("eff_c", "eff_m", "eff_att", "eff_kv", "per_kernel_s", "per_layer_s"):
        assert getattr(got, f) == pytest.approx(getattr(truth, f), rel=0.05), f
    rows["profile"] = rows["profile"].str.replace("aiconfigurator-", "other-")
    assert pp.fit_rows(rows, peak, bw).per_layer_s is None


def test_simulator_prices_decode_attention_as_the_h200_fit_prices_its_rows():
    """One formula: a decode batch's attention in the engine's terms (one layer: flops, KV bytes, one kernel and the
    layer's per_layer_s) costs on h200 exactly what the fit's row model gives aiconfigurator's row of that batch."""
    from sim.cost import terms as C
    from sim.cost.model_shape import ModelShape

    sh = pr.LLAMA_3_8B
    m = ModelShape("one-layer", 1, sh.d, sh.H, sh.Hkv, sh.Dh, sh.F, sh.V, 2, False)
    hw = load_hardware("h200")
    k = pp.Coefs(hw.eff_c, hw.eff_m, hw.eff_elem, hw.eff_att, hw.eff_kv, hw.per_kernel_s, None, hw.per_layer_s)
    for b, c in ((1, 15.0), (64, 8191.0), (256, 1023.0)):
        t = C.batch_terms(m, [1.0] * b, [c] * b, logits=[0] * b)
        F, B = 4.0 * sh.H * sh.Dh * b * (c + 1), pr.S * 2.0 * sh.Hkv * sh.Dh * b * (c + 1)
        assert (t.f_att, t.b_att, t.layers) == (F, B, 1.0)
        att = dataclasses.replace(t, f_lin=0.0, b_lin=0.0, f_head=0.0, b_head=0.0, b_elem=0.0, kernels=1.0, iters=0.0,
                                  flops=t.f_att, bytes=t.b_att)
        row = pr.op_rows("aiconfigurator-x", "attention", "attn", [float(b)], [1.0], [F], [B], c=c)
        assert float(hw.time(att, model=m)) == pytest.approx(pp.predict(row, k, hw.peak_flops, hw.mem_bw)[0],
                                                             rel=1e-12)
