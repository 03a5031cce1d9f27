"""Pareto frontier of a sweep: the configurations no other configuration beats on both axes.

With each axis oriented so that larger is better (a minimised metric is
negated), point ``i`` is *dominated* when some ``j`` has
``x_j >= x_i`` and ``y_j >= y_i`` with at least one strict inequality; the
frontier is every point that is not dominated. Consequences, all deliberate:

* identical points are all on the frontier or all off it (neither dominates
  the other), so the table shows every configuration that reaches a
  frontier point;
* of two points with equal x, only the better y can be on the frontier (the
  worse one is dominated), and likewise for equal y;
* rows where x or y is NaN (a metric that does not apply) are never on it.

The computation is exact: one sort, then a sweep in order of decreasing x
keeping the best y seen at strictly larger x (O(n log n)); no tolerance is
applied, floats are compared as they are.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# A metric whose name contains one of these (or ends in _s, seconds) is a cost: smaller is better.
_MINIMISE_HINTS = ("error", "disagreement", "latency", "bytes", "evictions", "recompute", "ttft", "exit_layer",
                   "time")
# ... unless it contains one of these (recall, speedup, accuracy are benefits).
_MAXIMISE_HINTS = ("speedup", "accuracy", "recall", "reuse", "throughput", "auc", "skip_rate")


def default_minimise(metric: str) -> bool:
    """Whether smaller is better for ``metric``, guessed from its name (see docs/sweeps.md)."""
    m = metric.lower()
    if any(h in m for h in _MAXIMISE_HINTS):
        return False
    return m.endswith("_s") or any(h in m for h in _MINIMISE_HINTS)


def pareto_mask(x, y, minimize_x: bool = True, maximize_y: bool = True) -> np.ndarray:
    """Boolean mask of the non-dominated points (see module doc for ties and NaN)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("pareto: x and y must be 1-D of the same length")
    gx = -x if minimize_x else x  # oriented: larger is better on both
    gy = y if maximize_y else -y
    ok = ~(np.isnan(gx) | np.isnan(gy))
    mask = np.zeros(x.shape, dtype=bool)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return mask
    # Decreasing x; within equal x, decreasing y.
    order = idx[np.lexsort((-gy[idx], -gx[idx]))]
    best_y = -np.inf  # best y among points with strictly larger x
    i = 0
    n = order.size
    while i < n:
        j = i
        while j + 1 < n and gx[order[j + 1]] == gx[order[i]]:
            j += 1
        group = order[i:j + 1]
        top = gy[group[0]]  # the group's best y (sorted first)
        if top > best_y:
            # only the group's best-y points survive; equal-y ties all survive
            mask[group[gy[group] == top]] = True
            best_y = top
        i = j + 1
    return mask


def pareto_mask_bruteforce(x, y, minimize_x: bool = True, maximize_y: bool = True) -> np.ndarray:
    """O(n^2) reference of :func:`pareto_mask`, straight from the definition (for tests)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    gx = -x if minimize_x else x
    gy = y if maximize_y else -y
    n = x.size
    mask = np.zeros(n, dtype=bool)
    for i in range(n):
        if np.isnan(gx[i]) or np.isnan(gy[i]):
            continue
        dominated = False
        for j in range(n):
            if np.isnan(gx[j]) or np.isnan(gy[j]):
                continue
            if gx[j] >= gx[i] and gy[j] >= gy[i] and (gx[j] > gx[i] or gy[j] > gy[i]):
                dominated = True
                break
        mask[i] = not dominated
    return mask


def frontier(df: pd.DataFrame, x: str, y: str, minimize_x: bool | None = None,
             maximize_y: bool | None = None) -> pd.DataFrame:
    """The frontier rows of ``df``, sorted by x (best x first), with the original row index kept."""
    for axis, col in (("--x", x), ("--y", y)):
        if col not in df.columns:
            numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
            raise ValueError(f"{axis} {col!r}: no such column (numeric columns: {', '.join(numeric)})")
        if not pd.api.types.is_numeric_dtype(df[col]):
            raise ValueError(f"{axis} {col!r}: column is not numeric")
    minimize_x = default_minimise(x) if minimize_x is None else minimize_x
    maximize_y = (not default_minimise(y)) if maximize_y is None else maximize_y
    mask = pareto_mask(df[x].to_numpy(dtype=np.float64), df[y].to_numpy(dtype=np.float64),
                       minimize_x, maximize_y)
    front = df[mask]
    keys = [x, y]
    asc = [minimize_x, not maximize_y]
    if "config_id" in df.columns:
        keys.append("config_id")
        asc.append(True)
    return front.sort_values(keys, ascending=asc, kind="mergesort")


def collapse_ties(front: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """One row per distinct (x, y) of the frontier: its first configuration (in row order), plus
    ``n_tied`` (how many configurations reach that point) and ``tied_config_ids`` (all of them).

    Sweeps of thresholds often map many configurations onto one outcome (every tau between two
    adjacent similarities makes the same decisions); the table names each outcome once.
    """
    groups: dict[tuple, list] = {}
    for idx in sorted(front.index):  # original row order: the first is the representative
        groups.setdefault((front.at[idx, x], front.at[idx, y]), []).append(idx)
    by_rep = {g[0]: g for g in groups.values()}
    reps = [i for i in front.index if i in by_rep]  # in the frontier's order (by x)
    out = front.loc[reps].assign(n_tied=[len(by_rep[i]) for i in reps])
    if "config_id" in front.columns:
        out = out.assign(tied_config_ids=[list(front.loc[by_rep[i], "config_id"]) for i in reps])
    return out
