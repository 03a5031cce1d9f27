"""Every name a benchmark script (bench/*.py, run by `make bench`, not by the suite) imports from the project
exists: a rename elsewhere must not leave `make bench` failing at its first import."""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("sim", "app", "calibrate", "traces", "policies")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
            for a in node.names:
                yield node.module, a.name


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "bench").glob("*.py")))
def test_bench_scripts_import_names_that_exist(script):
    missing = [f"{m}.{n}" for m, n in _imports(ROOT / "bench" / script)
               if not hasattr(importlib.import_module(m), n)
               and importlib.util.find_spec(f"{m}.{n}") is None]
    assert missing == [], f"bench/{script} imports names that do not exist"
