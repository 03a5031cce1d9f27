"""Bands (issue 30, item 8): a figure priced with each public fit of its device; the central prediction
lies inside its band, and a figure outside its band is reported, not tuned away."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from sim.cost.bands import band_of, band_profiles
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
    got = band_profiles(hw)
    assert [label for label, _ in got] == [f"fit on {f['fit_on']}" for f in fits] and len(got) == 2
    for (_, p), f in zip(got, fits):
        for k in ("eff_c", "eff_m", "eff_elem", "eff_att", "per_kernel_s"):
            assert getattr(p, k) == (f[k] if k in f else getattr(hw, k)), k   # a coefficient it cannot fit: central
        assert p.peak_flops == hw.peak_flops and p.source != hw.source
    assert band_profiles(load_hardware("h200")) == []       # a datasheet profile: one fit, no band
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
    assert band["fits"][0] == "central" and len(band["fits"]) == 3
    assert band["metrics"], band
    for k, (lo, hi) in band["metrics"].items():
        assert lo <= res[k] <= hi, k
    assert any(lo < hi for lo, hi in band["metrics"].values())   # the public fits do disagree
    assert "band over 3 fits of h100-sxm" in capsys.readouterr().out


def test_validate_band_marks_a_figure_outside_it(tmp_path, capsys):
    f = tmp_path / "figs.yaml"
    f.write_text(FIG)
    md, js = tmp_path / "v.md", tmp_path / "v.json"
    assert main(["validate", str(f), "--band", "--markdown", str(md), "--out", str(js)]) == 0
    rows = {r["id"]: r for r in json.loads(js.read_text())["rows"]}
    for r in rows.values():
        assert r["predicted_lo"] <= r["predicted"] <= r["predicted_hi"]
    assert rows["b"]["in_band"] is False                      # 100 ms is far outside any fit's TPOT
    assert rows["c"]["band_fits"] == 0 and rows["c"]["in_band"] is None   # h200: no band to be outside of
    text = md.read_text()
    assert "--band" in text.splitlines()[0] and "| band |" in text and "outside" in text


def test_plan_band_brackets_every_deployment(capsys):
    assert main(["plan", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "2",
                 "--tensor-parallel-size", "1,2", "--num-problems", "6", "--band", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["band_fits"][0] == "central" and len(out["meta"]["band_fits"]) == 3
    for r in out["frontier"] + out["best_per_policy"]:
        for c in ("goodput_problems_per_s", "e2e_p99_s"):
            assert r[f"{c}_lo"] <= r[c] <= r[f"{c}_hi"], (c, r)
    assert any(r["e2e_p99_s_lo"] < r["e2e_p99_s_hi"] for r in out["frontier"])
