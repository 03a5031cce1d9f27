"""Threshold sweeps: evaluate a policy at every configuration of a grid, locally or on Dask.

A sweep is ``sim.api.evaluate(trace, policy, params, **options)`` for every
``params`` of a :class:`sim.search.grid.Grid`. The result is one row per
configuration, in grid order (the order of ``--grid`` flags, the last key
varying fastest), with these columns:

``config_id``
    stable id of the parameters (:func:`sim.search.grid.config_id`);
``policy``
    the registry name;
``param.<key>``
    one column per grid key (the prefix keeps parameters apart from metrics);
every metric ``evaluate`` returns
    (``speedup_vs_no_kv``, ``cgee_error_rate``, ... — see docs/sim-api.md);
    a metric that does not apply is NaN.

The sweep's inputs (trace, policy, grid, options, backend) are stored as JSON
under the key ``rksim.sweep`` in the Parquet schema metadata
(:func:`read_sweep`). Files are written atomically.

The unit of work shipped to a Dask worker holds plain data only — the trace
*path*, the policy name, a list of ``(config_id, params)`` and the options;
each chunk loads the trace itself into a :class:`sim.replay.session.Session` it owns,
so a sweep never moves arrays over the network. Every backend
evaluates with one BLAS thread (:func:`single_thread_blas`), so rows are the
same floats whatever the core count.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from sim.search.grid import Grid, config_id

PARAM_PREFIX = "param."
META_KEY = b"rksim.sweep"

EvaluateFn = Callable[..., dict]


@dataclass(frozen=True)
class SweepOptions:
    """Everything but the policy parameters that ``evaluate`` takes (docs/sim-api.md)."""

    model_preset: str | None = None
    hardware: str = "local-cpu"
    mode: str = "isolated"
    problems: tuple[int, ...] | None = None
    workload: dict | None = None
    seed: int = 0
    arrival_rate: float | None = None
    serving: dict | None = None   # serving settings (sim.serving.capacity.ServingConfig fields), mode serving
    reshape: str | None = None  # sim.workload.reshape.ReshapeSpec text; kept canonical
    # the deployment keywords of sim.api.simulate that differ from their defaults (node, tensor/pipeline/
    # data_parallel_size, router, slo; declared on sim.replay.target.TargetSpec and sim.replay.runconfig.RunConfig)
    deployment: dict | None = None

    def __post_init__(self):
        if self.mode not in ("isolated", "serving"):
            raise ValueError(f"--mode: {self.mode!r} is not one of isolated, serving")
        if self.reshape is not None:
            from sim.workload.reshape import ReshapeSpec
            try:
                object.__setattr__(self, "reshape", ReshapeSpec.coerce(self.reshape).text())
            except ValueError as exc:
                raise ValueError(f"--reshape: {str(exc).removeprefix('reshape: ')}") from None
        if self.problems is not None:
            object.__setattr__(self, "problems", tuple(int(i) for i in self.problems))

    def kwargs(self) -> dict:
        """Keyword arguments for ``evaluate`` (plain, JSON-serialisable values)."""
        kw = dataclasses.asdict(self)
        if kw["problems"] is not None:
            kw["problems"] = list(kw["problems"])
        if kw["reshape"] is None:
            del kw["reshape"]  # evaluate functions that predate reshaping still take these kwargs
        kw.update(kw.pop("deployment") or {})  # absent for one GPU: as before
        return kw


def default_evaluate() -> EvaluateFn:
    from sim.api import evaluate  # imported late: sim.api is heavier than grid parsing

    return evaluate


def param_column(key: str) -> str:
    return PARAM_PREFIX + key


def policy_fields(policy: str) -> dict[str, dataclasses.Field]:
    """The parameters of a registered policy: its dataclass fields by name."""
    from policies import policy_class

    return {f.name: f for f in dataclasses.fields(policy_class(policy)) if f.init}


def validate_params(policy: str, configs: Sequence[dict], flag: str = "--grid") -> None:
    """Build every configuration through the policies registry before any work.

    An unknown policy or key, or a value the policy refuses, raises a
    ``ValueError`` naming the flag, the key and the valid keys.
    """
    from policies import PolicyError, get_policy

    try:
        fields = policy_fields(policy)
    except PolicyError as exc:
        raise ValueError(f"--policy {policy!r}: {exc}") from None
    keys: list[str] = []
    for c in configs:
        for k in c:
            if k not in keys:
                keys.append(k)
    for k in keys:
        if k not in fields:
            raise ValueError(f"{flag} {k!r}: policy {policy!r} has no parameter {k!r} "
                             f"(valid: {', '.join(sorted(fields))})")
    for c in configs:
        try:
            get_policy(policy, **c)
        except (PolicyError, TypeError) as exc:
            raise ValueError(f"{flag}: policy {policy!r} refuses {c}: {exc}") from None


@contextmanager
def single_thread_blas() -> Iterator[None]:
    """Limit BLAS/OpenMP thread pools to one thread while configurations are evaluated.

    A multi-threaded BLAS splits reductions by thread count, so the last bits of
    matmul-heavy metrics (the token-eviction attention errors) would depend on
    how many cores the evaluating process sees. Dask workers start with one BLAS
    thread (``distributed`` sets ``OMP_NUM_THREADS=1`` and friends); the local
    backend and tuning run under this limit too, so every backend gives the same
    floats on any machine with the same BLAS build.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def evaluate_chunk(evaluate: EvaluateFn, trace: Any, policy: str,
                   items: Sequence[tuple[str, dict]], options: dict) -> list[tuple[str, dict]]:
    """Evaluate ``items`` = [(config_id, params), ...] with one BLAS thread; the task a Dask worker runs.

    The chunk's evaluations share one :class:`sim.replay.session.Session` of ``trace`` (loaded here, owned
    by this call), so each loads the trace once.
    """
    with single_thread_blas():
        return _evaluate_items(evaluate, open_session(trace), policy, items, options)


