"""95% intervals on the simulator's rates and ratios: the code ``rksim reproduce`` judges with.

* A **rate** ``k`` of ``n`` (skip rate, CGEE error rate, accuracy: ``k`` problems of ``n``) gets a
  Wilson score interval (:func:`wilson`); it stays inside [0, 1] and is not empty at ``k = 0`` or
  ``k = n``, where the normal approximation collapses to a point.
* A **ratio** over problems (a speedup ``mean(baseline latency) / mean(policy latency)``, the KV
  reuse ``sum(reused) / sum(prompt)``) gets a seeded percentile bootstrap that resamples problems
  in pairs (:func:`bootstrap_ratio`): the same problems for the numerator and the denominator, so
  a policy and its baseline are compared on the same draw.
* A statistic of grouped rows (the ASKS gate's ROC AUC over its branches) resamples whole problems
  (:func:`bootstrap_stat`; for the AUC, :func:`bootstrap_auc`, the same resamples vectorised):
  branches of one problem are not independent.

Every bootstrap draws from ``numpy.random.default_rng(seed)`` with the run's seed, so the same
inputs give the same intervals byte for byte. :func:`summary_intervals` adds ``<metric>_ci95 =
[lo, hi]`` for a simulation's summary; it is computed on demand (``SimResult.intervals``), never
inside ``sim.api.evaluate``, so a sweep pays nothing for it.
"""
from __future__ import annotations

import math

import numpy as np

Z = 1.96             # 95% intervals
N_BOOT = 2000        # bootstrap resamples

# rate key of a summary -> the per-problem boolean column it counts (``sim.replay.problem_metrics.problem_row``)
RATE_COLUMNS = {"skip_rate": "skipped", "cgee_error_rate": "cgee_differs",
                "cgee_branch_disagreement_rate": "cgee_branch_differs", "accuracy": "correct",
                "vote_accuracy": "vote_correct"}
# ratio key -> (numerator column, denominator column), both summed over problems
RATIO_COLUMNS = {"kv_reuse": ("reused_tokens", "prompt_tokens"),
                 "answer_change_rate": ("answer_changes", "shared_branches"),
                 "prefix_hit_rate": ("prefix_hit_tokens", "prompt_tokens_admitted")}
# rates given as a fraction of the problems served (serving with an SLO): Wilson of round(rate n) of n
RATE_FRACTIONS = ("slo_attainment",)
SPEEDUPS = {"speedup_vs_no_kv": "no-kv", "speedup_vs_exact_prefix": "exact-prefix"}
SUFFIX = "_ci95"

