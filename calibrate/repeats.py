"""Repeated measurements on a shared host: interleaved passes, fastest kept.

On a shared machine interference only ever slows a measurement down, so the
fastest of identical repeats is the best estimate of the work itself (the
rule of ``timeit``'s documentation: "the lowest value gives a lower bound for
how fast your machine can run the given code snippet; higher values ... are
typically ... caused by ... other processes interfering with your timing
accuracy").

How the repeats are ordered matters as much. Back-to-back repeats of one job
(``AAA BBB CCC``) share one stretch of time: a slow minute on the host slows
every repeat of whichever jobs ran in it, and the minimum keeps that slowdown.
In a calibration it lands on a few problems only -- the held-out ones, say --
and biases every prediction made for them. Whole passes over the job list
(``ABC ABC ABC``) put a job's repeats minutes apart, so a slow stretch hits
different jobs in each pass and the minimum removes it, unless the host is
slow at every pass, which is then the machine's speed and not noise. Each
pass runs the jobs in its own seeded random order (``CAB BCA ...``; the
randomised run order of experimental design): in a fixed order a problem's
jobs sit side by side in every pass, so one slow stretch slows all of one
problem together, and a slowdown that recurs at the same point of every pass
(a neighbour's periodic job, the pass's own sweep) always hits the same jobs.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


def pass_order(n_jobs: int, rep: int, seed: int | None) -> list[int]:
    """The order of pass ``rep``: a permutation seeded by ``(seed, rep)``; ``seed=None``: ``0..n-1``."""
    if seed is None:
        return list(range(n_jobs))
    return [int(j) for j in np.random.default_rng([int(seed), int(rep)]).permutation(n_jobs)]


def fastest_of_passes(n_jobs: int, repeats: int, run: Callable[[int], tuple[Any, float]],
                      between_passes: Callable[[int], None] | None = None,
                      on_done: Callable[[int, int], None] | None = None,
                      seed: int | None = None) -> list[tuple[Any, float]]:
    """Run jobs ``0..n_jobs-1`` as ``repeats`` whole passes; keep each job's fastest result.

    Parameters
    ----------
    run : ``run(j) -> (result, seconds)``, one measurement of job ``j``.
    seed : each pass runs the jobs in :func:`pass_order` (None: in index order).
    between_passes : called with the pass index after each pass (for work that is itself
        measured once per pass, such as an operator sweep).
    on_done : called with ``(pass, job)`` after each measurement (progress).

    Returns
    -------
    ``[(result, seconds)]`` per job, the measurement with the least seconds (the first one
    on ties, so one repeat gives the single run unchanged).
    """
    if repeats < 1:
        raise ValueError("repeats: must be >= 1")
    best: list[tuple[Any, float] | None] = [None] * n_jobs
    for rep in range(repeats):
        for j in pass_order(n_jobs, rep, seed):
            res, sec = run(j)
            if best[j] is None or sec < best[j][1]:
                best[j] = (res, sec)
            if on_done is not None:
                on_done(rep, j)
        if between_passes is not None:
            between_passes(rep)
    return best  # type: ignore[return-value]


def fastest_per_row(passes: Sequence[Sequence[Any]], seconds: Callable[[Any], float]) -> list[Any]:
    """Element-wise fastest of several passes of independent measurements (one shape per row).

    Every pass must have measured the same rows in the same order.
    """
    if not passes:
        return []
    n = len(passes[0])
    if any(len(p) != n for p in passes):
        raise ValueError(f"fastest_per_row: passes measured {[len(p) for p in passes]} rows, not the same rows")
    out = list(passes[0])
    for p in passes[1:]:
        out = [a if seconds(a) <= seconds(b) else b for a, b in zip(out, p)]
    return out
