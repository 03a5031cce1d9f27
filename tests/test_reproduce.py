"""``rksim reproduce``: verdict rules, determinism, missing traces, bad input, and the committed report."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.reproduce import (DEFAULT_MEASURED, DEFAULT_ROOT, Reproducer, ReproduceConfig, discover, ratio_verdict,
                           trace_info, wilson)
from app.reproduce_report import VERDICTS, md_table, write_report

ROOT = Path(__file__).resolve().parent.parent
from trace_files import BUNDLED  # noqa: E402
OUT_DOCS = ROOT / "docs" / "reproduction"


def _rksim(*args, timeout=900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------- rules
def test_wilson_known_values():
    lo, hi = wilson(0, 12)
    assert lo == 0.0 and hi == pytest.approx(0.2425, abs=1e-4)   # the rule-of-three-like bound for n = 12
    lo, hi = wilson(6, 1616)
    assert lo < 6 / 1616 < hi and hi == pytest.approx(0.00809, abs=2e-4)
    assert all(x != x for x in wilson(0, 0))  # n = 0: NaN, not a made-up interval


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.data())
def test_wilson_brackets_the_proportion(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson(k, n)
    assert 0.0 <= lo <= k / n + 1e-12 and k / n - 1e-12 <= hi <= 1.0


def test_ratio_verdict_all_some_none():
    assert ratio_verdict(3.0, [("a", 2.5), ("b", 3.5)])[0] == "holds"           # 2.5 >= 0.8 * 3
    v = ratio_verdict(3.0, [("own shape", 1.0), ("paper shape", 2.4)])
    assert v == ("holds only when", "paper shape (1 of 2 conditions reach 80% of 3)")   # 2.4 = 0.8 * 3 exactly
    v = ratio_verdict(3.0, [("a", 1.0), ("b", 2.3)])
    assert v[0] == "does not hold" and "2.3" in v[1] and "(b)" in v[1]
    assert ratio_verdict(3.0, [("a", None), ("b", float("nan"))])[0] == "not measurable here"
    assert ratio_verdict(0.6, [("x", 0.59)], tol=1.0)[0] == "does not hold"
    v = ratio_verdict(3.0, [("a", 3.0), ("b", 3.1), ("c", 1.0)])
    assert v == ("holds only when", "not c (all but 1 of 3 conditions reach 80% of 3)")
    assert ratio_verdict(1.0, [("a", 1.0)], tol=1.0, strict=True)[0] == "does not hold"     # 1.0x saves nothing
    assert ratio_verdict(1.0, [("a", 1.01)], tol=1.0, strict=True)[0] == "holds"


def test_md_table_escapes_pipes():
    import pandas as pd
    t = md_table(pd.DataFrame([{"a": "x|y", "b": 1.23456789, "c": None}]))
    assert "x\\|y" in t and "1.235" in t and "—" in t


# ---------------------------------------------------------------------------- inputs
def test_discover_reports_a_manifest_only_trace(tmp_path):
    part = tmp_path / "roots" / "big-trace"
    part.mkdir(parents=True)
    shutil.copy(BUNDLED / "manifest.json", part / "manifest.json")
    found, missing = discover([tmp_path / "roots"])
    assert found == [] and list(missing) == ["big-trace"] and "data files absent" in missing["big-trace"]
    r = _rksim("reproduce", "--traces", str(tmp_path / "roots"), "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and "make reproduce-traces" in r.stderr and not (tmp_path / "o").exists()


def test_bad_inputs_name_the_file_or_flag(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"--traces .*manifest.json.*not valid JSON"):
        trace_info(bad)
    (bad / "manifest.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ValueError, match=r"manifest.json.*missing or bad field"):
        trace_info(bad)
    with pytest.raises(ValueError, match=r"--traces .*no such folder"):
        discover([tmp_path / "nowhere"])
    meas = tmp_path / "meas" / "run1"
    meas.mkdir(parents=True)
    (meas / "quality.json").write_text("[1,")
    with pytest.raises(ValueError, match=r"--measured .*quality.json.*not valid JSON"):
        Reproducer(ReproduceConfig(traces=[str(BUNDLED)], measured=tmp_path / "meas"), progress=False)
    r = _rksim("reproduce", "--traces", str(BUNDLED), "--measured", str(tmp_path / "nope"), "--out",
               str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and "--measured" in r.stderr


# ---------------------------------------------------------------------------- the run
@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    cfg = ReproduceConfig(traces=[str(BUNDLED)], measured=DEFAULT_MEASURED).quick()
    outs = []
    for k in range(2):
        res = Reproducer(cfg, progress=False).run()
        d = tmp_path_factory.mktemp(f"repro{k}")
        write_report(res, d)
        outs.append((res, d))
    return outs


@pytest.mark.slow
def test_quick_run_is_byte_identical(quick):
    (_, a), (_, b) = quick
    for name in ("claims.json", "report.md", "report.html"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.slow
def test_every_claim_has_a_verdict_and_a_source(quick):
    res, d = quick[0]
    rows = res["rows"]
    groups = {r["group"] for r in rows}
    assert {"RKSC speedup", "ASKS", "CGEE", "Shape", "VASE", "RSBCM", "Compatibility"} <= groups
    for r in rows:
        assert any(r["verdict"] == v for v in VERDICTS), r
        assert r["source"] and r["claim"] and r["why"], r
    md = (d / "report.md").read_text()
    assert md.count("\n| ") >= len(rows) and "Verdicts." in md
    # the bundled trace has no MMLU: that row must say so instead of inventing a figure
    mm = [r for r in rows if "mmlu" in r["claim"].lower()]
    assert mm and all(r["verdict"] == "not measurable here" for r in mm)
    html = (d / "report.html").read_text()
    assert html.count("reproduce-fig-") >= 5 and "plotly" in html.lower()


@pytest.mark.slow
def test_rows_follow_the_numbers(quick):
    """Each verdict agrees with the figures it reports (not a fixed string)."""
    res = quick[0][0]
    sp = [t for t in res["tables"]["rksc_speedups"] if t["policy"] == "rksc"]
    row = next(r for r in res["rows"] if r["claim"].startswith("RKSC (ASKS"))
    conds = row["data"]["conditions"]
    # the simulated conditions are the table's rows; the real run's speedups are conditions of their own
    assert sorted(v for c, v in conds if not c.startswith("real run")) == sorted(t["vs_no_kv"] for t in sp)
    passing = [c for c, v in conds if v is not None and v >= 0.8 * 3.008]
    assert row["verdict"] == ("holds" if len(passing) == len(conds) else "holds only when" if passing
                              else "does not hold")
    failing = [c for c, v in conds if c not in passing]
    if passing and failing:
        assert row["why"].startswith("not " + "; not ".join(failing) if len(failing) < len(passing)
                                     else "; ".join(passing))
    heat = res["tables"]["heat"]
    hrow = next(r for r in res["rows"] if r["group"] == "Shape")
    assert (hrow["verdict"] == "does not hold") == (max(h["rksc_vs_no_kv"] for h in heat) < 0.8 * 3.008)
    thr = res["tables"]["vase_throughput"]
    vrow = next(r for r in res["rows"] if "throughput" in r["claim"])
    passing = [t for t in thr if t["throughput_vs_full"] >= 0.8 * 3.1]
    assert vrow["verdict"] == ("holds" if len(passing) == len(thr) else "holds only when" if passing
                               else "does not hold")


@pytest.mark.slow
def test_cli_quick_end_to_end(tmp_path):
    r = _rksim("reproduce", "--traces", str(BUNDLED), "--quick", "--no-progress", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {"claims.json", "report.md", "report.html"}
    lines = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("wrote")]
    assert lines and all(any(ln.startswith(v) for v in VERDICTS) for ln in lines)


@pytest.mark.slow
def test_committed_report_is_what_make_reproduce_regenerates(tmp_path):
    """docs/reproduction/ holds exactly what `make reproduce` writes from the stored traces."""
    committed = OUT_DOCS / "claims.json"
    if not committed.is_file():
        pytest.skip("no committed report")
    r = _rksim("reproduce", "--traces", str(DEFAULT_ROOT), "--no-progress", "--out", str(tmp_path / "rep"),
               timeout=1200)
    assert r.returncode == 0, r.stderr
    for name in ("claims.json", "report.md"):
        assert (tmp_path / "rep" / name).read_bytes() == (OUT_DOCS / name).read_bytes(), name