def wilson(k: float, n: int, z: float = Z) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``k / n``.

    ``(p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``; NaN for ``n = 0``; exactly 0 (1) at
    the lower (upper) end for ``k = 0`` (``k = n``), and always containing ``p``.
    """
    if n <= 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = p + z * z / (2 * n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at k = 0 (k = n) the lower (upper) end is 0 (1) exactly; the formula leaves a rounding residue
    lo = 0.0 if k <= 0 else max(0.0, min(p, (c - h) / d))
    hi = 1.0 if k >= n else min(1.0, max(p, (c + h) / d))
    return (lo, hi)


def _resample(n: int, seed: int, n_boot: int) -> np.ndarray:
    """(n_boot, n) indices drawn with replacement (paired: the same rows for every array)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_ratio(num, den, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(``sum(num) / sum(den)``, 2.5th, 97.5th percentile) over problems resampled in pairs.

    A speedup ``mean(base) / mean(policy)`` is ``bootstrap_ratio(base, policy)``.
    """
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"bootstrap_ratio: paired 1-d arrays needed, got {a.shape} and {b.shape}")
    idx = _resample(a.size, seed, n_boot)
    r = a[idx].sum(1) / b[idx].sum(1)
    lo, hi = np.percentile(r, [2.5, 97.5])
    return float(a.sum() / b.sum()), float(lo), float(hi)


def bootstrap_mean(x, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of ``x`` resampled with replacement (a paired difference: x = a - b)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"bootstrap_mean: a non-empty 1-d array needed, got shape {a.shape}")
    m = a[_resample(a.size, seed, n_boot)].mean(1)
    lo, hi = np.percentile(m, [2.5, 97.5])
    return float(a.mean()), float(lo), float(hi)


def bootstrap_stat(stat, groups: list, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(stat(all), 2.5th, 97.5th percentile of stat over resampled groups); NaN resamples are dropped.

    ``groups``: one item per problem (e.g. its branches' (scores, labels)); ``stat`` takes a list of them.
    """
    full = float(stat(groups))
    idx = _resample(len(groups), seed, n_boot)
    vals = np.array([stat([groups[i] for i in row]) for row in idx], dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return full, float("nan"), float("nan")
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return full, float(lo), float(hi)



def wilson_of_rate(rate, n) -> list | None:
    """:func:`wilson` of a rate given as a fraction of ``n`` (``k = round(rate n)``); None when either is missing."""
    if rate is None or n is None or not math.isfinite(float(rate)) or int(n) <= 0:
        return None
    n = int(n)
    return list(wilson(round(float(rate) * n), n))


def wilson_upper(rate, n) -> float | None:
    """The upper end of :func:`wilson_of_rate` (what a conservative constraint on a rate reads)."""
    ci = wilson_of_rate(rate, n)
    return None if ci is None else ci[1]


def _pair(a: list, b: list) -> bool:
    return len(a) == len(b) and len(a) > 0


def auc_of_groups(groups: list) -> float:
    """ROC AUC of the branches of ``groups`` (one ``(scores, labels)`` per problem) pooled."""
    from sim.replay.problem_metrics import roc_auc
    if not groups:
        return float("nan")
    return roc_auc(np.concatenate([g[0] for g in groups]), np.concatenate([g[1] for g in groups]))


def bootstrap_auc(groups: list, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """``bootstrap_stat(auc_of_groups, groups, seed, n_boot)``, vectorised: the same resamples, the same figures.

    A resample that holds problem ``p`` ``c_p`` times weighs each of its branches by ``c_p``; the pooled
    AUC is then ``sum_ij w_i w_j M_ij / (sum_i w_i)(sum_j w_j)`` over positive ``i`` and negative ``j``
    with ``M_ij = [s_i > s_j] + [s_i = s_j] / 2`` (Mann-Whitney with ties counted half: what the rank
    formula of :func:`sim.replay.problem_metrics.roc_auc` computes). Resamples with one class only are dropped.
    """
    full = float(auc_of_groups(groups))
    if not groups:
        return full, float("nan"), float("nan")
    s = np.concatenate([np.asarray(g[0], np.float64) for g in groups])
    y = np.concatenate([np.asarray(g[1], bool) for g in groups])
    owner = np.concatenate([np.full(len(g[0]), i, np.int64) for i, g in enumerate(groups)])
    ok = np.isfinite(s)
    s, y, owner = s[ok], y[ok], owner[ok]
    idx = _resample(len(groups), seed, n_boot)
    counts = np.zeros((n_boot, len(groups)))
    np.add.at(counts, (np.repeat(np.arange(n_boot), idx.shape[1]), idx.ravel()), 1.0)
    w = counts[:, owner]                                   # (n_boot, branches)
    sp, sn = s[y], s[~y]
    m = (sp[:, None] > sn[None, :]) + 0.5 * (sp[:, None] == sn[None, :])
    wp, wn = w[:, y], w[:, ~y]
    with np.errstate(divide="ignore", invalid="ignore"):
        vals = ((wp @ m) * wn).sum(1) / (wp.sum(1) * wn.sum(1))
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return full, float("nan"), float("nan")
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return full, float(lo), float(hi)


def summary_intervals(summary: dict, rows: list, brows: list, baselines: dict | None = None,
                      seed: int = 0, n_boot: int = N_BOOT) -> dict:
    """``<metric>_ci95 = [lo, hi]`` for the rates and ratios ``summary`` holds (None where the metric is None).

    ``rows``/``brows``: the per-problem and per-branch rows the summary was computed from;
    ``baselines``: baseline name -> ``(positions, latencies)`` of the same problems, for the speedups'
    paired bootstrap (absent or not the same problems in the same order: no speedup interval).
    """
    out: dict = {}
    if not rows or "latency_s" not in rows[0] or "pos" not in rows[0]:
        return out   # not problem rows (a token policy's rows are its long decodes)
    n = len(rows)
    have = rows[0].keys()
    for key, col in RATE_COLUMNS.items():
        if key not in summary or col not in have:
            continue
        v = summary.get(key)
        out[key + SUFFIX] = (None if v is None or not math.isfinite(float(v))
                             else list(wilson(int(sum(bool(r[col]) for r in rows)), n)))
    for key, (num, den) in RATIO_COLUMNS.items():
        if key not in summary or num not in have or den not in have:
            continue
        a = np.array([r[num] for r in rows], np.float64)
        b = np.array([r[den] for r in rows], np.float64)
        v = summary.get(key)
        out[key + SUFFIX] = (None if v is None or not math.isfinite(float(v)) or b.sum() <= 0
                             else _ratio_ci(a, b, seed, n_boot))
    for key in RATE_FRACTIONS:
        if key in summary:
            out[key + SUFFIX] = wilson_of_rate(summary.get(key), n)
    lat = [float(r["latency_s"]) for r in rows]
    pos = [int(r["pos"]) for r in rows]
    for key, name in SPEEDUPS.items():
        if key not in summary:
            continue
        base = (baselines or {}).get(name)
        ok = summary.get(key) is not None and base is not None and list(base[0]) == pos and _pair(base[1], lat)
        out[key + SUFFIX] = _ratio_ci(np.asarray(base[1], np.float64), np.asarray(lat, np.float64), seed,
                                      n_boot) if ok else None
    if "asks_gate_auc" in summary:
        auc = summary.get("asks_gate_auc")
        out["asks_gate_auc" + SUFFIX] = None
        if auc is not None and math.isfinite(float(auc)) and brows and "sigma" in brows[0]:
            groups: dict = {}
            for r in brows:
                if r["branch"] > 0:   # the root has no sigma (the summary's AUC is over branches 1..B-1)
                    g_ = groups.setdefault(int(r["pos"]), ([], []))
                    g_[0].append(float(r["sigma"]))
                    g_[1].append(bool(r["cf_same_answer"]))
            g = [(np.asarray(groups[p][0], np.float64), np.asarray(groups[p][1], bool)) for p in sorted(groups)]
            _, lo, hi = bootstrap_auc(g, seed=seed, n_boot=n_boot)
            out["asks_gate_auc" + SUFFIX] = None if not (math.isfinite(lo) and math.isfinite(hi)) else [lo, hi]
    return out


def _ratio_ci(num: np.ndarray, den: np.ndarray, seed: int, n_boot: int) -> list | None:
    """The paired bootstrap interval of ``sum(num) / sum(den)``; None where a resample's denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        _, lo, hi = bootstrap_ratio(num, den, seed=seed, n_boot=n_boot)
    return [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None


__all__ = ["Z", "N_BOOT", "wilson", "bootstrap_ratio", "bootstrap_auc", "bootstrap_mean", "bootstrap_stat", "wilson_of_rate",
           "wilson_upper", "summary_intervals", "auc_of_groups", "RATE_COLUMNS", "RATIO_COLUMNS",
           "SPEEDUPS", "SUFFIX"]
