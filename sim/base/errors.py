"""The simulator's errors: configuration (``field`` names the option at fault), presets, calibration ranges."""
from __future__ import annotations


class ConfigError(ValueError):
    """Bad policy name, parameter, workload option, target or mode.

    ``field`` is the dotted name of the option at fault (``"policy"``, ``"params"``,
    ``"workload.block_size"``, ``"hardware"``, ``"mode"``, ...; ``None`` when no single option
    is): the CLI and the dashboard map it to their flag or widget, never the message text.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class PresetError(ValueError):
    """An unknown preset name or a malformed preset file (message names it)."""


class OutOfCalibrationError(ValueError):
    """A query outside the range a hardware profile was calibrated on (or, under ``strict``, its host)."""


__all__ = ["ConfigError", "PresetError", "OutOfCalibrationError"]
