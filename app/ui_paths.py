"""Which files the dashboard may read: only traces, sweeps, plans and calibration folders under the trace roots.

The roots come from ``rksim dashboard --trace-root DIR`` (repeatable; passed to the Streamlit
script after ``--``) or ``$RKSIM_TRACE_ROOT`` (``os.pathsep``-separated), else the bundled
``examples/`` and ``./runs``. Pages offer what :func:`listing` found in select boxes; anything
else a user can send (a query parameter, a stale session value) goes through :func:`resolve`,
which refuses a path that is not one of the listed entries — ``..``, absolute paths and
symlinks that leave a root included.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_DEPTH = 4          # folders below a root searched for traces/sweeps/calibration runs
MAX_ENTRIES = 500      # per kind: a huge root lists the first ones found, in sorted order


class PathRefused(ValueError):
    """A path outside the trace roots or not a listed entry (one-line message)."""


def default_roots() -> list[Path]:
    return [REPO / "examples", Path.cwd() / "runs"]


def roots_from(argv: list[str] | None = None, env: dict | None = None) -> list[Path]:
    """``--trace-root DIR`` flags of ``argv`` (the script's own arguments), else the env, else defaults."""
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ if env is None else env
    roots = []
    for i, a in enumerate(argv):
        if a == "--trace-root" and i + 1 < len(argv):
            roots.append(argv[i + 1])
        elif a.startswith("--trace-root="):
            roots.append(a.split("=", 1)[1])
    if not roots and env.get("RKSIM_TRACE_ROOT"):
        roots = [r for r in env["RKSIM_TRACE_ROOT"].split(os.pathsep) if r]
    out = [Path(r).expanduser().resolve() for r in roots] if roots else [p.resolve() for p in default_roots()]
    seen, uniq = set(), []
    for r in out:
        if r not in seen:
            seen.add(r)
            uniq.append(r)
    return uniq


def _label(root: Path, path: Path, roots: list[Path]) -> str:
    rel = path.relative_to(root)
    name = root.name if sum(r.name == root.name for r in roots) == 1 else str(root)
    return f"{name}/{rel.as_posix()}" if str(rel) != "." else name


def _walk(root: Path, depth: int):
    """Folders and files under ``root`` up to ``depth`` levels, not following links out of it."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.name.startswith("."):
            continue
        p = Path(e.path)
        if not _inside(p, root):
            continue
        yield p
        if depth > 1 and e.is_dir():
            # the bundled trace's own shards are not traces; do not descend into a trace
            if (p / "manifest.json").is_file():
                continue
            yield from _walk(p, depth - 1)


def _inside(path: Path, root: Path) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(Path(os.path.realpath(root)))
    except OSError:
        return False


def is_trace(p: Path) -> bool:
    return p.is_dir() and (p / "manifest.json").is_file()


def is_sweep(p: Path) -> bool:
    return p.is_file() and p.suffix == ".parquet" and p.stat().st_size > 0 and _rksim_meta(p) not in (None, "plan")


def is_plan(p: Path) -> bool:
    """A ``rksim plan --out`` table (a sweep-style Parquet file whose metadata says ``command: plan``)."""
    return p.is_file() and p.suffix == ".parquet" and p.stat().st_size > 0 and _rksim_meta(p) == "plan"


def _rksim_meta(p: Path) -> str | None:
    """None for a file without rksim metadata, else the ``command`` it names ("" when none)."""
    try:
        import json

        import pyarrow.parquet as pq

        md = pq.read_schema(p).metadata or {}
    except Exception:  # noqa: BLE001 - an unreadable file is simply not listed
        return None
    keys = [k for k in md if k.startswith(b"rksim")]
    if not keys:
        return None
    try:
        return str(json.loads(md[keys[0]]).get("command") or "")
    except (ValueError, AttributeError):
        return ""


def is_calibration(p: Path) -> bool:
    from app.ui_backend import calibration_kind

    return p.is_dir() and calibration_kind(p) is not None


KINDS = {"trace": is_trace, "sweep": is_sweep, "plan": is_plan, "calibration": is_calibration}


def listing(kind: str, roots: list[Path] | None = None) -> dict[str, str]:
    """``{label: absolute path}`` of every ``kind`` entry under the roots (sorted by label)."""
    roots = roots_from() if roots is None else roots
    test = KINDS[kind]
    out: dict[str, str] = {}
    for root in roots:
        if not root.is_dir():
            continue
        if test(root):
            out[_label(root, root, roots)] = str(root)
        for p in _walk(root, MAX_DEPTH):
            if len(out) >= MAX_ENTRIES:
                break
            if test(p):
                out[_label(root, p, roots)] = str(Path(os.path.realpath(p)))
    return dict(sorted(out.items()))


def resolve(kind: str, choice: str, roots: list[Path] | None = None) -> str:
    """The path of a listed entry named by its label (or its exact listed path); else :class:`PathRefused`."""
    items = listing(kind, roots)
    if choice in items:
        return items[choice]
    if choice in items.values():
        return choice
    roots = roots_from() if roots is None else roots
    where = ", ".join(str(r) for r in roots)
    raise PathRefused(f"{kind} {choice!r}: not a {kind} under the trace roots ({where}); choose one from the list")
