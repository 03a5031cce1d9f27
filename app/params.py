"""Parsing and validation of user-typed values, shared by the CLI and the dashboard.

Both front ends send what a user typed through these functions, so the same
input gives the same one-line error in a terminal (``rksim: error: ...``) and in
the page (``st.error``). Each raises :class:`ValueError` naming the flag or field;
argparse ``type=`` wrappers are built with :func:`arg_type`.

Nothing here imports the simulator at module level (``rksim --help`` stays fast).
"""
from __future__ import annotations

import math
from typing import Any, Callable

# one parser for the CLI, the dashboard and calibrate (policies.registry: no app import there)
from policies.registry import parse_sets, parse_value  # noqa: F401


def split_sets(text: str) -> list[str]:
    """The dashboard's one-line form of repeated ``--set``: ``"tau=0.8; alpha=2"`` (``;`` or newlines)."""
    return [s.strip() for s in str(text).replace("\n", ";").split(";") if s.strip()]


def number(value: Any, flag: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False, integer: bool = False, allow_none: bool = False):
    """A finite number (from text or a widget) within ``[lo, hi]`` (open ends where asked).

    Empty text or ``None`` is ``None`` when ``allow_none``, else an error. Returns an ``int``
    when ``integer`` (``"4.0"`` is 4; ``"4.5"`` is refused).
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            value = None
        else:
            try:
                value = int(text)  # exact, however many digits (a float would round 2**53 + 1)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    raise ValueError(f"{flag}: {text!r} is not a number") from None
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{flag}: a value is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ValueError(f"{flag}: {value!r} is not a number")
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        raise ValueError(f"{flag}: {str(value)[:12]}... ({len(str(value))} digits) is out of range") from None
    if not math.isfinite(v):
        raise ValueError(f"{flag}: must be a finite number, got {value!r}")
    if integer and v != int(v):
        raise ValueError(f"{flag}: must be an integer, got {value!r}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{flag}: must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{flag}: must be {'<' if hi_open else '<='} {hi:g}, got {value!r}")
    if integer:
        return int(value) if isinstance(value, int) else int(v)
    return v


def positive_int(value, flag: str = "value", allow_none: bool = False):
    """An integer >= 1."""
    return number(value, flag, lo=1, integer=True, allow_none=allow_none)


def positive_float(value, flag: str = "value", allow_none: bool = False):
    """A finite number > 0."""
    return number(value, flag, lo=0, lo_open=True, allow_none=allow_none)


def fraction(value, flag: str = "value", allow_none: bool = False):
    """A share in (0, 1] (e.g. ``--gpu-memory-utilization``)."""
    return number(value, flag, lo=0, hi=1, lo_open=True, allow_none=allow_none)


def seed(value, flag: str = "--seed"):
    """A simulator seed: an integer >= 0."""
    return number(value, flag, lo=0, integer=True)


def port(value, flag: str = "--port"):
    """A TCP port 1..65535."""
    return number(value, flag, lo=1, hi=65535, integer=True)


def arg_type(fn: Callable, flag: str) -> Callable[[str], Any]:
    """An argparse ``type=`` from a validator above: the same message, as argparse's one-line error."""
    import argparse

    def conv(text: str):
        try:
            return fn(text, flag)
        except ValueError as exc:
            msg = str(exc)
            raise argparse.ArgumentTypeError(msg[len(flag) + 2:] if msg.startswith(flag + ": ") else msg) from None

    conv.__name__ = getattr(fn, "__name__", "value")
    return conv


def policy_params(policy: str, params: dict) -> dict:
    """Check a policy's parameters exactly as the simulator will (``sim.workload.decisions.make_config``);
    returns them unchanged or raises ``ValueError`` naming the policy and field."""
    from sim.workload.decisions import make_config

    make_config(policy, params, None)
    return params


def workload(options: dict | None) -> dict:
    """Check workload options as the simulator does (unknown keys and bad values raise naming them)."""
    from sim.workload.config import Workload

    Workload.from_any(dict(options or {}))
    return dict(options or {})
