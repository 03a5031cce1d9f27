"""The :class:`RunConfig`: what one simulation runs (policy, workload, mode, seed, arrivals), validated once.

Every check happens in ``__post_init__``; an error is a :class:`sim.base.errors.ConfigError`
whose ``field`` names the option (``"mode"``, ``"arrival_rate"``, ``"workload.batching"``,
``"params"``, ...). The policy objects are built here too (``sim``: a
:class:`sim.workload.decisions.SimConfig`), so a run never re-validates.

Adding an option is one declaration: a field with :func:`sim.base.options.option` metadata (type,
default, bounds, help, flag); the CLI builds its flag from it (``app/cli_sim.py``) and
``validate_options`` checks it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sim.serving.capacity import check_block_budget, check_block_size, check_budget_frac
from sim.workload.decisions import SimConfig, freeze, make_config, workload_key
from sim.base.errors import ConfigError
from sim.base.options import declared, option, validate_options
from sim.workload.config import Workload

MODES = ("isolated", "serving")


@dataclass(frozen=True)
class RunConfig:
    """One simulation's settings (see :func:`sim.api.simulate` for each)."""

    policy: str = field(default="exact-prefix", metadata={"flag": "--policy"})
    params: dict = field(default_factory=dict, metadata={"flag": "--set"})
    workload: Workload = field(default_factory=Workload, metadata={"flag": "--workload"})  # a dict is converted
    mode: str = option("isolated", kind=str, choices=MODES, flag="--mode",
                       help="isolated: one problem at a time (per-problem latency); serving: arrivals and contention")
    seed: int = option(0, kind=int, flag="--sim-seed", aliases=("--seed",), metavar="N",
                       help="simulator seed: arrivals and stochastic policies (default 0)")
    arrival_rate: float | None = option(None, kind=float, gt=0, flag="--problem-rate", aliases=("--arrival-rate",),
                                        metavar="R",
                                        help="serving mode: Poisson arrivals of problems per second, each problem B "
                                             "branch requests (default: closed loop)")
    router: str = option("prefix-affinity", kind=str, flag="--router", metavar="NAME",
                         help="serving mode with --data-parallel-size > 1: round-robin, least-outstanding, "
                              "prefix-affinity or branch-spread (docs/parallelism.md; default prefix-affinity)")
    slo: str | None = option(None, kind=str, flag="--slo", metavar="KEY=S,KEY=S",
                             help="serving mode: latency SLOs ttft=S,tpot=S,e2e=S in seconds (any subset); goodput (problems/s meeting "
                                  "every one) is reported beside throughput (default: none)")
    problems: tuple | None = None
    engine: bool = field(default=False, metadata={"flag": "--engine"})
    baselines: bool | None = None      # None: where the mode has them (not token policies)
    strict: bool = option(False, kind=bool, flag="--strict",
                          help="refuse a hardware profile fitted on another host (default: say so in one line)")
    allow_extrapolation: bool = option(False, kind=bool, flag="--allow-extrapolation",
                                       help="price queries outside the profile's fitted range; the result says which "
                                            "(default: refuse)")
    step_by_step: bool = option(False, kind=bool, flag="--step-by-step",
                                help="serving mode: step every engine iteration instead of advancing quiet decode "
                                     "stretches at once (the reference path: the same figures, slower; "
                                     "docs/simulator.md)")
    sim: SimConfig = field(init=False, repr=False, compare=False)
    budget: tuple | None = field(init=False, repr=False, compare=False)  # ("blocks", n) | ("frac", f) | None

    def __post_init__(self) -> None:
        validate_options(self, RUN_OPTIONS)
        if self.arrival_rate is not None and self.mode != "serving":
            raise ConfigError("arrival_rate: only meaningful with mode='serving'", field="arrival_rate")
        if self.step_by_step and self.mode != "serving":   # isolated mode has no windows to leave out
            raise ConfigError("--step-by-step: only meaningful with mode='serving'", field="step_by_step")
        from sim.serving.goodput import SLOError, SLO
        from sim.serving.router import ROUTERS
        if self.router not in ROUTERS:
            raise ConfigError(f"--router: {self.router!r} is not one of {', '.join(ROUTERS)}", field="router")
        if self.slo is not None:
            if self.mode != "serving":
                raise ConfigError("--slo: only meaningful with mode='serving'", field="slo")
            try:
                SLO.parse(self.slo)
            except SLOError as exc:
                raise ConfigError(str(exc), field="slo") from None
        if self.problems is not None:
            object.__setattr__(self, "problems", tuple(self.problems))
        object.__setattr__(self, "workload", Workload.from_any(self.workload))
        cfg = make_config(self.policy, self.params, self.workload)
        if self.mode == "serving" and cfg.workload.batching == "static":
            raise ConfigError("workload option 'batching': static pads one problem's branches into one batch "
                              "(the real module's eager runs) and is only defined in isolated mode; serving mode "
                              "is continuous batching", field="workload.batching")
        check_block_size("workload option 'block_size'", cfg.workload.block_size)
        budget = _user_budget(cfg, self.params, self.workload) if cfg.block is not None else None
        if cfg.kind == "token":
            for name in ("engine", "problems", "baselines"):
                if getattr(self, name) not in (None, False):
                    raise ConfigError(f"{name}: not applicable to the token policy {self.policy!r} (it replays the "
                                      "trace's long decodes, with no baselines and no engine choice)", field=name)
        object.__setattr__(self, "sim", cfg)
        object.__setattr__(self, "budget", budget)

    @property
    def kind(self) -> str:
        return self.sim.kind

    @property
    def wants_baselines(self) -> bool:
        return self.kind != "token" and self.baselines is not False

    def baseline(self, name: str) -> "RunConfig":
        """The same run under the baseline policy ``name`` at its defaults (fast path, no baselines)."""
        return RunConfig(policy=name, params={}, workload=self.sim.workload, mode=self.mode, seed=self.seed,
                         arrival_rate=self.arrival_rate, problems=self.problems, baselines=False,
                         allow_extrapolation=self.allow_extrapolation, router=self.router,
                         step_by_step=self.step_by_step)

    def baseline_key(self, name: str) -> tuple:
        return (name, self.mode, self.problems, workload_key(self.sim), self.seed, self.arrival_rate,
                self.allow_extrapolation, self.router)

    @property
    def slo_spec(self):
        """The parsed ``--slo`` (``sim.serving.goodput.SLO``), or None when none is stated."""
        from sim.serving.goodput import SLO
        return None if self.slo is None else SLO.parse(self.slo)

    def describe(self) -> dict:
        return {"policy": self.policy, "params": dict(self.params or {}), "components": self.sim.describe()}


RUN_OPTIONS = declared(RunConfig)  # its option fields, once


def _user_budget(cfg, params, workload: Workload) -> tuple | None:
    """The block budget the user asked for: ``("blocks", n)``, ``("frac", f)`` or ``None`` (the device's capacity)."""
    params = params or {}
    if cfg.budget_blocks is not None:
        return ("blocks", check_block_budget(f"policy {cfg.policy!r}: budget_blocks" if "budget_blocks" in params else
                                             "workload option 'kv_budget_blocks'", cfg.budget_blocks))
    if "budget_frac" in params or workload.kv_budget_frac is not None:
        return ("frac", check_budget_frac(f"policy {cfg.policy!r}: budget_frac" if "budget_frac" in params else
                                          "workload option 'kv_budget_frac'", cfg.budget_frac))
    return None


__all__ = ["RunConfig", "Workload", "MODES", "freeze"]
