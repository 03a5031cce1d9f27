"""Host time per engine step and front-end time as priced terms of the plain serving path (issue 30, items 1-2).

``sim.plain.run`` drives :class:`sim.engine.Engine`; with a profile's ``host_step`` every step costs
``step_seconds(gpu_s, host_s, async_scheduling, host_serial_s)`` and with its ``frontend`` a request's TTFT
gains ``FrontendCost.ttft_s(prompt)``. Known coefficients on one request give exact differences. No torch.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.cli import main
from sim.bench import plain
from sim.base.errors import PresetError
from sim.cost.overheads import FrontendCost, HostStepCost, host_step_from_preset
from sim.cost.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parents[1]
GPU_PRESETS = ("h100-sxm", "h200", "a100-80gb", "l4", "rtx-pro-6000", "rtx-4090")


def _hw(host=None, fe=None, name="h100-sxm"):
    return dataclasses.replace(load_hardware(name), host_step=host, frontend=fe)


def _one(hw, P=64, T=9, **kw):
    m = load_model("smollm2-135m")
    wl = plain.PlainWorkload(np.array([P]), np.array([T]))
    r = plain.run(m, hw, wl, request_rate=float("inf"), **kw)
    return r


def test_sync_step_is_gpu_plus_host_with_every_count():
    """One request of P prompt tokens and T outputs: 1 prefill step + T - 1 decode steps, one running
    request, P + T - 1 scheduled tokens, T sampled, one admission of P tokens: each coefficient shows up."""
    P, T = 64, 9
    h = HostStepCost(base_s=1e-3, per_running_s=2e-4, per_token_s=3e-6, per_output_s=5e-5, per_admit_s=7e-4,
                     per_admit_token_s=1e-6)
    off = _one(_hw(), P, T)
    on = _one(_hw(h), P, T, async_scheduling=False)
    steps = T
    expect = (steps * (h.base_s + h.per_running_s) + h.per_token_s * (P + T - 1) + h.per_output_s * T
              + h.per_admit_s + h.per_admit_token_s * P)
    assert on.e2el[0] - off.e2el[0] == pytest.approx(expect, rel=1e-9)
    # the first token waits for the prefill step's host time: base + running + P tokens + 1 sample + admission
    first = h.base_s + h.per_running_s + h.per_token_s * P + h.per_output_s + h.per_admit_s + h.per_admit_token_s * P
    assert on.ttft[0] - off.ttft[0] == pytest.approx(first, rel=1e-9)
    assert on.info["overheads"]["host_step"]["host_seconds"] == pytest.approx(expect, rel=1e-9)
    assert on.info["iterations"] == steps


def test_async_step_is_max_of_gpu_plus_serial_and_host():
    P, T = 64, 9
    off = _one(_hw(), P, T)
    g = np.diff(np.concatenate([[0.0], [off.ttft[0]], off.ttft[0] + np.cumsum(off.itls[0])]))   # gpu step seconds
    # host shorter than every GPU step, nothing serial: fully hidden
    small = HostStepCost(base_s=float(g.min()) / 4)
    assert _one(_hw(small), P, T, async_scheduling=True).e2el[0] == pytest.approx(off.e2el[0], rel=1e-12)
    # host longer than every GPU step: the host sets the pace, each step costs exactly host_s
    big = HostStepCost(base_s=float(g.max()) * 3)
    assert _one(_hw(big), P, T, async_scheduling=True).e2el[0] == pytest.approx(T * big.base_s, rel=1e-9)
    # a serial part stays on the GPU's path: gpu + serial_fraction * host per step
    ser = HostStepCost(base_s=float(g.min()) / 4, serial_fraction=0.5)
    got = _one(_hw(ser), P, T, async_scheduling=True).e2el[0]
    assert got - off.e2el[0] == pytest.approx(T * 0.5 * ser.base_s, rel=1e-9)
    # and async is never slower than sync
    assert got <= _one(_hw(ser), P, T, async_scheduling=False).e2el[0]


def test_default_is_vllm_033_async_on_and_flags_say_so():
    h = HostStepCost(base_s=1e-3)
    r = _one(_hw(h))
    assert r.info["overheads"]["host_step"]["async_scheduling"] is True
    assert _one(_hw(h), async_scheduling=False).info["overheads"]["host_step"]["async_scheduling"] is False


def test_ttft_gains_exactly_the_frontend_term_and_no_frontend_removes_it():
    fe = FrontendCost(request_s=2e-3, per_prompt_token_s=1e-5, per_output_s=3e-4, step_base_s=0.0)
    P = 200
    base, on = _one(_hw(), P, 12), _one(_hw(fe=fe), P, 12)
    assert on.ttft[0] - base.ttft[0] == pytest.approx(fe.ttft_s(P), rel=1e-9)
    assert on.e2el[0] - base.e2el[0] == pytest.approx(fe.ttft_s(P), rel=1e-9)
    assert on.itls[0] == pytest.approx(base.itls[0], rel=1e-12)
    m = load_model("llama-3-8b")   # steps of milliseconds: the front-end's pass (running x 0.3 ms) never binds
    wl = plain.random_workload(12, 200, 16, range_ratio=0.5, seed=3)
    base = plain.run(m, _hw(), wl, request_rate=50.0, seed=3)
    off = plain.run(m, _hw(fe=fe), wl, request_rate=50.0, seed=3, frontend=False)
    np.testing.assert_array_equal(off.ttft, base.ttft)
    np.testing.assert_array_equal(off.e2el, base.e2el)
    on = plain.run(m, _hw(fe=fe), wl, request_rate=50.0, seed=3)
    assert on.info["overheads"]["frontend"]["priced"] and not off.info["overheads"]["frontend"]["priced"]
    np.testing.assert_array_equal(on.start, base.start)   # the client's send times do not move
    assert (on.ttft >= fe.ttft_s(wl.input_lens) - 1e-12).all()
    # offline (vllm bench throughput: an in-process LLM) has no front-end by default
    thr = plain.run(m, _hw(fe=fe), wl, seed=3, offline=True)
    assert not thr.info["overheads"]["frontend"]["priced"]


def test_one_api_server_takes_a_burst_in_turn():
    """All requests sent at once: request k reaches the engine after the API server handled requests
    0..k (HTTP + tokenisation each, one at a time), so its TTFT is at least that sum plus its chunk."""
    m = load_model("llama-3-8b")
    fe = FrontendCost(request_s=5e-3, per_prompt_token_s=2e-5, per_output_s=1e-4)
    wl = plain.random_workload(10, 300, 4, range_ratio=0.5, seed=2)
    on = plain.run(m, _hw(fe=fe), wl, request_rate=float("inf"), seed=2)
    before = fe.request_s + fe.per_prompt_token_s * wl.input_lens
    assert (on.ttft >= np.cumsum(before) + fe.per_output_s - 1e-12).all()
    two = plain.run(m, _hw(fe=dataclasses.replace(fe, api_servers=10)), wl, request_rate=float("inf"), seed=2)
    assert two.ttft.mean() < on.ttft.mean()


def test_max_concurrency_slot_is_held_through_the_frontend():
    m = load_model("llama-3-8b")
    fe = FrontendCost(request_s=5e-3, per_prompt_token_s=2e-5, per_output_s=2e-3)
    wl = plain.random_workload(20, 300, 8, range_ratio=0.5, seed=4)
    r = plain.run(m, _hw(fe=fe), wl, request_rate=float("inf"), max_concurrency=3, seed=4)
    assert plain.serve_result(r, max_concurrency=3)["max_concurrent_requests"] == 3
    r2 = plain.run(m, _hw(fe=fe), wl, request_rate=float("inf"), max_concurrency=3, seed=4,
                   data_parallel_size=2, tensor_parallel_size=1)
    assert plain.serve_result(r2, max_concurrency=3)["max_concurrent_requests"] == 3


def test_token_pace_is_bounded_by_the_frontend():
    """A front-end slower than the engine: every gap is at least its pass over the step's outputs."""
    m = load_model("smollm2-135m")
    fe = FrontendCost(per_output_s=0.02, step_base_s=0.01)
    wl = plain.random_workload(6, 32, 10, seed=1)
    base = plain.run(m, _hw(), wl, request_rate=float("inf"), seed=1)
    on = plain.run(m, _hw(fe=fe), wl, request_rate=float("inf"), seed=1)
    for b, o in zip(base.itls, on.itls):
        assert len(b) == len(o)
        assert all(x >= fe.step_s(1) - 1e-12 and x >= y for x, y in zip(o, b))
    assert (on.e2el - on.ttft >= base.e2el - base.ttft).all()
    assert on.e2el == pytest.approx(on.ttft + np.array([sum(x) for x in on.itls]), rel=1e-12)


