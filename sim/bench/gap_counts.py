"""Every request's gaps between tokens (ITLs) as one multiset: each distinct value once, with how often it occurs.

A run's requests decode in the same engine steps, so their gaps repeat: a day of 100,000 requests has about
28 million gaps but about as many distinct values as engine steps. :class:`GapCounts` holds those, so a result's
ITL statistics need memory in proportion to the steps, not to the tokens (per-request gaps are kept only where
a result writes them, ``--save-detailed``).

Its statistics are ``numpy``'s over the gaps written out in full (:func:`expanded`), on the sorted values and
their cumulative counts:

* ``median``: ``numpy.median``'s order statistics, the middle one, or for an even count ``(x[n/2 - 1] + x[n/2]) / 2``;
* ``percentile(q)``: ``numpy.percentile``'s default ``linear`` method, ``v = (n - 1) q / 100``,
  ``x[floor v] + (x[floor v + 1] - x[floor v]) g`` with ``g = v - floor v`` (from the upper point where
  ``g >= 0.5``, as numpy's ``_lerp``), the largest where ``v >= n - 1``: the same floats as numpy's;
* ``mean = fsum(v_i c_i) / n`` and ``std = sqrt(fsum(c_i (v_i - mean)^2) / n)``, numpy's population standard
  deviation. These sums are exact over the products (``math.fsum``) where numpy's pairwise sums round along the
  gaps' order, so the two agree to about 1e-15 relative, not always to the last bit.
"""
from __future__ import annotations

import math

import numpy as np


class GapCounts:
    """Distinct gaps (``values``, sorted) and their counts; :meth:`add` merges more gaps in (a batch at a time:
    gaps wait in a buffer of at most about ``max(PENDING, distinct values)`` until they are merged)."""

    PENDING = 1 << 16

    def __init__(self):
        self._values = np.zeros(0, np.float64)
        self._counts = np.zeros(0, np.int64)
        self._pend, self._n_pend = [], 0

    @property
    def values(self) -> np.ndarray:
        self._merge()
        return self._values

    @property
    def counts(self) -> np.ndarray:
        self._merge()
        return self._counts

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def add(self, gaps) -> None:
        """Merge ``gaps`` (each counted once) into the multiset: counted now, merged with the others once the
        distinct values waiting outnumber ``max(PENDING, distinct values merged)``."""
        v, c = np.unique(np.asarray(gaps, np.float64).ravel(), return_counts=True)
        self._pend.append((v, c))
        self._n_pend += v.size
        if self._n_pend > max(self.PENDING, self._values.size):
            self._merge()

    def _merge(self) -> None:
        if not self._pend:
            return
        v = np.concatenate([self._values, *(p[0] for p in self._pend)])
        c = np.concatenate([self._counts, *(p[1] for p in self._pend)])
        self._pend, self._n_pend = [], 0
        u, inv = np.unique(v, return_inverse=True)
        self._values, self._counts = u, np.bincount(inv.ravel(), weights=c, minlength=u.size).astype(np.int64)

    def _at(self, k: int) -> float:
        """The ``k``-th smallest gap (0-based) of the gaps written out in full."""
        cum = np.cumsum(self.counts)
        return float(self.values[int(np.searchsorted(cum, k, side="right"))])

    def mean(self) -> float:
        return math.fsum((self.values * self.counts).tolist()) / self.n

    def std(self) -> float:
        d = self.values - self.mean()
        return math.sqrt(math.fsum((d * d * self.counts).tolist()) / self.n)

    def median(self) -> float:
        n = self.n
        if n % 2:
            return self._at(n // 2)
        return (self._at(n // 2 - 1) + self._at(n // 2)) / 2.0

    def percentile(self, q: float) -> float:
        """``numpy.percentile(gaps, q)`` (its default ``linear`` method: module docstring)."""
        n = self.n
        v = (n - 1) * float(np.true_divide(q, 100))
        if v >= n - 1:
            return self._at(n - 1)
        lo = math.floor(v)
        a, b = self._at(lo), self._at(lo + 1)
        g = v - lo
        d = b - a
        return b - d * (1 - g) if g >= 0.5 else a + d * g


def expanded(g: GapCounts) -> np.ndarray:
    """Every gap written out, sorted (tests; a day's would be tens of millions)."""
    return np.repeat(g.values, g.counts)
