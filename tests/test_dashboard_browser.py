"""The dashboard for real: `rksim dashboard` on loopback, Debian's Chromium driven by playwright.

Opens every page (screenshots under runs/dashboard/), moves What-if's tau slider back and forth and
times slider -> updated KPI in the page (p95 written to runs/dashboard/latency.json and printed; the
goal is < 300 ms, a measurement, not an assertion), moves the Serving page's max concurrent problems, and checks
a traversal in the URL is refused, opens the Deployment page's frontier figure and sends a clicked
deployment to Serving. Skipped where Chromium or playwright is missing.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "dashboard"
PAGES = {"": "What-if", "serving": "Serving", "explorer": "Trace explorer", "sweeps": "Sweeps",
         "deployment": "Deployment", "calibration": "Calibration", "compare": "Compare"}
N_MOVES = 30
GOAL_P95_S = 0.300
KPI = "asks · speedup vs exact prefix (x) · target"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_changed(page, locator, before: str, timeout_ms: int = 30_000) -> None:
    page.wait_for_function("([el, b]) => el.innerText !== b", arg=[locator.element_handle(), before],
                           timeout=timeout_ms, polling="raf")


def _click_until_shown(page, point, text: str, tries: int = 4, each_ms: int = 30_000) -> None:
    """Click a plotly point until ``text`` appears: a click that lands while Streamlit re-renders the figure
    (a loaded machine) is lost, so it is repeated, ``tries`` times at most."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for k in range(tries):
        point.click(force=True)
        try:
            page.get_by_text(text).first.wait_for(timeout=each_ms)
            return
        except PlaywrightTimeout:
            if k == tries - 1:
                raise


def _no_exception(page, where: str) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, where


