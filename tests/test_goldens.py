"""The simulator's figures are pinned: ``rksim compare --json`` / ``serve --json`` equal tests/golden/.

A change that moves a figure on purpose regenerates them with ``python scripts/goldens.py --write``
and says why in ``tests/golden/NOTES.md``.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("goldens", ROOT / "scripts" / "goldens.py")
goldens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(goldens)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(goldens.CASES))
def test_golden(name):
    want = json.loads((goldens.GOLDEN / f"{name}.json").read_text())
    got = goldens.run_case(goldens.CASES[name])
    assert goldens.dump(got) == goldens.dump(want), f"{name}: figures moved (scripts/goldens.py --write if on purpose)"


@pytest.mark.slow
def test_goldens_do_not_depend_on_the_host(monkeypatch):
    """On a CPU other than the one ``local-cpu`` was fitted on, a golden priced with it still equals its file
    (the harness runs as on the fitted host); outside the harness that host says so."""
    import sim.cost.fingerprint

    foreign = {"kind": "cpu", "cpu_model": "Foreign CPU 9000", "isa": ["avx2"], "torch": "9.9.9"}
    monkeypatch.setattr(sim.cost.fingerprint, "current_cpu_fingerprint", lambda *a, **k: dict(foreign))
    name = "compare-trace-local-cpu"
    want = json.loads((goldens.GOLDEN / f"{name}.json").read_text())
    assert goldens.dump(goldens.run_case(goldens.CASES[name])) == goldens.dump(want)
    assert sim.cost.fingerprint.current_cpu_fingerprint()["cpu_model"] == "Foreign CPU 9000"   # restored after the case
