"""Collect every ``DIR/<area>.json`` written by ``bench/bench_*.py`` into one table.

Writes ``DIR/summary.json`` and ``DIR/summary.md`` and prints the table, so a
closing note can quote one file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from traces.store import atomic_write_text as _atomic_write


def _flatten(prefix: str, obj, out: dict) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for f in sorted(args.dir.glob("*.json")):
        if f.name == "summary.json":
            continue
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            print(f"{f}: not valid JSON: {exc}", file=sys.stderr)
            return 1
        flat: dict = {}
        _flatten("", data, flat)
        for k, v in flat.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                rows.append({"area": f.stem, "metric": k, "value": v})
    if not rows:
        print(f"{args.dir}: no benchmark results found", file=sys.stderr)
        return 1
    df = pd.DataFrame(rows)
    _atomic_write(args.dir / "summary.json", json.dumps(rows, indent=2, default=str))
    _atomic_write(args.dir / "summary.md", df.to_markdown(index=False) if has_tabulate() else df.to_string(index=False))
    with pd.option_context("display.max_rows", None, "display.width", 200, "display.max_colwidth", 80):
        print(df.to_string(index=False))
    return 0


def has_tabulate() -> bool:
    """Whether pandas can write Markdown tables (``to_markdown`` needs the optional tabulate)."""
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
