"""Host time per step and front-end time (sim/cost/overheads.py) and their calibration (calibrate/host_step.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from json_close import moved

from sim.base.errors import PresetError
from sim.cost.overheads import (NO_FRONTEND, FrontendCost, HostStepCost, add, frontend_from_preset, frontend_or_none,
                           host_step_from_preset, step_seconds)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data" / "host_step" / "vllm-0.33.0-cpu.json"
PRESET_FIELDS = ROOT / "calibrate" / "data" / "host_step" / "preset-fields.yaml"
VLLM_PY = Path(os.environ.get("RKSIM_VLLM_PYTHON", "/work/main/.venv-vllm/bin/python"))
if not VLLM_PY.exists():
    VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"

HS = HostStepCost(base_s=1e-3, per_running_s=2e-5, per_token_s=3e-7, per_output_s=4e-6, per_admit_s=5e-5,
                  per_admit_token_s=6e-8, source="test")


# ---------------------------------------------------------------------------------- host step


def test_host_step_terms_recover_known_values():
    # 1 ms + 64 * 20 us + 1088 * 0.3 us + 64 * 4 us + 2 * 50 us + 1024 * 0.06 us
    want = 1e-3 + 64 * 2e-5 + 1088 * 3e-7 + 64 * 4e-6 + 2 * 5e-5 + 1024 * 6e-8
    assert HS.seconds(64, 1088, admitted=2, admitted_tokens=1024) == pytest.approx(want, rel=1e-12)
    # sampled defaults to running; a prefill chunk that samples nothing leaves the output term out
    assert HS.seconds(1, 512, sampled=0) == pytest.approx(1e-3 + 2e-5 + 512 * 3e-7, rel=1e-12)
    # a host twice as fast halves every term
    assert HS.scaled(2.0).seconds(64, 1088) == pytest.approx(HS.seconds(64, 1088) / 2, rel=1e-12)


def test_host_step_is_vectorised_over_steps():
    rng = np.random.default_rng(0)
    r = rng.integers(1, 256, 500)
    t = r + rng.integers(0, 2048, 500)
    many = HS.seconds(r, t)
    assert many.shape == (500,)
    assert many.sum() == pytest.approx(sum(HS.seconds(int(a), int(b)) for a, b in zip(r, t)), rel=1e-12)


def test_window_host_remembers_each_batch_size_for_its_host_step():
    """The window's decode host floats: a few steps read each batch size's remembered floats, a long window one
    numpy pass, the same floats as a step priced alone; a new host_step is priced afresh."""
    import dataclasses

    from sim.cost import pricing

    p = pricing.StepPricer(None, host_step=dataclasses.replace(HS, max_running=64))
    B = np.array([1, 7, 6, 7, 200, 3], np.int64)         # 200: past the measured range, on the same lines
    long = np.resize(B, pricing.HOST_MEMO_STEPS + 1)
    h, s = p.window_host(B)
    hl, sl = p.window_host(long)
    np.testing.assert_array_equal(h, hl[:6])
    np.testing.assert_array_equal(s, sl[:6])
    assert [p.window_host(int(b)) for b in B] == list(zip(h.tolist(), s.tolist()))
    assert h.tolist() == [HS.seconds(b, b, b) for b in B.tolist()]
    p.host_step = dataclasses.replace(HS, base_s=2e-3)
    assert p.window_host(7)[0] == pytest.approx(h[1] + 1e-3, rel=1e-12)
    np.testing.assert_allclose(p.window_host(B)[0], h + 1e-3, rtol=1e-12)


def test_host_step_refuses_more_than_it_was_measured_at():
    hs = HostStepCost(base_s=1e-4, per_running_s=1e-5, max_running=512, max_tokens=8192, source="measured x")
    hs.seconds(512, 8192)
    with pytest.raises(ValueError, match="513 running requests.*512"):
        hs.seconds(np.array([4, 513]), 600)
    with pytest.raises(ValueError, match="8193 scheduled tokens"):
        hs.seconds(4, 8193)
    with pytest.raises(ValueError, match=">= 0"):
        hs.seconds(-1, 4)


def test_adding_two_host_parts_sums_terms():
    a = HostStepCost(base_s=1e-4, per_running_s=1e-5, max_running=512, source="a")
    b = HostStepCost(base_s=7e-4, per_running_s=1e-5, per_token_s=1e-7, max_running=128, source="b")
    c = add(a, b)
    assert c.seconds(10, 100) == pytest.approx(a.seconds(10, 100) + b.seconds(10, 100), rel=1e-12)
    assert c.max_running == 128
    with pytest.raises(ValueError, match="different speed"):
        add(a, b.scaled(2.0))


# ---------------------------------------------------------------------------------- async rule


def test_step_seconds_sync_and_async_known_values():
    assert step_seconds(0.010, 0.003, async_scheduling=False) == pytest.approx(0.013)
    assert step_seconds(0.010, 0.003, async_scheduling=True) == pytest.approx(0.010)   # host hidden
    assert step_seconds(0.002, 0.003, async_scheduling=True) == pytest.approx(0.003)   # host bound
    assert step_seconds(0.010, 0.003, True, host_serial_s=0.001) == pytest.approx(0.011)
    with pytest.raises(ValueError, match="cannot exceed"):
        step_seconds(0.010, 0.003, True, host_serial_s=0.004)
    g = np.array([0.01, 0.002])
    assert np.allclose(step_seconds(g, 0.003, True), [0.010, 0.003])


finite = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=100, deadline=None)
@given(g=st.lists(finite, min_size=0, max_size=20), h=finite, frac=st.floats(0.0, 1.0), sync=st.booleans())
def test_a_windows_steps_of_one_batch_are_each_steps_seconds(g, h, frac, sync):
    """An array of GPU seconds with the host floats of one batch size (a fast-forward window's stretch): each
    element the one-step float, and the same refusals."""
    s = frac * h
    got = step_seconds(np.array(g, np.float64), h, not sync, host_serial_s=s)
    assert got.tolist() == [step_seconds(x, h, not sync, host_serial_s=s) for x in g]
    with pytest.raises(ValueError, match="cannot exceed"):
        step_seconds(np.array(g + [1.0]), h, True, host_serial_s=h + 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        step_seconds(np.array(g + [-1.0]), h, True, host_serial_s=s)


@settings(max_examples=300, deadline=None)
@given(g=finite, h=finite, frac=st.floats(min_value=0.0, max_value=1.0))
def test_async_is_never_slower_than_sync(g, h, frac):
    s = frac * h
    a = step_seconds(g, h, True, host_serial_s=s)
    b = step_seconds(g, h, False)
    assert a <= b + 1e-12
    assert a >= max(g, h) - 1e-12          # overlap hides the shorter side, never both


@settings(max_examples=100, deadline=None)
@given(r=st.integers(1, 512), t=st.integers(0, 8192), g=finite, frac=st.floats(0.0, 1.0))
def test_async_never_slower_with_a_host_step_cost(r, t, g, frac):
    hs = HostStepCost(base_s=1e-3, per_running_s=2e-5, per_token_s=3e-7, serial_fraction=frac, source="t")
    h = hs.seconds(r, r + t)
    s = hs.serial_seconds(r, r + t)
    assert step_seconds(g, h, True, s) <= step_seconds(g, h, False) + 1e-12


# ---------------------------------------------------------------------------------- front-end


def test_frontend_terms():
    fe = FrontendCost(request_s=2e-4, per_prompt_token_s=3e-6, per_output_s=4e-5, step_base_s=1e-5, source="t")
    assert fe.ttft_s(1000) == pytest.approx(2e-4 + 3e-3 + 4e-5)
    assert fe.step_s(256) == pytest.approx(1e-5 + 256 * 4e-5)
    # at 256 running the front-end needs 10.25 ms a step: it sets the pace of a 5 ms step
    assert fe.itl_s(0.005, 256) == pytest.approx(1e-5 + 256 * 4e-5)
    assert fe.itl_s(0.020, 256) == pytest.approx(0.020)
    two = FrontendCost(request_s=2e-4, per_output_s=4e-5, step_base_s=1e-5, api_servers=2, source="t")
    assert two.step_s(256) == pytest.approx(fe.step_s(256) / 2)
    off = frontend_or_none(fe, frontend=False)
    assert off is NO_FRONTEND and off.ttft_s(1000) == 0.0 and off.itl_s(0.005, 256) == 0.005
    assert frontend_or_none(fe, frontend=True) is fe


# ---------------------------------------------------------------------------------- presets


def test_preset_blocks_load():
    hs = host_step_from_preset({"host_step": {"base_s": "1e-3", "per_running_s": 2e-5, "max_running": 512,
                                              "source": "measured"}}, where="h100-sxm.yaml")
    assert hs.base_s == 1e-3 and hs.max_running == 512
    assert host_step_from_preset({"name": "x"}) is None and frontend_from_preset({}) is None


@pytest.mark.parametrize("block, field", [
    ({"base_s": -1.0, "source": "s"}, "host_step.base_s"),
    ({"base_s": "fast", "source": "s"}, "host_step.base_s"),
    ({"base_s": 1e-3, "bogus": 1, "source": "s"}, "host_step.bogus"),
    ({"base_s": 1e-3}, "host_step.source"),
    ({"base_s": 1e-3, "serial_fraction": 1.5, "source": "s"}, "host_step.serial_fraction"),
    ({"base_s": 1e-3, "host_speed": 0, "source": "s"}, "host_step.host_speed"),
    ({"base_s": 1e-3, "max_running": 0.5, "source": "s"}, "host_step.max_running"),
])
def test_bad_host_step_fields_name_the_field(block, field):
    with pytest.raises(PresetError, match=r"h100-sxm\.yaml.*" + re.escape(field)):
        host_step_from_preset({"host_step": block}, where="h100-sxm.yaml")


@pytest.mark.parametrize("block, field", [
    ({"request_s": -1, "source": "s"}, "frontend.request_s"),
    ({"api_servers": 0, "source": "s"}, "frontend.api_servers"),
    ({"per_output_s": 1e-5}, "frontend.source"),
    ("fast", "frontend"),
])
def test_bad_frontend_fields_name_the_field(block, field):
    with pytest.raises(PresetError, match=r"l4\.yaml.*" + re.escape(field)):
        frontend_from_preset({"frontend": block}, where="l4.yaml")


def test_proposed_preset_fields_load_and_match_the_measurement():
    """The blocks proposed for the GPU presets load, and the measured coefficients are the data file's fit."""
    prop = yaml.safe_load(PRESET_FIELDS.read_text())
    rec = json.loads(DATA.read_text())
    assert set(prop) == {"h100-sxm", "a100-80gb", "h200", "l4", "rtx-pro-6000", "rtx-4090"}
    for name, blocks in prop.items():
        hs = host_step_from_preset(blocks, where=f"{PRESET_FIELDS.name}:{name}")
        fe = frontend_from_preset(blocks, where=f"{PRESET_FIELDS.name}:{name}")
        assert hs is not None and fe is not None
        for k in ("base_s", "per_running_s", "per_token_s", "per_admit_s", "per_admit_token_s", "max_running"):
            assert getattr(hs, k) == rec["preset"]["host_step"][k], (name, k)
        for k in ("request_s", "per_prompt_token_s", "per_output_s", "step_base_s"):
            assert getattr(fe, k) == rec["preset"]["frontend"][k], (name, k)


# ---------------------------------------------------------------------------------- calibration


def test_fit_recovers_known_coefficients():
    from calibrate.host_step import fit_linear, fit_measurement

    rng = np.random.default_rng(3)
    r = rng.integers(1, 512, 40).astype(float)
    t = r + rng.integers(0, 4096, 40)
    y = 5e-5 + 3.5e-5 * r + 4e-7 * t
    got = fit_linear(np.c_[np.ones_like(r), r, t], y * (1 + rng.normal(0, 1e-3, 40)), ["a", "b", "c"])
    assert got["coef"]["a"] == pytest.approx(5e-5, rel=0.05)
    assert got["coef"]["b"] == pytest.approx(3.5e-5, rel=0.01)
    assert got["coef"]["c"] == pytest.approx(4e-7, rel=0.02)

    # the whole measurement -> fits path, on a synthetic driver output with known coefficients
    runs = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    dec = [{"kind": "decode", "running": n, "tokens": n, "core_cpu_ms": 1e3 * (6e-5 + 3e-5 * n + 5e-7 * n),
            "output_cpu_ms": 1e3 * (1e-5 + 2e-5 * n), "ipc_cpu_ms": 1e3 * 1e-6 * n, "sse_cpu_ms": 1e3 * 2e-5 * n}
           for n in runs]
    pre = [{"kind": "prefill", "running": b + 1, "tokens": p + b, "prefill_tokens": p,
            "core_cpu_ms": 1e3 * (6e-5 + 3e-5 * (b + 1) + 5e-7 * (p + b)),
            "admit_core_cpu_ms": 1e3 * (4e-5 + 2e-7 * p)} for b in (0, 32) for p in (256, 1024, 4096, 8192)]
    req = [{"prompt_tokens": p, "parse_cpu_ms": 0.05, "tokenize_cpu_ms": 1e3 * 2e-6 * p, "ipc_cpu_ms": 0.02}
           for p in (16, 128, 512, 2048, 8192)]
    f = fit_measurement({"decode": dec, "prefill": pre, "requests": req})
    assert f["engine_core"]["coef"]["base_s"] == pytest.approx(6e-5, rel=1e-4)
    assert f["engine_core"]["coef"]["per_running_s"] == pytest.approx(3e-5, rel=1e-4)
    assert f["engine_core"]["coef"]["per_token_s"] == pytest.approx(5e-7, rel=1e-4)
    assert f["admission"]["coef"]["per_admit_token_s"] == pytest.approx(2e-7, rel=1e-4)
    assert f["frontend_step"]["coef"]["per_output_s"] == pytest.approx(4.1e-5, rel=1e-4)
    assert f["frontend_request"]["coef"]["request_s"] == pytest.approx(7e-5, rel=1e-4)
    assert f["frontend_request"]["coef"]["per_prompt_token_s"] == pytest.approx(2e-6, rel=1e-4)


def test_fit_rejects_a_malformed_measurement():
    from calibrate.host_step import HostStepError, fit_measurement

    with pytest.raises(HostStepError, match="'prefill'"):
        fit_measurement({"decode": [{"running": 1}], "prefill": [], "requests": [{}]})
    with pytest.raises(HostStepError, match="core_cpu_ms"):
        fit_measurement({"decode": [{"kind": "decode", "running": 1, "tokens": 1}] * 3,
                         "prefill": [{"kind": "prefill", "running": 1, "tokens": 9}], "requests": [{}]})


def test_vidur_model_runner_fit_matches_its_rows():
    from calibrate.host_step import fit_worker, lm_head_s, vidur_rows

    rows = vidur_rows()
    assert [r["batch_size"] for r in rows][0] == 8 and rows[-1]["batch_size"] == 128
    f = fit_worker(rows)
    for r in (rows[0], rows[-1]):
        pred = f["coef"]["base_s"] + f["coef"]["per_running_s"] * r["batch_size"]
        # the logits product inside Sarathi's sampler is priced with the kernels: taken out of the cited time
        head = lm_head_s(r["batch_size"])
        assert 1e-4 < head < 1e-3
        assert pred == pytest.approx(1e-3 * (r["prepare_inputs_ms"] + r["sampler_ms"]) - head, rel=0.06)


def test_shipped_measurement_is_this_fit_of_its_data():
    """The committed file's fits and preset blocks are what the code computes from its measurement."""
    from calibrate.host_step import assemble

    rec = json.loads(DATA.read_text())
    assert rec["fingerprint"]["kind"] == "cpu" and rec["fingerprint"]["cpu_model"]
    assert rec["measurement"]["vllm_version"] == "0.33.0"
    assert [r["running"] for r in rec["measurement"]["decode"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    again = assemble(rec["measurement"], rec["fingerprint"], rec["microbench_s"], rec["measured"])
    assert again["preset"] == rec["preset"]
    assert moved(again["fits"], rec["fits"]) == []   # to 1e-12: least squares' last bits differ between CPUs
    # the engine core's time grows with the running requests
    core = [r["core_cpu_ms"] for r in rec["measurement"]["decode"]]
    assert core[-1] > 20 * core[0]


def test_microbench_is_positive_and_repeatable():
    from calibrate.host_step import microbench

    a, b = microbench(reps=3, n=4000), microbench(reps=3, n=4000)
    assert a > 0 and 0.3 < a / b < 3.0


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM's venv (.venv-vllm, vllm==0.33.0) is not installed")
def test_driver_times_vllm_scheduler_and_output_processor(tmp_path):
    """The driver in vLLM's own venv: every phase timed, the engine core's time growing with running requests."""
    out = tmp_path / "m.json"
    p = subprocess.run([str(VLLM_PY), str(ROOT / "scripts" / "host_step_driver.py"), str(out),
                        "--running", "1,64", "--steps", "6", "--warm", "2", "--prefill-tokens", "512",
                        "--prefill-beside", "0", "--prefill-reps", "2"],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"})
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads(out.read_text())
    assert m["vllm_version"] == "0.33.0"
    d1, d64 = m["decode"]
    assert d1["running"] == 1 and d64["running"] == 64 and d64["outputs"] == 64
    for k in ("schedule_cpu_ms", "update_cpu_ms", "output_cpu_ms", "ipc_cpu_ms", "sse_cpu_ms"):
        assert d1[k] > 0 and d64[k] > d1[k], k
    assert m["prefill"][0]["tokens"] == 512 and m["prefill"][0]["admit_core_cpu_ms"] > 0


@settings(max_examples=200, deadline=None)
@given(r=st.integers(0, 600), t=st.integers(0, 9000), a=st.integers(0, 8), at=st.integers(0, 9000),
       g=finite, asy=st.booleans())
def test_one_step_in_python_numbers_equals_the_array_path(r, t, a, at, g, asy):
    """A step priced from Python numbers (the engine's stepped iterations) gives the float the numpy path gives,
    and both refuse the same inputs."""
    hs = HostStepCost(base_s=5.842e-4, per_running_s=2.397e-05, per_token_s=1.672e-07, per_admit_s=2.087e-05,
                      per_admit_token_s=1.38e-07, serial_fraction=0.25, host_speed=1.3)
    h, sr = hs.seconds_and_serial(r, t, r, a, at)
    H, SR = hs.seconds_and_serial(np.array([r]), np.array([t]), np.array([r]), np.array([a]), np.array([at]))
    assert (h, sr) == (float(H[0]), float(SR[0]))
    assert step_seconds(g, h, asy, sr) == float(step_seconds(np.array([g]), H, asy, SR)[0])
    for bad in ((-1, t), (r, -1)):
        for args in (bad, tuple(np.array([x]) for x in bad)):
            with pytest.raises(ValueError, match="must be >= 0"):
                hs.seconds(*args)
    capped = HostStepCost(base_s=1e-4, max_running=4, max_tokens=100)
    for args in ((5, 1), (1, 101), (np.array([5]), np.array([1])), (np.array([1]), np.array([101]))):
        with pytest.raises(ValueError, match="measured at"):
            capped.seconds(*args)
    for x in (g, np.array([g])):
        with pytest.raises(ValueError, match="must be >= 0"):
            step_seconds(-1.0 if x is g else np.array([-1.0]), 0.1, asy)
