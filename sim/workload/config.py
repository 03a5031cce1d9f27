"""The :class:`Workload`: how the trace's problems are replayed (KV reuse, blocks, budgets, arrivals), validated once.

One declared field per option (:func:`sim.base.options.option`: type, default, bounds, help and,
where the option has a command-line flag of its own, the flag). Errors are
:class:`sim.base.errors.ConfigError` with ``field = "workload.<name>"``; the CLI's ``--workload
KEY=VALUE`` and the dashboard build one from a dict (:meth:`Workload.from_any`), which also
refuses unknown keys by name. Documented in docs/simulator.md (Workload options).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sim.base.errors import ConfigError
from sim.base.options import check_value, declared, option

# kv_budget_frac when none is stated: isolated mode's per-problem budget (serving then uses the device's capacity).
DEFAULT_BUDGET_FRAC = 0.5
MAX_PROBLEMS = 10_000_000
MAX_CONCURRENT = 1 << 20


@dataclass(frozen=True)
class Workload:
    """Workload options (``simulate(workload=...)``, ``--workload KEY=VALUE``); see docs/simulator.md."""

    verify_reuses_kv: bool = option(True, kind=bool,
                                    help="verification reads the branch's generation KV (No-KV always recomputes)")
    base_sharing: str = option("no-kv", kind=str, help="sharing under exit-only and token-only policies")
    block_sharing: str = option("exact-prefix", kind=str, help="sharing under block policies")
    block_size: int = option(16, lo=1, help="KV block (tokens) for memory accounting and the block pool")
    kv_budget_frac: float | None = option(None, kind=float, gt=0,
                                          help="block policies: budget = ceil(frac x the unconstrained peak blocks) per "
                                               "problem in isolated mode, frac x the KV capacity in serving mode "
                                               f"(default {DEFAULT_BUDGET_FRAC} in isolated mode; serving: the capacity)")
    kv_budget_blocks: int | None = option(None, lo=0, help="block policies: explicit budget (overrides kv_budget_frac)")
    score: str = option("mean_prob", kind=str, choices=("mean_prob", "vote_share", "verify_score"),
                        help="RSBCM branch score: generation confidence, vote share or verification score")
    concurrency: int = option(4, lo=1, hi=MAX_CONCURRENT, flag="--max-concurrent-problems", metavar="C",
                              aliases=("--concurrency",),
                              help="serving mode, closed loop: problems in flight, each of B branch requests "
                                   "(default 4)")
    n_requests: int | None = option(None, lo=1, hi=MAX_PROBLEMS, flag="--num-problems", metavar="N",
                                    aliases=("--requests",),
                                    help="serving mode: problems submitted, cycling over the trace's; each is B "
                                         "branch requests (default: each selected problem once)")
    token_compressions: tuple = option((2, 4, 8), kind=tuple,
                                       help="token policies: KV compression ratios reported")
    max_long_layers: int | None = option(None, lo=1, help="token policies: evaluate at most this many recorded layers "
                                                          "per sequence (default: all)")
    batching: str = option("continuous", kind=str, choices=("continuous", "static"),
                           help="isolated mode: continuous (variable-length rows) or static (left-padded, eager HF)")

    def __post_init__(self) -> None:
        from policies import list_policies
        for f, opt in WORKLOAD_OPTIONS or declared(self):
            v = getattr(self, f.name)
            if opt.kind is bool and isinstance(v, np.bool_):
                v = bool(v)
            elif opt.kind is int and isinstance(v, np.integer):
                v = int(v)
            object.__setattr__(self, f.name, v)
            if opt.kind is tuple:
                continue
            try:
                check_value(f"'{f.name}'", opt, v)
            except ConfigError as exc:
                raise ConfigError(f"workload option {exc}", field=f"workload.{f.name}") from None
        sharing = list_policies("sharing")
        for k in ("base_sharing", "block_sharing"):
            if getattr(self, k) not in sharing:
                raise ConfigError(f"workload option {k!r}: {getattr(self, k)!r} is not a sharing policy "
                                  f"({', '.join(sharing)})", field=f"workload.{k}")
        tc = self.token_compressions
        tc = (tc,) if isinstance(tc, (int, np.integer)) and not isinstance(tc, bool) else tc
        if not isinstance(tc, (list, tuple)) or not tc or any(
                isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in tc):
            raise ConfigError(f"workload option 'token_compressions': a list of integers >= 1, got {tc!r}",
                              field="workload.token_compressions")
        object.__setattr__(self, "token_compressions", tuple(int(x) for x in tc))

    @classmethod
    def from_any(cls, x) -> "Workload":
        """``x`` as a Workload: one already, ``None`` (the defaults) or a dict of options (unknown keys refused)."""
        if isinstance(x, cls):
            return x
        if x is None:
            return DEFAULT_WORKLOAD
        if not isinstance(x, dict):
            raise ConfigError(f"workload: expected a dict of options, got {type(x).__name__}", field="workload")
        bad = [k for k in x if k not in WORKLOAD_FIELDS]
        if bad:
            raise ConfigError(f"workload option {bad[0]!r} is unknown; valid: {', '.join(WORKLOAD_FIELDS)}",
                              field="workload")
        return cls(**x)

    @property
    def budget_frac(self) -> float:
        """The block budget's fraction (its isolated-mode default when none is stated)."""
        return DEFAULT_BUDGET_FRAC if self.kv_budget_frac is None else float(self.kv_budget_frac)

    def to_dict(self) -> dict:
        """The options as a result reports them (``info["workload"]``; kv_budget_frac's default filled in)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["kv_budget_frac"] = self.budget_frac
        out["token_compressions"] = list(self.token_compressions)
        return out

    def key(self) -> tuple:
        """A hashable key of every stated option (an unstated kv_budget_frac differs from a stated 0.5)."""
        return tuple(sorted((f.name, repr(getattr(self, f.name))) for f in dataclasses.fields(self)))


WORKLOAD_OPTIONS = declared(Workload)  # its option fields, once
WORKLOAD_FIELDS = tuple(f.name for f, _ in WORKLOAD_OPTIONS)
DEFAULT_WORKLOAD = Workload()
# name -> default as reported (sim.workload.decisions, the dashboard's routing of its controls).
WORKLOAD_DEFAULTS = DEFAULT_WORKLOAD.to_dict()

__all__ = ["Workload", "WORKLOAD_DEFAULTS", "WORKLOAD_FIELDS", "DEFAULT_WORKLOAD", "DEFAULT_BUDGET_FRAC"]
