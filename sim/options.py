"""One declaration per option: :func:`option` puts type, default, bounds, help and flag on a dataclass field.

``validate_options(obj)`` checks every declared field of a dataclass instance (raising
:class:`sim.errors.ConfigError` with ``field`` set); ``declared(cls)`` lists them, which is
what the CLI builds its flags from (``app/cli_sim.py``). Adding an option to a
:class:`sim.runconfig.RunConfig` or :class:`sim.capacity.ServingConfig` is one such field.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Option:
    """What a declared field accepts and how the CLI spells it."""

    kind: type = int
    help: str = ""
    flag: str | None = None       # the command-line flag (None: none)
    metavar: str | None = None
    lo: float | None = None       # inclusive bounds
    hi: float | None = None
    gt: float | None = None       # exclusive lower bound
    choices: tuple | None = None


def option(default, *, kind: type = int, help: str = "", flag=None, metavar=None, lo=None, hi=None, gt=None,
           choices=None):
    """A dataclass field declaring an option (its metadata carries an :class:`Option`)."""
    opt = Option(kind=kind, help=help, flag=flag, metavar=metavar, lo=lo, hi=hi, gt=gt,
                 choices=None if choices is None else tuple(choices))
    return dataclasses.field(default=default, metadata={"option": opt})


def declared(cls) -> list[tuple[dataclasses.Field, Option]]:
    """The option fields of a dataclass (class or instance), in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]


def check_value(name: str, opt: Option, v):
    """``v`` if the option accepts it, else :class:`ConfigError` naming ``name`` (``None`` passes)."""
    if v is None:
        return v
    if opt.choices is not None:
        if v not in opt.choices:
            raise ConfigError(f"{name}: {v!r} is not one of {', '.join(map(str, opt.choices))}", field=name)
        return v
    if opt.kind in (int, float):
        ok = not isinstance(v, bool) and (isinstance(v, (int, float)) if opt.kind is float else hasattr(v, "__index__"))
        if not ok or (opt.kind is float and not math.isfinite(v)):
            raise ConfigError(f"{name}: must be {'an integer' if opt.kind is int else 'a finite number'}, got {v!r}",
                              field=name)
        if opt.gt is not None and not v > opt.gt:
            raise ConfigError(f"{name}: must be a number > {opt.gt:g}, got {v!r}", field=name)
        if (opt.lo is not None and v < opt.lo) or (opt.hi is not None and v > opt.hi):
            rng = f">= {opt.lo:g}" if opt.hi is None else f"in {opt.lo:g}..{opt.hi:g}"
            raise ConfigError(f"{name}: must be {rng}, got {v!r}", field=name)
    return v


def validate_options(obj) -> None:
    for f, opt in declared(obj):
        check_value(f.name, opt, getattr(obj, f.name))


__all__ = ["Option", "option", "declared", "check_value", "validate_options"]
