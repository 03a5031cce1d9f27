"""Parameter grids for sweeps: ``--grid`` parsing, the Cartesian product, stable config ids.

Two forms of ``--grid`` (repeat the flag, one key each):

``key=start:stop:step``
    An arithmetic range, stop **inclusive**. The bounds are parsed as exact
    decimals (:class:`decimal.Decimal`) and value ``i`` is
    ``start + i * step`` computed in decimal, then rounded once to the nearest
    float, so ``tau=0.5:1.0:0.1`` gives exactly ``0.5, 0.6, 0.7, 0.8, 0.9, 1.0``
    (the same floats as typing them) instead of the drift of repeated float
    addition (``0.1 + 0.2 != 0.3``). The stop is included when it lies within
    ``1e-9`` of a step of the last value. If start, stop and step are all
    integer literals the values are ints. ``step`` must be non-zero and point
    from start to stop (``1:0:-0.25`` is fine, ``0:1:-0.1`` is an error).

``key=v1,v2,...``
    An explicit list. Each item is an int, a float, a boolean (``true``/``false``,
    any case) or else a string. A list mixing ints and floats becomes floats;
    any other mix (a number and a word) is an error, as are empty items and
    repeated values. A single value (``key=v``) is a one-item list.

The product runs over the keys in the order the flags were given, the last key
varying fastest, so a sweep's rows come out in the same order every time.
Every configuration has a stable id: the first 16 hex digits of the sha256 of
its parameters as canonical JSON (keys sorted, floats by ``repr``), so the same
parameters get the same id in every run, process and machine.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any, Iterator

#: A grid larger than this needs ``--max-configs`` (a typo like ``0:1:0.0001``
#: should not start a ten-hour sweep).
DEFAULT_MAX_CONFIGS = 20_000

_INT_RE = re.compile(r"^[+-]?\d+$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# Stop is inclusive when within this fraction of a step of the last value.
_STOP_TOL = Decimal("1e-9")


class GridError(ValueError):
    """A bad ``--grid`` value; the message names the flag and the bad part."""


def _flag(text: str) -> str:
    return f"--grid {text!r}"


def _parse_scalar(item: str) -> Any:
    low = item.lower()
    if low in ("true", "false"):
        return low == "true"
    if _INT_RE.match(item):
        return int(item)
    try:
        val = float(item)
    except ValueError:
        return item
    return val


def _decimal(part: str, what: str, text: str) -> Decimal:
    try:
        d = Decimal(part.strip())
    except InvalidOperation:
        raise GridError(f"{_flag(text)}: {what} {part!r} is not a number "
                        "(a range is start:stop:step)") from None
    if not d.is_finite():
        raise GridError(f"{_flag(text)}: {what} {part!r} must be finite")
    return d


def parse_range(text: str, spec: str) -> list:
    """Values of ``start:stop:step`` (stop inclusive, decimal-exact; see module doc)."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise GridError(f"{_flag(text)}: a range needs exactly start:stop:step, got {spec!r}")
    names = ("start", "stop", "step")
    for name, part in zip(names, parts):
        if not part.strip():
            raise GridError(f"{_flag(text)}: {name} of the range is empty")
    start, stop, step = (_decimal(p, n, text) for p, n in zip(parts, names))
    if step == 0:
        raise GridError(f"{_flag(text)}: step is 0")
    if stop != start and (stop - start) * step < 0:
        raise GridError(f"{_flag(text)}: step {parts[2]!r} has the wrong sign to go "
                        f"from {parts[0]!r} to {parts[1]!r}")
    q = (stop - start) / step
    n = int((q + _STOP_TOL).to_integral_value(rounding=ROUND_FLOOR)) + 1
    if n > 10_000_000:
        raise GridError(f"{_flag(text)}: the range has {n} values")
    as_int = all(_INT_RE.match(p.strip()) for p in parts)
    vals = [start + i * step for i in range(n)]
    return [int(v) for v in vals] if as_int else [float(v) for v in vals]


def parse_list(text: str, spec: str) -> list:
    """Values of ``v1,v2,...`` (see module doc for the typing rules)."""
    items = spec.split(",")
    vals = []
    for i, raw in enumerate(items):
        item = raw.strip()
        if not item:
            raise GridError(f"{_flag(text)}: item {i + 1} of the list is empty")
        v = _parse_scalar(item)
        if isinstance(v, float) and math.isnan(v):
            raise GridError(f"{_flag(text)}: item {item!r} is NaN")
        vals.append(v)
    kinds = {"bool" if isinstance(v, bool) else "num" if isinstance(v, (int, float)) else "str"
             for v in vals}
    if len(kinds) > 1:
        words = {"bool": "booleans", "num": "numbers", "str": "words"}
        raise GridError(f"{_flag(text)}: the list mixes {' and '.join(words[k] for k in sorted(kinds))}; "
                        "give one kind of value per key")
    if kinds == {"num"} and any(isinstance(v, float) for v in vals):
        vals = [float(v) for v in vals]
    seen = set()
    for v in vals:
        if v in seen:
            raise GridError(f"{_flag(text)}: value {v!r} appears twice")
        seen.add(v)
    return vals


def parse_grid_arg(text: str) -> tuple[str, list]:
    """Parse one ``--grid`` argument into ``(key, values)``."""
    if "=" not in text:
        raise GridError(f"{_flag(text)}: expected key=start:stop:step or key=v1,v2,... (no '=')")
    key, spec = text.split("=", 1)
    key = key.strip()
    if not key:
        raise GridError(f"{_flag(text)}: the key before '=' is empty")
    if not _KEY_RE.match(key):
        raise GridError(f"{_flag(text)}: {key!r} is not a parameter name")
    spec = spec.strip()
    if not spec:
        raise GridError(f"{_flag(text)}: no values after '='")
    if ":" in spec:
        if "," in spec:
            raise GridError(f"{_flag(text)}: use either a range (start:stop:step) or a list (a,b,c), not both")
        return key, parse_range(text, spec)
    return key, parse_list(text, spec)


def config_id(params: dict) -> str:
    """Stable id of a configuration: sha256 of its canonical JSON, 16 hex digits."""
    canon = json.dumps(params, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


@dataclass
class Grid:
    """An ordered mapping key -> values, and its Cartesian product."""

    axes: dict[str, list] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.axes.values()) if self.axes else 1

    @property
    def keys(self) -> list[str]:
        return list(self.axes)

    def configs(self) -> Iterator[dict]:
        """Every configuration, keys in flag order, the last key varying fastest."""
        keys = self.keys
        for combo in itertools.product(*(self.axes[k] for k in keys)):
            yield dict(zip(keys, combo))

    def to_json(self) -> dict:
        return {k: list(v) for k, v in self.axes.items()}


def parse_grids(args: list[str] | None, max_configs: int | None = DEFAULT_MAX_CONFIGS) -> Grid:
    """Parse every ``--grid`` flag; refuse duplicate keys and grids over ``max_configs``."""
    grid = Grid()
    for text in args or []:
        key, vals = parse_grid_arg(text)
        if key in grid.axes:
            raise GridError(f"{_flag(text)}: key {key!r} is given by two --grid flags")
        grid.axes[key] = vals
    check_size(grid, max_configs)
    return grid


def check_size(grid: Grid, max_configs: int | None) -> None:
    if max_configs is not None and grid.size > max_configs:
        shape = " x ".join(f"{len(v)} {k}" for k, v in grid.axes.items())
        raise GridError(f"--grid: {grid.size} configurations ({shape}) exceed the limit of "
                        f"{max_configs}; narrow the grid or pass --max-configs {grid.size}")
