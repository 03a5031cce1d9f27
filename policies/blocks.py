"""KV block eviction under a block budget: RSBCM, LRU, FIFO, and the BlockPool that runs them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Hashable

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


class _BlockPolicy(PolicyBase):
    kind: ClassVar[str] = "block"

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        """Indices into the given blocks, first = evict first (deterministic)."""
        raise NotImplementedError

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
class RSBCM(_BlockPolicy):
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
    score_source: str = "given"
    unscored_value: float = 0.0

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

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        n = len(ids)
        om = self.omega(self._vec("score", score, n), self._vec("depth", depth, n))
        ins = self._vec("inserted", inserted, n)
        return np.lexsort((_id_ranks(ids), ins, om))


@register
@dataclass
class LRU(_BlockPolicy):
    """Least recently used first (vLLM / SGLang default); ties: older insertion, lower id."""

    name: ClassVar[str] = "lru"

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        n = len(ids)
        return np.lexsort((_id_ranks(ids), self._vec("inserted", inserted, n),
                           self._vec("last_used", last_used, n)))


@register
@dataclass
class FIFO(_BlockPolicy):
    """First in, first out (oldest insertion first); ties: lower id."""

    name: ClassVar[str] = "fifo"

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        n = len(ids)
        return np.lexsort((_id_ranks(ids), self._vec("inserted", inserted, n)))


class BlockPool:
    """A KV block pool holding at most ``budget_blocks`` blocks, evicting with ``policy``.

    ``access`` returns True on a hit; on a miss the block is (re)inserted — the caller
    computes (or recomputes) its KV — after evicting the policy's first victims if the pool
    is full. ``refetches`` counts misses on blocks that had been evicted before: recompute
    that the eviction policy caused. Blocks can be pinned (in use by a running step), in
    which case they are never chosen as victims; a pool whose blocks are all pinned
    cannot admit a new block and ``access`` raises PolicyError.
    """

    def __init__(self, budget_blocks: int, policy: _BlockPolicy):
        if isinstance(budget_blocks, bool) or int(budget_blocks) != budget_blocks or budget_blocks < 0:
            raise PolicyError(f"BlockPool: budget_blocks: must be an integer >= 0, got {budget_blocks!r}")
        if not isinstance(policy, _BlockPolicy):
            raise PolicyError(f"BlockPool: policy: must be a block policy (rsbcm, lru, fifo), got {policy!r}")
        self.budget = int(budget_blocks)
        self.policy = policy
        self._meta: dict[Hashable, list[float]] = {}  # id -> [score, depth, last_used, insertion no.]
        self._pinned: set[Hashable] = set()
        self._evicted: set[Hashable] = set()
        self._seq = 0
        self.evictions = 0
        self.refetches = 0
        self.hits = 0
        self.misses = 0
        self.peak = 0
        self.evicted_log: list[tuple[Hashable, float]] = []  # (block id, time) per eviction

    @property
    def size(self) -> int:
        return len(self._meta)

    def __contains__(self, block_id: Hashable) -> bool:
        return block_id in self._meta

    def blocks(self) -> list[Hashable]:
        return list(self._meta)

    def access(self, block_id: Hashable, score: float = 0.0, depth: int = 0, now: float = 0.0) -> bool:
        """Touch a block: True = hit, False = miss (the caller computes its KV)."""
        if not np.isfinite(score) or not np.isfinite(now):
            raise PolicyError(f"BlockPool: score/now: must be finite, got score={score!r}, now={now!r}")
        if depth < 0:
            raise PolicyError(f"BlockPool: depth: must be >= 0, got {depth!r}")
        meta = self._meta.get(block_id)
        if meta is not None:
            meta[0], meta[1], meta[2] = float(score), float(depth), float(now)
            self.hits += 1
            return True
        self.misses += 1
        if block_id in self._evicted:
            self.refetches += 1
            self._evicted.discard(block_id)
        if self.budget == 0:
            return False  # nothing can be held: computed, used, dropped
        while len(self._meta) >= self.budget:
            self._evict_one(now)
        # "inserted" is an insertion counter: older insertion = smaller, never tied.
        self._meta[block_id] = [float(score), float(depth), float(now), float(self._seq)]
        self._seq += 1
        self.peak = max(self.peak, len(self._meta))
        return False

    def update(self, block_id: Hashable, score: float | None = None, depth: int | None = None) -> None:
        """Change a resident block's score or depth (e.g. once its branch is verified)."""
        meta = self._meta.get(block_id)
        if meta is None:
            return
        if score is not None:
            meta[0] = float(score)
        if depth is not None:
            meta[1] = float(depth)

    def pin(self, block_id: Hashable) -> None:
        self._pinned.add(block_id)

    def unpin(self, block_id: Hashable) -> None:
        self._pinned.discard(block_id)

    def free(self, block_id: Hashable) -> bool:
        """Release a block that is no longer needed (not an eviction). True if it was held."""
        self._pinned.discard(block_id)
        return self._meta.pop(block_id, None) is not None

    def _evict_one(self, now: float) -> None:
        ids = [i for i in self._meta if i not in self._pinned]
        if not ids:
            raise PolicyError(f"BlockPool: budget_blocks: all {self.budget} blocks are pinned; cannot admit another")
        m = np.array([self._meta[i] for i in ids], dtype=np.float64)
        order = self.policy.victim_order(ids, m[:, 0], m[:, 1], m[:, 2], m[:, 3])
        victim = ids[int(order[0])]
        del self._meta[victim]
        self._evicted.add(victim)
        self.evictions += 1
        self.evicted_log.append((victim, float(now)))

    def stats(self) -> dict[str, int]:
        return {"evictions": self.evictions, "refetches": self.refetches, "hits": self.hits,
                "misses": self.misses, "peak": self.peak, "size": self.size}
