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
    assert goldens.moved(got, want) == [], f"{name}: figures moved (scripts/goldens.py --write if on purpose)"


def test_golden_comparison_allows_last_bits_only():
    want = {"a": 0.11795600085481131, "b": [1, "x", None, True], "c": {"d": 2.0}}
    assert goldens.moved({"a": 0.11795600085481134, "b": [1, "x", None, True], "c": {"d": 2.0}}, want) == []
    assert goldens.moved({"a": 0.11795600086, "b": [1, "x", None, True], "c": {"d": 2.0}}, want) == \
        ["/a: 0.11795600086 != 0.11795600085481131"]
    assert goldens.moved({**want, "b": [1, "x", None, 1]}, want) == ["/b[3]: 1 != True"]
    assert goldens.moved({**want, "b": [1, "x", None]}, want) == ["/b: 3 items != 4"]
    assert goldens.moved({**want, "c": {"d": 2.0, "e": 1}}, want) == ["/c: keys ['e'] in one only"]
    assert goldens.moved({**want, "c": {"d": 2}}, want) == ["/c/d: 2 != 2.0"]


@pytest.mark.slow
def test_goldens_do_not_depend_on_the_host(monkeypatch):
    """On a CPU other than the one ``local-cpu`` was fitted on, a golden priced with it still equals its file
    (the harness runs as on the fitted host); outside the harness that host says so."""
    import sim.cost.fingerprint

    foreign = {"kind": "cpu", "cpu_model": "Foreign CPU 9000", "isa": ["avx2"], "torch": "9.9.9"}
    monkeypatch.setattr(sim.cost.fingerprint, "current_cpu_fingerprint", lambda *a, **k: dict(foreign))
    name = "compare-trace-local-cpu"
    want = json.loads((goldens.GOLDEN / f"{name}.json").read_text())
    assert goldens.moved(goldens.run_case(goldens.CASES[name]), want) == []
    assert sim.cost.fingerprint.current_cpu_fingerprint()["cpu_model"] == "Foreign CPU 9000"   # restored after the case
