"""The one decode loop that drives every token-eviction policy over a layer's K, V, Q."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .base import PolicyError
from .token_scoring import softmax_last, window_logits
from .tokens import TokenPolicy


@dataclass
class EvictionResult:
    """Which cached tokens each KV head keeps over one decode.

    ``steps[i] = (t, kept)``: after the eviction at position ``t`` the cache holds the
    positions ``kept`` (H_kv, budget + buffer), ascending per head. Between evictions the
    new tokens are appended, so the query at position ``t'`` sees
    ``kept ∪ {t + 1 .. t'}`` of the latest eviction at ``t <= t'``.
    """

    prompt_len: int
    seq_len: int
    n_kv_heads: int
    steps: list[tuple[int, np.ndarray]] = field(default_factory=list)
    kept_final: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    event_positions: list[int] = field(default_factory=list)  # kept even with record=False
    size_after_eviction: int = 0                                # budget + buffer

    @property
    def n_evictions(self) -> int:
        return len(self.event_positions)

    def kept_at(self, t: int) -> np.ndarray:
        """(H_kv, n) positions visible to the query at position ``t``."""
        if not 0 <= t < self.seq_len:
            raise PolicyError(f"kept_at: t: must be in 0..{self.seq_len - 1}, got {t}")
        if len(self.steps) != len(self.event_positions):
            raise PolicyError("kept_at: the run was made with record=False; rerun with record=True")
        i = int(np.searchsorted(self.event_positions, t, side="right")) - 1
        if i < 0:
            return np.tile(np.arange(t + 1, dtype=np.int64), (self.n_kv_heads, 1))
        e, kept = self.steps[i]
        tail = np.tile(np.arange(e + 1, t + 1, dtype=np.int64), (self.n_kv_heads, 1))
        return np.concatenate([kept, tail], axis=1)

    def cache_sizes(self) -> np.ndarray:
        """Cache length (per head) seen by each decode query, positions prompt_len..T-1."""
        t = np.arange(self.prompt_len, self.seq_len)
        out = t + 1
        if self.event_positions:
            ev = np.asarray(self.event_positions)
            i = np.searchsorted(ev, t, side="right") - 1      # latest eviction at or before t
            after = i >= 0
            out[after] = self.size_after_eviction + (t[after] - ev[i[after]])
        return out


def _check_inputs(pol: TokenPolicy, K, V, Q, prompt_len: int):
    K = pol._array("K", K, ndim=3)
    T, H, D = K.shape
    V = pol._array("V", V, ndim=3, shape=(T, H, D))
    Q = pol._array("Q", Q, ndim=3, shape=(T, None, D))
    if Q.shape[1] == 0 or Q.shape[1] % H:
        raise pol._fail("Q", f"query heads ({Q.shape[1]}) must be a positive multiple of KV heads ({H})")
    if isinstance(prompt_len, bool) or int(prompt_len) != prompt_len or not 0 <= prompt_len <= T:
        raise pol._fail("prompt_len", f"must be an integer in 0..{T}, got {prompt_len!r}")
    return K, V, Q, int(prompt_len)


def gather_rows(X: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """X (T, H, D) at per-head positions pos (H, n) -> (n, H, D)."""
    return X[pos.T, np.arange(pos.shape[0])[None, :]]


def observe(pol: TokenPolicy, state, K, Q, cache: np.ndarray, q_from: int, q_to: int,
             chunk: int = 256) -> None:
    """Feed H2O-style policies the attention of queries q_from..q_to-1 over the cache."""
    if q_to <= q_from:
        return
    Kc = gather_rows(K, cache)
    total = np.zeros(cache.shape)
    for a in range(q_from, q_to, chunk):
        b = min(a + chunk, q_to)
        p = softmax_last(window_logits(Kc, Q[a:b], cache, np.arange(a, b)))  # (H, g, w, n)
        total += p.sum(axis=(1, 2))
    pol.observe(state, total)


def run_token_eviction(pol: TokenPolicy, K, V, Q, prompt_len: int,
                       rng: np.random.Generator | None = None, record: bool = True) -> EvictionResult:
    """Replay one layer's decode under a token-eviction policy.

    Parameters
    ----------
    pol : a token policy from the registry.
    K, V : (T, H_kv, D) keys (post-RoPE) and values of positions 0..T-1.
    Q : (T, H_q, D) queries (post-RoPE).
    prompt_len : positions 0..prompt_len-1 are the prefilled prompt; decode steps are
        positions prompt_len..T-1.
    rng : numpy Generator for stochastic policies (the only source of randomness).
    record : keep every eviction's kept set (needed by ``kept_at`` and the metrics).

    Schedule (DESIGN §4): at decode position t with ``s = t - prompt_len + 1`` generated
    tokens, if ``s % buffer == 0`` and the cache holds more than ``budget + buffer``
    tokens, the candidates (all but the last ``buffer``) are cut to ``budget`` per KV head
    by ``pol.select``; the query at t already sees the reduced cache.
    """
    if not isinstance(pol, TokenPolicy):
        raise PolicyError(f"run_token_eviction: pol: {getattr(pol, 'name', pol)!r} is not a token-eviction policy")
    K, V, Q, P = _check_inputs(pol, K, V, Q, prompt_len)
    T, H, _ = K.shape
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise pol._fail("rng", f"must be a numpy.random.Generator, got {type(rng).__name__}")
    res = EvictionResult(prompt_len=P, seq_len=T, n_kv_heads=H)
    cache = np.tile(np.arange(P, dtype=np.int64), (H, 1))
    last = P - 1          # newest position in the cache
    state = pol.init_state(H, P)
    pending = 0           # first query whose attention is not yet observed (H2O)
    B = pol.buffer
    if pol.evicts:
        for t in range(P - 1 + B, T, B):
            cache = np.concatenate([cache, np.tile(np.arange(last + 1, t + 1), (H, 1))], axis=1)
            last = t
            n = cache.shape[1]
            if not pol.should_evict(n, t - P + 1):
                continue
            if pol.needs_history:
                observe(pol, state, K, Q, cache, pending, t)
                pending = t
            cand = n - B
            w = min(pol.window, t + 1)
            keep = pol.select(gather_rows(K, cache), gather_rows(V, cache), Q[t + 1 - w: t + 1], cand, rng, state,
                              k_pos=cache, q_pos=np.arange(t + 1 - w, t + 1))
            slots = np.concatenate([keep, np.tile(np.arange(cand, n), (H, 1))], axis=1)
            cache = np.take_along_axis(cache, slots, axis=1)
            pol.compact(state, slots)
            res.event_positions.append(t)
            res.size_after_eviction = cache.shape[1]
            if record:
                res.steps.append((t, cache.copy()))
    tail = np.tile(np.arange(last + 1, T, dtype=np.int64), (H, 1))
    res.kept_final = np.concatenate([cache, tail], axis=1)
    if not record and res.event_positions:
        res.steps = []
    return res