def test_frontend_gaps_in_chunks_equal_one_pass(monkeypatch):
    """The client's gaps are made a chunk of requests at a time (``plain.FRONTEND_CHUNK``): chunks of 3 requests over
    two replicas give the same ITLs and E2E as one chunk, the front end sets the pace of some tokens, and each E2E
    is its TTFT plus its own gaps."""
    m = load_model("smollm2-135m")
    fe = FrontendCost(per_output_s=2e-3, step_base_s=1e-3)
    wl = plain.random_workload(17, 32, 12, range_ratio=0.5, seed=5)
    kw = dict(request_rate=200.0, seed=5, data_parallel_size=2)
    base = plain.run(m, _hw(), wl, **kw)
    one = plain.run(m, _hw(fe=fe), wl, **kw)
    monkeypatch.setattr(plain, "FRONTEND_CHUNK", 3)
    small = plain.run(m, _hw(fe=fe), wl, **kw)
    np.testing.assert_array_equal(small.e2el, one.e2el)
    np.testing.assert_array_equal(small.itls.flat(), one.itls.flat())
    np.testing.assert_array_equal(small.tally.gaps.counts, one.tally.gaps.counts)   # counted as they land
    np.testing.assert_array_equal(small.tally.tok, one.tally.tok)
    assert any(sum(o) > sum(b) for o, b in zip(small.itls, base.itls))   # the front end binds somewhere
    np.testing.assert_allclose(small.e2el, small.ttft + np.array([sum(x) for x in small.itls]), rtol=1e-12)


