"""Phase timing: every measured phase becomes one row with the op terms the cost model needs.

A phase is timed between two device synchronisations (``sync`` is
``LoadedModel.sync`` — ``torch.cuda.synchronize()`` on GPU, a no-op on CPU),
so the time covers the work launched inside it and nothing else.

A row describes its operation exactly as :func:`sim.cost.terms.batch_terms` takes
it: one *forward* is a list of items ``i`` with ``n_i`` new tokens over
``c_i`` cached, run through ``layers_i`` layers, with ``probes_i`` logit-lens
probes and ``logits_i`` full LM-head rows; other kinds (``probe``, ``evict``,
``copy``) carry their own sizes. ``calibrate.fit`` rebuilds the terms from
these columns, so the fit and the simulator charge the very same formula.

Two clocks per phase: ``seconds`` is wall time (``time.perf_counter``), and
``cpu_seconds`` the timing thread's CPU time (``time.thread_time``). With one
torch thread on a CPU the thread's CPU time is the work itself and does not
count the time other processes of a shared machine hold the core; on a GPU the
host thread mostly waits, and wall time between synchronisations is the truth.
:func:`select_clock` picks one (``auto``: CPU time on CPU, wall on CUDA) and
falls back to wall time, saying so, for runs recorded before ``cpu_seconds``.
``sampled`` counts the rows a phase samples a token for (the top-p sort over
the vocabulary the decode loop runs every step).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, asdict
from typing import Callable, Iterator

import pandas as pd

# Columns of phases.parquet, in order. The first six are timings.parquet's (docs/trace-schema.md).
PHASE_COLUMNS = [
    "phase", "branch", "n_new", "n_cached", "batch", "seconds",
    "problem", "policy", "kind", "n", "c", "layers", "probes", "logits",
    "cand", "window", "evict_layers", "note", "cpu_seconds", "sampled", "shared",
]
CLOCKS = ("auto", "cpu", "wall")
KINDS = ("forward", "probe", "evict", "copy", "host")


@dataclass
class PhaseRow:
    phase: str
    kind: str = "forward"
    branch: int = -1
    problem: int = -1
    policy: str = ""
    n: list[int] = field(default_factory=list)       # new tokens per item
    c: list[int] = field(default_factory=list)       # cached tokens per item
    layers: list[int] = field(default_factory=list)  # layers run per item (empty = all)
    probes: list[int] = field(default_factory=list)  # logit-lens probes per item (empty = 0)
    logits: list[int] = field(default_factory=list)  # full LM-head rows per item (empty = 1)
    cand: int = 0             # evict: candidate tokens; probe: probes; copy: tokens copied
    window: int = 0           # evict: observation window (queries)
    evict_layers: int = 0     # evict: layers scored
    seconds: float = 0.0      # wall clock
    note: str = ""
    cpu_seconds: float = float("nan")   # the timing thread's CPU time
    sampled: int = 0          # rows a token was sampled for inside the phase (top-p over the vocabulary)
    shared: list[int] = field(default_factory=list)  # per item: cached tokens in KV blocks an earlier item of
                                                     # the forward reads too (sim.serving.kvshare; empty = none)

    def items(self, n: list[int], c: list[int], layers=None, probes=None, logits=None, shared=None) -> "PhaseRow":
        """Set the batch items of a forward (layers/probes/logits/shared: per item, or one value for all)."""
        k = len(n)

        def per(v, default):
            if v is None:
                return [default] * k
            return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * k

        self.n, self.c = [int(x) for x in n], [int(x) for x in c]
        self.layers, self.probes, self.logits = per(layers, -1), per(probes, 0), per(logits, 1)
        self.shared = per(shared, 0)
        return self

    def flat(self) -> dict:
        d = asdict(self)
        d["n_new"] = max(self.n) if self.n else int(self.cand)
        d["n_cached"] = max(self.c) if self.c else 0
        d["batch"] = len(self.n) if self.n else 1
        return d


@dataclass
class PhaseTimer:
    """Collects :class:`PhaseRow` s; ``with timer.phase("prefill") as row: ...`` times a block."""

    sync: Callable[[], None] = lambda: None
    rows: list[PhaseRow] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # fields stamped on every row (problem, policy)
    enabled: bool = True

    @contextmanager
    def phase(self, name: str, kind: str = "forward", **fields) -> Iterator[PhaseRow]:
        if kind not in KINDS:
            raise ValueError(f"phase {name!r}: kind {kind!r} is not one of {KINDS}")
        row = PhaseRow(phase=name, kind=kind, **{**self.context, **fields})
        self.sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield row  # the body fills in what it ran (items, layers reached, probes)
        finally:
            self.sync()
            row.seconds = time.perf_counter() - t0
            row.cpu_seconds = time.thread_time() - c0
        if self.enabled:
            self.rows.append(row)

    def total(self, **match) -> float:
        return float(sum(r.seconds for r in self.rows if all(getattr(r, k) == v for k, v in match.items())))

    def frame(self) -> pd.DataFrame:
        return phases_frame(self.rows)


def phases_frame(rows: list[PhaseRow]) -> pd.DataFrame:
    if not rows:
        df = pd.DataFrame({c: pd.Series(dtype="object") for c in PHASE_COLUMNS})
        return df
    df = pd.DataFrame([r.flat() for r in rows])[PHASE_COLUMNS]
    for col in ("branch", "n_new", "n_cached", "batch", "problem", "cand", "window", "evict_layers"):
        df[col] = df[col].astype("int64")
    df["seconds"] = df["seconds"].astype("float64")
    df["cpu_seconds"] = df["cpu_seconds"].astype("float64")
    df["sampled"] = df["sampled"].astype("int64")
    return df


def resolve_clock(clock: str, device: str) -> str:
    """``auto`` -> ``cpu`` on a CPU device, ``wall`` on CUDA; ``cpu``/``wall`` as given.

    CPU time on CUDA is refused: the host thread's CPU time there measures launches and
    spinning in ``synchronize``, not the device's work.
    """
    if clock not in CLOCKS:
        raise ValueError(f"--clock: {clock!r} is not one of {', '.join(CLOCKS)}")
    cuda = str(device).startswith("cuda")
    if clock == "auto":
        return "wall" if cuda else "cpu"
    if clock == "cpu" and cuda:
        raise ValueError(f"--clock cpu: the run is on {device}; on a GPU only wall time between "
                         "synchronisations measures the device (use --clock wall)")
    return clock


def select_clock(phases: pd.DataFrame, decisions: pd.DataFrame | None, clock: str, device: str
                 ) -> tuple[pd.Series, pd.Series | None, str, str]:
    """The seconds to fit/report on: (phase seconds, end-to-end seconds, clock used, note).

    A run recorded before both clocks existed (no ``cpu_seconds`` column, or NaN) falls back to
    wall time and the note says so.
    """
    want = resolve_clock(clock, device)
    note = f"clock: {want} ({'thread CPU time' if want == 'cpu' else 'wall time'})"
    if want == "cpu":
        ok = "cpu_seconds" in phases and phases["cpu_seconds"].notna().all() and (
            decisions is None or ("cpu_seconds" in decisions and decisions["cpu_seconds"].notna().all()))
        if not ok:
            return (phases["seconds"], None if decisions is None else decisions["seconds"], "wall",
                    "clock: wall (fallback: this run has no cpu_seconds, recorded before both clocks were; "
                    "re-run `rksim calibrate run` to fit on CPU time)")
        return phases["cpu_seconds"], None if decisions is None else decisions["cpu_seconds"], "cpu", note
    return phases["seconds"], None if decisions is None else decisions["seconds"], "wall", note
