"""One declaration per option: :func:`option` puts type, default, bounds, help and flag on a dataclass field.

``validate_options(obj)`` checks every declared field of a dataclass instance (raising
:class:`sim.base.errors.ConfigError` with ``field`` set); ``declared(cls)`` lists them, which is
what the CLI builds its flags from (``app/cli_sim.py``). Adding an option to a
:class:`sim.replay.runconfig.RunConfig` or :class:`sim.serving.capacity.ServingConfig` is one such field.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sim.base.errors import ConfigError


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
    aliases: tuple = ()           # deprecated spellings of the flag (accepted, with a one-line warning)


def option(default, *, kind: type = int, help: str = "", flag=None, metavar=None, lo=None, hi=None, gt=None,
           choices=None, aliases=()):
    """A dataclass field declaring an option (its metadata carries an :class:`Option`)."""
    opt = Option(kind=kind, help=help, flag=flag, metavar=metavar, lo=lo, hi=hi, gt=gt,
                 choices=None if choices is None else tuple(choices), aliases=tuple(aliases))
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
    if opt.kind is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{name}: must be true or false, got {v!r}", field=name)
        return v
    if opt.kind is int:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not hasattr(v, "__index__") or isinstance(v, float):
            raise ConfigError(f"{name}: must be an integer >= {opt.lo}, got {v!r}", field=name)
        if (opt.lo is not None and v < opt.lo) or (opt.hi is not None and v > opt.hi):
            rng = f">= {opt.lo}" if opt.hi is None else f"in {opt.lo}..{opt.hi}"
            raise ConfigError(f"{name}: must be an integer {rng}, got {v!r}", field=name)
    elif opt.kind is float:
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or (opt.gt is not None and not v > opt.gt) or (opt.lo is not None and v < opt.lo) \
                or (opt.hi is not None and v > opt.hi):
            raise ConfigError(f"{name}: must be a number {describe_range(opt)}, got {v!r}", field=name)
    return v


def describe_range(opt: Option) -> str:
    """``in (0, 1]``, ``in 0..1e+18``, ``> 0``, ... (the bounds of a numeric option in words)."""
    if opt.gt is not None:
        return f"> {opt.gt:g}" if opt.hi is None else f"in ({opt.gt:g}, {opt.hi:g}]"
    if opt.lo is not None:
        return f">= {opt.lo:g}" if opt.hi is None else f"in {opt.lo:g}..{opt.hi:g}"
    return "" if opt.hi is None else f"<= {opt.hi:g}"


def flag_for(field_name: str | None, *classes) -> str | None:
    """The command-line flag of a (dotted) field of one of ``classes``: the field's own flag where it has one
    (``"workload.concurrency"`` -> ``--max-concurrent-problems`` with :class:`sim.workload.config.Workload` among
    ``classes``), else its head's (``"workload.block_size"`` -> ``--workload``)."""
    if field_name is None:
        return None
    head, _, tail = field_name.partition(".")
    exact = [f for c in classes for f in dataclasses.fields(c) if f.name in (field_name, tail)]
    for f in exact + [f for c in classes for f in dataclasses.fields(c) if f.name == head]:
        opt = f.metadata.get("option")
        flag = opt.flag if opt is not None else f.metadata.get("flag")
        if flag is not None:
            return flag
    return None


def validate_options(obj, options=None) -> None:
    """Check every declared option of ``obj`` (``options``: its :func:`declared` list, computed once by the caller)."""
    for f, opt in (declared(obj) if options is None else options):
        check_value(f.name, opt, getattr(obj, f.name))


__all__ = ["Option", "option", "declared", "check_value", "validate_options", "flag_for", "describe_range"]
