"""What a simulation returns: :class:`SimResult` (the summary, per-problem and per-branch rows, KV timeline)."""
from __future__ import annotations

import math

import pandas as pd

from sim.replay.problem_metrics import clean


class SimResult:
    """Everything one simulation produced (DataFrames built on first access)."""

    def __init__(self, summary: dict, rows: list, brows: list, timeline: list, info: dict, token=None,
                 baselines: dict | None = None):
        self.summary, self.info, self.token = summary, info, token
        self._rows, self._brows, self._timeline = rows, brows, timeline
        # baseline name -> (positions, per-problem latencies): the speedups' paired bootstrap
        self.baselines = baselines
        self._frames: dict = {}
        self._intervals: dict | None = None

    def intervals(self) -> dict:
        """``<metric>_ci95 = [lo, hi]`` of the summary's rates and ratios (:func:`sim.replay.intervals.summary_intervals`,
        seeded with the run's seed; computed once, on first call)."""
        if self._intervals is None:
            from sim.replay.intervals import summary_intervals
            self._intervals = summary_intervals(self.summary, self._rows, self._brows, self.baselines,
                                                seed=int(self.info.get("seed", 0) or 0))
        return self._intervals

    def problem_latencies(self) -> tuple[tuple, tuple]:
        """``(positions, latencies)`` of the problems in run order (what a speedup's bootstrap pairs)."""
        return (tuple(int(r["pos"]) for r in self._rows), tuple(float(r["latency_s"]) for r in self._rows))

    @property
    def problems(self) -> pd.DataFrame:
        """One row per problem (latency and phases, reuse, decisions, accuracy, ...)."""
        if "p" not in self._frames:
            self._frames["p"] = pd.DataFrame(self._rows)
        return self._frames["p"]

    @property
    def branches(self) -> pd.DataFrame:
        """One row per (problem, branch): sigma, shared, exit layer, selected."""
        if "b" not in self._frames:
            self._frames["b"] = pd.DataFrame(self._brows)
        return self._frames["b"]

    @property
    def kv_timeline(self) -> pd.DataFrame:
        """KV bytes after every iteration (``pos`` = problem; -1 = the whole server in serving mode)."""
        if "t" not in self._frames:
            parts = [pd.DataFrame({"pos": p, "t_s": t, "kv_bytes": b}) for p, t, b in self._timeline]
            self._frames["t"] = (pd.concat(parts, ignore_index=True) if parts
                                 else pd.DataFrame(columns=["pos", "t_s", "kv_bytes"]))
        return self._frames["t"]

    @property
    def aggregate(self) -> pd.DataFrame:
        """The summary as a one-row DataFrame (index: the policy)."""
        return pd.DataFrame([clean(self.summary)], index=[self.info.get("policy", "")])

    def to_json_dict(self) -> dict:
        """The summary's keys and their ``*_ci95`` intervals, ``info``, and (serving) ``timeline``: KV bytes and running sequences over time."""
        out = {**self.summary, **self.intervals(), "info": {k: v for k, v in self.info.items() if k != "timeline"}}
        if "timeline" in self.info:
            out["timeline"] = self.info["timeline"]
        return clean(out)

    def scalars(self) -> dict:
        """:func:`sim.replay.problem_metrics.clean` of the summary, with a fast lane for plain values (what ``evaluate`` returns)."""
        out = {}
        for k, v in self.summary.items():
            t = type(v)
            if t is float:
                out[k] = v if math.isfinite(v) else None
            elif v is None or t is int or t is bool or t is str:
                out[k] = v
            else:
                out[k] = clean(v)
        return out


__all__ = ["SimResult"]
