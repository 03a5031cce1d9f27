"""A fitted profile belongs to a host and a range: fingerprints, per-dimension ranges, the host fit, user profiles."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.cost.fingerprint import fingerprint_differences, host_status, parse_cpuinfo, profile_host_status
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import ModelShape
from sim.base.errors import OutOfCalibrationError
from sim.cost.profiles import load_hardware
from sim.cost.ranges import RangeQuery, check, iteration_query, violations

SMOL = ModelShape(name="smollm2-135m", n_layers=30, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64,
                  intermediate_size=1536, vocab_size=49152, dtype_bytes=4, tied_embeddings=True, dtype="float32")
FP = {"kind": "cpu", "cpu_model": "Intel(R) Xeon(R) Processor", "isa": ["amx_tile", "avx2", "avx512f"],
      "threads": 1, "torch": "2.13.0+cpu", "blas": "mkl", "dtype": "float32"}
BUNDLED = Path(__file__).resolve().parents[1] / "examples" / "trace-gsm8k-persona"


def test_cpuinfo_flags_are_the_blas_ones():
    text = ("processor\t: 0\nmodel name\t: Some  CPU @ 2GHz\nflags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16 "
            "amx_tile amx_bf16 avx_vnni\nprocessor\t: 1\nmodel name\t: Some CPU\n")
    info = parse_cpuinfo(text)
    assert info == {"cpu_model": "Some CPU @ 2GHz", "isa": ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"],
                    "logical_cpus": 2}


def test_fingerprint_differences_name_what_differs():
    assert fingerprint_differences(FP, dict(FP)) == []
    other = {**FP, "cpu_model": "AMD EPYC 7B13", "isa": ["avx2"]}
    d = fingerprint_differences(FP, other)
    assert any("cpu_model" in x and "AMD EPYC 7B13" in x for x in d)
    assert any("ISA flags differ" in x and "amx_tile" in x and "avx512f" in x for x in d)
    # keys the current side does not know (the simulator knows no threads / BLAS) are not compared
    assert fingerprint_differences(FP, {"kind": "cpu", "cpu_model": FP["cpu_model"], "isa": FP["isa"]}) == []
    assert fingerprint_differences(FP, {**FP, "threads": 2}) == ["threads 1 vs 2 here"]
    gpu = {"kind": "gpu", "device_name": "NVIDIA H100 80GB HBM3"}
    assert fingerprint_differences(gpu, {"kind": "gpu", "device_name": "NVIDIA A100-SXM4-80GB"})


def _fitted(tmp_path, fp, **fr) -> Path:
    data = {"name": "fit-x", "peak_flops": 1e11, "mem_bw": 2e10, "mem_capacity": 2e10, "calibrated": True,
            "device": "cpu", "fitted_range": {"max_context_tokens": 4096, "max_new_tokens": 2048, "max_batch": 64,
                                              "models": ["smollm2-135m"], "device": "cpu", "dtypes": ["float32"],
                                              **fr}}
    if fp is not None:
        data["fingerprint"] = fp
    p = tmp_path / "fit-x.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_mismatching_host_says_so_and_is_not_calibrated(tmp_path):
    from sim.cost.fingerprint import current_cpu_fingerprint

    here = current_cpu_fingerprint()
    same = load_hardware(str(_fitted(tmp_path, {**FP, **here})))
    st = profile_host_status(same)
    assert st["host_match"] is True and st["hardware_calibrated"] and st["host_note"] == ""
    foreign = load_hardware(str(_fitted(tmp_path, {**FP, **here, "cpu_model": "Foreign CPU 9000",
                                                   "isa": ["avx2"]})))
    st = profile_host_status(foreign)
    assert st["host_match"] is False and st["hardware_calibrated"] is False
    assert "\n" not in st["host_note"] and "another host" in st["host_note"] and "Foreign CPU 9000" in st["host_note"]
    assert "rksim calibrate host" in st["host_note"]
    # a datasheet profile is not a host's: nothing to say
    assert profile_host_status(load_hardware("h100-sxm"))["host_match"] is None
    assert host_status("x", None, calibrated=False)["host_note"] == ""


def test_simulate_marks_and_strict_refuses_a_foreign_profile(tmp_path, capsys):
    from app.cli import main
    from sim.api import simulate
    from sim.cost.fingerprint import current_cpu_fingerprint

    shipped = yaml.safe_load(Path(load_hardware("local-cpu").source).read_text())
    shipped["fingerprint"] = {**current_cpu_fingerprint(), "cpu_model": "Foreign CPU 9000"}
    p = tmp_path / "foreign-cpu.yaml"
    p.write_text(yaml.safe_dump(shipped))
    r = simulate(BUNDLED, policy="exact-prefix", hardware=str(p), problems=[0])
    assert r.info["hardware_calibrated"] is False and r.summary["hardware_calibrated"] is False
    assert "Foreign CPU 9000" in r.info["host_note"]
    with pytest.raises(OutOfCalibrationError, match=r"--strict: .*another host .*cpu_model 'Foreign CPU 9000'"):
        simulate(BUNDLED, policy="exact-prefix", hardware=str(p), problems=[0], strict=True)
    assert main(["simulate", "--trace", str(BUNDLED), "--policy", "no-kv", "--hardware", str(p)]) == 0
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if "another host" in ln] and "hardware_calibrated=false" in err
    assert main(["simulate", "--trace", str(BUNDLED), "--policy", "no-kv", "--hardware", str(p), "--strict"]) == 2
    assert "Foreign CPU 9000" in capsys.readouterr().err


def test_each_dimension_outside_is_refused_naming_it():
    fr = {"max_batch": 8, "max_tokens_per_iteration": 512, "max_context_tokens": 1000, "max_new_tokens": 256,
          "mixed_iterations": False}
    assert violations(fr, RangeQuery(seqs=8, tokens=512, context=1000, item_tokens=256)) == []
    cases = [(RangeQuery(seqs=9), "sequences per iteration 9 is outside the fitted range [1, 8]"),
             (RangeQuery(tokens=513), "tokens per iteration 513 is outside the fitted range [1, 512]"),
             (RangeQuery(context=1001), "context length 1001 is outside the fitted range [0, 1000]"),
             (RangeQuery(item_tokens=300), "new tokens of one forward item 300 is outside the fitted range [1, 256]"),
             (RangeQuery(mixed=True), "mixed prefill + decode iterations present")]
    for q, msg in cases:
        with pytest.raises(OutOfCalibrationError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
            check("fit", fr, q)
        notes = check("fit", fr, q, allow_extrapolation=True)
        assert len(notes) == 1 and notes[0].startswith("extrapolated: ")
    # a key an older profile does not record is not checked
    assert check("fit", {"max_batch": 8}, RangeQuery(tokens=10 ** 6, mixed=True)) == []
    q = iteration_query([[(1, 100), (1, 200), (64, 10)], [(1, 300)]])
    assert q == RangeQuery(seqs=3, tokens=66, context=301, item_tokens=64, mixed=True)


def test_check_query_refuses_and_extrapolation_marks(tmp_path):
    from sim.api import simulate

    hw = load_hardware(str(_fitted(tmp_path, None, max_context_tokens=40)))
    with pytest.raises(OutOfCalibrationError, match=r"context length \d+ is outside the fitted range \[0, 40\]"):
        hw.check_query(SMOL, max_context=500)
    assert hw.check_query(SMOL, max_context=500, allow_extrapolation=True)[0].startswith("extrapolated: hardware fit-x")
    p = _fitted(tmp_path, None, max_context_tokens=40)
    data = yaml.safe_load(p.read_text())
    data["fitted_range"]["models"] = ["smollm2-135m"]
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(OutOfCalibrationError, match="context length"):
        simulate(BUNDLED, policy="no-kv", hardware=str(p), problems=[0])
    r = simulate(BUNDLED, policy="no-kv", hardware=str(p), problems=[0], allow_extrapolation=True)
    assert any("context length" in x for x in r.info["extrapolated"])


# --------------------------------------------------------------------------- calibrate host
def test_host_budget_is_respected_on_a_fake_clock():
    from calibrate.host import HostConfig, measure, plan_shapes

    shapes = plan_shapes(HostConfig())
    kinds = {s.kind for s in shapes}
    assert kinds == {"decode", "shared", "prefill", "mixed"}
    assert max(s.decodes for s in shapes) == 64 and max(s.prefill for s in shapes) == 2048
    assert {s.decodes for s in shapes if s.kind == "decode"} >= set(range(1, 17))

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    cost = {"decode": 0.4, "shared": 0.4, "prefill": 1.5, "mixed": 0.9}

    def run_one(s):
        dt = cost[s.kind] * (1 + s.decodes / 64)
        clock.t += dt
        return dt, dt

    for budget in (20.0, 60.0, 180.0):
        clock.t = 0.0
        rows, info = measure(shapes, run_one, budget_s=budget, clock=clock, repeats=2, reserve_s=5.0)
        assert clock.t <= budget - 5.0 + 1e-9, (budget, clock.t)
        assert info["measured"] == len(rows) and info["measured"] + info["cut_by_budget"] == len(shapes)
    # the first round covers every dimension at its extremes, so even a short budget keeps the range
    clock.t = 0.0
    rows, _ = measure(shapes, run_one, budget_s=30.0, clock=clock, repeats=1, reserve_s=5.0)
    got = [s for s, _, _ in rows]
    assert max(s.decodes for s in got) == 64 and max(s.prefill for s in got) == 2048
    assert any(s.kind == "mixed" for s in got) and any(s.kind == "shared" for s in got)


def test_a_budget_cut_thins_the_batch_dimension_instead_of_dropping_its_top():
    """Shapes priced by a profile with a kernel change at 24 rows, measured on a fake clock with a budget that
    cuts a third of the plan: every decode batch of the plan is still measured at some context (a plan in
    increasing batch order kept 1-8 and 64 only, and the fit never saw 13-63)."""
    from calibrate.fit import phase_terms, predict
    from calibrate.host import HostConfig, batch_sizes, spread, measure, phases_from, plan_shapes

    assert spread(range(1, 10)) == [1, 9, 5, 3, 7, 2, 6, 4, 8] and sorted(spread(range(7))) == list(range(7))
    true = HardwareProfile(name="t", peak_flops=7.6e10, mem_bw=1.9e11, mem_capacity=2.5e10, eff_c=1.3, eff_m=0.03,
                           eff_mv=0.08, eff_att=0.8, eff_kv=0.01, per_kernel_s=7e-5, per_layer_s=2e-5,
                           sample_s_per_vocab=1.2e-7, gemm_row_block=3, gemm_small_m_max=23, roofline="operator")
    shapes = plan_shapes(HostConfig())
    price = dict(zip(shapes, predict(true, phase_terms(SMOL, phases_from([(s, 1.0, 1.0) for s in shapes], 16)))))

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()

    def run_one(s):
        clock.t += price[s]
        return price[s], price[s]

    rows, info = measure(shapes, run_one, budget_s=0.6 * 2 * sum(price.values()), clock=clock, repeats=2,
                         reserve_s=0.0)
    assert 0.5 * len(shapes) < info["measured"] < 0.8 * len(shapes)
    got = {s.decodes for s, _, _ in rows if s.kind == "decode"}
    assert got == set(batch_sizes(64))
    assert {s.prefill for s, _, _ in rows if s.kind == "prefill" and not s.prefill_cached} >= {16, 256, 1024, 2048}
    assert {s.decodes for s, _, _ in rows if s.kind == "mixed"} >= {1, 8, 32, 64}


def test_speed_drift_is_the_probes_median_ratio_to_the_fit():
    """The probe shapes are in the plan's first round; the drift is the median of now / at-fit CPU time."""
    from calibrate.host import PROBE_SHAPES, HostConfig, measure, phases_from, plan_shapes, probe_reference, speed_drift

    shapes = plan_shapes(HostConfig())
    r1 = shapes[:20]
    assert set(PROBE_SHAPES) <= set(r1)
    cost = {s: 0.01 * (1 + s.decodes + s.prefill / 16) for s in shapes}
    rows, _ = measure(r1, lambda s: (cost[s], cost[s]), budget_s=1e9, repeats=1, reserve_s=0.0)
    ref = probe_reference(phases_from(rows, 16))
    assert set(ref) == set(PROBE_SHAPES) and all(ref[s] == pytest.approx(cost[s]) for s in PROBE_SHAPES)
    slow = {PROBE_SHAPES[0]: 1.10, PROBE_SHAPES[1]: 1.08, PROBE_SHAPES[2]: 1.30}
    calls = []

    def run_one(s):
        calls.append(s)
        t = cost[s] * slow[s] * (1 + 0.05 * (len(calls) % 3))   # the fastest of the repeats counts
        return t, t

    got = speed_drift(run_one, ref, repeats=3)
    assert got["drift"] == pytest.approx(1.10) and len(calls) == 9
    assert sorted(got["ratios"].values()) == pytest.approx([1.08, 1.10, 1.30])
    # a fit whose budget cut every probe shape has no reference
    assert probe_reference(phases_from([r for r in rows if r[0] not in PROBE_SHAPES], 16)) == {}
    with pytest.raises(ValueError, match="no probe shape"):
        speed_drift(run_one, {})


