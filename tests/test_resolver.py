"""The one layout resolver (sim.replay.target.resolve_layout): what it checks, and that no other command
module builds a ParallelConfig from the target flags."""
import ast
from pathlib import Path

import pytest

from sim.cost.parallel import ParallelConfig, ParallelError
from sim.cost.profiles import load_hardware, load_model
from sim.replay.target import resolve_layout
from sim.serving.capacity import CapacityError, ServingConfig

ROOT = Path(__file__).resolve().parents[1]


def test_resolver_node_validate_and_fit():
    m, hw, sv = load_model("llama-3-70b"), load_hardware("h100-sxm"), ServingConfig()
    assert resolve_layout(load_model("llama-3-8b"), hw, sv, ParallelConfig(1, 1)) is None   # one GPU: no node
    nd = resolve_layout(m, hw, sv, ParallelConfig(4, 1))          # TP > 1: the one shipped node of the GPU
    assert nd.name == "dgx-h100" and nd.gpu == "h100-sxm"
    with pytest.raises(CapacityError, match="tensor-parallel-size"):   # 141 GB of weights on one 80 GB GPU
        resolve_layout(m, hw, sv, ParallelConfig(1, 1))
    with pytest.raises(ParallelError, match=r"on one dgx-h100 node \(--node\)"):   # 2 x 8 GPUs on an 8-GPU node
        resolve_layout(m, hw, sv, ParallelConfig(8, 1, 2), node_gpus=True)


def test_only_the_resolvers_build_a_layout_from_flags():
    """A command module (app/, sim/bench/, sim/replay/, sim/api.py) that resolves a target builds its
    ParallelConfig through resolve_layout: only these functions may construct one."""
    allowed = {("sim/replay/target.py", "resolve"), ("sim/replay/target.py", "parallel"),
               ("sim/bench/plain.py", "_layout")}
    files = [*ROOT.glob("app/*.py"), *ROOT.glob("sim/bench/*.py"), *ROOT.glob("sim/replay/*.py"), ROOT / "sim/api.py"]
    bad = []
    for f in files:
        tree = ast.parse(f.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "ParallelConfig":
                    if (str(f.relative_to(ROOT)), fn.name) not in allowed:
                        bad.append(f"{f.relative_to(ROOT)}:{fn.name}")
    assert sorted(set(bad)) == []
