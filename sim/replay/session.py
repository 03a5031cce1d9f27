"""The :class:`Session`: one trace, its features and every memo the simulator keeps for it.

The caller owns it (a CLI command, a dashboard session, a sweep worker) and passes it to
``sim.api``; nothing is remembered between calls anywhere else. Memo tables are bounded
(:class:`Memo`, oldest entry out first) and the session's ``lock`` serialises simulations
that share it (the dashboard reruns scripts in threads). A trace re-captured in place is
seen: :meth:`Session.refresh` compares the trace directory's stamp (``manifest.json`` and
directory modification times, sizes and inodes) with the one loaded and, when it moved,
reloads the features and forgets every memo.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from sim.workload import features

# Entries per memo table: a 4,480-configuration sweep over the bundled trace's 12 problems
# stays well inside (decisions are memoised per distinct outcome, not per configuration).
MEMO_ENTRIES = 200_000
# The memo tables a session keeps (see the module docstring of each user).
TABLES = ("decisions", "signals", "rows", "summaries", "baselines", "token_quality", "full_attention",
          "range_ok", "fastpaths", "presets", "reshapes")


class Memo(dict):
    """A dict holding at most ``limit`` entries: inserting past it drops the oldest (insertion order).

    Reads are plain ``dict.get`` (the sweep's hot path); only inserts pay for the bound.
    """

    def __init__(self, limit: int = MEMO_ENTRIES):
        super().__init__()
        self.limit = int(limit)

    def __setitem__(self, key, value) -> None:
        if key not in self and len(self) >= self.limit:
            del self[next(iter(self))]
        super().__setitem__(key, value)


def default_trace_path() -> Path:
    """The bundled example trace (``examples/trace-gsm8k-persona`` at the repository root)."""
    return Path(__file__).resolve().parents[2] / "examples" / "trace-gsm8k-persona"


def _stamp(path) -> tuple | None:
    """What changes when a trace directory is re-captured in place (two ``stat`` calls)."""
    try:
        d, m = os.stat(path), os.stat(os.path.join(path, "manifest.json"))
    except OSError:
        return None
    return (d.st_mtime_ns, d.st_ino, m.st_mtime_ns, m.st_size, m.st_ino)


class Session:
    """A trace's features plus the simulator's memo tables for it (caller-owned, thread-safe).

    Parameters
    ----------
    trace : path, ``traces.store.Trace``, ``sim.workload.features.TraceFeatures`` or ``sim.workload.reshape.ReshapedTrace``
        ``None``: the bundled example trace.
    memo_entries : int
        Bound of every memo table.
    """

    def __init__(self, trace=None, memo_entries: int = MEMO_ENTRIES):
        self.source = default_trace_path() if trace is None else trace
        self.memo_entries = int(memo_entries)
        self.lock = threading.RLock()
        self._is_path = isinstance(self.source, (str, os.PathLike))
        self._stamp = None
        self._tf = None  # loaded on first use (a sweep task with a stand-in evaluate never loads it)
        self._host = None  # this host's fingerprint, read once (it does not change under a running process)
        self.clear()

    @classmethod
    def of(cls, trace) -> "Session":
        """``trace`` itself when it is a session, else a new session of it."""
        return trace if isinstance(trace, cls) else cls(trace)

    # ------------------------------------------------------------------ loading
    def refresh(self) -> "Session":
        """Reload the features (forgetting every memo) when the trace directory changed on disk."""
        with self.lock:
            if self._tf is not None and not self._is_path:
                return self
            stamp = _stamp(self.source) if self._is_path else None
            if self._tf is None or stamp != self._stamp:
                src = self.source
                self._tf = src if isinstance(src, features.TraceFeatures) else features.load(src)
                self._stamp = stamp
                self.clear()
        return self

    @property
    def host(self) -> dict:
        """This host's CPU fingerprint (:func:`sim.cost.fingerprint.current_cpu_fingerprint`), read on first use: every
        result says whether its profile was fitted here, and reading /proc/cpuinfo and the torch version
        per evaluation would cost more than a fast-path simulation."""
        if self._host is None:
            from sim.cost.fingerprint import current_cpu_fingerprint
            with self.lock:
                if self._host is None:
                    self._host = current_cpu_fingerprint()
        return self._host

    @property
    def tf(self):
        """The trace's features (``sim.workload.features.TraceFeatures``), loaded on first use."""
        if self._tf is None:
            self.refresh()
        return self._tf

    def clear(self) -> None:
        """Forget every memo (the features stay loaded)."""
        with self.lock:
            for name in TABLES:
                setattr(self, name, Memo(self.memo_entries))
            self.trace_model = None
            self._target_ids: dict = {}

    def __fspath__(self) -> str:
        """A session of a trace directory stands for that directory (sweep tasks that take a path)."""
        if not self._is_path:
            raise TypeError("this Session holds a trace object, not a path")
        return os.fspath(self.source)

    @property
    def trace(self):
        return self.tf.trace

    @property
    def path(self) -> str:
        return self.tf.path

    # ------------------------------------------------------------------ keys
    def cache_key(self) -> tuple:
        """What results computed on this session depend on: the trace and its stamp on disk."""
        return (str(self.source) if self._is_path else id(self.source), self.refresh()._stamp)

    def target_id(self, key) -> int:
        """A small int standing for a cost target's key in per-problem memo keys (hashing the model
        for every problem of every configuration was a visible cost); under the lock."""
        with self.lock:
            t = self._target_ids.get(key)
            if t is None:
                t = self._target_ids[key] = len(self._target_ids)
            return t

    def reshaped(self, spec) -> "Session":
        """The session of this trace's problems reshaped by ``spec`` (sim/workload/reshape.py), memoised here."""
        from sim.workload.reshape import ReshapeSpec, build_reshaped
        spec = ReshapeSpec.coerce(spec)
        with self.lock:
            hit = self.reshapes.get(spec)
            if hit is None:
                hit = self.reshapes[spec] = Session(build_reshaped(self.tf, spec).features, self.memo_entries)
            return hit


__all__ = ["Session", "Memo", "MEMO_ENTRIES", "default_trace_path"]