def open_session(trace):
    from sim.replay.session import Session  # imported late: the simulator is heavier than grid parsing
    return Session.of(trace)


def _evaluate_items(evaluate, trace, policy, items, options) -> list[tuple[str, dict]]:
    out = []
    for cid, params in items:
        try:
            metrics = evaluate(trace, policy=policy, params=dict(params), **options)
        except ValueError as exc:
            raise ValueError(f"config {cid} {params}: {exc}") from None
        out.append((cid, dict(metrics)))
    return out


def _normalise(value: Any) -> Any:
    if value is None:
        return np.nan
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    # A non-scalar metric (a histogram, say) is kept, as JSON text.
    return json.dumps(value, sort_keys=True, default=float)


def results_frame(policy: str, configs: Sequence[dict], ids: Sequence[str],
                  results: dict[str, dict]) -> pd.DataFrame:
    """One row per configuration, in the order of ``configs``."""
    metric_keys: list[str] = []
    for cid in ids:
        for k in results[cid]:
            if k not in metric_keys:
                metric_keys.append(k)
    param_keys: list[str] = []
    for c in configs:
        for k in c:
            if k not in param_keys:
                param_keys.append(k)
    cols: dict[str, list] = {"config_id": list(ids), "policy": [policy] * len(ids)}
    for k in param_keys:
        cols[param_column(k)] = [c.get(k) for c in configs]
    for k in metric_keys:
        if k in cols:
            raise ValueError(f"evaluate returned a metric named {k!r}, which clashes with a sweep column")
        cols[k] = [_normalise(results[cid].get(k)) for cid in ids]
    df = pd.DataFrame(cols)
    for k in metric_keys:
        s = df[k]
        if s.dtype == object:
            vals = [v for v in s if not (isinstance(v, float) and math.isnan(v))]
            if not vals or all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                df[k] = pd.to_numeric(s).astype("float64")
    return df


