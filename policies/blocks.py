"""KV block eviction orders under a block budget: RSBCM, LRU, FIFO (run by ``sim.serving.kvcache.BlockManager``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import PolicyBase, PolicyError, register


def _id_ranks(ids) -> np.ndarray:
    """Ranks of block ids for the final tie-break (numeric order, else order of repr)."""
    arr = np.asarray(ids)
    if arr.ndim == 1 and arr.dtype.kind in "iuf":
        return arr.astype(np.float64)
    keys = [(type(i).__name__, repr(i)) for i in ids]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    ranks = np.empty(len(keys), dtype=np.float64)
    ranks[order] = np.arange(len(keys))
    return ranks


class BlockPolicyBase(PolicyBase):
    kind: ClassVar[str] = "block"
    # True when evict_key's order is the order blocks were released in (its first field is ``last_used``, a
    # fresh tick at every release, whatever the score): the block manager then keeps a release-ordered queue
    # instead of a heap (vLLM's FreeKVCacheBlockQueue), with the same victims
    release_ordered: ClassVar[bool] = False

    def evict_key(self, score: float, depth: float, last_used: float, inserted: float) -> tuple:
        """The eviction rank of one block as a tuple: the smallest key is evicted first.

        A block policy states its order here and only here: ``victim_order`` sorts by it, and
        the block manager (``sim.serving.kvcache.BlockManager``) keeps its evictable blocks in a heap of it.
        """
        raise NotImplementedError

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        """Indices into the given blocks, first = evict first: by :meth:`evict_key`, then the lower block id."""
        n = len(ids)
        cols = [self._vec(name, x, n) for name, x in
                (("score", score), ("depth", depth), ("last_used", last_used), ("inserted", inserted))]
        ranks = _id_ranks(ids) if n else np.zeros(0)
        keys = [self.evict_key(*(float(c[i]) for c in cols)) + (float(ranks[i]),) for i in range(n)]
        return np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)

    @staticmethod
    def _vec(name: str, x, n: int) -> np.ndarray:
        a = np.asarray(x, dtype=np.float64)
        if a.shape != (n,):
            raise PolicyError(f"block policy: {name}: must have shape ({n},), got {a.shape}")
        if n and np.isnan(a).any():
            raise PolicyError(f"block policy: {name}: contains NaN")
        return a


@register
@dataclass
class RSBCM(BlockPolicyBase):
    """Reasoning-selective block cache manager (DESIGN §4).

    Each KV block carries (branch score, tree depth); under the budget the block with the
    lowest::

        omega = branch_score / (depth + 1)

    is evicted first; ties go to the older insertion, then the lower block id.

    Parameters
    ----------
    score_source : {"given", "unscored"}, default "given"
        "unscored" reproduces the RKSC public code, which never fills in the branch
        score: every block's score is ``unscored_value`` whatever the caller passes, so
        omega only depends on depth (with the default 0 every omega ties and RSBCM
        degenerates to FIFO; with a positive value the deepest blocks go first).
    unscored_value : float, default 0.0
        The constant score of the "unscored" mode.
    """

    name: ClassVar[str] = "rsbcm"
    choices: ClassVar[dict[str, tuple[str, ...]]] = {'score_source': ('given', 'unscored')}
    score_source: str = "given"
    unscored_value: float = 0.0
    domains: ClassVar[dict[str, tuple]] = {
        "unscored_value": (None, None, "", "score_source=unscored only: every block's constant score")}

    def __post_init__(self) -> None:
        self._check_choice("score_source", ("given", "unscored"))
        self._check_number("unscored_value")

    def omega(self, score, depth) -> np.ndarray:
        """``omega = score / (depth + 1)`` (score replaced by ``unscored_value`` if "unscored")."""
        s = np.asarray(score, dtype=np.float64)
        d = np.asarray(depth, dtype=np.float64)
        if (d < 0).any():
            raise self._fail("depth", "must be >= 0")
        if self.score_source == "unscored":
            s = np.full(np.broadcast(s, d).shape, float(self.unscored_value))
        return s / (d + 1.0)

    def evict_key(self, score, depth, last_used, inserted) -> tuple:
        if depth < 0:
            raise self._fail("depth", "must be >= 0")
        s = float(self.unscored_value) if self.score_source == "unscored" else float(score)
        return (s / (float(depth) + 1.0), float(inserted))


@register
@dataclass
class LRU(BlockPolicyBase):
    """Least recently used first (vLLM / SGLang default); ties: older insertion, lower id."""

    name: ClassVar[str] = "lru"
    release_ordered: ClassVar[bool] = True

    def evict_key(self, score, depth, last_used, inserted) -> tuple:
        return (float(last_used), float(inserted))


@register
@dataclass
class FIFO(BlockPolicyBase):
    """First in, first out (oldest insertion first); ties: lower id."""

    name: ClassVar[str] = "fifo"

    def evict_key(self, score, depth, last_used, inserted) -> tuple:
        return (float(inserted), float(inserted))
