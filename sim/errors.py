"""The simulator's configuration error: its message names the problem, ``field`` the option at fault."""
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


__all__ = ["ConfigError"]