def run_sweep(trace: str | os.PathLike, policy: str, configs: Iterable[dict] | Grid,
              options: SweepOptions | None = None, *, evaluate: EvaluateFn | None = None,
              backend: str = "local", workers: int | None = None, scheduler: str | None = None,
              progress: bool = True, retries: int = 3, chunk_size: int | None = None,
              client: Any = None) -> pd.DataFrame:
    """Evaluate ``policy`` at every configuration; one row each (see module doc).

    ``evaluate`` defaults to :func:`sim.api.evaluate`; tests and benchmarks may
    pass another callable with the same signature (on Dask it must be
    importable by the workers). ``backend="dask"`` runs on a LocalCluster of
    ``workers`` processes, or on the cluster at ``scheduler``, or on an open
    ``client`` (:mod:`sim.search.dist`); the rows are identical to the local backend's.
    """
    options = options or SweepOptions()
    evaluate = evaluate or default_evaluate()
    configs = list(configs.configs() if isinstance(configs, Grid) else configs)
    ids = [config_id(c) for c in configs]
    if len(set(ids)) != len(ids):
        raise ValueError("--grid: the grid holds the same configuration twice")
    # a path, or the caller's sim.replay.session.Session (local backend: its memo tables are reused)
    trace = trace if hasattr(trace, "refresh") else os.fspath(trace)
    opts = options.kwargs()
    items = list(zip(ids, configs))
    if backend == "local":
        results = _run_local(evaluate, trace, policy, items, opts, progress)
    elif backend == "dask":
        from sim.search import dist

        results = dist.run_dask(evaluate_chunk, evaluate, os.fspath(getattr(trace, "source", trace)), policy, items, opts, workers=workers,
                                scheduler=scheduler, client=client, progress=progress,
                                retries=retries, chunk_size=chunk_size)
    else:
        raise ValueError(f"--backend: {backend!r} is not one of local, dask")
    return results_frame(policy, configs, ids, results)


def _run_local(evaluate, trace, policy, items, opts, progress) -> dict[str, dict]:
    from tqdm.auto import tqdm

    results: dict[str, dict] = {}
    session = open_session(trace)  # this sweep's: every configuration reuses its memo tables
    with single_thread_blas():
        for item in tqdm(items, desc=f"sweep {policy}", unit="config", disable=not progress,
                         mininterval=0.5):
            (cid, metrics), = _evaluate_items(evaluate, session, policy, [item], opts)
            results[cid] = metrics
    return results


def row_intervals(trace, policy: str, configs: Sequence[dict], options: SweepOptions | None = None,
                  session=None) -> list[dict]:
    """``<metric>_ci95`` of each of ``configs`` (:meth:`sim.replay.records.SimResult.intervals`), re-simulated.

    A sweep's rows carry point figures only (the bootstrap would cost more than the simulation of a
    memoised configuration); the CLI asks for the intervals of the rows it reports, here, in one
    session (the re-simulation is a memo hit for everything but the bootstrap).
    """
    from sim.api import simulate
    from sim.replay.problem_metrics import clean
    options = options or SweepOptions()
    session = session if session is not None else open_session(trace)
    with single_thread_blas():
        return [clean(simulate(session, policy=policy, params=dict(p), **options.kwargs()).intervals())
                for p in configs]


def write_parquet(df: pd.DataFrame, path: str | os.PathLike, meta: dict | None = None) -> Path:
    """Write ``df`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from traces.store import atomic_write_bytes

    path = Path(path)
    if path.suffix != ".parquet":
        raise ValueError(f"--out {str(path)!r}: the sweep is written as Parquet; name it *.parquet")
    if not path.parent.exists():
        raise FileNotFoundError(f"--out {str(path)!r}: folder {str(path.parent)!r} does not exist")
    table = pa.Table.from_pandas(df, preserve_index=False)
    if meta is not None:
        schema_meta = dict(table.schema.metadata or {})
        schema_meta[META_KEY] = json.dumps(meta, sort_keys=True, default=str).encode()
        table = table.replace_schema_metadata(schema_meta)
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue().to_pybytes())
    return path


def read_sweep(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """A sweep's rows and its ``rksim.sweep`` metadata ({} for another Parquet file)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r}: no such file")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a non-Parquet file
        raise ValueError(f"{str(path)!r}: not a readable Parquet file ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = json.loads(raw) if raw else {}
    return table.to_pandas(), meta


def param_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith(PARAM_PREFIX)]
