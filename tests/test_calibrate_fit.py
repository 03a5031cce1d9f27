"""calibrate.fit: least squares recovers known hardware coefficients from synthetic timings."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibrate.fit import fit_profile, fitted_range, phase_terms, predict, write_preset
from calibrate.timing import PhaseRow, phases_frame
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import ModelShape
from sim.cost.profiles import load_hardware

SMOL = ModelShape(name="smollm2-135m", n_layers=30, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64,
                  intermediate_size=1536, vocab_size=49152, dtype_bytes=4, tied_embeddings=True)
TRUE = HardwareProfile(name="t", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9, eff_c=0.35, eff_m=0.6,
                       per_kernel_s=4e-5, per_layer_s=3e-4)


def _synthetic_rows(rng) -> list[PhaseRow]:
    rows = []
    for n in (16, 32, 64, 128, 256, 512, 1024, 2048):          # prefill sweep
        rows.append(PhaseRow("prefill").items([n], [0]))
    for b in (1, 2, 4, 8):                                     # decode at several batches and contexts
        for ctx in (32, 256, 1024):
            rows.append(PhaseRow("decode").items([1] * b, list(rng.integers(ctx // 2, ctx + 1, b))))
    for lay in (6, 12, 20, 30):                                # verification stopped at a layer, with probes
        rows.append(PhaseRow("verify").items([40], [200], layers=lay, probes=lay // 3, logits=0))
    for n in (5, 20, 60):                                      # ASKS gate (no LM head)
        rows.append(PhaseRow("gate").items([n], [0], logits=0))
    for p in (1, 5, 15):
        rows.append(PhaseRow("lens", kind="probe", cand=p))
    return rows


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    df = phases_frame(_synthetic_rows(rng))
    terms = phase_terms(SMOL, df)
    y = predict(TRUE, terms) * np.exp(rng.normal(0, 0.01, terms.shape[1]))  # 1% timing noise
    base = HardwareProfile(name="t", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9)
    res = fit_profile(base, terms, y)
    got = res.profile
    assert got.eff_c == pytest.approx(TRUE.eff_c, rel=0.05)
    assert got.eff_m == pytest.approx(TRUE.eff_m, rel=0.10)
    # kernels and layers are nearly collinear; their joint effect on a full forward is what must hold
    full = 30 * got.per_layer_s + (11 * 30 + 4) * got.per_kernel_s
    assert full == pytest.approx(30 * TRUE.per_layer_s + 334 * TRUE.per_kernel_s, rel=0.05)
    assert res.rel_rms < 0.03


def test_fit_exact_without_noise():
    rng = np.random.default_rng(1)
    df = phases_frame(_synthetic_rows(rng))
    terms = phase_terms(SMOL, df)
    y = predict(TRUE, terms)
    res = fit_profile(HardwareProfile(name="t", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9), terms, y)
    assert res.rel_rms < 1e-4
    assert np.allclose(predict(res.profile, terms), y, rtol=1e-3)


def test_fit_rejects_bad_timings():
    df = phases_frame(_synthetic_rows(np.random.default_rng(2)))
    terms = phase_terms(SMOL, df)
    y = np.ones(terms.shape[1])
    y[3] = 0.0
    with pytest.raises(ValueError, match="seconds"):
        fit_profile(TRUE, terms, y)
    with pytest.raises(ValueError, match="need at least"):
        fit_profile(TRUE, terms[:, :2], np.ones(2))


def test_preset_written_loads_and_refuses_outside_range(tmp_path):
    from sim.base.errors import OutOfCalibrationError

    rng = np.random.default_rng(3)
    df = phases_frame(_synthetic_rows(rng))
    terms = phase_terms(SMOL, df)
    res = fit_profile(HardwareProfile(name="local-test", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9),
                      terms, predict(TRUE, terms))
    fr = fitted_range(SMOL, df)
    assert fr == {"max_context_tokens": 2048, "max_new_tokens": 2048, "max_batch": 8, "max_tokens_per_iteration": 2048,
                  "mixed_iterations": False, "models": ["smollm2-135m"]}
    path = tmp_path / "local-test.yaml"
    write_preset(path, res, fr, device="cpu", fitted_on={"run": "synthetic"}, notes="test")
    hw = load_hardware(str(path))
    assert hw.calibrated and hw.fitted_range["max_batch"] == 8
    assert hw.eff_c == pytest.approx(res.profile.eff_c)
    hw.check_query(SMOL, max_context=2000, max_new=100, max_batch=8)
    with pytest.raises(OutOfCalibrationError, match="max_context_tokens"):
        hw.check_query(SMOL, max_context=4096)
    with pytest.raises(OutOfCalibrationError, match="max_batch"):
        hw.check_query(SMOL, max_context=100, max_batch=16)
