"""scripts/gpu_calibrate.sh --smoke: the GPU kit's steps end to end on CPU with a tiny random-weight model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_kit_smoke_end_to_end(tmp_path):
    out = tmp_path / "kit"
    env = {**os.environ, "PY": sys.executable}
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_calibrate.sh"), "--smoke", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from sim.cost.profiles import load_hardware

    hw = load_hardware(str(out / "smoke-cpu.yaml"))
    fr = hw.fitted_range
    assert hw.calibrated and fr["device"] == "cpu" and fr["dtypes"] == ["float32"] and fr["models"] == ["tiny"]
    assert hw.extra["fit"]["clock"] == "cpu" and set(hw.extra["fit"]["by_roofline"]) == {"iteration", "operator"}
    reps = json.loads((out / "report.json").read_text())
    assert len(reps) == 1
    rep = reps[0]
    assert rep["decision_parity"] == 1.0 and rep["n_holdout"] == 2 and rep["clock"] == "cpu"
    assert rep["hardware_calibrated"] and set(rep["by_clock"]) == {"cpu", "wall"}
    assert "held-out report" in (out / "report.txt").read_text()
    run = json.loads((out / "runs" / "tiny" / "run.json").read_text())
    assert run["model"]["name"] == "tiny" and "random weights" in run["model"]["source"]
    with tarfile.open(out / "runs.tar.gz") as t:
        names = t.getnames()
    assert "runs/tiny/phases.parquet" in names and not any("/trace/" in n for n in names)