def test_pipeline_parallel_puts_host_time_on_stage_zero():
    m = load_model("llama-3-8b")
    wl = plain.PlainWorkload(np.array([64]), np.array([5]))
    h = HostStepCost(base_s=2e-3)
    off = plain.run(m, _hw(), wl, pipeline_parallel_size=2, host_time=False)
    on = plain.run(m, _hw(h), wl, pipeline_parallel_size=2, async_scheduling=False)
    assert on.e2el[0] - off.e2el[0] == pytest.approx(5 * h.base_s, rel=1e-9)


def test_gpu_presets_carry_the_blocks_and_local_cpu_does_not():
    src = yaml.safe_load((ROOT / "calibrate/data/host_step/preset-fields.yaml").read_text())
    for name in GPU_PRESETS:
        hw = load_hardware(name)
        assert hw.host_step is not None and hw.frontend is not None, name
        assert hw.host_step == host_step_from_preset(src[name], where=name)   # every field, as the fit wrote it
        assert hw.frontend.request_s == src[name]["frontend"]["request_s"]
        assert hw.host_per_iter_s == 0 and hw.sample_s_per_vocab == 0   # nothing counted twice
    cpu = load_hardware("local-cpu")
    assert cpu.host_step is None and cpu.frontend is None and cpu.host_per_iter_s > 0
    # round trip through to_dict (a fitted profile written and read back)
    hw = load_hardware("h100-sxm")
    d = hw.to_dict()
    d.pop("calibration_note")
    assert type(hw)(**d).host_step == hw.host_step


def _preset(tmp_path, **blocks):
    d = yaml.safe_load((ROOT / "sim/presets/hardware/h100-sxm.yaml").read_text())
    d.update(blocks)
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.mark.parametrize("block,field", [
    ({"host_step": {"base_s": 1e-3, "bogus": 1, "source": "x"}}, "host_step.bogus"),
    ({"host_step": {"base_s": -1, "source": "x"}}, "host_step.base_s"),
    ({"host_step": {"base_s": 1e-3}}, "host_step.source"),
    ({"frontend": {"api_servers": 0, "source": "x"}}, "frontend.api_servers"),
    ({"frontend": {"request_s": "fast", "source": "x"}}, "frontend.request_s"),
    ({"host_step": {"base_s": 1e-3, "source": "x"}, "host_per_iter_s": 0.01}, "host_per_iter_s"),
])
def test_bad_preset_field_names_the_file_and_field(tmp_path, block, field):
    p = _preset(tmp_path, **block)
    with pytest.raises(PresetError) as e:
        load_hardware(p)
    assert str(p) in str(e.value) and field in str(e.value), str(e.value)


def _serve(tmp_path, capsys, *extra, name="r.json"):
    argv = ["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "16",
            "--random-input-len", "300", "--random-output-len", "12", "--request-rate", "8", "--save-result",
            "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", name, *extra]
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads((tmp_path / name).read_text()), out


def test_cli_flags_end_to_end(tmp_path, capsys):
    hw = load_hardware("h100-sxm")
    d, out = _serve(tmp_path, capsys, name="a.json")
    o = d["rksim"]["overheads"]
    assert o["host_step"]["priced"] and o["host_step"]["async_scheduling"] is True and o["frontend"]["priced"]
    assert o["host_step"]["source"] == hw.host_step.source and o["frontend"]["source"] == hw.frontend.source
    assert "async scheduling on" in out and "front-end time priced" in out
    s, out = _serve(tmp_path, capsys, "--no-async-scheduling", name="s.json")
    assert s["rksim"]["overheads"]["host_step"]["async_scheduling"] is False and "async scheduling off" in out
    assert s["mean_tpot_ms"] > d["mean_tpot_ms"]
    n, out = _serve(tmp_path, capsys, "--no-frontend", name="n.json")
    assert not n["rksim"]["overheads"]["frontend"]["priced"] and "no front-end time" in out
    np.testing.assert_allclose(np.array(d["ttfts"]) - np.array(n["ttfts"]),
                               hw.frontend.ttft_s(np.array(d["input_lens"])), rtol=1e-9)
    h, out = _serve(tmp_path, capsys, "--no-host-time", "--no-async-scheduling", name="h.json")
    assert not h["rksim"]["overheads"]["host_step"]["priced"] and "no host time per step (turned off: --no-host-time" in out
    assert h["mean_tpot_ms"] < s["mean_tpot_ms"]
    # bench throughput: vLLM's offline LLM benchmark, no API server
    assert main(["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts",
                 "8", "--input-len", "64", "--output-len", "8", "--output-json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    t = json.loads((tmp_path / "t.json").read_text())
    assert not t["rksim"]["overheads"]["frontend"]["priced"] and t["rksim"]["overheads"]["host_step"]["priced"]
    assert "no front-end time (in-process LLM run" in out
