"""Bands (issue 30, item 8): a figure priced with each public fit of its device; the central prediction
lies inside its band, and a figure outside its band is reported, not tuned away."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from sim.cost.bands import FP8_LOW, HOST_LOW, band_of, band_profiles
from sim.cost.profiles import PRESET_DIR, load_hardware
from sim.base.errors import PresetError

FIG = ("figures:\n"
       "  - {id: a, model: llama-3-8b, hardware: h100-sxm, dtype: bf16, metric: mean_tpot_ms, value: 9.0,\n"
       "     workload: {input_len: 256, output_len: 32, num_prompts: 16, request_rate: inf, seed: 0},\n"
       "     source: {url: 'https://example.invalid/x'}}\n"
       "  - {id: b, model: llama-3-8b, hardware: h100-sxm, dtype: bf16, metric: mean_tpot_ms, value: 100.0,\n"
       "     workload: {input_len: 256, output_len: 32, num_prompts: 16, request_rate: inf, seed: 0},\n"
       "     source: {url: 'https://example.invalid/x'}}\n"
       "  - {id: c, model: llama-3-8b, hardware: h200, dtype: bf16, metric: mean_tpot_ms, value: 9.0,\n"
       "     workload: {input_len: 256, output_len: 32, num_prompts: 16, request_rate: inf, seed: 0},\n"
       "     source: {url: 'https://example.invalid/x'}}\n")


def test_the_band_profiles_are_the_preset_s_single_source_fits():
    hw = load_hardware("h100-sxm")
    fits = yaml.safe_load((PRESET_DIR / "hardware" / "h100-sxm.yaml").read_text())["band_fits"]
    got = band_profiles(hw, host_time=False)
    assert [label for label, _ in got] == [f"fit on {f['fit_on']}" for f in fits] and len(got) == 2
    for (_, p), f in zip(got, fits):
        for k in ("eff_c", "eff_m", "eff_elem", "eff_att", "per_kernel_s"):
            assert getattr(p, k) == (f[k] if k in f else getattr(hw, k)), k   # a coefficient it cannot fit: central
        assert p.peak_flops == hw.peak_flops and p.source != hw.source and p.host_step == hw.host_step
    assert band_profiles(load_hardware("l4"), host_time=False) == []     # a datasheet profile: one fit, no band
    assert band_profiles(load_hardware("h200"), host_time=False) == []   # one public source: no second fit


def test_the_host_time_range_prices_every_fit_with_the_engine_core_alone():
    hw = load_hardware("h100-sxm")
    fits = band_profiles(hw, host_time=False)
    got = band_profiles(hw)
    assert got[:2] == fits and [label for label, _ in got[2:]] == [
        HOST_LOW, f"{fits[0][0]}, {HOST_LOW}", f"{fits[1][0]}, {HOST_LOW}"]
    h = hw.host_step
    assert h.runner_base_s > 0 and h.runner_per_running_s > 0          # the preset's cited model-runner part
    low = h.engine_core_only()
    assert low.base_s == pytest.approx(h.base_s - h.runner_base_s) and low.per_running_s == pytest.approx(
        h.per_running_s - h.runner_per_running_s) and not low.has_runner_part
    assert (low.per_token_s, low.per_admit_s, low.host_speed) == (h.per_token_s, h.per_admit_s, h.host_speed)
    for (_, p), base in zip(got[2:], [hw] + [p for _, p in fits]):
        assert p.host_step == low and p.eff_c == base.eff_c and p.eff_att == base.eff_att
    # a datasheet profile has no public fit to disagree with, but its host time has the same cited part
    assert [label for label, _ in band_profiles(load_hardware("h200"))] == [HOST_LOW]
    with pytest.raises(PresetError, match="runner_base_s.*part of 'host_step.base_s'"):
        dataclasses.replace(h, runner_base_s=2 * h.base_s)


def test_an_fp8_run_is_priced_with_cutlass_fp8_products_too(tmp_path):
    hw = load_hardware("h100-sxm")
    assert hw.eff_c_fp8_low is not None and hw.eff_c_fp8_low < hw.eff_c_fp8   # CUTLASS 3.6 under DeepGEMM
    plain16 = band_profiles(hw)
    got = band_profiles(hw, fp8=True)
    assert got[:len(plain16)] == plain16 and len(got) == 2 * len(plain16) + 1   # every profile so far, and central
    assert [label for label, _ in got[len(plain16):]][:2] == [FP8_LOW, f"{plain16[0][0]}, {FP8_LOW}"]
    for (_, p), (_, base) in zip(got[len(plain16) + 1:], plain16):
        assert p.eff_c_fp8 == hw.eff_c_fp8_low and p.eff_c == base.eff_c and p.host_step == base.host_step
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--input-len",
                 "1024", "--output-len", "8", "--num-prompts", "64", "--quantization", "fp8", "--band",
                 "--output-json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert FP8_LOW in res["band"]["fits"]
    lo, hi = res["band"]["metrics"]["requests_per_second"]
    assert lo < res["requests_per_second"] <= hi   # prefill-bound FP8 products at a lower rate: fewer requests/s
    # a 16-bit run of the same GPU carries no FP8 profile
    assert FP8_LOW not in main_band(tmp_path, ["--input-len", "1024", "--output-len", "8", "--num-prompts", "8"])


def main_band(tmp_path, flags) -> list:
    out = tmp_path / "b.json"
    assert main(["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", *flags, "--band",
                 "--output-json", str(out)]) == 0
    return json.loads(out.read_text())["band"]["fits"]


def test_the_host_time_range_moves_a_sync_step(tmp_path):
    """Without --async-scheduling the host time adds to every step, so the engine core alone is a lower TPOT."""
    out = tmp_path / "s.json"
    assert main(["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h200", "--num-prompts", "20",
                 "--random-input-len", "256", "--random-output-len", "32", "--request-rate", "4",
                 "--no-async-scheduling", "--band", "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", out.name]) == 0
    res = json.loads(out.read_text())
    assert res["band"]["fits"] == ["central", HOST_LOW]
    lo, hi = res["band"]["metrics"]["mean_tpot_ms"]
    assert hi == res["mean_tpot_ms"] and lo < hi - 0.5   # ~0.6 ms of cited runner time per step left out
    assert band_of([3.0, None, 1.0, float("nan"), 2.0]) == [1.0, 3.0] and band_of([None]) is None


@pytest.mark.parametrize("entry, words", [
    ("band_fits: {fit_on: x}", "must be a list"),
    ("band_fits: [{eff_c: 0.5}]", "needs 'fit_on'"),
    ("band_fits: [{fit_on: x, eff_q: 0.5}]", "unknown field(s) eff_q"),
    ("band_fits: [{fit_on: x, eff_c: 7}]", "field 'eff_c' must be a number"),
])
def test_a_bad_band_names_the_field(tmp_path, entry, words):
    text = (PRESET_DIR / "hardware" / "h200.yaml").read_text() + "\n" + entry + "\n"
    f = tmp_path / "hw.yaml"
    f.write_text(text)
    with pytest.raises(PresetError) as e:
        band_profiles(load_hardware(f))
    assert words in str(e.value) and "hw.yaml" in str(e.value)


def test_bench_throughput_band_contains_the_central_figure(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--input-len",
                 "512", "--output-len", "64", "--num-prompts", "40", "--band", "--output-json", str(out)]) == 0
    res = json.loads(out.read_text())
    band = res["band"]
    assert band["fits"][0] == "central" and len(band["fits"]) == 6   # 3 fits x {host time, engine core only}
    assert band["metrics"], band
    for k, (lo, hi) in band["metrics"].items():
        assert lo <= res[k] <= hi, k
    assert any(lo < hi for lo, hi in band["metrics"].values())   # the public fits do disagree
    assert "band over 6 fits of h100-sxm" in capsys.readouterr().out


def test_validate_band_marks_a_figure_outside_it(tmp_path, capsys):
    f = tmp_path / "figs.yaml"
    f.write_text(FIG)
    md, js = tmp_path / "v.md", tmp_path / "v.json"
    assert main(["validate", str(f), "--band", "--markdown", str(md), "--out", str(js)]) == 0
    rows = {r["id"]: r for r in json.loads(js.read_text())["rows"]}
    for r in rows.values():
        assert r["predicted_lo"] <= r["predicted"] <= r["predicted_hi"]
    assert rows["b"]["in_band"] is False                      # 100 ms is far outside any fit's TPOT
    assert rows["c"]["band_fits"] == 1   # h200: no public fit to disagree with, only the host-time range
    text = md.read_text()
    assert "--band" in text.splitlines()[0] and "| band |" in text and "outside" in text
    fam = {x["family"]: x for x in json.loads(js.read_text())["families"]}["tpot"]
    assert fam["banded"] == 3 and fam["in_band"] == sum(r["in_band"] is True for r in rows.values()) < 3
    assert f"| {fam['in_band']} of 3 |" in text and "inside its band" in text


def test_plan_band_brackets_every_deployment(capsys):
    assert main(["plan", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "2",
                 "--tensor-parallel-size", "1,2", "--num-problems", "6", "--band", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["band_fits"][0] == "central" and len(out["meta"]["band_fits"]) == 6
    for r in out["frontier"] + out["best_per_policy"]:
        for c in ("goodput_problems_per_s", "e2e_p99_s"):
            assert r[f"{c}_lo"] <= r[c] <= r[f"{c}_hi"], (c, r)
    assert any(r["e2e_p99_s_lo"] < r["e2e_p99_s_hi"] for r in out["frontier"])