def test_fit_recovers_a_step_at_a_batch_size():
    """Decode time steps up every 3 rows (the small-M GEMM's row blocks): the fit finds the block and its cost;
    without the term the same data cannot be fitted."""
    from calibrate.fit import fit_profile, phase_terms, predict
    from calibrate.timing import PhaseRow, phases_frame

    true = HardwareProfile(name="t", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9, eff_c=0.35, eff_m=0.6,
                           per_kernel_s=4e-5, per_layer_s=3e-4, eff_mv=0.9, gemm_row_block=3, gemm_small_m_max=15)
    rng = np.random.default_rng(0)
    rows = [PhaseRow("prefill").items([n], [0]) for n in (16, 64, 256, 1024, 2048)]
    for b in list(range(1, 17)) + [24, 32]:
        for ctx in (64, 512):
            rows.append(PhaseRow("decode").items([1] * b, [ctx] * b))
    for b in (2, 8):
        rows.append(PhaseRow("mixed").items([1] * b + [128], [200] * b + [0]))
    df = phases_frame(rows)
    terms = phase_terms(SMOL, df)
    y = predict(true, terms) * np.exp(rng.normal(0, 0.005, terms.shape[1]))
    base = HardwareProfile(name="t", peak_flops=2e11, mem_bw=2e10, mem_capacity=16e9)
    res = fit_profile(base, terms, y)
    got = res.profile
    assert got.gemm_row_block == 3 and got.gemm_small_m_max == 15
    assert got.eff_mv == pytest.approx(true.eff_mv, rel=0.1)
    assert res.rel_median_abs < 0.03 and res.rel_rms < 0.05
    flat = fit_profile(base, terms, y, row_blocks=False)
    # a model without the term misses the step: residuals several times larger, 8% or more somewhere
    assert flat.rel_rms > 3 * res.rel_rms and np.max(np.abs(flat.residuals)) > 0.08


