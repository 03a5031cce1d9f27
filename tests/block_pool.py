"""A test double of a KV block pool: budgeted blocks evicted in a block policy's order.

The simulator's block pool is ``sim.serving.kvcache.BlockManager``; this small pool exercises a
policy's :meth:`evict_key` order alone (hits, misses, refetches, pinning) in the policy tests.
"""
from __future__ import annotations

import heapq
import math
from typing import Hashable

import numpy as np

from policies import PolicyError
from policies.blocks import BlockPolicyBase


class BlockPool:
    """A KV block pool holding at most ``budget_blocks`` blocks, evicting with ``policy``.

    ``access`` returns True on a hit; on a miss the block is (re)inserted — the caller
    computes (or recomputes) its KV — after evicting the policy's first victim if the pool
    is full. ``refetches`` counts misses on blocks that had been evicted before: recompute
    that the eviction policy caused. Blocks can be pinned (in use by a running step), in
    which case they are never chosen as victims; a pool whose blocks are all pinned
    cannot admit a new block and ``access`` raises PolicyError.

    The victim is the movable block with the smallest ``policy.evict_key`` (the first of
    ``victim_order``); the slot arrays grow with the blocks held, never to the budget's size.
    """

    MAX_BUDGET = 1 << 40  # bound on budget_blocks (memory grows with the blocks held, never with the budget)

    def __init__(self, budget_blocks: int, policy: BlockPolicyBase):
        if isinstance(budget_blocks, bool) or not isinstance(budget_blocks, (int, np.integer, float)) \
                or int(budget_blocks) != budget_blocks or not 0 <= budget_blocks <= self.MAX_BUDGET:
            raise PolicyError(f"BlockPool: budget_blocks: must be an integer in 0..{self.MAX_BUDGET}, "
                              f"got {budget_blocks!r}")
        if not isinstance(policy, BlockPolicyBase):
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
        key = self.policy.evict_key
        i = min(np.flatnonzero(movable), key=lambda j: key(float(self._score[j]), float(self._depth[j]),
                                                            float(self._last[j]), float(self._ins[j])))
        victim = self._ids[i]
        del self._slot[victim]
        self._release(i)
        self._evicted.add(victim)
        self.evictions += 1
        self.evicted_log.append((victim, float(now)))

    def stats(self) -> dict[str, int]:
        return {"evictions": self.evictions, "refetches": self.refetches, "hits": self.hits,
                "misses": self.misses, "peak": self.peak, "size": self.size}
