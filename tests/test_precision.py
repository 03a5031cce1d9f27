"""FP8 weights and KV cache (vLLM's --quantization fp8 / --kv-cache-dtype fp8): bytes, rates and refusals."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.cost import terms as C
from sim.cost.hardware import HardwareProfile
from sim.base.errors import OutOfCalibrationError, PresetError
from sim.cost.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parents[1]
LLAMA = load_model("llama-3-8b")


def test_fp8_kv_halves_kv_bytes_exactly():
    for name in ("llama-3-8b", "qwen2.5-7b", "llama-3-70b"):
        m = load_model(name)
        assert m.dtype_bytes == 2
        for k in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            q = m.with_precision(kv_cache_dtype=k)
            assert 2 * q.kv_bytes_per_token == m.kv_bytes_per_token
            assert q.weight_bytes == m.weight_bytes          # the KV dtype leaves the weights alone
        assert m.with_precision(kv_cache_dtype="auto") is m


def test_fp8_weights_are_one_byte_for_linear_layers_only():
    m = LLAMA
    q = m.with_precision("fp8")
    d, L, P = m.hidden_size, m.n_layers, m.params_per_layer
    emb = m.vocab_size * d * (1 if m.tied_embeddings else 2)
    # linear weights 1 byte; the two norms per layer, the embeddings, LM head and final norm stay 2 bytes
    assert q.weight_bytes == L * ((P - 2 * d) * 1 + 2 * d * 2) + 2 * (emb + d)
    assert q.kv_bytes_per_token == m.kv_bytes_per_token
    t16, t8 = C.decode_step_terms(m, [100.0]), C.decode_step_terms(q, [100.0])
    assert float(t8.b_lin) == pytest.approx(float(t16.b_lin) * (P - 2 * d + 4 * d) / (2 * P), rel=1e-12)
    assert float(t8.b_head) == float(t16.b_head)
    assert float(t8.f_lin_fp8) == float(t8.f_lin) > 0 and float(t16.f_lin_fp8) == 0.0


@pytest.mark.parametrize("flag,value", [("quantization", "int4"), ("quantization", "awq"),
                                        ("kv_cache_dtype", "int8"), ("kv_cache_dtype", "fp4")])
def test_unknown_precision_refused_naming_the_flag(flag, value):
    with pytest.raises(PresetError, match=f"--{flag.replace('_', '-')} '{value}'"):
        LLAMA.with_precision(**{flag: value})


def test_a_quantized_release_refuses_another_quantization_as_vllm_does():
    # vLLM's ModelConfig._verify_quantization: the checkpoint's quant_method against a different --quantization
    oss, ds = load_model("gpt-oss-20b"), load_model("deepseek-v3")
    assert (oss.quantization, ds.quantization) == ("mxfp4", "fp8")   # served as released
    for m, other in ((oss, "fp8"), (ds, "mxfp4")):
        with pytest.raises(PresetError, match=f"--quantization {other}: {m.name} is released in {m.quantization}"):
            m.with_precision(other)
    assert oss.with_precision("mxfp4") == oss and ds.with_precision("fp8") == ds   # its own: as released
    # a 16-bit re-release (--quantization none) has no quantization_config: vLLM's online FP8 takes it
    assert oss.with_precision("none").with_precision("fp8").quantization == "fp8"
    assert LLAMA.with_precision("fp8").quantization == "fp8"          # a bf16 release: online FP8


def _hw(**kw) -> HardwareProfile:
    base = dict(name="t", peak_flops=100e12, mem_bw=1e12, mem_capacity=80e9, eff_c=0.5, eff_m=1.0)
    return HardwareProfile(**{**base, **kw})


def test_fp8_linear_flops_run_at_the_fp8_rate():
    """Terms with only linear-layer flops: w8a8 prices them at peak_flops_fp8 * eff_c_fp8 (None: eff_c),
    w8a16 at the 16-bit rate, both rooflines."""
    t = C.OpTerms(flops=1e12, bytes=0.0, kernels=0.0, layers=0.0, f_lin=1e12, f_lin_fp8=1e12)
    for roof in ("iteration", "operator"):
        assert float(_hw(roofline=roof).time(t)) == pytest.approx(1e12 / 50e12, rel=1e-12)
        assert float(_hw(roofline=roof, fp8_weights="w8a16").time(t)) == pytest.approx(1e12 / 50e12, rel=1e-12)
        w8a8 = _hw(roofline=roof, fp8_weights="w8a8", peak_flops_fp8=200e12)
        assert float(w8a8.time(t)) == pytest.approx(1e12 / 100e12, rel=1e-12)
        eff = _hw(roofline=roof, fp8_weights="w8a8", peak_flops_fp8=200e12, eff_c_fp8=0.25)
        assert float(eff.time(t)) == pytest.approx(1e12 / 50e12, rel=1e-12)


def test_w8a8_needs_an_fp8_peak():
    with pytest.raises(PresetError, match="peak_flops_fp8"):
        _hw(fp8_weights="w8a8")
    with pytest.raises(PresetError, match="fp8_weights"):
        _hw(fp8_weights="fp4")


def test_fp8_prefill_faster_and_decode_reads_fewer_bytes_on_h100():
    hw = load_hardware("h100-sxm")
    q = LLAMA.with_precision("fp8", "fp8")
    pre16 = float(hw.time(C.prefill_terms(LLAMA, 4096), model=LLAMA))
    pre8 = float(hw.time(C.prefill_terms(q, 4096), model=q))
    assert pre8 < pre16
    dec16 = float(hw.time(C.decode_step_terms(LLAMA, np.full(64, 2000.0)), model=LLAMA))
    dec8 = float(hw.time(C.decode_step_terms(q, np.full(64, 2000.0)), model=q))
    assert dec8 < 0.7 * dec16          # weights and KV both about halved; the step is memory bound


def test_profiles_refuse_what_they_cannot_price():
    cpu = load_hardware("local-cpu")
    with pytest.raises(OutOfCalibrationError, match="--quantization fp8"):
        cpu.check_precision(LLAMA.with_precision("fp8"))
    with pytest.raises(OutOfCalibrationError, match="--kv-cache-dtype fp8"):
        cpu.check_precision(LLAMA.with_precision(kv_cache_dtype="fp8"))
    load_hardware("a100-80gb").check_precision(LLAMA.with_precision("fp8", "fp8"))   # weight-only FP8 (Marlin)
    load_hardware("h100-sxm").check_precision(LLAMA.with_precision("fp8", "fp8"))


item = st.tuples(st.sampled_from([1.0, 1.0, 3.0, 17.0, 300.0]), st.floats(0, 4000).map(float),
                 st.sampled_from([None, 8.0]), st.sampled_from([0.0, 2.0]), st.sampled_from([0.0, 1.0]),
                 st.sampled_from([0.0, 5.0]))


@settings(max_examples=60, deadline=None)
@given(st.lists(item, min_size=1, max_size=6), st.sampled_from(["h100-sxm", "a100-80gb", "l4"]),
       st.sampled_from([("fp8", ""), ("", "fp8"), ("fp8", "fp8_e5m2")]))
def test_scalar_path_equals_vectorised_under_fp8(items, hw_name, prec):
    m = LLAMA.with_precision(*prec)
    hw = load_hardware(hw_name)
    n = [i[0] for i in items]
    c = [i[1] for i in items]
    ell = [m.n_layers if i[2] is None else i[2] for i in items]
    t = C.batch_terms(m, n, c, layers=ell, probes=[i[3] for i in items], logits=[i[4] for i in items],
                      copy_tokens=[i[5] for i in items])
    assert C.ScalarCost(m, hw).seconds(items) == pytest.approx(float(hw.time(t, model=m)), rel=1e-12)


def test_decode_steps_terms_equal_batch_terms_under_fp8():
    m = LLAMA.with_precision("fp8", "fp8")
    ctx = np.array([[10.0, 200.0, 3000.0], [5.0, 0.0, 0.0]])
    mask = np.array([[True, True, True], [True, False, False]])
    many = C.decode_steps_terms(m, ctx, mask)
    for j in range(2):
        one = C.decode_step_terms(m, ctx[j][mask[j]])
        for k in C.TERM_NAMES:
            assert float(getattr(many, k)[j]) == pytest.approx(float(getattr(one, k)), rel=1e-12, abs=1e-9), k


def _bench(*extra):
    return subprocess.run([sys.executable, "-m", "app.cli", "bench", "throughput", "--model-preset", "llama-3-8b",
                           "--hardware", "h100-sxm", "--input-len", "256", "--output-len", "16", "--num-prompts", "8",
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_fp8_end_to_end(tmp_path):
    out16, out8 = tmp_path / "a.json", tmp_path / "b.json"
    r16 = _bench("--output-json", str(out16))
    r8 = _bench("--quantization", "fp8", "--kv-cache-dtype", "fp8", "--output-json", str(out8))
    assert r16.returncode == 0, r16.stderr
    assert r8.returncode == 0, r8.stderr
    assert "(fp8 weights, fp8 KV cache)" in r8.stdout
    a, b = json.loads(out16.read_text()), json.loads(out8.read_text())
    assert b["elapsed_time"] < a["elapsed_time"]
    bad = _bench("--kv-cache-dtype", "int8")
    assert bad.returncode != 0 and "--kv-cache-dtype 'int8'" in bad.stderr