# --------------------------------------------------------------------------- user profiles
def test_fits_go_to_the_user_directory_never_over_a_shipped_preset(tmp_path, monkeypatch):
    from calibrate.fit import profile_out_path
    from sim.cost.catalog import profiles_table
    from sim.cost.profiles import PRESET_DIR, preset_origin, user_profile_dir

    monkeypatch.setenv("RKSIM_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.delenv("RKSIM_PRESETS", raising=False)
    assert user_profile_dir() == tmp_path / "profiles"
    assert profile_out_path("local-cpu") == tmp_path / "profiles" / "hardware" / "local-cpu.yaml"
    with pytest.raises(ValueError, match="shipped preset.*--force"):
        profile_out_path("local-cpu", PRESET_DIR / "hardware" / "local-cpu.yaml")
    assert profile_out_path("local-cpu", PRESET_DIR / "hardware" / "local-cpu.yaml", force=True).name == "local-cpu.yaml"
    # a user profile shadows the shipped one of the same name
    shipped = load_hardware("local-cpu")
    assert preset_origin(Path(shipped.source)) == "package"
    d = tmp_path / "profiles" / "hardware"
    d.mkdir(parents=True, exist_ok=True)
    (d / "local-cpu.yaml").write_text(Path(shipped.source).read_text().replace("eff_c:", "eff_c: 0.5 #"))
    mine = load_hardware("local-cpu")
    assert preset_origin(Path(mine.source)) == "user" and mine.eff_c == 0.5
    tab = profiles_table().set_index("name")
    assert tab.loc["local-cpu", "origin"] == "user" and tab.loc["h100-sxm", "status"] == "public profiles" and tab.loc["l4", "status"] == "datasheet"
    assert tab.loc["a100-80gb", "status"] == "public profiles"
    assert tab.loc["local-cpu", "status"] == "fitted end to end" and tab.loc["local-cpu", "date"]


def test_profile_line_for_a_newcomer():
    from sim.cost.fingerprint import current_cpu_fingerprint, profile_line

    hw = load_hardware("local-cpu")
    here = dataclasses.replace(hw, extra={**hw.extra, "fingerprint": {**FP, **current_cpu_fingerprint()}})
    assert "fitted on this host" in profile_line(here)
    there = dataclasses.replace(hw, extra={**hw.extra, "fingerprint": {**FP, "cpu_model": "Elsewhere"}})
    line = profile_line(there)
    assert "\n" not in line and "another host" in line and "rksim calibrate host" in line


@pytest.mark.slow
def test_committed_inputs_recreate_the_shipped_local_cpu(tmp_path, monkeypatch):
    """`rksim calibrate fit` on calibrate/data/local-cpu-fit (the command in docs/calibration.md, run from the
    repository root) re-creates the shipped local-cpu.yaml (every comment, key and string; floats to 1e-6): its inputs
    are in the repository."""
    import shutil

    from calibrate.fit import fit_run_dirs

    root = Path(__file__).resolve().parents[1]
    rel = Path("calibrate") / "data" / "local-cpu-fit"
    names = ("host", "calrun")
    for name in names:   # copies: the fit writes fit.json beside its inputs
        shutil.copytree(root / rel / name, tmp_path / rel / name)
    monkeypatch.chdir(tmp_path)   # the preset names its inputs relative to the working directory
    out = tmp_path / "local-cpu.yaml"
    fit_run_dirs([rel / n for n in names], name="local-cpu", out=out, clock="cpu")
    shipped = root / "sim" / "presets" / "hardware" / "local-cpu.yaml"
    # comments, keys, strings and integers exactly; the fitted floats to 1e-6 relative, or 1e-12 (seconds, or a
    # dimensionless efficiency) where the optimiser drives a constant to its zero bound: its stopping point moves in
    # the 9th digit between CPUs (tests/json_close.py)
    import yaml
    from json_close import moved
    comments = [line for line in out.read_text().splitlines() if line.lstrip().startswith("#")]
    assert comments == [line for line in shipped.read_text().splitlines() if line.lstrip().startswith("#")]
    assert moved(yaml.safe_load(out.read_text()), yaml.safe_load(shipped.read_text()), rel=1e-6,
                 abs_tol=1e-12) == []
    hw = load_hardware(str(shipped))
    assert hw.fingerprint and hw.fingerprint["kind"] == "cpu" and hw.fitted_range["max_batch"] >= 64


def test_calibrate_serve_and_report_refuse_a_profile_of_another_host():
    """``calibrate serve`` / ``report`` measure this host: a profile fitted on another is refused, naming the
    difference; ``--allow-other-host`` goes on and says the prices are not this machine's."""
    from calibrate.serve_config import check_host
    from sim.cost.profiles import load_hardware

    recorded = load_hardware("local-cpu").fingerprint
    run_here = {**recorded, "cpu_model": "Foreign CPU 9000", "isa": ["avx2"]}
    with pytest.raises(OutOfCalibrationError, match=r"--hardware local-cpu: fitted on another host \(cpu_model "
                                                    r"'Intel.*' vs 'Foreign CPU 9000' here; ISA flags differ"):
        check_host("local-cpu", run_here)
    st = check_host("local-cpu", run_here, allow_other_host=True)
    assert st["host_match"] is False and st["hardware_calibrated"] is False
    assert "Foreign CPU 9000" in st["host_note"] and "\n" not in st["host_note"]
    same = check_host("local-cpu", dict(recorded))
    assert same["host_match"] is True and same["hardware_calibrated"] is True and same["host_note"] == ""


@pytest.mark.slow
def test_the_same_host_phases_give_the_same_profile_under_any_name(tmp_path):
    """``calibrate fit`` of a ``calibrate host --keep`` folder, under any ``--name``, gives the profile
    ``calibrate host`` fitted (the fit starts from one CPU base, not from whatever preset the name finds)."""
    import json
    import shutil

    import pandas as pd

    from calibrate.fit import fit_run_dir
    from calibrate.host import fit_host_phases
    from sim.cost.profiles import model_from_manifest

    src = Path(__file__).resolve().parents[1] / "calibrate" / "data" / "local-cpu-fit" / "host"
    keep = tmp_path / "keep"
    shutil.copytree(src, keep)
    phases = pd.read_parquet(keep / "phases.parquet")
    model = model_from_manifest(json.loads((keep / "run.json").read_text()))
    host = fit_host_phases(phases, model, "host-somebox")
    fit_run_dir(keep, name="my-box", out=tmp_path / "my-box.yaml", holdout=0.0, clock="cpu")
    again = load_hardware(str(tmp_path / "my-box.yaml"))
    assert again.roofline == host.profile.roofline
    for k in ("eff_c", "eff_m", "eff_mv", "eff_kv", "per_kernel_s", "host_per_iter_s", "gemm_row_block"):
        assert getattr(again, k) == pytest.approx(getattr(host.profile, k), rel=1e-9), k
