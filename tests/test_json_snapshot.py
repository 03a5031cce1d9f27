"""``scripts/json_snapshot.sh --diff``: the refactor check (docs/design.md, "Refactors: nothing moves but code")
ignores wall clocks and dates line by line, and so must see a changed figure in a one-line JSON file (vllm bench's
result files are written on one line, wall clock and figures together)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _diff(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "json_snapshot.sh"), "--diff", str(a), str(b)],
                          capture_output=True, text=True, env={"PY": sys.executable, "PATH": "/usr/bin:/bin"})


def test_a_changed_figure_in_a_one_line_result_file_is_a_difference(tmp_path):
    dirs = {k: tmp_path / k for k in ("start", "clock", "figure")}
    docs = {"start": {"date": "simulated", "wall_s": 1.0, "mean_tpot_ms": 16.45},
            "clock": {"date": "simulated", "wall_s": 2.5, "mean_tpot_ms": 16.45},     # only the wall clock moved
            "figure": {"date": "simulated", "wall_s": 1.0, "mean_tpot_ms": 16.46}}    # a figure moved
    for k, d in dirs.items():
        d.mkdir()
        (d / "bench-serve.json").write_text(json.dumps(docs[k]))   # one line, as vllm bench writes it
        (d / "serve.txt").write_text("wrote x\n")
    same = _diff(dirs["start"], dirs["clock"])
    assert same.returncode == 0 and same.stdout.strip().endswith("IDENTICAL"), same.stdout + same.stderr
    moved = _diff(dirs["start"], dirs["figure"])
    assert moved.returncode == 1 and "16.46" in moved.stdout and "IDENTICAL" not in moved.stdout, moved.stdout
