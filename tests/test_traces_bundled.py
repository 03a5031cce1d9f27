"""The bundled example trace: valid, described, and every single-file corruption named. No torch."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.cli import main as cli_main
from traces.store import TraceError, load_trace

ROOT = Path(__file__).resolve().parents[1]
from trace_files import BUNDLED  # noqa: E402


@pytest.fixture(scope="module")
def trace():
    return load_trace(BUNDLED)


def test_bundled_contents(trace):
    info = trace.info()
    assert info["schema_version"] == 1 and info["model"] == "smollm2-135m"
    assert info["dataset"] == "gsm8k" and info["layout"] == "persona-prefix"
    assert info["n_problems"] >= 12 and info["n_branches"] == 8 and info["n_layers"] == 30
    assert info["has_counterfactual"] and info["has_verification_lens"] and info["has_tree"]
    assert len(info["long_decode_layers"]) == 4 and info["n_long_decodes"] == 2
    assert trace.manifest["command"].startswith("rksim capture ")
    assert info["bytes"] <= 20 * 1024 * 1024
    du = sum(p.stat().st_size for p in BUNDLED.rglob("*") if p.is_file())
    assert du <= 20 * 1024 * 1024
    for ld in trace.long_decodes:
        assert ld.meta["gen_len"] >= 512 and ld.K.shape[0] == 4
    # the root's counterfactual is its own generation; ASKS root rows are 1
    for p in trace.problems:
        b = p.branches
        assert list(b["cf_gen_ids"][0]) == list(b["gen_ids"][0])
        assert (p.cos("mean", "centered")[0] == 1).all()
    # some branches finish and answer within the token budget
    answered = sum(int((p.branches["answer"] != "").sum()) for p in trace.problems)
    assert answered > 0
    assert len(trace.trees[0].nodes) > 3


def test_cli_validate_and_info(capsys):
    assert cli_main(["trace", "validate", str(BUNDLED)]) == 0
    capsys.readouterr()
    assert cli_main(["trace", "info", str(BUNDLED), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    for k in ("schema_version", "model", "dataset", "layout", "n_problems", "n_branches", "n_layers",
              "has_counterfactual", "has_verification_lens", "long_decode_layers", "has_tree"):
        assert k in info


def test_corrupting_any_file_is_named(tmp_path):
    copy = tmp_path / "t"
    shutil.copytree(BUNDLED, copy)
    files = sorted(p for p in copy.rglob("*") if p.is_file())
    assert len(files) > 20
    rng = np.random.default_rng(0)
    for f in files:
        orig = f.read_bytes()
        b = bytearray(orig)
        i = int(rng.integers(len(b)))
        b[i] ^= 0x5A
        f.write_bytes(bytes(b))
        rel = f.relative_to(copy).as_posix()
        with pytest.raises(TraceError) as ei:
            load_trace(copy)
        msg = str(ei.value)
        assert "\n" not in msg and msg.startswith(rel + ":"), (rel, msg)
        f.write_bytes(orig)
        # truncation too
        f.write_bytes(orig[: len(orig) // 2])
        with pytest.raises(TraceError, match="^" + rel.replace(".", r"\.") + ":"):
            load_trace(copy)
        f.write_bytes(orig)
    load_trace(copy)  # restored copy is valid again


def test_cli_validate_names_corrupt_file(tmp_path):
    copy = tmp_path / "t"
    shutil.copytree(BUNDLED, copy)
    victim = copy / "long" / "s00001" / "Q.npy"
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "app.cli", "trace", "validate", str(copy)], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode != 0
    err = r.stderr.strip()
    assert err.count("\n") == 0 and "long/s00001/Q.npy" in err and "sha256" in err
    (copy / "manifest.json").unlink()
    r = subprocess.run([sys.executable, "-m", "app.cli", "trace", "validate", str(copy)], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode != 0 and "manifest.json" in r.stderr
