"""Published end-to-end figures are checks, never fit inputs: no fit code may read ``docs/validation/``, nor the
measured serving runs those figures are computed from (``calibrate/data/llmservingsim-bench/``).

Two guards. A static one: no module of ``calibrate/`` or ``sim/`` (other than ``sim/bench/validate.py``, the reader
of the checks, and ``calibrate/llmservingsim_bench.py``, the reader of those runs) names the validation folder, its
files, the runs' folder, or imports ``sim.bench.validate``. A dynamic one: the fit entry points run under a Python
audit hook (PEP 578, event ``open`` and the directory listings) that records every file they open, and the test
fails if any lies under either folder -- however the path was built.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = (ROOT / "docs" / "validation").resolve()
FIGS = VALIDATION / "published-figures.yaml"
RUNS = (ROOT / "calibrate" / "data" / "llmservingsim-bench").resolve()   # the measured runs behind Source 6's figures
CHECK_ONLY = (VALIDATION, RUNS)

# names of the checks and of their reader, as fit code would have to write them to read the checks
_NAMES = re.compile(r"docs[/\\\\]validation|published[-_]figures|ratios\.(json|md)|['\"]validation['\"]|"
                    r"llmservingsim[-_]bench|"
                    r"\bsim\.validate\b|from\s+sim\s+import[^\n]*\bvalidate\b|from\s+\.\s+import[^\n]*\bvalidate\b|"
                    r"from\s+\.validate\s+import")
# the reader of the checks itself (it must name them); everything else under these folders is fit or model code
_ALLOWED = {ROOT / "sim" / "bench" / "validate.py", ROOT / "calibrate" / "llmservingsim_bench.py"}


def _fit_sources() -> list[Path]:
    files = sorted(p for d in ("calibrate", "sim") for p in (ROOT / d).rglob("*.py") if p not in _ALLOWED)
    assert len(files) > 40, "the scan found too few modules: wrong root?"
    return files


def test_no_fit_module_names_the_validation_figures():
    hits = []
    for p in _fit_sources():
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if _NAMES.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "fit/model code refers to the published validation figures:\n" + "\n".join(hits)


# ----------------------------------------------------------------------------- the audit hook
_STATE = {"on": False, "reads": []}
_EVENTS = {"open", "os.listdir", "os.scandir", "glob.glob", "os.walk"}


def _under_validation(path) -> bool:
    if isinstance(path, int) or path is None:
        return False
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    try:
        rp = Path(os.path.realpath(p))
    except (OSError, ValueError):
        return False
    return any(rp == d or d in rp.parents for d in CHECK_ONLY)


def _hook(event, args):
    if _STATE["on"] and event in _EVENTS and args and _under_validation(args[0]):
        _STATE["reads"].append((event, os.fsdecode(os.fspath(args[0]))))


_INSTALLED = []


class _Guard:
    """Record every open / listing of ``docs/validation`` while active (hooks cannot be removed: one per process,
    switched on and off)."""

    def __enter__(self):
        if not _INSTALLED:
            sys.addaudithook(_hook)
            _INSTALLED.append(True)
        _STATE["reads"] = []
        _STATE["on"] = True
        return self

    def __exit__(self, *exc):
        _STATE["on"] = False
        self.reads = list(_STATE["reads"])
        return False


def test_the_guard_sees_every_way_of_reading_the_figures(tmp_path):
    """The hook is what the fit tests rely on: it must see text, binary, yaml, a relative path, a listing."""
    import yaml

    from sim.bench.validate import load_figures
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        for read in (lambda: FIGS.read_text(), lambda: open(FIGS, "rb").close(),
                     lambda: next(RUNS.glob("*-requests.jsonl")).read_text(),
                     lambda: yaml.safe_load(open("docs/validation/published-figures.yaml")),
                     lambda: load_figures(FIGS), lambda: os.listdir("docs/validation"),
                     lambda: list(Path("docs").glob("validation/*.yaml"))):
            with _Guard() as g:
                read()
            assert g.reads, read
        with _Guard() as g:                    # and stays quiet for everything else
            (tmp_path / "x.yaml").write_text("a: 1")
            (ROOT / "docs" / "calibration.md").read_text()
        assert not g.reads
    finally:
        os.chdir(cwd)


def test_a_public_profile_fit_and_the_collective_fit_never_open_the_figures():
    from calibrate import collectives, fp8_gemm
    from calibrate import public_profiles as pp
    with _Guard() as g:
        fit = pp.fit_preset("a100-80gb")
        fp8 = [fp8_gemm.fit(p) for p in fp8_gemm.PRESETS]
        d = collectives.load(collectives.PROFILES[0], collectives.COLLECTIVES[0])
        (nw, dpn), grp = next(iter(d.groupby(["num_workers", "devices_per_node"])))
        segs, _ = collectives.fit_segments(grp["size"].to_numpy(), grp["seconds"].to_numpy())
    assert fit["rows"] > 0 and segs and all(f["rows"] > 0 for f in fp8)
    assert not g.reads, f"the fit read the published validation figures: {g.reads}"


@pytest.mark.slow
def test_every_fit_entry_point_never_opens_the_figures(tmp_path):
    """All the shipped fits, as `make` regenerates them: the public-profile fits and cross-validation of every
    GPU preset, the collective fits of the node presets, and `rksim calibrate fit` of the shipped CPU runs
    (copied: a fit writes its fit.json beside the run)."""
    from calibrate import collectives
    from calibrate import public_profiles as pp
    from calibrate.fit import fit_run_dirs
    runs = []
    for name in ("calrun", "host"):
        dst = tmp_path / name
        shutil.copytree(ROOT / "calibrate" / "data" / "local-cpu-fit" / name, dst)
        runs.append(dst)
    from calibrate import moe_kernels, moe_perf
    with _Guard() as g:
        res = pp.run_all()
        moe = moe_kernels.table()
        rtx_moe = moe_perf.render()
        coll = collectives.fit()
        cpu = fit_run_dirs(runs[:1], out=tmp_path / "cpu.yaml")
        host = fit_run_dirs(runs[1:], name="local-cpu-host", out=tmp_path / "host.yaml")
    assert res["fits"] and moe["fits"] and "eff_c_moe" in rtx_moe and coll["profiles"]
    assert cpu["n_phases"] > 0 and host["n_phases"] > 0
    assert not g.reads, f"a fit read the published validation figures: {g.reads}"
