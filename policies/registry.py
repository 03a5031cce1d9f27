"""Policy registry: every policy by its name, for the CLI, the simulator and the real runner."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from . import blocks, composite, exit, sharing, tokens  # noqa: F401  (imports register the classes)
from .base import _REGISTRY, POLICY_KINDS, PolicyError, params_of

# Order used by list_policies(): sharing, exit, blocks, composite, tokens.
POLICY_NAMES: tuple[str, ...] = ("no-kv", "exact-prefix", "asks", "cgee", "rsbcm", "lru", "fifo", "rksc",
                                 "full", "streamingllm", "h2o", "snapkv", "rkv", "curdkv", "random",
                                 "vase-attnv", "vase-dkv")
assert set(POLICY_NAMES) == set(_REGISTRY), sorted(set(POLICY_NAMES) ^ set(_REGISTRY))


def list_policies(kind: str | None = None) -> list[str]:
    """Registry names, optionally only those of one kind (see ``POLICY_KINDS``)."""
    if kind is not None and kind not in POLICY_KINDS:
        raise PolicyError(f"list_policies: kind: {kind!r} is not one of {', '.join(POLICY_KINDS)}")
    return [n for n in POLICY_NAMES if kind is None or _REGISTRY[n].kind == kind]


def policy_class(name: str) -> type:
    """The dataclass registered under ``name``."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise PolicyError(f"unknown policy {name!r}; valid names: {', '.join(POLICY_NAMES)}")
    return cls


def policy_defaults(name: str) -> dict[str, Any]:
    """Parameter names and default values of a policy."""
    return params_of(policy_class(name))


def param_domains(name: str) -> dict[str, tuple]:
    """``{field: (lo, hi, unit, note)}`` of a policy's parameters (``PolicyBase.domains``, merged over the
    class's bases, the subclass first); a composite policy takes its components' too."""
    cls = policy_class(name)
    classes = list(cls.__mro__)
    if cls.kind == "composite":
        classes += [k for c in _REGISTRY.values() if c.kind != "composite" for k in c.__mro__]
    fields = set(policy_defaults(name))
    out: dict[str, tuple] = {}
    for c in classes:
        for k, v in c.__dict__.get("domains", {}).items():
            if k in fields and k not in out:
                out[k] = v
    return out


def param_applies(name: str) -> list[str]:
    """The parameters of a policy that act on it (``PolicyBase.applies``; default all of them)."""
    fields = list(policy_defaults(name))
    keep = policy_class(name).applies
    return fields if keep is None else [f for f in fields if f in keep]


def param_choices(name: str) -> dict[str, tuple[str, ...]]:
    """The allowed values of each string-valued parameter of a policy (e.g. ``pooling: mean | last``).

    A composite policy (``rksc``) takes its components' parameters, so it offers their choices too.
    """
    cls = policy_class(name)
    classes = [cls]
    if cls.kind == "composite":
        classes += [c for c in _REGISTRY.values() if c.kind != "composite"]
    fields = set(policy_defaults(name))
    out: dict[str, tuple[str, ...]] = {}
    for c in classes:
        for k, v in getattr(c, "choices", {}).items():
            if k in fields:
                out.setdefault(k, tuple(v))
    return out


def get_policy(name: str, **params: Any):
    """Build a policy by registry name; unknown parameters raise PolicyError listing valid ones."""
    cls = policy_class(name)
    valid = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in params if k not in valid]
    if unknown:
        raise PolicyError(f"policy {name!r}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
                          f"valid: {', '.join(valid) if valid else '(none)'}")
    return cls(**params)


def parse_value(text: str):
    """A ``--set`` value: int, float, true/false, none, a comma list of those, else the string.

    Non-finite numbers (``nan``, ``inf``) stay strings, so the policy's own check
    rejects them by name ("must be a number, got 'nan'").
    """
    t = str(text).strip()
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        v = float(t)
        if math.isfinite(v):
            return v
    except ValueError:
        pass
    if "," in t:
        return [parse_value(x) for x in t.split(",")]
    return t


def parse_sets(items, flag: str) -> dict:
    """``["k=v", ...]`` (repeated ``--set`` / ``--workload``) -> ``{k: parse_value(v)}``."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ValueError(f"{flag} {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise ValueError(f"{flag} {it!r}: empty key")
        out[k] = parse_value(v)
    return out


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value[:key=value...]`` (an ablation such as ``vase-attnv:value_frac=0``)
    → ``(name, params)``, values read by :func:`parse_value`; a bad spec raises :class:`PolicyError`."""
    name, *sets = [x.strip() for x in str(spec).split(":")]
    try:
        return name, parse_sets(sets, repr(spec))
    except ValueError as exc:
        raise PolicyError(str(exc)) from None


def policy_from_spec(spec: str, **overrides: Any):
    """A policy from a :func:`parse_spec` spec; ``overrides`` win. Bad specs raise :class:`PolicyError`
    naming the spec."""
    name, params = parse_spec(spec)
    try:
        return get_policy(name, **{**params, **overrides})
    except PolicyError as exc:
        raise PolicyError(f"{spec!r}: {exc}") from None
