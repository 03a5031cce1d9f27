"""Mixture-of-experts routing: how many distinct experts a batch of tokens reads.

Uniform routing (each token picks ``k`` of ``E`` experts, independently): the expected distinct
experts of ``rows`` tokens is ``E (1 - (1 - k / E)^rows)`` (derived: an expert is missed by one token
with probability ``1 - k / E``); :class:`SampledRouting` draws it instead, seeded. Used by
:mod:`sim.cost.terms` (expert weight bytes) and :mod:`sim.cost.gemm` (grouped-GEMM rows per expert).
"""
from __future__ import annotations

import numpy as np


def distinct_experts(m, rows):
    """``E_hit = E (1 - (1 - k / E)^rows)``: expected distinct experts ``rows`` tokens route to (module
    docstring; uniform routing). ``rows`` a float or an array; 0 for a dense model. One rank of expert
    parallelism holds ``E / EP`` of them: ``(E / EP) (1 - (1 - k / E)^rows)``. Under DP attention (``D =
    m.expert_rows_factor``) the experts route every DP rank's rows: ``(E / EP) (1 - (1 - k / E)^(D rows))``."""
    if not m.num_experts:
        return 0.0 * rows
    E, k = float(m.num_experts), float(m.experts_per_token)
    if m.expert_rows_factor != 1:
        rows = rows * m.expert_rows_factor
    return m.local_experts * (1.0 - (1.0 - k / E) ** rows)


class SampledRouting:
    """Seeded sampled routing: the distinct experts of ``rows`` tokens drawn, not expected.

    Each of ``draws`` MoE layers routes ``rows`` tokens, each to ``k`` distinct experts of ``E`` drawn
    uniformly (``numpy.random.default_rng((seed, rows))``); a draw counts the distinct experts the busiest
    expert-parallel rank holds (experts ``[r E / EP, (r + 1) E / EP)`` on rank ``r``, vLLM's linear
    ``expert_map``; all of them without EP), and the mean over draws is the count. Where every expert is
    hit but with probability below 1e-6 (``E (1 - k / E)^rows < 1e-6``) the expectation is returned.
    Memoised per row count. Without EP it agrees with :func:`distinct_experts` up to sampling noise; with
    EP the busiest rank reads more than the mean rank at small batches.
    """

    def __init__(self, seed: int = 0, draws: int = 32):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"--moe-routing sampled: seed must be a non-negative integer, got {seed!r}")
        if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or not 1 <= draws <= 4096:
            raise ValueError(f"--moe-routing sampled: draws must be an integer in 1..4096, got {draws!r}")
        self.seed, self.draws = int(seed), int(draws)
        self._memo: dict = {}

    def distinct(self, m, rows):
        if np.ndim(rows):
            r = np.asarray(rows, np.float64)
            return np.vectorize(lambda x: self.distinct(m, float(x)), otypes=[np.float64])(r)
        E, k, ep = m.num_experts, m.experts_per_token, m.expert_parallel_size
        if not E:
            return 0.0
        T = int(round(rows * m.expert_rows_factor))   # DP attention: every DP rank's rows (distinct_experts)
        if T <= 0 or E * (1.0 - k / E) ** T < 1e-6:
            return float(distinct_experts(m, float(rows)))
        key = (E, k, ep, T)
        hit = self._memo.get(key)
        if hit is None:
            rng = np.random.default_rng((self.seed, T))
            per = E // ep
            tot = 0.0
            for _ in range(self.draws):
                chosen = np.argpartition(rng.random((T, E)), k - 1, axis=1)[:, :k]
                used = np.zeros(E, bool)
                used[chosen.ravel()] = True
                tot += float(used.reshape(ep, per).sum(axis=1).max())
            hit = self._memo[key] = tot / self.draws
        return hit


ROUTINGS = ("expected", "sampled")


def routing_for(name: str, seed: int = 0):
    """``None`` (the expectation, :func:`distinct_experts`) for ``expected``; a :class:`SampledRouting`."""
    if name == "expected":
        return None
    if name == "sampled":
        return SampledRouting(seed)
    raise ValueError(f"--moe-routing: {name!r} is not one of {', '.join(ROUTINGS)}")
