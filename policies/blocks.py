"""KV block eviction under a block budget: RSBCM, LRU, FIFO, and the BlockPool that runs them."""
from __future__ import annotations

import heapq
import math
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

    def victim(self, score, depth, last_used, inserted, mask) -> int:
        """The first victim among ``mask``ed entries in one O(n) pass.

        Equals ``victim_order(...)[0]`` restricted to ``mask`` when ``inserted`` has no ties
        (the pool's insertion counter), which is all the pool needs.
        """
        key = np.where(mask, self._primary(score, depth, last_used, inserted), np.inf)
        best = key.min()
        return int(np.argmin(np.where(mask & (key == best), inserted, np.inf)))

    def _primary(self, score, depth, last_used, inserted) -> np.ndarray:
        raise NotImplementedError

    def evict_key(self, score: float, depth: float, last_used: float, inserted: float) -> tuple:
        """The eviction rank of one block as a tuple: the smallest key is evicted first.

        The scalar form of :meth:`victim_order` (same primary key, then the older insertion);
        block managers that keep their evictable blocks in a heap (``sim.kvcache``) rank with it.
        """
        p = float(self._primary(np.array([score], np.float64), np.array([depth], np.float64),
                                np.array([last_used], np.float64), np.array([inserted], np.float64))[0])
        return (p, float(inserted))

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
    choices: ClassVar[dict[str, tuple[str, ...]]] = {'score_source': ('given', 'unscored')}
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

    def _primary(self, score, depth, last_used, inserted):
        return self.omega(score, depth)

    def evict_key(self, score, depth, last_used, inserted) -> tuple:
        if depth < 0:
            raise self._fail("depth", "must be >= 0")
        s = float(self.unscored_value) if self.score_source == "unscored" else float(score)
        return (s / (float(depth) + 1.0), float(inserted))


@register
@dataclass
class LRU(_BlockPolicy):
    """Least recently used first (vLLM / SGLang default); ties: older insertion, lower id."""

    name: ClassVar[str] = "lru"

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        n = len(ids)
        return np.lexsort((_id_ranks(ids), self._vec("inserted", inserted, n),
                           self._vec("last_used", last_used, n)))

    def _primary(self, score, depth, last_used, inserted):
        return last_used

    def evict_key(self, score, depth, last_used, inserted) -> tuple:
        return (float(last_used), float(inserted))


@register
@dataclass
class FIFO(_BlockPolicy):
    """First in, first out (oldest insertion first); ties: lower id."""

    name: ClassVar[str] = "fifo"

    def victim_order(self, ids, score, depth, last_used, inserted) -> np.ndarray:
        n = len(ids)
        return np.lexsort((_id_ranks(ids), self._vec("inserted", inserted, n)))

    def _primary(self, score, depth, last_used, inserted):
        return inserted

    def evict_key(self, score, depth, last_used, inserted) -> tuple:
        return (float(inserted), float(inserted))


