"""The Streamlit dashboard: in-process with streamlit's AppTest, and for real in headless Chromium."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app" / "dashboard.py"
BUNDLED = ROOT / "examples" / "trace-gsm8k-persona"


def _metric(at, label):
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r} in {[m.label for m in at.metric]}")


def test_dashboard_runs_and_reacts_to_thresholds():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    # The dashboard shows what the simulator computes for the same inputs (rksc at its defaults).
    from sim.api import evaluate
    hardware = at.sidebar.selectbox(key="hardware").value
    ref = evaluate(str(BUNDLED), policy="rksc", params={}, hardware=hardware)
    assert f"{ref['speedup_vs_no_kv']:.4g}" == _metric(at, "speedup_vs_no_kv")
    assert f"{ref['accuracy']:.4g}" == _metric(at, "accuracy")

    # Switch to ASKS with a tau no branch can pass: it must fall back to exact prefix (speedup 1 over it).
    at.sidebar.selectbox(key="policy").set_value("asks").run()
    at.sidebar.number_input(key="asks.tau").set_value(1.5).run()
    assert not at.exception, at.exception
    assert float(_metric(at, "speedup_vs_exact_prefix")) == pytest.approx(1.0)


def test_dashboard_rejects_a_bad_threshold_with_a_clear_error():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.sidebar.selectbox(key="policy").set_value("cgee").run()
    at.sidebar.number_input(key="cgee.l_min").set_value(-3).run()
    assert not at.exception
    assert any("l_min" in e.value for e in at.error), [e.value for e in at.error]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_dashboard_in_a_real_browser(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make install puts it there where apt-get is available)")
    sync_api = pytest.importorskip("playwright.sync_api")
    port = _free_port()
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium,
                args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            page = browser.new_page()
            deadline = time.time() + 60
            while True:
                try:
                    page.goto(f"http://127.0.0.1:{port}/", timeout=10_000)
                    break
                except Exception:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(1)
            page.get_by_text("speedup_vs_no_kv").first.wait_for(timeout=120_000)
            body = page.inner_text("body")
            assert "rksim" in body and "speedup_vs_exact_prefix" in body
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
