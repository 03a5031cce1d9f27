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
