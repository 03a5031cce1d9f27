"""Issue 12: both clocks, the new cost terms (sampling, host per iteration, CUDA graphs), the two rooflines,
the fitted range covering device and dtype, calibration notes, and the Vidur fit of a100-80gb."""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pandas as pd
import pytest

from calibrate.fit import fit_profile, fit_run_dir, phase_terms, predict
from calibrate.timing import PhaseRow, PhaseTimer, phases_frame, resolve_clock, select_clock
from sim.cost import terms as C
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import ModelShape
from sim.base.errors import OutOfCalibrationError
from sim.cost.profiles import load_hardware, load_model

SMOL = ModelShape(name="smollm2-135m", n_layers=30, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64,
                  intermediate_size=1536, vocab_size=49152, dtype_bytes=4, tied_embeddings=True)
BASE = HardwareProfile(name="t", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9)
TRUE = dataclasses.replace(BASE, eff_c=0.35, eff_m=0.6, per_kernel_s=4e-5, per_layer_s=3e-4,
                           sample_s_per_vocab=2e-8, host_per_iter_s=2e-3)


def _rows(rng) -> list[PhaseRow]:
    """Phases like a calibration run's: decode steps sample every row, the op sweep's decode does not,
    verification stops at several layers (what separates host-per-iteration from per-layer/kernel time)."""
    rows = []
    for n in (16, 64, 256, 1024, 2048):
        rows.append(PhaseRow("sweep-prefill").items([n], [0]))
    for b in (1, 2, 4, 8, 16):
        for ctx in (32, 256, 1024):
            c = list(rng.integers(ctx // 2, ctx + 1, b))
            r = PhaseRow("decode").items([1] * b, c)
            r.sampled = b
            rows.append(r)
            rows.append(PhaseRow("sweep-decode").items([1] * b, c))
    for lay in (1, 2, 4, 8, 16, 30):
        rows.append(PhaseRow("verify").items([40], [200], layers=lay, probes=max(lay - 15, 0), logits=int(lay == 30)))
    for n in (5, 20, 60):
        rows.append(PhaseRow("gate").items([n], [0], logits=0))
    for p in (1, 5, 15):
        rows.append(PhaseRow("lens", kind="probe", cand=p))
    return rows


@pytest.mark.parametrize("roofline", ["iteration", "operator"])
def test_fit_recovers_new_terms_and_picks_the_roofline(roofline):
    rng = np.random.default_rng(0)
    df = phases_frame(_rows(rng))
    A = phase_terms(SMOL, df)
    true = dataclasses.replace(TRUE, roofline=roofline)
    y = predict(true, A) * np.exp(rng.normal(0, 0.005, A.shape[1]))
    res = fit_profile(BASE, A, y)
    got = res.profile
    assert res.roofline == roofline                       # the fit chose the shape the timings came from
    assert set(res.by_roofline) == {"iteration", "operator"}
    assert res.by_roofline[roofline]["rel_rms"] < res.by_roofline[
        "operator" if roofline == "iteration" else "iteration"]["rel_rms"]
    assert "sample_s_per_vocab" in res.fitted and "host_per_iter_s" in res.fitted
    assert "per_kernel_graph_s" not in res.fitted          # no phase replayed a CUDA graph
    assert got.sample_s_per_vocab == pytest.approx(true.sample_s_per_vocab, rel=0.1)
    assert got.host_per_iter_s == pytest.approx(true.host_per_iter_s, rel=0.15)
    assert got.eff_c == pytest.approx(true.eff_c, rel=0.05)
    assert got.eff_m == pytest.approx(true.eff_m, rel=0.1)
    full = 30 * got.per_layer_s + (11 * 30 + 4) * got.per_kernel_s
    assert full == pytest.approx(30 * true.per_layer_s + 334 * true.per_kernel_s, rel=0.05)
    assert res.rel_rms < 0.02


def test_sampling_term_is_what_separates_decode_from_the_sweep():
    df = phases_frame(_rows(np.random.default_rng(1)))
    A = phase_terms(SMOL, df)
    s = A[C.TERM_NAMES.index("samples")]
    dec = (df["phase"] == "decode").to_numpy()
    assert np.all(s[dec] == df.loc[dec, "batch"].to_numpy() * SMOL.vocab_size)
    assert np.all(s[~dec] == 0)
    # a run recorded before the `sampled` column: decode rows sample every row
    old = df.drop(columns=["sampled"])
    assert np.array_equal(phase_terms(SMOL, old), A)


def test_cuda_graph_kernels_priced_apart():
    hw = dataclasses.replace(TRUE, per_kernel_graph_s=1e-6)
    eager = C.batch_terms(SMOL, [1, 1], [100, 200])
    graph = C.batch_terms(SMOL, [1, 1], [100, 200], cuda_graph=True)
    assert graph.graph_kernels == eager.kernels and graph.kernels == 0
    d = float(hw.time(eager)) - float(hw.time(graph))
    assert d == pytest.approx(float(eager.kernels) * (4e-5 - 1e-6))
    # fitted where a phase replayed a graph
    rng = np.random.default_rng(2)
    A = phase_terms(SMOL, phases_frame(_rows(rng)))
    Ag = A.copy()
    ki, gi = C.TERM_NAMES.index("kernels"), C.TERM_NAMES.index("graph_kernels")
    Ag[gi], Ag[ki] = A[ki], 0.0
    both = np.concatenate([A, Ag], axis=1)
    res = fit_profile(BASE, both, predict(hw, both))
    assert "per_kernel_graph_s" in res.fitted
    assert res.profile.per_kernel_graph_s == pytest.approx(1e-6, abs=2e-7)


@pytest.mark.parametrize("roofline", ["iteration", "operator"])
def test_scalar_cost_equals_vectorised_with_new_terms(roofline):
    hw = dataclasses.replace(TRUE, roofline=roofline, eff_elem=0.3)
    items = [(1, 500, None, 0, 1, 0), (7, 90, None, 0, 1, 0, 0), (40, 200, 12, 3, 0, 0), (0, 0, None, 2, 0, 5)]
    n, c = [it[0] for it in items], [it[1] for it in items]
    t = C.batch_terms(SMOL, n, c, layers=[30, 30, 12, 30], probes=[0, 0, 3, 2], logits=[1, 1, 0, 0],
                      copy_tokens=[0, 0, 0, 5], sampled=[1, 0, 0, 0])
    assert C.ScalarCost(SMOL, hw).seconds(items) == pytest.approx(float(hw.time(t)), rel=1e-12)
    cc = np.array([[10.0, 20.0, 0.0], [5.0, 0.0, 0.0]])
    mask = cc > 0
    a = C.decode_steps_terms(SMOL, cc, mask)
    b = C.batch_terms(SMOL, np.ones_like(cc), cc, mask=mask)
    assert np.allclose(hw.time(a), hw.time(b), rtol=1e-12)


def test_operator_roofline_charges_what_the_iteration_max_hides():
    hw = dataclasses.replace(TRUE, sample_s_per_vocab=0.0, host_per_iter_s=0.0)
    t = C.prefill_terms(SMOL, 512)
    it = float(hw.time(t, roofline="iteration"))
    op = float(hw.time(t, roofline="operator"))
    assert op > it  # memory-bound parts no longer hide under compute, element-wise traffic is paid
    # terms built from the four classic fields alone: one operator, the same as the whole iteration
    bare = C.OpTerms(t.flops, t.bytes, t.kernels, t.layers)
    assert float(hw.time(bare, roofline="operator")) == pytest.approx(float(hw.time(bare, roofline="iteration")))


# ----------------------------------------------------------------------------- clocks

def test_both_clocks_recorded_and_differ_when_the_thread_waits():
    timer = PhaseTimer()
    with timer.phase("prefill") as row:
        time.sleep(0.05)          # wall time passes, the thread does no work
        row.items([4], [0])
    with timer.phase("prefill") as row:
        x = 0
        for i in range(200000):   # the thread works
            x += i
        row.items([4], [0])
    df = timer.frame()
    assert {"seconds", "cpu_seconds", "sampled"} <= set(df.columns)
    assert df["seconds"].iloc[0] >= 0.05 and df["cpu_seconds"].iloc[0] < 0.02
    # the working phase has CPU time, never more than its wall time (one thread); how much less depends
    # on the neighbours, which is the point of recording it
    assert 0 < df["cpu_seconds"].iloc[1] <= df["seconds"].iloc[1] + 1e-3


def test_clock_choice_as_documented():
    assert resolve_clock("auto", "cpu") == "cpu"
    assert resolve_clock("auto", "cuda:0") == "wall"
    assert resolve_clock("wall", "cpu") == "wall"
    with pytest.raises(ValueError, match="--clock cpu"):
        resolve_clock("cpu", "cuda:0")
    with pytest.raises(ValueError, match="--clock"):
        resolve_clock("gpu", "cpu")
    ph = pd.DataFrame({"seconds": [1.0, 2.0], "cpu_seconds": [0.5, 1.5]})
    s, _, used, note = select_clock(ph, None, "auto", "cpu")
    assert used == "cpu" and list(s) == [0.5, 1.5] and "CPU time" in note
    s, _, used, _ = select_clock(ph, None, "auto", "cuda")
    assert used == "wall" and list(s) == [1.0, 2.0]
    old = ph.drop(columns=["cpu_seconds"])
    s, _, used, note = select_clock(old, None, "cpu", "cpu")
    assert used == "wall" and "fallback" in note and list(s) == [1.0, 2.0]


def _run_dir(tmp_path, with_cpu: bool):
    from tests.test_calibrate import _fake_run_dir
    tmp_path.mkdir(parents=True, exist_ok=True)
    d = _fake_run_dir(tmp_path)
    if with_cpu:
        ph = pd.read_parquet(d / "phases.parquet")
        ph["cpu_seconds"] = ph["seconds"] * 0.5       # a clock that differs from the wall clock by 2x
        ph["sampled"] = np.where(ph["phase"] == "decode", ph["batch"], 0)
        ph.to_parquet(d / "phases.parquet")
        dec = pd.read_parquet(d / "decisions.parquet")
        dec["cpu_seconds"] = dec["seconds"] * 0.5
        dec.to_parquet(d / "decisions.parquet")
    return d


def test_fit_and_report_use_cpu_time_by_default_and_fall_back(tmp_path):
    from calibrate.report import fidelity_report, format_report

    d = _run_dir(tmp_path / "a", with_cpu=True)
    info = fit_run_dir(d, name="t-cpu", out=tmp_path / "t-cpu.yaml")
    assert info["clock"] == "cpu"
    rep = fidelity_report(d)
    assert rep["clock"] == "cpu" and set(rep["by_clock"]) == {"cpu", "wall"}
    assert rep["by_clock"]["wall"]["measured_total_s"] == pytest.approx(2 * rep["by_clock"]["cpu"]["measured_total_s"])
    assert rep["hardware_calibrated"] is True and rep["calibration_note"].startswith("fitted end to end on cpu")
    text = format_report(rep)
    assert "against wall clock" in text and "against cpu  clock" in text and "fitted end to end" in text
    info_w = fit_run_dir(d, name="t-wall", out=tmp_path / "t-wall.yaml", clock="wall")
    assert info_w["clock"] == "wall"
    # a fit on half the seconds prices everything at half: the CPU-time fit is not the wall one
    hw_c, hw_w = load_hardware(str(tmp_path / "t-cpu.yaml")), load_hardware(str(tmp_path / "t-wall.yaml"))
    A = phase_terms(SMOL, pd.read_parquet(d / "phases.parquet"))
    assert np.median(predict(hw_c, A) / predict(hw_w, A)) == pytest.approx(0.5, rel=0.1)

    old = _run_dir(tmp_path / "b", with_cpu=False)
    info = fit_run_dir(old, name="t-old", out=tmp_path / "t-old.yaml")
    assert info["clock"] == "wall" and "fallback" in info["clock_note"]
    rep = fidelity_report(old)
    assert rep["clock"] == "wall" and "fallback" in rep["clock_note"] and set(rep["by_clock"]) == {"wall"}


def test_cli_clock_flag(tmp_path, capsys):
    from app.cli import main

    d = _run_dir(tmp_path, with_cpu=True)
    assert main(["calibrate", "fit", str(d), "--name", "x", "--out", str(tmp_path / "x.yaml"), "--clock", "wall"]) == 0
    assert "clock: wall" in capsys.readouterr().out
    assert main(["calibrate", "report", str(d), "--json", "--clock", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clock"] == "cpu" and "hardware_calibrated" in out and "calibration_note" in out


# ----------------------------------------------------------------------------- range, notes

def test_range_refuses_another_dtype_or_device_naming_both():
    hw = HardwareProfile(name="fit", peak_flops=1e11, mem_bw=1e10, mem_capacity=1e11, calibrated=True,
                         fitted_range={"max_context_tokens": 4096, "models": ["smollm2-135m", "qwen2.5-7b"],
                                       "device": "cpu", "dtypes": ["float32"]})
    hw.check_query(SMOL, max_context=100, device="cpu")
    bf16 = dataclasses.replace(SMOL, dtype="bfloat16", dtype_bytes=2)
    with pytest.raises(OutOfCalibrationError, match=r"dtype float32.*device cpu.*bfloat16"):
        hw.check_query(bf16, max_context=100)
    # a preset shape (no dtype name): its element size decides
    with pytest.raises(OutOfCalibrationError, match=r"fitted on dtype float32.*qwen2.5-7b in dtype bfloat16"):
        hw.check_query(load_model("qwen2.5-7b"), max_context=100)
    with pytest.raises(OutOfCalibrationError, match=r"fitted on device cpu; refusing a query on device NVIDIA H200"):
        hw.check_query(SMOL, max_context=100, device="NVIDIA H200")


def test_calibration_notes_of_the_shipped_presets():
    hw = load_hardware("l4")
    assert not hw.calibrated and hw.fitted_range is None and hw.calibration_status == "datasheet"
    assert hw.calibration_note == "uncalibrated: datasheet numbers with assumed efficiencies"
    hw = load_hardware("h200")   # vLLM's own kernels timed by aiconfigurator (tests/test_public_profiles.py)
    assert not hw.calibrated and hw.calibration_status == "public-profiles"
    assert hw.calibration_note.startswith("fitted on public per-operator profiles (aiconfigurator-h200-")
    for name in ("a100-80gb", "h100-sxm"):   # fitted on public per-operator profiles (tests/test_public_profiles.py)
        hw = load_hardware(name)
        assert not hw.calibrated and hw.calibration_status == "public-profiles"
        assert hw.calibration_note.startswith("fitted on public per-operator profiles (vidur-")
        assert hw.roofline == "operator" and hw.priced_dtypes == ("float16", "bfloat16")
    cpu = load_hardware("local-cpu")
    assert cpu.calibrated and cpu.calibration_status == "end-to-end"
    assert cpu.calibration_note.startswith("fitted end to end on cpu")


def test_half_split_is_counterbalanced_in_run_order():
    """A speed drift linear in run order biases neither half (ABBA); the seed picks the held-out half."""
    from calibrate.fit import split_problems

    for n in (4, 8, 12):
        for seed in (0, 1, 2):
            fit, hold = split_problems(list(range(n)), 0.5, seed)
            assert sorted(fit + hold) == list(range(n)) and len(hold) == n // 2
            assert np.mean(fit) == pytest.approx(np.mean(hold))   # linear trend cancels
            assert split_problems(list(range(n)), 0.5, seed) == (fit, hold)
    assert {tuple(split_problems(list(range(8)), 0.5, s)[1]) for s in range(6)} == {(0, 3, 4, 7), (1, 2, 5, 6)}
    fit, hold = split_problems([5, 9], 0.5, 0)
    assert fit and hold


# ----------------------------------------------------------------------------- matrix-vector regime

def test_mv_bytes_only_for_a_single_token_row():
    one = C.batch_terms(SMOL, [1], [140])
    assert float(one.b_lin_mv) == float(one.b_lin) > 0 and float(one.b_head_mv) == float(one.b_head) > 0
    for n, c in (([1, 1], [140, 90]), ([5], [0]), ([1, 40], [100, 0])):
        t = C.batch_terms(SMOL, n, c)
        assert float(t.b_lin_mv) == 0.0 and float(t.b_head_mv) == 0.0, (n, c)
    # a masked-out second item leaves one row: a GEMV again
    t = C.batch_terms(SMOL, [1, 1], [140, 90], mask=[True, False])
    assert float(t.b_lin_mv) == float(t.b_lin)
    # the closed-form decode steps agree row by row
    cc = np.array([[10.0, 0.0], [5.0, 7.0]])
    a, b = C.decode_steps_terms(SMOL, cc, cc > 0), C.batch_terms(SMOL, np.ones_like(cc), cc, mask=cc > 0)
    assert np.array_equal(a.b_lin_mv, b.b_lin_mv) and np.array_equal(a.b_head_mv, b.b_head_mv)
    assert a.b_lin_mv[0] > 0 and a.b_lin_mv[1] == 0


@pytest.mark.parametrize("roofline", ["iteration", "operator"])
def test_eff_mv_prices_one_row_weights_and_nothing_else(roofline):
    hw = dataclasses.replace(TRUE, roofline=roofline)
    mv = dataclasses.replace(hw, eff_mv=3.0)
    one, two = C.batch_terms(SMOL, [1], [140]), C.batch_terms(SMOL, [1, 1], [140, 90])
    pre = C.batch_terms(SMOL, [300], [0])
    # off (None) is the old formula, and eff_mv = eff_m is the same as off
    assert float(dataclasses.replace(hw, eff_mv=hw.eff_m).time(one)) == pytest.approx(float(hw.time(one)), rel=1e-12)
    for t in (two, pre):
        assert float(mv.time(t)) == float(hw.time(t))
    # one row, memory-bound: the weights' bytes move from eff_m to eff_mv
    w = float(one.b_lin + one.b_head)
    want = w / (hw.mem_bw * hw.eff_m) - w / (hw.mem_bw * 3.0)
    assert float(hw.time(one)) - float(mv.time(one)) == pytest.approx(want, rel=1e-9)
    # the scalar path the engine uses agrees
    sc = C.ScalarCost(SMOL, mv)
    for items, t in (([(1, 140, None, 0, 1, 0)], one), ([(1, 140, None, 0, 1, 0), (1, 90, None, 0, 1, 0)], two)):
        assert sc.seconds(items) == pytest.approx(float(mv.time(t)), rel=1e-12)


def test_fit_recovers_eff_mv():
    rng = np.random.default_rng(4)
    df = phases_frame(_rows(rng))
    A = phase_terms(SMOL, df)
    true = dataclasses.replace(TRUE, eff_mv=2.5)
    y = predict(true, A) * np.exp(rng.normal(0, 0.003, A.shape[1]))
    res = fit_profile(BASE, A, y)
    assert "eff_mv" in res.fitted
    assert res.profile.eff_mv == pytest.approx(2.5, rel=0.1)
    assert res.profile.eff_m == pytest.approx(true.eff_m, rel=0.1)
    # no one-row phase: eff_mv is not identified and stays the base's (off)
    keep = (df["batch"] > 1) | (df["n_new"] > 1) | (df["kind"] != "forward")
    res2 = fit_profile(BASE, A[:, keep.to_numpy()], y[keep.to_numpy()])
    assert "eff_mv" not in res2.fitted and res2.profile.eff_mv is None


def test_eff_mv_in_presets(tmp_path):
    with pytest.raises(ValueError, match="eff_mv"):
        dataclasses.replace(BASE, eff_mv=0.0)
    p = tmp_path / "hw.yaml"
    p.write_text("peak_flops: 1e11\nmem_bw: 1e10\nmem_capacity: 1e9\neff_mv: '2'\n")
    assert load_hardware(str(p)).eff_mv == 2.0
    assert load_hardware("h100-sxm").eff_mv is None   # other presets: off


# ----------------------------------------------------------------------------- attention's own efficiencies

@pytest.mark.parametrize("roofline", ["iteration", "operator"])
def test_eff_att_and_eff_kv_price_attention_and_nothing_else(roofline):
    hw = dataclasses.replace(TRUE, roofline=roofline)
    att = dataclasses.replace(hw, eff_att=0.05, eff_kv=0.02)
    dec = C.batch_terms(SMOL, [1] * 8, [1500] * 8)          # decode over a long context: KV-bound attention
    pre = C.batch_terms(SMOL, [2048], [0])                  # long prefill: attention flops
    # None is the old formula, and eff_att = eff_c, eff_kv = eff_m are the same as None
    same = dataclasses.replace(hw, eff_att=hw.eff_c, eff_kv=hw.eff_m)
    for t in (dec, pre):
        assert float(same.time(t)) == pytest.approx(float(hw.time(t)), rel=1e-12)
        assert float(att.time(t)) > float(hw.time(t))
    # terms without attention are priced exactly as before
    lin = C.OpTerms(dec.flops - dec.f_att, dec.bytes - dec.b_att, dec.kernels, dec.layers, f_lin=dec.f_lin,
                    b_lin=dec.b_lin, f_head=dec.f_head, b_head=dec.b_head)
    assert float(att.time(lin)) == float(hw.time(lin))
    if roofline == "operator":
        # the KV bytes move from eff_m to eff_kv (decode attention is memory-bound at both)
        ba = float(dec.b_att)
        want = ba / (hw.mem_bw * 0.02) - ba / (hw.mem_bw * hw.eff_m)
        assert float(att.time(dec)) - float(hw.time(dec)) == pytest.approx(want, rel=1e-9)
    # the scalar path the engine uses agrees
    sc = C.ScalarCost(SMOL, att)
    assert sc.seconds([(1, 1500, None, 0, 1, 0)] * 8) == pytest.approx(float(att.time(dec)), rel=1e-12)
    assert sc.seconds([(2048, 0, None, 0, 1, 0)]) == pytest.approx(float(att.time(pre)), rel=1e-12)


def test_fit_recovers_eff_att_and_eff_kv():
    rng = np.random.default_rng(7)
    df = phases_frame(_rows(rng))
    A = phase_terms(SMOL, df)
    true = dataclasses.replace(TRUE, roofline="operator", eff_att=0.12, eff_kv=0.15)
    y = predict(true, A) * np.exp(rng.normal(0, 0.003, A.shape[1]))
    res = fit_profile(BASE, A, y, roofline="operator")
    assert {"eff_att", "eff_kv"} <= set(res.fitted)
    assert res.profile.eff_att == pytest.approx(0.12, rel=0.1)
    assert res.profile.eff_kv == pytest.approx(0.15, rel=0.1)
    assert res.profile.eff_c == pytest.approx(true.eff_c, rel=0.05)
    assert res.profile.eff_m == pytest.approx(true.eff_m, rel=0.1)
    # attention=False: they stay the base profile's (None), and the fit is worse
    off = fit_profile(BASE, A, y, roofline="operator", attention=False)
    assert "eff_att" not in off.fitted and off.profile.eff_att is None and off.profile.eff_kv is None
    assert off.rel_rms > 3 * res.rel_rms


def test_eff_att_and_eff_kv_in_presets(tmp_path):
    for f in ("eff_att", "eff_kv"):
        with pytest.raises(ValueError, match=f):
            dataclasses.replace(BASE, **{f: -1.0})
    p = tmp_path / "hw.yaml"
    p.write_text("peak_flops: 1e11\nmem_bw: 1e10\nmem_capacity: 1e9\neff_att: '0.5'\neff_kv: 0.25\n")
    hw = load_hardware(str(p))
    assert (hw.eff_att, hw.eff_kv) == (0.5, 0.25)
    assert load_hardware("l4").eff_att is None and load_hardware("l4").eff_kv is None   # datasheet: off


def test_scalar_cost_equals_vectorised_under_wave_quantisation():
    """h100-sxm (sm_count 132): the engine's scalar path and the vectorised one are one formula over batches
    of every size regime (rows <= 64 and above, LM-head rows above 64, probes, early exit, KV copies)."""
    m, hw = load_model("qwen2.5-7b"), load_hardware("h100-sxm")
    assert hw.sm_count and hw.roofline == "operator"
    sc = C.ScalarCost(m, hw)
    rng = np.random.default_rng(7)
    for _ in range(60):
        k = int(rng.integers(1, 90))
        n = rng.choice([1, 1, 1, 7, 64, 65, 300, 2048], size=k).astype(float)
        c = rng.integers(0, 4000, size=k).astype(float)
        ell = rng.choice([m.n_layers, m.n_layers, 12], size=k)
        p = rng.choice([0, 0, 2], size=k)
        g = rng.choice([1, 1, 0], size=k)
        cp = rng.choice([0, 0, 0, 5], size=k)
        items = [(n[i], c[i], int(ell[i]), int(p[i]), int(g[i]), int(cp[i])) for i in range(k)]
        t = C.batch_terms(m, n, c, layers=ell, probes=p, logits=g, copy_tokens=cp)
        assert sc.seconds(items) == pytest.approx(float(hw.time(t, model=m)), rel=1e-12)
    # a one-row decode and a 65-row chunk cross the 64-row tile boundary: both quantised, the second dearer
    one, chunk = sc.seconds([(1.0, 100.0, None, 0, 1, 0)]), sc.seconds([(65.0, 100.0, None, 0, 1, 0)])
    assert chunk > one
