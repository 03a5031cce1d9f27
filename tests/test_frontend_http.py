"""The front end with its HTTP layer (calibrate/frontend_http.py, scripts/frontend_http_driver.py): the fit and the
shipped measurement."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from calibrate.frontend_http import DATA_DIR, FrontendHttpError, assemble, fit

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = Path(os.environ.get("RKSIM_VLLM_PYTHON", "/work/main/.venv-vllm/bin/python"))
if not VLLM_PY.exists():
    VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


def _rows(a=2.5e-3, s=5e-6, c=4e-3, per_out=8e-5, n=200):
    """Driver rows made from a known front end: TTFT = a + s * P; the server's CPU per request c + per_out * O."""
    rows = [{"name": f"ttft-{p}", "input_len": p, "output_len": 2, "num_prompts": n,
             "ttft_median_ms": 1e3 * (a + s * p)} for p in (32, 512, 2048)]
    for o in (16, 128):
        rows.append({"name": f"stream-{o}", "input_len": 512, "output_len": o, "num_prompts": n,
                     "server_cpu_s": n * (c + per_out * o), "chunks_per_request": o})
    rows.append({"name": "sent-at-once", "input_len": 512, "output_len": 128, "num_prompts": 500,
                 "request_throughput": 50.0})
    return {"vllm": "0.33.0", "rows": rows}


def test_the_fit_recovers_a_known_front_end():
    """TTFT's line gives the per-request and per-prompt-token terms, the streamed runs' CPU difference the
    per-token term, and the first chunk is taken out of the intercept (FrontendCost.ttft_s adds it back)."""
    f = fit(_rows())
    c = f["coef"]
    assert c["per_prompt_token_s"] == pytest.approx(5e-6, rel=1e-3)
    assert c["per_output_s"] == pytest.approx(8e-5, rel=1e-3)
    assert c["request_s"] == pytest.approx(2.5e-3 - 8e-5, rel=1e-3)
    one = c["request_s"] + c["per_prompt_token_s"] * 512 + c["per_output_s"] * 128
    assert f["checks"]["sent_at_once"]["one_api_server_bound"] == pytest.approx(1 / one, rel=1e-3)
    assert f["checks"]["sent_at_once"]["ratio"] == pytest.approx(50.0 * one, rel=1e-3)


@pytest.mark.parametrize("drop, match", [("stream-128", "stream-128"), ("ttft-512", "two prompt lengths"),
                                         ("all", "non-empty")])
def test_a_malformed_measurement_is_refused_by_name(drop, match):
    m = _rows()
    if drop == "all":
        m["rows"] = []
    else:
        m["rows"] = [r for r in m["rows"] if r["name"] != drop and not (drop == "ttft-512" and r["name"] == "ttft-32")]
    with pytest.raises(FrontendHttpError, match=match):
        fit(m)


def test_a_negative_coefficient_is_refused():
    m = _rows(per_out=-1e-5)
    with pytest.raises(FrontendHttpError, match="<= 0"):
        fit(m)


@pytest.mark.parametrize("version", ["0.33.0", "0.11.0"])
def test_shipped_measurement_is_this_fit_of_its_data(version):
    """Each committed file's fit and proposed block are what the code computes from its measurement, and the
    measurement covers the scenarios the driver runs by default."""
    rec = json.loads((DATA_DIR / f"vllm-{version}-cpu.json").read_text())
    assert rec["fingerprint"]["kind"] == "cpu"
    m = rec["measurement"]
    assert m["vllm"] == version
    names = {r["name"] for r in m["rows"]}
    assert {"ttft-32", "ttft-512", "ttft-2048", "idle-512", "stream-16", "stream-128", "stream1-128",
            "sent-at-once", "chat-512", "paced-c1"} == names
    again = assemble(m, rec["fingerprint"], rec["microbench_s"], rec["measured"])
    assert again["fit"] == rec["fit"] and again["preset"] == rec["preset"]
    # the streamed runs kept up: about one chunk per token (else per_output_s would be a coalesced chunk's)
    for r in m["rows"]:
        if r["name"].startswith("stream-"):
            assert r["chunks_per_request"] >= 0.9 * r["output_len"], r


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM's venv (.venv-vllm, vllm==0.33.0) is not installed")
def test_driver_serves_through_vllms_own_server(tmp_path):
    """The driver in vLLM's venv: vllm serve with the stand-in engine core answers vllm bench serve's requests."""
    from calibrate.frontend_http import build_model_dir
    model = build_model_dir(tmp_path / "model")
    out = tmp_path / "m.json"
    p = subprocess.run([str(VLLM_PY), str(ROOT / "scripts" / "frontend_http_driver.py"), str(out), "--model",
                        str(model), "--scenarios", "ttft-64,64,2,6,1,inf,0;stream-8,64,8,6,2,inf,3", "--port", "18191"],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["ttft-64"]["ttft_median_ms"] > 0 and rows["ttft-64"]["server_cpu_s"] >= 0
    assert rows["stream-8"]["chunks_per_request"] >= 7   # a 3 ms step: one chunk per token


def test_a_missing_vllm_venv_is_refused_by_the_flag(tmp_path):
    """Without vLLM's venv the run stops before anything is written, naming the flag and how to build the venv."""
    from calibrate.frontend_http import run_driver
    with pytest.raises(FrontendHttpError, match="--vllm-python: .* does not exist .*pip install vllm"):
        run_driver(str(tmp_path / "no-python"), tmp_path / "m.json", tmp_path, None)
    assert not (tmp_path / "m.json").exists()
