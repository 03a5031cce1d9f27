"""Shared pieces of the policy library: the error type, parameter checks, the registry table.

Policies are small dataclasses; each names its ``kind`` and registry ``name`` as class
variables (so ``dataclasses.asdict(pol)`` holds only its parameters) and validates its
parameters in ``__post_init__``, raising :class:`PolicyError` naming the policy and field.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

POLICY_KINDS: tuple[str, ...] = ("sharing", "exit", "block", "token", "composite")

# name -> class; filled by the @register decorator when the policy modules are imported.
_REGISTRY: dict[str, type] = {}


class PolicyError(ValueError):
    """Bad policy parameter or input; the message names the policy and the field."""


def register(cls: type) -> type:
    """Class decorator: add a policy dataclass to the registry under ``cls.name``."""
    name = cls.name
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise RuntimeError(f"policy name {name!r} registered twice")
    if cls.kind not in POLICY_KINDS:
        raise RuntimeError(f"policy {name!r}: unknown kind {cls.kind!r}")
    _REGISTRY[name] = cls
    return cls


class PolicyBase:
    """Mixin for every policy dataclass: identity, parameter dict and check helpers."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    # What each parameter means, for listings (``rksim policies``): ``{field: (lo, hi, unit, note)}``,
    # the domain where its values differ in effect (None: unbounded), its unit ("" for a pure number)
    # and a short note. The ``_check_*`` calls stay the enforced range; a value outside the domain
    # is still accepted where it has a meaning (the note says which). Merged over the class's bases.
    domains: ClassVar[dict[str, tuple]] = {}
    # The parameters that act on this policy (None: all of them); e.g. a cache that evicts nothing
    # takes the eviction parameters of its family but none of them does anything.
    applies: ClassVar[tuple[str, ...] | None] = None

    def params(self) -> dict[str, Any]:
        """The policy's parameters as a plain dict (same as ``dataclasses.asdict``)."""
        return dataclasses.asdict(self)

    # --- parameter checks (raise PolicyError naming policy and field) ---
    def _fail(self, field: str, what: str) -> PolicyError:
        return PolicyError(f"policy {self.name!r}: {field}: {what}")

    def _check_choice(self, field: str, choices: tuple[str, ...]) -> None:
        # The class's ``choices`` table (read by the dashboard and sweeps) must say the same.
        assert getattr(type(self), "choices", {}).get(field, choices) == choices, (type(self).__name__, field)
        value = getattr(self, field)
        if value not in choices:
            raise self._fail(field, f"{value!r} is not one of {', '.join(map(repr, choices))}")

    def _check_number(self, field: str, lo: float | None = None, hi: float | None = None,
                      lo_open: bool = False, hi_open: bool = False, integer: bool = False) -> None:
        value = getattr(self, field)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise self._fail(field, f"must be a number, got {value!r}")
        if integer and float(value) != int(value):
            raise self._fail(field, f"must be an integer, got {value!r}")
        v = float(value)
        if math.isnan(v):
            raise self._fail(field, "is NaN")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise self._fail(field, f"must be {'>' if lo_open else '>='} {lo}, got {value!r}")
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise self._fail(field, f"must be {'<' if hi_open else '<='} {hi}, got {value!r}")
        if integer:
            object.__setattr__(self, field, int(value))

    def _check_bool(self, field: str) -> None:
        value = getattr(self, field)
        if not isinstance(value, (bool, np.bool_)):
            raise self._fail(field, f"must be true or false, got {value!r}")
        object.__setattr__(self, field, bool(value))

    def _array(self, field: str, value: Any, ndim: int | None = None, dtype: Any = np.float64,
               shape: tuple[int | None, ...] | None = None, finite: bool = True) -> np.ndarray:
        """Convert an input to an array, checking dimension, shape and finiteness."""
        try:
            arr = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise self._fail(field, f"cannot be read as {np.dtype(dtype).name} array ({exc})") from None
        if ndim is not None and arr.ndim != ndim:
            raise self._fail(field, f"must have {ndim} dimensions, got shape {arr.shape}")
        if shape is not None:
            for axis, want in enumerate(shape):
                if want is not None and arr.shape[axis] != want:
                    raise self._fail(field, f"axis {axis} must have length {want}, got shape {arr.shape}")
        if finite and arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise self._fail(field, f"contains NaN or inf (first at index {tuple(int(i) for i in bad)})")
        return arr


def params_of(cls: type) -> dict[str, Any]:
    """Parameter names of a policy class with their defaults (MISSING ones omitted)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


