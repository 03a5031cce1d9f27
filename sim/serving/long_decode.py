"""A long decode under token eviction (VASE): the cache its steps attend over, read by the engine's pricing
(``sim.cost.pricing.StepPricer.item``) and the block manager's reservation (``Request.kv_cap``)."""
from __future__ import annotations

import numpy as np


class LongDecode:
    """A long decode under token eviction: the cache its steps attend over and the eviction costs.

    ``sizes[i]``: keys the query at position ``prompt_len + i`` attends over (itself included);
    ``evict_s[t]``: seconds of scoring the candidates at the eviction of position ``t``;
    ``window_s[t]``: seconds the step at position ``t`` adds where its sliding-window layers read more keys
    than the policy's cache (eviction runs on the full-attention layers only; ``sim.replay.mode_token``);
    ``cap``: the most tokens of KV the sequence ever holds (its block reservation).
    """

    def __init__(self, prompt_len: int, sizes, evict_s: dict, window_s: dict | None = None):
        self.P = int(prompt_len)
        self.sizes = np.asarray(sizes, np.int64)
        self.evict_s = dict(evict_s)
        self.window_s = dict(window_s or {})
        self.cap = int(max(int(self.sizes.max()) if self.sizes.size else 0, self.P))

    def extra_s(self, c: int) -> float:
        """Seconds the step at position ``c`` adds beyond its priced forward: eviction scoring and window reads."""
        return self.evict_s.get(c, 0.0) + self.window_s.get(c, 0.0)

    def context(self, c: int) -> int:
        i = c - self.P
        if 0 <= i < self.sizes.size:
            return int(self.sizes[i]) - 1
        return c
