"""The configuration of a ``rksim calibrate serve`` run, its flag checks, and the host check of its profile.

:class:`ServeConfig` is recorded in ``serve.json``; every bad value is one line naming its flag
(numbers arrive from the CLI as text: :func:`int_flag`, :func:`float_flag`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sim.serving.scheduler import POLICIES as SCHEDULERS  # one list of scheduler names

CLOCKS = ("cpu", "wall")


@dataclass
class ServeConfig:
    """Everything that decides a ``calibrate serve`` run (recorded in ``serve.json``)."""

    problems: int = 3
    capacity_tokens: int = 512          # KV capacity of the run, in tokens (rounded down to whole blocks)
    concurrency: int = 2                # closed-loop users
    branches: int = 2                   # requests per problem (the multi-branch workload)
    max_new_tokens: int = 32
    block_size: int = 16                # vLLM's default block size
    max_num_seqs: int = 256             # vLLM V1 defaults (scheduler config)
    max_num_batched_tokens: int = 2048
    scheduler: str = "vllm-v1"          # or prefill-first
    block_policy: str = "lru"           # eviction order of the freed (cached) blocks
    prefix_caching: bool = True
    hardware: str = "local-cpu"         # profile the replay prices iterations with
    clock: str | None = None            # clock the errors use; None: cpu on a 1-thread CPU run, else wall
    model: str = "smollm2-135m"
    model_preset: str | None = None     # sim model preset of the replay (default: --model, a preset name)
    device: str = "cpu"
    dtype: str = ""                     # the run's torch dtype (set from the loaded model): the replay prices it
    seed: int = 0
    threads: int | None = 1
    dataset: str = "gsm8k"
    layout: str = "hint-suffix"         # branches share all but the last segment: prefix-cache hits
    temperature: float = 0.7
    top_p: float = 0.95
    warmup: bool = True
    allow_other_host: bool = False      # price with a profile fitted on another host (the result says so)
    allow_extrapolation: bool = False   # price iterations outside the profile's fitted range (marked)

    def __post_init__(self) -> None:
        for f in ("problems", "capacity_tokens", "concurrency", "branches", "max_new_tokens", "block_size",
                  "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"--{f.replace('_', '-')}: must be a positive integer, got {v!r}")
        if self.capacity_tokens < self.block_size:
            raise ValueError(f"--capacity-tokens: {self.capacity_tokens} is less than one block "
                             f"(--block-size {self.block_size})")
        if self.clock is None:
            self.clock = "cpu" if self.device == "cpu" and self.threads == 1 else "wall"
        if self.clock not in CLOCKS:
            raise ValueError(f"--clock: {self.clock!r} is not one of {', '.join(CLOCKS)}")
        if self.clock == "cpu" and self.device != "cpu":
            raise ValueError(f"--clock: cpu (the thread's CPU time) does not see work on {self.device}; use wall")
        if self.clock == "cpu" and self.threads != 1:
            raise ValueError("--clock: cpu is this thread's CPU time and misses torch's other intra-op threads; "
                             "use --threads 1 or --clock wall")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads: must be >= 1, got {self.threads}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"--scheduler: {self.scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        if self.temperature < 0:
            raise ValueError(f"--temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p: must be in (0, 1], got {self.top_p}")

    def validate_targets(self) -> None:
        """Names that would otherwise fail after the model loaded: layout, block policy, replay presets."""
        from sim.cost.profiles import load_hardware, load_model
        from traces.workload import LAYOUTS

        from calibrate.serve_sched import block_policy

        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout: {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        block_policy(self.block_policy)
        try:
            load_hardware(self.hardware)
        except ValueError as exc:
            raise ValueError(f"--hardware: {exc}") from None
        try:
            load_model(self.model_preset or self.model)
        except ValueError as exc:
            raise ValueError(f"--model: the replay needs a sim model preset of the same name ({exc})") from None

    @property
    def num_blocks(self) -> int:
        return self.capacity_tokens // self.block_size

    @classmethod
    def from_args(cls, a) -> "ServeConfig":
        """From the CLI namespace; numeric flags arrive as text so a bad value is one line naming its flag."""
        kw = {}
        for f in dataclasses.fields(cls):
            v = getattr(a, f.name, None)
            if v is None:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("int", "int | None"):
                v = int_flag(flag, v)
            elif f.type == "float":
                v = float_flag(flag, v)
            kw[f.name] = v
        if getattr(a, "no_prefix_caching", False):
            kw["prefix_caching"] = False
        if kw.get("scheduler") is not None and kw["scheduler"] not in SCHEDULERS:
            raise ValueError(f"--scheduler: {kw['scheduler']!r} is not one of {', '.join(SCHEDULERS)}")
        return cls(**kw)


def check_host(hardware: str, fp: dict, allow_other_host: bool = False) -> dict:
    """Refuse to compare a run on this host with a profile fitted on another (naming the difference).

    ``calibrate serve`` and ``calibrate report`` measure this host: a profile from another host
    can only disagree with it. ``allow_other_host``: go on; the result carries the one-line note
    and ``hardware_calibrated: false``. Returns :func:`sim.cost.fingerprint.profile_host_status`.
    """
    from sim.cost.fingerprint import profile_host_status
    from sim.base.errors import OutOfCalibrationError
    from sim.cost.profiles import load_hardware

    hw = load_hardware(hardware)
    st = profile_host_status(hw, fp)
    if st["host_match"] is False and not allow_other_host:
        raise OutOfCalibrationError(
            f"--hardware {hardware}: fitted on another host ({'; '.join(st['host_differences'])}); this run "
            f"measures this one (fit it: rksim calibrate host; or --allow-other-host to compare anyway)")
    return st


def profile_host_fields(hardware: str, fp: dict) -> dict:
    from sim.cost.fingerprint import host_fields
    from sim.cost.profiles import load_hardware
    return host_fields(load_hardware(hardware), current=fp)


def int_flag(flag: str, v) -> int:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    try:
        return int(str(v).strip())
    except ValueError:
        raise ValueError(f"{flag}: must be an integer, got {v!r}") from None


def float_flag(flag: str, v) -> float:
    try:
        x = float(str(v).strip())
    except ValueError:
        raise ValueError(f"{flag}: must be a number, got {v!r}") from None
    if not np.isfinite(x):
        raise ValueError(f"{flag}: must be finite, got {v!r}")
    return x
