"""The :class:`Target`: the model, hardware and serving limits a simulation's costs come from.

Frozen and hashable (its key is the model, the hardware profile's cost terms and the serving
settings), so memo tables key on it directly. :meth:`Target.resolve` turns preset names or
files into profiles (memoised in the :class:`sim.session.Session`, re-read when a preset file
changes); the target then answers the scheduler, the KV capacity and the fitted-range check
every mode uses, each in one place.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from .capacity import ServingConfig, capacity_blocks, kv_capacity
from .errors import ConfigError
from .options import option, validate_options
from .profiles import HardwareProfile, ModelShape, PresetError, load_hardware, load_model, model_from_manifest
from .scheduler import SchedulerConfig

# Isolated mode: one problem alone, every branch admitted at once, prefills first.
ISOLATED_SCHEDULER = SchedulerConfig(max_num_seqs=1 << 20, max_num_batched_tokens=1 << 24, policy="prefill-first")


def hw_key(hw: HardwareProfile) -> tuple:
    """The cost terms of a hardware profile (what two equal profiles share)."""
    return (hw.name, hw.source, hw.peak_flops, hw.mem_bw, hw.mem_capacity, hw.eff_c, hw.eff_m,
            hw.per_kernel_s, hw.per_layer_s)


def _preset(session, kind: str, name):
    """A model or hardware preset by name or file, memoised in the session per file modification time."""
    path = str(name)
    mtime = None
    if path.endswith((".yaml", ".yml", ".json")) or os.sep in path:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = None
    key = (kind, path)
    hit = session.presets.get(key)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        obj = load_model(name) if kind == "model" else load_hardware(name)
    except PresetError as exc:
        raise ConfigError(str(exc), field="model" if kind == "model" else "hardware") from None
    session.presets[key] = (mtime, obj)
    return obj


@dataclass(frozen=True)
class TargetSpec:
    """The target as a user names it (preset names or YAML/JSON files); :meth:`Target.resolve` reads them.

    One declaration per option: the CLI's target flags are built from these fields.
    """

    model: str | None = option(None, kind=str, flag="--model-preset", metavar="NAME",
                               help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    hardware: str = option("local-cpu", kind=str, flag="--hardware", metavar="NAME",
                           help="hardware preset name or YAML/JSON file (default local-cpu)")

    def __post_init__(self) -> None:
        validate_options(self)


@dataclass(frozen=True, eq=False)
class Target:
    """Where the costs come from: ``model`` on ``hardware`` under ``serving`` limits.

    ``trace_model`` is the shape of the model the trace was captured on (the decisions' model).
    """

    model: ModelShape
    hardware: HardwareProfile
    serving: ServingConfig
    trace_model: ModelShape

    @classmethod
    def resolve(cls, session, model=None, hardware="local-cpu", serving=None) -> "Target":
        """A target from preset names, files or profiles (``model=None``: the trace's own model)."""
        with session.lock:  # the session's preset memo is shared by its threads
            if session.trace_model is None:
                session.trace_model = model_from_manifest(session.tf.manifest)
            if model is None:
                m = session.trace_model
            else:
                m = model if isinstance(model, ModelShape) else _preset(session, "model", model)
            hw = hardware if isinstance(hardware, HardwareProfile) else _preset(session, "hardware", hardware)
            return cls(model=m, hardware=hw, serving=ServingConfig.from_any(serving), trace_model=session.trace_model)

    key: tuple = field(init=False, repr=False)  # (model, hardware cost terms): what a job's costs depend on

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.model, hw_key(self.hardware)))

    def __hash__(self) -> int:
        return hash((self.key, self.serving))

    def __eq__(self, other) -> bool:
        return isinstance(other, Target) and (self.key, self.serving) == (other.key, other.serving)

    # ------------------------------------------------------------------ what the target answers
    @property
    def max_batch(self) -> int | None:
        """The largest batch the hardware profile was fitted on (None: analytical)."""
        return (self.hardware.fitted_range or {}).get("max_batch")

    @property
    def calibrated(self) -> bool:
        hw = self.hardware
        return bool(getattr(hw, "calibrated", hw.fitted_range is not None))

    def scheduler(self, mode: str) -> SchedulerConfig:
        """The scheduler a mode runs under: isolated admits everything; serving is the hardware's
        vLLM defaults (or the user's), its running-sequence cap no larger than the fitted batch
        (larger batches wait in the queue, never fail)."""
        if mode != "serving":
            return ISOLATED_SCHEDULER
        cfg = self.serving.scheduler_config(self.hardware.name)
        fb = self.max_batch
        if fb is not None and cfg.max_num_seqs > int(fb):
            cfg = dataclasses.replace(cfg, max_num_seqs=int(fb))
        return cfg

    def capacity(self, mode: str, block_size: int) -> dict:
        """KV capacity (``sim.capacity.kv_capacity``) plus its blocks, block size and the mode's scheduler."""
        sched = self.scheduler(mode)
        cap = kv_capacity(self.model, self.hardware, self.serving)
        cap["kv_capacity_blocks"] = capacity_blocks(cap["kv_capacity_bytes"], block_size, self.model.kv_bytes_per_token)
        cap["block_size"] = int(block_size)
        cap["scheduler"] = sched.to_dict()
        return cap

    def check_query(self, max_context: int, max_new: int, max_batch: int, tokens: int = 0, mixed: bool = False,
                    allow_extrapolation: bool = False) -> list:
        """Refuse a query outside the hardware profile's fitted range (``HardwareProfile.check_query``,
        :mod:`sim.ranges`); with ``allow_extrapolation`` the notes of what was extrapolated instead."""
        return self.hardware.check_query(self.model, max_context=max_context, max_new=max_new, max_batch=max_batch,
                                         tokens=tokens, mixed=mixed, allow_extrapolation=allow_extrapolation)

    def note(self, decisions_model: str) -> str:
        m, hw = self.model.name, self.hardware.name
        return (f"decisions from the trace's model {decisions_model}; costs from {m} on {hw}"
                if m != decisions_model else f"decisions and costs from {m} on {hw}")


__all__ = ["Target", "TargetSpec", "ISOLATED_SCHEDULER", "hw_key"]
