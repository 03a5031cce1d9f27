"""The simulator core's structure: no import circles, one path per simulation, no hidden state, thread safety."""
from __future__ import annotations

import ast
import dataclasses
import sys
import threading
from pathlib import Path

import pytest

from sim import api

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "app", "policies", "traces", "calibrate")
from trace_files import BUNDLED  # noqa: E402


# ---------------------------------------------------------------------------- import graph
def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its body (function-level imports too)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    head = base[:len(base) - node.level + 1]
                    src = ".".join(head + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                names = [src] + [f"{src}.{a.name}" for a in node.names]
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod and not mod.startswith(n + "."):  # a package's own __init__ is not a circle
                    graph[mod].add(n)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other():
    graph = import_graph()
    assert graph["sim.api"] >= {"sim.replay.modes", "sim.replay.session", "sim.replay.target", "sim.replay.runconfig"}  # the graph is real
    assert circles(graph) == []


# sim/'s layers, lowest first (docs/design.md, "sim/'s packages"): a module may import its own package and
# the layers below it, never one above. errors and options are the floor every layer stands on.
SIM_LAYERS = [("sim.base",), ("sim.cost",), ("sim.workload",), ("sim.serving",), ("sim.replay",),
              ("sim.api",), ("sim.search", "sim.bench")]


def sim_layer(mod: str) -> int | None:
    for i, names in enumerate(SIM_LAYERS):
        if any(mod == n or mod.startswith(n + ".") for n in names):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a imports b`` for every sim module ``a`` importing a sim module of a higher layer (or of the other
    package on its own layer: search and bench do not import each other), or a sim module in no layer."""
    bad = []
    for a, deps in sorted(graph.items()):
        if not a.startswith("sim.") or a == "sim.__init__":
            continue
        la = sim_layer(a)
        if la is None:
            bad.append(f"{a} is in no layer")
            continue
        pa = a.split(".")[1]
        for b in sorted(deps):
            if not b.startswith("sim.") or b == "sim":
                continue
            lb = sim_layer(b)
            if lb is None or lb > la or (lb == la and b.split(".")[1] != pa and la > 0):
                bad.append(f"{a} imports {b}")
    return bad


def test_sim_packages_import_only_downward():
    graph = import_graph()
    assert {m.split(".")[1] for m in graph if m.startswith("sim.") and m.count(".") >= 2} == \
        {"base", "cost", "workload", "serving", "replay", "search", "bench"}
    assert upward_imports(graph) == []


def test_sim_top_level_holds_only_the_face_and_the_packages():
    top = sorted(p.name for p in (ROOT / "sim").iterdir() if p.name != "__pycache__")
    pkgs = sorted(p.name for p in (ROOT / "sim").iterdir() if (p / "__init__.py").is_file())
    assert [n for n in top if n not in pkgs] == ["__init__.py", "api.py", "presets"]
    assert len((ROOT / "sim" / "api.py").read_text().splitlines()) <= 150   # the face a newcomer reads in one screen
    # the check sees an upward arrow when there is one
    assert upward_imports({"sim.cost.terms": {"sim.serving.engine"}}) == ["sim.cost.terms imports sim.serving.engine"]
    assert upward_imports({"sim.search.sweep": {"sim.bench.plain"}}) == ["sim.search.sweep imports sim.bench.plain"]
    assert upward_imports({"sim.replay.tree": {"sim.api"}}) == ["sim.replay.tree imports sim.api"]


# ---------------------------------------------------------------------------- one path per simulation
def returns(fn, graph) -> list[tuple[str, ...]]:
    """Call stacks of ``fn()`` in which a project module calls, by name, a module the path already left.

    The stack is read as project modules (consecutive frames of one module merged). A call from
    module ``b`` into module ``a`` already lower on the stack is a return when ``b`` imports ``a``
    (``graph``): the reader following names would go back to ``a``. Callbacks through objects
    handed down (argparse's formatter class, a request's content function) are not calls by name.
    """
    seen: set = set()
    bad = []

    def prof(frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "")
        if callee == caller or callee not in graph or callee not in graph.get(caller, ()):
            return
        mods = []
        f = frame.f_back
        while f is not None:
            name = f.f_globals.get("__name__", "")
            if name in graph and (not mods or mods[-1] != name):
                mods.append(name)
            f = f.f_back
        key = tuple(reversed(mods)) + (callee,)
        if callee in mods and key not in seen:
            seen.add(key)
            bad.append(key)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return bad


def test_path_checker_sees_a_return():
    """The checker itself: the old shape (baselines computed by re-entering simulate through a helper
    module that imports the API back) is reported."""
    import types
    api_mod = types.ModuleType("sim.fake_api")
    helper = types.ModuleType("sim.fake_helper")
    exec("def simulate(depth=0):\n    return helper.baseline(depth) if depth == 0 else 1.0", api_mod.__dict__)
    exec("def baseline(depth):\n    return api.simulate(depth + 1)", helper.__dict__)
    api_mod.helper, helper.api = helper, api_mod
    graph = {"sim.fake_api": {"sim.fake_helper"}, "sim.fake_helper": {"sim.fake_api"}}
    assert returns(api_mod.simulate, graph) == [("sim.fake_api", "sim.fake_helper", "sim.fake_api")]
    assert returns(lambda: helper.api.helper and 1.0, graph) == []


@pytest.mark.skipif(not (BUNDLED / "manifest.json").is_file(), reason="bundled trace not present")
@pytest.mark.parametrize("argv", [["simulate", "--policy", "rksc", "--json"],
                                  ["simulate", "--policy", "asks", "--mode", "serving", "--num-problems", "4", "--json"],
                                  ["simulate", "--policy", "vase-dkv", "--json"]])
def test_one_simulation_never_returns_to_a_module_it_left(argv, capsys):
    from app.cli import main
    rcs = []
    bad = returns(lambda: rcs.append(main(list(argv))), import_graph())
    assert rcs == [0]
    assert bad == [], "\n".join(" -> ".join(k) for k in bad[:40])


# ---------------------------------------------------------------------------- the session
THREAD_RUNS = [(pol, hw, model, mode) for pol in ("asks", "cgee", "rksc", "rsbcm", "no-kv", "h2o")
               for hw, model in (("local-cpu", None), ("h100-sxm", "qwen2.5-7b"), ("h200", "qwen3-4b"))
               for mode in ("isolated",)] + [("exact-prefix", "h100-sxm", "qwen2.5-7b", "serving"),
                                             ("rksc", "h200", "qwen3-4b", "serving")]


@pytest.mark.slow
@pytest.mark.skipif(not (BUNDLED / "manifest.json").is_file(), reason="bundled trace not present")
def test_threads_on_one_session_equal_serial_results():
    """20 threads, different targets and policies, one shared Session (cold): the serial results exactly."""
    def one(session, pol, hw, model, mode):
        wl = {"n_requests": 4} if mode == "serving" else None
        return api.evaluate(session, pol, {}, model_preset=model, hardware=hw, mode=mode, workload=wl)

    serial = [one(api.Session(BUNDLED), *r) for r in THREAD_RUNS]  # a fresh session each: no shared memo
    shared = api.Session(BUNDLED)
    got: list = [None] * len(THREAD_RUNS)
    barrier = threading.Barrier(len(THREAD_RUNS))

    def work(i):
        barrier.wait()
        got[i] = one(shared, *THREAD_RUNS[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(THREAD_RUNS))]
    assert len(threads) >= 16
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == serial
    assert len({r["cost_model"] for r in got}) == 3


def test_session_sees_a_trace_recaptured_in_place(tmp_path):
    """Rewriting the trace directory (same path): ``refresh`` reloads the features and forgets every memo."""
    import shutil

    from tests.synthetic import write_synthetic_trace
    path = write_synthetic_trace(tmp_path / "t", n_problems=2, seed=1)
    session = api.Session(path)
    a = api.evaluate(session, "asks", {"tau": 0.8}, hardware="h100-sxm")
    assert a["n_problems"] == 2 and len(session.decisions) > 0
    shutil.rmtree(path)
    write_synthetic_trace(path, n_problems=3, seed=2)
    assert api.evaluate(session, "asks", {"tau": 0.8}, hardware="h100-sxm") == a  # its owner has not looked yet
    b = api.evaluate(session.refresh(), "asks", {"tau": 0.8}, hardware="h100-sxm")
    assert b["n_problems"] == 3
    assert b == api.evaluate(api.Session(path), "asks", {"tau": 0.8}, hardware="h100-sxm")


def test_memo_tables_are_bounded():
    from sim.replay.session import Memo
    m = Memo(3)
    for i in range(10):
        m[i] = i
    assert list(m) == [7, 8, 9]
    m[8] = "again"  # an update of a held key evicts nothing
    assert list(m.items()) == [(7, 7), (8, "again"), (9, 9)]


def test_no_module_level_caches_in_sim_or_app():
    """No module of sim/ or app/ binds a mutable container at module level, except constant tables
    (upper-case names, never written) and registries filled at import."""
    allowed = {"app.cli": {"_AREAS"}}
    bad = []
    for mod, path in _modules().items():
        if not mod.startswith(("sim", "app")):
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) and node.value is not None else []
            value = getattr(node, "value", None)
            for t in targets:
                name = getattr(t, "id", None)
                if name is None or name.isupper() or name.startswith("__") or name in allowed.get(mod, ()):
                    continue
                if isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                        isinstance(value, ast.Call) and getattr(value.func, "attr", getattr(value.func, "id", ""))
                        in ("WeakSet", "WeakValueDictionary", "WeakKeyDictionary", "defaultdict", "OrderedDict")):
                    bad.append(f"{mod}.{name}")
    assert bad == []


def test_no_attributes_written_into_other_objects():
    """No ``x.__dict__[...] = `` writes in sim/ or app/ (what an object carries is a declared field)."""
    bad = []
    for mod, path in _modules().items():
        if not mod.startswith(("sim", "app")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(t, ast.Subscript) and getattr(t.value, "attr", None) == "__dict__":
                        bad.append(f"{mod}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("setdefault", "pop") \
                    and getattr(node.func.value, "attr", None) == "__dict__":
                bad.append(f"{mod}:{node.lineno}")
    assert bad == []


# ---------------------------------------------------------------------------- declarations
def test_a_declared_option_is_a_flag_and_a_check():
    """One declaration makes the CLI flag, its help and its bounds; errors name the flag by field."""
    import argparse

    from app.cli_sim import add_declared, declared_values, flagged
    from sim.base.errors import ConfigError
    from sim.base.options import option

    @dataclasses.dataclass(frozen=True)
    class Spec:
        tensor_parallel_size: int = option(1, lo=1, hi=64, flag="--tensor-parallel-size", metavar="N",
                                           help="GPUs a model is split over")

    p = argparse.ArgumentParser()
    add_declared(p, Spec, text=True)
    assert "--tensor-parallel-size" in p.format_help() and "GPUs a model is split over" in p.format_help()
    assert declared_values(p.parse_args(["--tensor-parallel-size", "8"]), Spec) == {"tensor_parallel_size": 8}
    with pytest.raises(ValueError, match=r"^--tensor-parallel-size: must be an integer in 1\.\.64, got 65$"):
        declared_values(p.parse_args(["--tensor-parallel-size", "65"]), Spec)
    assert flagged(ConfigError("mode: 'x' is not one of isolated, serving", field="mode")).startswith("--mode: ")
    assert flagged(ConfigError("policy 'asks': tau: bad", field="params")) == "--set: policy 'asks': tau: bad"
    assert flagged(ConfigError("unknown hardware preset 'x'", field="hardware")).startswith("--hardware: ")


def test_token_policies_refuse_options_they_cannot_use():
    from sim.base.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        api.RunConfig(policy="h2o", problems=[0])
    assert e.value.field == "problems"
    with pytest.raises(ValueError, match="^engine: not applicable"):
        api.RunConfig(policy="h2o", engine=True)


def test_no_private_name_is_imported_across_modules():
    # issue 31: a name another module needs is public; a leading underscore means "this module's own"
    bad = []
    for mod, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                bad += [f"{mod} imports {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


# ---------------------------------------------------------------------------- sizes (issue 31)
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
SIZED = ("sim", "app", "calibrate")
# "path" is a module over MAX_MODULE_LINES, "path::function" a function over MAX_FUNCTION_LINES; each is listed
# with the same reason in docs/design.md ("Size limits").
SIZE_EXCEPTIONS: dict[str, str] = {}


def _oversized(roots=SIZED, max_module=MAX_MODULE_LINES, max_function=MAX_FUNCTION_LINES) -> dict[str, int]:
    """Modules over ``max_module`` lines and functions (methods, nested ones) over ``max_function``, by key."""
    out = {}
    for root in roots:
        for p in sorted((ROOT / root).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            text = p.read_text()
            if text.count("\n") > max_module:
                out[rel] = text.count("\n")
            for node in ast.walk(ast.parse(text, rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > max_function:
                        out[f"{rel}::{node.name}"] = n
    return out


def _design_size_exceptions() -> dict[str, str]:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Size limits", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        if line.startswith("- `") and "`: " in line:
            key, reason = line[3:].split("`: ", 1)
            out[key] = reason.strip()
    return out


def test_size_checker_sees_a_long_function():
    assert "sim/api.py" in _oversized(("sim",), max_module=10)
    assert any(k.startswith("sim/api.py::") for k in _oversized(("sim",), max_function=5))


def test_modules_and_functions_stay_small():
    over = _oversized()
    unlisted = {k: v for k, v in over.items() if k not in SIZE_EXCEPTIONS}
    assert unlisted == {}, "over the size limits and not a named exception (docs/design.md, 'Size limits')"
    stale = sorted(set(SIZE_EXCEPTIONS) - set(over))
    assert stale == [], "back under the limits: remove from SIZE_EXCEPTIONS and docs/design.md"


def test_size_exceptions_are_named_with_reasons_in_the_design_doc():
    assert _design_size_exceptions() == SIZE_EXCEPTIONS
