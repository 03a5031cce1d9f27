"""The checks of a preset's numeric and choice fields, written once: hardware presets
(:class:`sim.cost.hardware.HardwareProfile`) and their ``host_step`` / ``frontend`` blocks
(:mod:`sim.cost.overheads`) name the field their own way and share the rule and its words."""
from __future__ import annotations

import math

import numpy as np

from sim.base.errors import PresetError


def is_number(v) -> bool:
    """A finite real number (a YAML ``true`` is not one)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


# rule -> (the words of its refusal, the test a value passes)
RULES = {
    "positive": ("a positive number", lambda v: is_number(v) and v > 0),
    "nonneg": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "fraction": ("a number in [0, 1]", lambda v: is_number(v) and 0.0 <= v <= 1.0),
    "positive or null": ("a positive number or null", lambda v: v is None or (is_number(v) and v > 0)),
    "count": ("a positive integer", _is_count),
    "count or null": ("a positive integer or null", lambda v: v is None or _is_count(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
}


def check_field(label: str, v, rule: str) -> None:
    """Raise :class:`PresetError` ``"<label> must be <words>, got <v>"`` unless ``v`` passes ``rule`` (:data:`RULES`)."""
    words, ok = RULES[rule]
    if not ok(v):
        raise PresetError(f"{label} must be {words}, got {v!r}")


def check_choice(label: str, v, choices) -> None:
    """Raise :class:`PresetError` ``"<label> must be one of <choices>, got <v>"`` unless ``v`` is one of them."""
    if v not in choices:
        raise PresetError(f"{label} must be one of {', '.join(str(x) for x in choices)}, got {v!r}")