@pytest.mark.slow
def test_dashboard_in_a_real_browser(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make install puts it there where apt-get is available)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from app.cli import main

    root = tmp_path / "root"
    root.mkdir()
    assert main(["sweep", "--policy", "asks", "--grid", "tau=0.96:0.99:0.005", "--quiet",
                 "--out", str(root / "sweep-asks.parquet")]) == 0
    assert main(["plan", "--model-preset", "qwen2.5-32b", "--hardware", "dgx-h100", "--gpus", "2", "--policies",
                 "exact-prefix,asks", "--tensor-parallel-size", "1,2", "--requests", "12", "--concurrency", "4",
                 "--slo", "e2e=5", "--json", "--out", str(root / "plan-32b.parquet")]) == 0
    OUT.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    timing = tmp_path / "server-timing.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), RKSIM_DASH_TIMING=str(timing))
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "dashboard", "--port", str(port), "--host", "127.0.0.1",
         "--trace-root", str(ROOT / "examples"), "--trace-root", str(root)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium,
                args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            deadline = time.time() + 90
            while True:
                try:
                    page.goto(base + "/", timeout=10_000)
                    break
                except Exception:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(1)

            # --- What-if: move tau between the ends of its span (all branches share / none does)
            kpi = page.locator('[data-testid="stMetric"]').filter(has_text=KPI).first
            kpi.wait_for(timeout=120_000)
            _no_exception(page, "What-if")
            tau = page.locator('[data-testid="stSlider"]').filter(has_text="tau").first.locator('input[type="range"]')
            latencies, values, pressed = [], [], []
            for i in range(N_MOVES):
                before = kpi.inner_text()
                tau.focus()
                t0 = time.perf_counter()
                pressed.append(time.time())
                page.keyboard.press("End" if i % 2 == 0 else "Home")
                _wait_changed(page, kpi, before)
                latencies.append(time.perf_counter() - t0)
                values.append(kpi.inner_text().splitlines()[-1])
                time.sleep(0.2)
            assert len(set(values)) == 2, values  # the KPI changes with the slider, and back
            _no_exception(page, "What-if after the slider")
            server = [json.loads(line) for line in timing.read_text().splitlines()][-N_MOVES:]
            lat = sorted(latencies)
            p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))]
            rec = {"what": "What-if: tau slider key press -> asks speedup KPI updated in Chromium",
                   "n": len(lat), "p50_s": statistics.median(lat), "p95_s": p95, "max_s": lat[-1],
                   "goal_p95_s": GOAL_P95_S, "samples_s": latencies,
                   "server_to_kpis_p50_s": statistics.median(s["to_kpis_s"] for s in server),
                   "server_fragment_p50_s": statistics.median(s["total_s"] for s in server),
                   # key press -> the fragment run starts on the server (browser, widget commit, websocket)
                   "press_to_server_p50_s": statistics.median(s["start_wall"] - t for s, t in zip(server, pressed)),
                   "load_average": os.getloadavg(), "cpus": os.cpu_count(), "machine": platform.node(),
                   "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            from traces.store import atomic_write_text

            atomic_write_text(OUT / "latency.json", json.dumps(rec, indent=1) + "\n")
            print(f"\nslider -> KPI: p50 {rec['p50_s'] * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms over {len(lat)} moves "
                  f"(press to server p50 {rec['press_to_server_p50_s'] * 1000:.0f} ms, "
                  f"server to KPIs p50 {rec['server_to_kpis_p50_s'] * 1000:.0f} ms; "
                  f"goal {GOAL_P95_S * 1000:.0f} ms; load average {rec['load_average'][0]:.1f} on "
                  f"{rec['cpus']} CPUs) -> {OUT / 'latency.json'}")
            if p95 > GOAL_P95_S:
                print("note: p95 above the goal on this machine (a shared CPU); see latency.json")

            # --- every other page opens, without an exception element (a tall window: the app scrolls inside
            # its own container, so a "full page" screenshot is the window)
            page.set_viewport_size({"width": 1400, "height": 2400})
            for path, title in PAGES.items():
                page.goto(f"{base}/{path}", timeout=30_000)
                page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
                page.wait_for_timeout(1500)
                if not path:
                    kpi.wait_for(timeout=60_000)
                if path == "compare":
                    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=120_000)
                    page.get_by_text("download CSV").first.wait_for(timeout=60_000)
                if path == "sweeps":
                    page.get_by_text("configurations on the frontier").first.wait_for(timeout=60_000)
                if path == "deployment":  # the serving figures and the planner's frontier figure are drawn
                    page.get_by_text("deployments on the frontier").first.wait_for(timeout=180_000)
                    page.locator(".js-plotly-plot").filter(has=page.locator(".scatterlayer")).first \
                        .wait_for(timeout=60_000)
                _no_exception(page, title)
                page.screenshot(path=str(OUT / f"{path or 'whatif'}.png"), full_page=True)

            # --- Sweeps: a click on a frontier point, then its configuration opens in What-if
            page.set_viewport_size({"width": 1400, "height": 1000})
            page.goto(f"{base}/sweeps", timeout=30_000)
            page.get_by_text("configurations on the frontier").first.wait_for(timeout=60_000)
            point = page.locator(".js-plotly-plot .scatterlayer .trace").nth(1).locator(".point").first
            point.wait_for(timeout=30_000)
            _click_until_shown(page, point, "selected: asks", tries=2)
            chosen = page.get_by_text("selected: asks").first.inner_text()
            page.get_by_role("button", name="open this configuration in What-if").click()
            page.get_by_role("heading", name="What-if").first.wait_for(timeout=60_000)
            exact = page.locator('[data-testid="stTextInput"]').filter(has_text="exact values").first.locator("input")
            exact.wait_for(timeout=60_000)
            tau_sent = chosen.split("tau=")[1].split()[0]
            assert exact.input_value() == f"tau={tau_sent}", (exact.input_value(), chosen)
            _no_exception(page, "What-if from Sweeps")

            # --- Deployment: a click on a frontier point selects its row; "open in Serving" re-runs it there
            page.goto(f"{base}/deployment", timeout=30_000)
            page.get_by_text("deployments on the frontier").first.wait_for(timeout=180_000)
            # the one scatter figure of the page (the per-replica figures are bars); its traces: asks' deployments,
            # asks' frontier, exact-prefix's deployments, ... (app.frontier_plot.plan_figure); the last frontier point of
            # asks is TP 2
            fig = page.locator(".js-plotly-plot").filter(has=page.locator(".scatterlayer")).first
            point = fig.locator(".scatterlayer .trace").nth(1).locator(".point").last
            point.wait_for(timeout=60_000)
            _click_until_shown(page, point, "selected: frontier · asks: TP 2 x PP 1 x DP 1")
            _no_exception(page, "Deployment after a click")
            page.get_by_role("button", name="open this deployment in Serving").click()
            page.get_by_text("loaded from the planner: asks").first.wait_for(timeout=120_000)
            page.locator('[data-testid="stMetric"]').filter(has_text="asks · goodput").first.wait_for(timeout=180_000)
            _no_exception(page, "Serving from Deployment")
            page.screenshot(path=str(OUT / "serving-from-deployment.png"), full_page=False)

            # --- Serving: move the concurrency slider, the throughput KPI follows
            page.goto(f"{base}/serving", timeout=30_000)
            thr = page.locator('[data-testid="stMetric"]').filter(has_text="exact-prefix · throughput (generated").first
            thr.wait_for(timeout=120_000)
            before = thr.inner_text()
            page.locator('[data-testid="stSlider"]').filter(has_text="max concurrent problems").first \
                .locator('input[type="range"]').focus()
            # down to one problem in flight: on local-cpu the server saturates from 4 on (the fitted batch caps it),
            # so moving up would leave the throughput as it is
            page.keyboard.press("Home")
            _wait_changed(page, thr, before, 60_000)
            _no_exception(page, "Serving after the slider")

            # --- a traversal in the URL is refused in one line, the page keeps working
            page.goto(f"{base}/?trace=../../../etc", timeout=30_000)
            page.get_by_text("not a trace under the trace roots").first.wait_for(timeout=60_000)
            page.locator('[data-testid="stMetric"]').filter(has_text=KPI).first.wait_for(timeout=60_000)
            _no_exception(page, "What-if with a traversal")
            page.screenshot(path=str(OUT / "traversal.png"), full_page=False)
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    for name in ("whatif", "serving", "explorer", "sweeps", "deployment", "calibration", "compare"):
        assert (OUT / f"{name}.png").stat().st_size > 10_000, name