class BlockPool:
    """A KV block pool holding at most ``budget_blocks`` blocks, evicting with ``policy``.

    ``access`` returns True on a hit; on a miss the block is (re)inserted — the caller
    computes (or recomputes) its KV — after evicting the policy's first victim if the pool
    is full. ``refetches`` counts misses on blocks that had been evicted before: recompute
    that the eviction policy caused. Blocks can be pinned (in use by a running step), in
    which case they are never chosen as victims; a pool whose blocks are all pinned
    cannot admit a new block and ``access`` raises PolicyError.

    Resident blocks live in slots of numpy arrays, so choosing a victim is one O(blocks
    held) pass (``policy.victim``, equal to ``victim_order(...)[0]``); the arrays grow with
    the blocks held, never to the budget's size (a budget of 10^9 blocks allocates nothing).
    """

    MAX_BUDGET = 1 << 40  # bound on budget_blocks (memory grows with the blocks held, never with the budget)

    def __init__(self, budget_blocks: int, policy: _BlockPolicy):
        if isinstance(budget_blocks, bool) or not isinstance(budget_blocks, (int, np.integer, float)) \
                or int(budget_blocks) != budget_blocks or not 0 <= budget_blocks <= self.MAX_BUDGET:
            raise PolicyError(f"BlockPool: budget_blocks: must be an integer in 0..{self.MAX_BUDGET}, "
                              f"got {budget_blocks!r}")
        if not isinstance(policy, _BlockPolicy):
            raise PolicyError(f"BlockPool: policy: must be a block policy (rsbcm, lru, fifo), got {policy!r}")
        self.budget = int(budget_blocks)
        self.policy = policy
        self._slot: dict[Hashable, int] = {}          # resident id -> slot
        # Slot arrays grow (doubling) with the blocks held, up to the budget: memory is proportional to use.
        n = min(self.budget, 64)
        self._ids: list[Hashable | None] = [None] * n
        self._free = list(range(n))                   # heap of free slots, lowest first
        self._score = np.zeros(n)
        self._depth = np.zeros(n)
        self._last = np.zeros(n)
        self._ins = np.full(n, np.inf)                # insertion counter; inf = empty slot
        self._pinned = np.zeros(n, bool)
        self._evicted: set[Hashable] = set()
        self._seq = 0
        self.evictions = 0
        self.refetches = 0
        self.hits = 0
        self.misses = 0
        self.peak = 0
        self.evicted_log: list[tuple[Hashable, float]] = []  # (block id, time) per eviction

    def _grow(self) -> None:
        """Double the slot arrays (never past the budget)."""
        old = len(self._ids)
        new = min(self.budget, max(2 * old, 64))
        add = new - old
        self._ids.extend([None] * add)
        for name, fill in (("_score", 0.0), ("_depth", 0.0), ("_last", 0.0), ("_ins", np.inf)):
            setattr(self, name, np.concatenate([getattr(self, name), np.full(add, fill)]))
        self._pinned = np.concatenate([self._pinned, np.zeros(add, bool)])
        for i in range(old, new):
            heapq.heappush(self._free, i)

    @property
    def size(self) -> int:
        return len(self._slot)

    def __contains__(self, block_id: Hashable) -> bool:
        return block_id in self._slot

    def blocks(self) -> list[Hashable]:
        return list(self._slot)

    def access(self, block_id: Hashable, score: float = 0.0, depth: int = 0, now: float = 0.0) -> bool:
        """Touch a block: True = hit, False = miss (the caller computes its KV)."""
        if not (math.isfinite(score) and math.isfinite(now)):
            raise PolicyError(f"BlockPool: score/now: must be finite, got score={score!r}, now={now!r}")
        if depth < 0:
            raise PolicyError(f"BlockPool: depth: must be >= 0, got {depth!r}")
        i = self._slot.get(block_id)
        if i is not None:
            self._score[i], self._depth[i], self._last[i] = score, depth, now
            self.hits += 1
            return True
        self.misses += 1
        if block_id in self._evicted:
            self.refetches += 1
            self._evicted.discard(block_id)
        if self.budget == 0:
            return False  # nothing can be held: computed, used, dropped
        if not self._free and len(self._ids) < self.budget:
            self._grow()
        if not self._free:
            self._evict_one(now)
        i = heapq.heappop(self._free)
        self._slot[block_id] = i
        self._ids[i] = block_id
        # "inserted" is an insertion counter: older insertion = smaller, never tied.
        self._score[i], self._depth[i], self._last[i], self._ins[i] = score, depth, now, self._seq
        self._seq += 1
        self.peak = max(self.peak, len(self._slot))
        return False

    def update(self, block_id: Hashable, score: float | None = None, depth: int | None = None) -> None:
        """Change a resident block's score or depth (e.g. once its branch is verified)."""
        i = self._slot.get(block_id)
        if i is None:
            return
        if score is not None:
            self._score[i] = score
        if depth is not None:
            self._depth[i] = depth

    def pin(self, block_id: Hashable) -> None:
        """Protect a resident block from eviction (no effect on absent blocks)."""
        i = self._slot.get(block_id)
        if i is not None:
            self._pinned[i] = True

    def unpin(self, block_id: Hashable) -> None:
        i = self._slot.get(block_id)
        if i is not None:
            self._pinned[i] = False

    def free(self, block_id: Hashable) -> bool:
        """Release a block that is no longer needed (not an eviction). True if it was held."""
        i = self._slot.pop(block_id, None)
        if i is None:
            return False
        self._release(i)
        return True

    def _release(self, i: int) -> None:
        self._ids[i] = None
        self._ins[i] = np.inf
        self._pinned[i] = False
        heapq.heappush(self._free, i)

    def _evict_one(self, now: float) -> None:
        movable = ~self._pinned & np.isfinite(self._ins)
        if not movable.any():
            raise PolicyError(f"BlockPool: budget_blocks: all {self.budget} blocks are pinned; cannot admit another")
        i = self.policy.victim(self._score, self._depth, self._last, self._ins, movable)
        victim = self._ids[i]
        del self._slot[victim]
        self._release(i)
        self._evicted.add(victim)
        self.evictions += 1
        self.evicted_log.append((victim, float(now)))

    def stats(self) -> dict[str, int]:
        return {"evictions": self.evictions, "refetches": self.refetches, "hits": self.hits,
                "misses": self.misses, "peak": self.peak, "size": self.size}
