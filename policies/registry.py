"""Policy registry: every policy by its name, for the CLI, the simulator and the real runner."""
from __future__ import annotations

import dataclasses
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
