"""Dask backend for sweeps: a LocalCluster or an existing scheduler, losing and repeating nothing.

``dask.distributed`` is the optional extra ``dist`` (``pip install 'rksim[dist]'``)
and is imported only here, only when ``--backend dask`` is used.

How a sweep runs on Dask
------------------------
* The configurations are cut into chunks (a few per worker, at most
  ``MAX_CHUNK`` each): one Dask task per configuration would spend more time
  in the scheduler than in ``evaluate``'s fast path (~1 ms).
* A chunk's task carries plain data only: trace path, policy name,
  ``[(config_id, params), ...]`` and the options. Its key is
  ``rksim-sweep-<sha256 of its config ids>``, so submitting the same chunk twice
  names the same task and Dask runs it once.
* Fault tolerance. A worker that dies (killed, out of memory) takes its running
  and finished-but-unfetched tasks with it; the scheduler notices and reruns
  them elsewhere (up to ``distributed.scheduler.allowed-failures`` times, after
  which the future fails with ``KilledWorker``). An exception inside a task is
  retried ``retries`` times by Dask. On top of that, a chunk whose future still
  fails for any reason but a ``ValueError`` (a user error, which is re-raised)
  is resubmitted under a new key, up to ``MAX_ROUNDS`` rounds. Results are
  collected in a dict keyed by config id — a configuration that comes back
  twice (a rerun of a task whose first result had already arrived) is kept
  once, after checking that both copies are equal — and at the end the set of
  ids must equal the grid's exactly, or the sweep fails naming what is missing.
* Equality with the local backend: workers call the same ``evaluate`` on the
  same inputs and return Python floats, which travel bit for bit; rows are put
  back in grid order by :func:`sim.search.sweep.results_frame`.
"""
from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

MAX_CHUNK = 256
CHUNKS_PER_WORKER = 4
MAX_ROUNDS = 3


def require_dask():
    """Import ``dask.distributed`` or fail with a one-line hint about the ``dist`` extra."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ValueError("--backend dask needs dask.distributed, the optional extra 'dist': "
                         "pip install 'rksim[dist]'") from None
    return distributed


@contextmanager
def open_client(scheduler: str | None = None, workers: int | None = None) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` if given, else to a new LocalCluster.

    The LocalCluster has ``workers`` worker processes (default 2), one thread
    each, on 127.0.0.1 and no dashboard; it is closed on exit.
    """
    distributed = require_dask()
    if scheduler:
        if workers is not None:
            raise ValueError("--workers applies to the LocalCluster only; with --scheduler "
                             "the cluster's own workers are used")
        try:
            client = distributed.Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as exc:
            raise ValueError(f"--scheduler {scheduler!r}: cannot connect ({exc})") from None
        try:
            yield client
        finally:
            client.close()
        return
    n = 2 if workers is None else int(workers)
    if n < 1:
        raise ValueError(f"--workers {workers}: needs at least 1 worker")
    cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    try:
        client = distributed.Client(cluster)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


def chunk_items(items: Sequence[tuple[str, dict]], n_workers: int,
                chunk_size: int | None = None) -> list[list[tuple[str, dict]]]:
    """Cut ``items`` into contiguous chunks, a few per worker, at most ``MAX_CHUNK`` each."""
    if not items:
        return []
    if chunk_size is None:
        chunk_size = math.ceil(len(items) / max(1, n_workers * CHUNKS_PER_WORKER))
        chunk_size = max(1, min(MAX_CHUNK, chunk_size))
    return [list(items[i:i + chunk_size]) for i in range(0, len(items), chunk_size)]


def chunk_key(chunk: Sequence[tuple[str, dict]], round_: int = 0) -> str:
    h = hashlib.sha256(",".join(cid for cid, _ in chunk).encode()).hexdigest()[:24]
    return f"rksim-sweep-{h}" + (f"-r{round_}" if round_ else "")


def run_dask(task, evaluate, trace: str, policy: str, items: Sequence[tuple[str, dict]], options: dict, *,
             workers: int | None = None, scheduler: str | None = None, client: Any = None,
             progress: bool = True, retries: int = 3, chunk_size: int | None = None) -> dict[str, dict]:
    """Run ``task(evaluate, trace, policy, chunk, options) -> [(config_id, metrics), ...]`` on every chunk of
    ``items`` on Dask; returns {config_id: metrics}, complete and without duplicates."""
    if client is not None:
        return _run_on(client, task, evaluate, trace, policy, items, options, progress, retries, chunk_size)
    with open_client(scheduler, workers) as c:
        return _run_on(c, task, evaluate, trace, policy, items, options, progress, retries, chunk_size)


def _run_on(client, task, evaluate, trace, policy, items, options, progress, retries, chunk_size):
    distributed = require_dask()
    from tqdm.auto import tqdm

    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    chunks = chunk_items(items, n_workers, chunk_size)
    wanted = {cid for cid, _ in items}
    results: dict[str, dict] = {}
    pending = {chunk_key(ch): ch for ch in chunks}
    bar = tqdm(total=len(items), desc=f"sweep {policy} (dask)", unit="config",
               disable=not progress, mininterval=0.5)
    try:
        for round_ in range(MAX_ROUNDS):
            if not pending:
                break
            futures = {}
            for key, ch in pending.items():
                fut = client.submit(task, evaluate, trace, policy, ch, options,
                                    key=chunk_key(ch, round_), pure=True, retries=retries)
                futures[fut] = key
            failed: dict[str, list] = {}
            errors: dict[str, BaseException] = {}
            for fut in distributed.as_completed(list(futures)):
                key = futures[fut]
                if fut.status != "finished":
                    exc = (fut.exception() if fut.status == "error"
                           else RuntimeError(f"task {fut.key} was {fut.status}"))
                    if isinstance(exc, ValueError):
                        raise exc
                    failed[key] = pending[key]
                    errors[key] = exc
                    continue
                new = 0
                for cid, metrics in fut.result():
                    if cid not in wanted:
                        raise RuntimeError(f"dask sweep: a worker returned unknown config {cid}")
                    if cid in results:
                        if results[cid] != metrics and not _equal(results[cid], metrics):
                            raise RuntimeError(f"dask sweep: config {cid} gave two different results")
                        continue
                    results[cid] = metrics
                    new += 1
                bar.update(new)
                fut.release()
            pending = failed
        if pending:
            first = next(iter(errors.values()))
            raise RuntimeError(f"dask sweep: {sum(len(c) for c in pending.values())} configurations "
                               f"still failed after {MAX_ROUNDS} rounds ({type(first).__name__}: {first})")
    finally:
        bar.close()
    missing = wanted - results.keys()
    if missing:
        raise RuntimeError(f"dask sweep: {len(missing)} configurations missing, e.g. {sorted(missing)[:3]}")
    return results


def _equal(a: dict, b: dict) -> bool:
    """Dict equality where NaN equals NaN (two runs of a metric that does not apply)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True
