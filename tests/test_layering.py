"""DESIGN §1: torch only in traces/capture*, traces/models* and calibrate/; the simulator,
policies, sweeps, CLI start-up and dashboard helpers run without it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_IMPORT = re.compile(r"^\s*(import|from)\s+(torch|transformers)\b", re.M)
FORBIDDEN = {  # folder -> packages it must not import (DESIGN §1 table)
    "policies": ("traces", "sim", "calibrate", "app", "torch", "transformers"),
    # sim/ returns data; figures are built in app/ (issue 31)
    "sim": ("calibrate", "app", "torch", "transformers", "plotly", "streamlit"),
    "traces": ("sim", "calibrate", "app"),
    "calibrate": ("app",),
}


def _imports(path: Path) -> set[str]:
    found = set()
    for m in re.finditer(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", path.read_text(), re.M):
        found.add((m.group(1) or m.group(2)).split(".")[0])
    return found


def test_layering_of_every_module():
    bad = []
    for folder, banned in FORBIDDEN.items():
        for py in sorted((ROOT / folder).rglob("*.py")):
            for mod in _imports(py) & set(banned):
                bad.append(f"{py.relative_to(ROOT)} imports {mod}")
    assert not bad, bad


def test_torch_only_in_capture_and_model_modules_of_traces():
    bad = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "traces").rglob("*.py"))
           if TORCH_IMPORT.search(p.read_text()) and not p.name.startswith(("capture", "models"))]
    assert not bad, f"torch imported outside traces/capture*, traces/models*: {bad}"


def test_app_imports_torch_lazily_only():
    bad = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "app").rglob("*.py"))
           if re.search(r"^(import|from)\s+(torch|transformers)\b", p.read_text(), re.M)]
    assert not bad, bad


def test_simulator_sweeps_policies_traces_and_cli_run_without_torch(syn):
    """The one no-torch check: in a fresh interpreter (other tests may have imported torch in this one),
    import every torch-free layer, build the CLI, simulate and compare, and find no torch loaded."""
    code = ("import sys, policies, sim.api, sim.search.sweep, sim.search.pareto, sim.search.grid, app.cli, app.report; "
            "import traces.store, traces.schema, traces.datasets, traces.workload, traces.answers, traces.errors; "
            "app.cli.build_parser(); policies.get_policy('vase-attnv'); "
            f"sim.api.evaluate({syn!r}, 'rksc', {{}}, hardware='h100-sxm'); "
            f"app.cli.main(['compare', '--trace', {syn!r}, '--hardware', 'l4', '--json']); "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "print(bad, file=sys.stderr); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "[]" in out.stderr  # the check ran to its end
