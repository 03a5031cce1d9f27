"""A long decode under token eviction (VASE): the cache its steps attend over, read by the engine's pricing
(``sim.cost.pricing.StepPricer.item``) and the block manager's reservation (``Request.kv_cap``)."""
from __future__ import annotations

import numpy as np


class LongDecode:
    """A long decode under token eviction: the cache its steps attend over and the eviction costs.

    ``sizes[i]``: keys the query at position ``prompt_len + i`` attends over (itself included);
    ``evict_s[t]``: seconds of scoring the candidates at the eviction of position ``t``;
    ``cap``: the most tokens of KV the sequence ever holds (its block reservation).
    """

    def __init__(self, prompt_len: int, sizes, evict_s: dict):
        self.P = int(prompt_len)
        self.sizes = np.asarray(sizes, np.int64)
        self.evict_s = dict(evict_s)
        self.cap = int(max(int(self.sizes.max()) if self.sizes.size else 0, self.P))

    def context(self, c: int) -> int:
        i = c - self.P
        if 0 <= i < self.sizes.size:
            return int(self.sizes[i]) - 1
        return c
