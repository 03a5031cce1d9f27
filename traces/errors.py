"""Errors raised by the trace store and loaders."""
from __future__ import annotations


class TraceError(ValueError):
    """A fault in a trace or a benchmark file.

    The message is one line, ``"FILE: field: what"``, where FILE is the path
    relative to the trace root (or the input file) and field names the column,
    array or JSON key at fault.
    """

    def __init__(self, file: str, field: str, what: str):
        self.file, self.field, self.what = str(file), str(field), " ".join(str(what).split())
        super().__init__(f"{self.file}: {self.field}: {self.what}")
