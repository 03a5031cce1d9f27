"""Phase timing: every measured phase becomes one row with the op features the cost model needs.

A phase is timed between two device synchronisations (``sync`` is
``LoadedModel.sync`` — ``torch.cuda.synchronize()`` on GPU, a no-op on CPU),
so the time covers the work launched inside it and nothing else.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, asdict
from typing import Callable, Iterator

import pandas as pd

# Columns of phases.parquet, in order. The first six are timings.parquet's
# (docs/trace-schema.md); the rest describe the op for the cost model.
PHASE_COLUMNS = [
    "phase", "branch", "n_new", "n_cached", "batch", "seconds",
    "problem", "policy", "layers", "ctx_sum", "ctx_max", "ctx_sq_sum", "n_probes", "note",
]


@dataclass
class PhaseRow:
    phase: str
    branch: int = -1
    n_new: int = 0           # tokens computed per sequence (prefill length, 1 for a decode step)
    n_cached: int = 0        # context already in the KV, per sequence (max over the batch)
    batch: int = 1
    seconds: float = 0.0
    problem: int = -1
    policy: str = ""
    layers: int = 0          # decoder layers run (< L when CGEE stops early)
    ctx_sum: int = 0         # sum over the batch of the attended context (cached + new)
    ctx_max: int = 0
    ctx_sq_sum: int = 0      # sum over the batch of n_new * (n_cached + n_new): attention's quadratic term
    n_probes: int = 0        # logit-lens probes (d x V matmuls) in this phase
    note: str = ""


@dataclass
class PhaseTimer:
    """Collects :class:`PhaseRow` s; ``with timer.phase("prefill", n_new=...)`` times a block."""

    sync: Callable[[], None] = lambda: None
    rows: list[PhaseRow] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # fields stamped on every row (problem, policy)

    @contextmanager
    def phase(self, name: str, **features) -> Iterator[PhaseRow]:
        row = PhaseRow(phase=name, **{**self.context, **features})
        self.sync()
        t0 = time.perf_counter()
        try:
            yield row  # the body may fill in features known only afterwards (layers run, probes)
        finally:
            self.sync()
            row.seconds = time.perf_counter() - t0
        self.rows.append(row)

    def total(self, **match) -> float:
        return float(sum(r.seconds for r in self.rows
                         if all(getattr(r, k) == v for k, v in match.items())))

    def frame(self) -> pd.DataFrame:
        if not self.rows:
            return pd.DataFrame({c: pd.Series(dtype="object") for c in PHASE_COLUMNS})
        df = pd.DataFrame([asdict(r) for r in self.rows])[PHASE_COLUMNS]
        for c in ("branch", "n_new", "n_cached", "batch", "problem", "layers", "ctx_sum", "ctx_max",
                  "ctx_sq_sum", "n_probes"):
            df[c] = df[c].astype("int64")
        return df


def attn_features(n_new: int, cached: list[int]) -> dict:
    """Batch features of one forward where sequence i has ``cached[i]`` tokens in its KV and adds ``n_new``."""
    ctx = [c + n_new for c in cached]
    return dict(n_new=int(n_new), n_cached=int(max(cached) if cached else 0), batch=len(cached),
                ctx_sum=int(sum(ctx)), ctx_max=int(max(ctx) if ctx else 0),
                ctx_sq_sum=int(sum(n_new * c for c in ctx)))
