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

from app.reproduce import DEFAULT_MEASURED, DEFAULT_ROOT, Reproducer, ReproduceConfig, discover, trace_info
from app.reproduce_report import VERDICTS, md_table, write_report
from app.verdicts import TOL, Cond, combine

ROOT = Path(__file__).resolve().parent.parent
from trace_files import BUNDLED  # noqa: E402
OUT_DOCS = ROOT / "docs" / "reproduction"


def _rksim(*args, timeout=900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------- rendering (the rules: test_reproduce_rules.py)
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
    """Each verdict and reason is what the rules give for the conditions the row stores (not a fixed string)."""
    res = quick[0][0]
    judged = 0
    for r in res["rows"]:
        conds = r["data"].get("conditions")
        if not conds:
            continue
        v, why, _ = combine([Cond(**c) for c in conds])
        assert (v, why) == (r["verdict"], r["why"]), r["id"]
        for c in conds:
            assert c["outcome"] in ("pass", "fail", "tie", "untestable") and c["text"], (r["id"], c)
        judged += 1
    assert judged >= 15
    sp = {t["vs_no_kv"] for t in res["tables"]["rksc_speedups"] if t["policy"] == "rksc"}
    row = next(r for r in res["rows"] if r["claim"].startswith("RKSC (ASKS"))
    sim = [c for c in row["data"]["conditions"] if not c["label"].startswith("real run")]
    assert sim and all(c["value"] in sp for c in sim)              # raw figures, the table's own
    assert all(c["primary"] == ("paper shape" in c["label"]) for c in sim)
    for c in sim:                                                   # a pass is an interval at or above the bar
        if c["outcome"] == "pass":
            assert c["lo"] >= TOL * 3.008
        if c["outcome"] == "fail":
            assert c["hi"] < TOL * 3.008
    heat = res["tables"]["heat"]
    hrow = next(r for r in res["rows"] if r["group"] == "Shape")
    passing = {f"prefix {h['prefix_tokens']}, B {h['branches']}, T {h['gen_tokens']}" for h in heat
               if h["ci_low"] >= TOL * 3.008}
    assert {c["label"] for c in hrow["data"]["conditions"] if c["outcome"] == "pass"} <= passing
    thr = res["tables"]["vase_throughput"]
    vrow = next(r for r in res["rows"] if "throughput" in r["claim"])
    assert [c["outcome"] == "pass" for c in vrow["data"]["conditions"]] == [
        t["throughput_vs_full"] >= TOL * 3.1 for t in thr]


@pytest.mark.slow
def test_cli_quick_end_to_end(tmp_path):
    r = _rksim("reproduce", "--traces", str(BUNDLED), "--quick", "--no-progress", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {"claims.json", "report.md", "report.html"}
    lines = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("wrote")]
    assert lines and all(any(ln.startswith(v) for v in VERDICTS) for ln in lines)


@pytest.mark.slow
def test_committed_report_is_what_make_reproduce_regenerates(tmp_path):
    """docs/reproduction/ holds what `make reproduce` writes from the stored traces (report.md exactly)."""
    committed = OUT_DOCS / "claims.json"
    if not committed.is_file():
        pytest.skip("no committed report")
    r = _rksim("reproduce", "--traces", str(DEFAULT_ROOT), "--no-progress", "--out", str(tmp_path / "rep"),
               timeout=1200)
    assert r.returncode == 0, r.stderr
    # the report's text byte for byte; its JSON's floats to 1e-12 relative: the attention errors go through BLAS
    # matrix products whose last bits differ between CPUs (tests/json_close.py)
    assert (tmp_path / "rep" / "report.md").read_bytes() == (OUT_DOCS / "report.md").read_bytes()
    from json_close import moved
    assert moved(json.loads((tmp_path / "rep" / "claims.json").read_text()), json.loads(committed.read_text())) == []
