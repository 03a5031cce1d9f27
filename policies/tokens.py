"""Token eviction for long decodes: VASE-AttnV, VASE-DKV and the baselines (DESIGN §4).

Every policy here shares one schedule (run by :func:`policies.token_loop.run_token_eviction`
in the simulator and by the real runner's cache): a persistent budget ``budget`` (K) and a
recent buffer ``buffer`` (B). During decode, when the cache holds more than K + B tokens
and the number of generated tokens is a multiple of B, the candidates (every cached token
but the last B) are cut to K per KV head by :meth:`TokenPolicy.select`. What differs is
how the K are chosen:

1. the first ``sinks`` candidates (attention sinks) are always kept;
2. VASE only: the ``n_value`` candidates with the largest value range
   ``max(v) - min(v)`` over the head dimension are kept;
3. the rest are the top-k of the policy's score (deterministic policies) or drawn without
   replacement with probability ∝ ``score ** (1 / temperature)`` (stochastic ones),
   computed in log space as ``log(score) / temperature`` (Gumbel-top-k).

Stochastic choices draw from the ``numpy.random.Generator`` passed in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .base import PolicyBase, register
from .token_scoring import (avg_pool, gumbel_top_k, max_pool, sample_without_replacement, softmax_last,
                            top_k, window_logits)


@dataclass
class TokenPolicy(PolicyBase):
    """Common parameters and the selection skeleton of every token-eviction policy.

    Parameters
    ----------
    budget : int, default 128
        K, tokens kept per KV head at each eviction (besides the recent buffer).
    buffer : int, default 16
        B, recent tokens never evicted; also the eviction period in decode steps.
    sinks : int
        Leading tokens always kept (policy-specific default).
    window : int
        Observation window: how many of the latest queries score an eviction
        (policy-specific; 0 = none needed). The real runner keeps this many queries.
    """

    kind: ClassVar[str] = "token"
    evicts: ClassVar[bool] = True           # False: never evicts (full cache)
    stochastic: ClassVar[bool] = False      # draws from the generator
    needs_history: ClassVar[bool] = False   # needs observe() with every step's attention

    budget: int = 128
    buffer: int = 16
    sinks: int = 4
    window: int = 0
    domains: ClassVar[dict[str, tuple]] = {
        "budget": (1, None, "tokens", "kept per KV head at each eviction, besides the recent buffer"),
        "buffer": (1, None, "tokens", "recent tokens never evicted; also the eviction period (decode steps)"),
        "sinks": (0, None, "tokens", "leading tokens always kept (at most budget)"),
        "window": (0, None, "queries", "latest queries that score an eviction"),
        "kernel": (1, None, "tokens", "width of the score's 1-d pooling"),
        "mix_lambda": (0.0, 1.0, "fraction", "weight of the redundancy term"),
        "threshold": (-1.0, 1.0, "cosine similarity", "keys more similar than this count as redundant"),
        "rank": (0, None, "columns", "columns of the Gaussian projection; 0 = none"),
        "g_seed": (0, None, "seed", "seed of the Gaussian projection"),
        "local_window": (0, None, "tokens", "leverage normalisation window; 0 = all candidates"),
        "value_frac": (0.0, 1.0, "fraction", "share of the budget chosen by value norm"),
        "n_value": (0, None, "tokens", "tokens chosen by value norm (overrides value_frac)"),
        "temperature": (0.0, None, "", "sampling temperature of the scores (> 0)"),
    }

    def __post_init__(self) -> None:
        self._check_number("budget", lo=1, integer=True)
        self._check_number("buffer", lo=1, integer=True)
        self._check_number("sinks", lo=0, integer=True)
        self._check_number("window", lo=0, integer=True)
        if self.sinks > self.budget:
            raise self._fail("sinks", f"({self.sinks}) must not exceed budget ({self.budget})")

    # ---- state hooks (only H2O uses them) --------------------------------------------
    def init_state(self, n_kv_heads: int, n_cached: int) -> dict[str, Any]:
        """Per-sequence state; ``n_cached`` tokens are cached when decoding starts."""
        return {}

    def observe(self, state: dict[str, Any], attn: np.ndarray) -> None:
        """Accumulate attention received by each cache slot, ``attn`` (H_kv, n_cache)."""

    def compact(self, state: dict[str, Any], slots: np.ndarray) -> None:
        """Re-index the state after an eviction: ``slots`` (H_kv, n_new) are old slot indices."""

    # ---- the decision ----------------------------------------------------------------
    def should_evict(self, cache_len: int, generated: int) -> bool:
        """The shared schedule: evict when ``generated % buffer == 0`` and ``cache_len > budget + buffer``.

        ``cache_len``: tokens cached (per head) after appending the current token;
        ``generated``: decode tokens so far, the current one included.
        """
        return (self.evicts and generated > 0 and generated % self.buffer == 0
                and cache_len > self.budget + self.buffer)

    def reserved_values(self) -> int:
        """N_v, candidates kept for their value range (0 except VASE)."""
        return 0

    def scores(self, K: np.ndarray, V: np.ndarray, Q: np.ndarray, cand_len: int,
               k_pos: np.ndarray, q_pos: np.ndarray, rng: np.random.Generator,
               state: dict[str, Any]) -> np.ndarray:
        """(H_kv, cand_len) non-negative score per candidate (higher = keep)."""
        raise NotImplementedError

    def select(self, K: np.ndarray, V: np.ndarray, Q_window: np.ndarray, cand_len: int,
               rng: np.random.Generator | None = None, state: dict[str, Any] | None = None,
               k_pos: np.ndarray | None = None, q_pos: np.ndarray | None = None) -> np.ndarray:
        """One eviction decision: which ``budget`` of the first ``cand_len`` cache slots to keep.

        Parameters
        ----------
        K, V : (n, H_kv, D) the cache of one layer in slot order (oldest first).
        Q_window : (w, H_q, D) the latest queries, oldest first; only the last ``window``
            are used (may be empty when the policy's window is 0).
        cand_len : int, candidates are slots ``0 .. cand_len - 1`` (all but the recent buffer).
        rng : numpy Generator (required by stochastic policies).
        state : the dict from :meth:`init_state` (H2O).
        k_pos, q_pos : absolute positions of the cache slots ((n,) or per head (H_kv, n))
            and of the queries, for the causal mask; default: the queries are the last
            ``w`` slots.

        Returns
        -------
        (H_kv, min(budget, cand_len)) int64 slot indices, ascending per head.
        """
        K = self._array("K", K, ndim=3)
        n, H, D = K.shape
        V = self._array("V", V, ndim=3, shape=(n, H, None))
        Qw = self._array("Q_window", Q_window, ndim=3)
        if Qw.shape[0] and (Qw.shape[1] % H or Qw.shape[2] != D):
            raise self._fail("Q_window", f"shape {Qw.shape} does not fit K's {K.shape} (H_q must be a multiple of H_kv)")
        cand_len = int(cand_len)
        if not 0 <= cand_len <= n:
            raise self._fail("cand_len", f"must be in 0..{n}, got {cand_len}")
        k_pos = np.arange(n) if k_pos is None else np.asarray(k_pos, dtype=np.int64)
        q_pos = (np.arange(n - Qw.shape[0], n) if q_pos is None else np.asarray(q_pos, dtype=np.int64))
        if k_pos.shape not in ((n,), (H, n)) or q_pos.shape != (Qw.shape[0],):
            raise self._fail("k_pos/q_pos", f"must have shapes ({n},) or ({H}, {n}), and ({Qw.shape[0]},)")
        if self.window and Qw.shape[0] > self.window:  # a runner may record more; only the latest count
            Qw, q_pos = Qw[-self.window:], q_pos[-self.window:]
        if self.stochastic and rng is None and not getattr(self, "deterministic", False):
            raise self._fail("rng", "a numpy.random.Generator is required by this stochastic policy")
        state = {} if state is None else state
        k = min(self.budget, cand_len)
        if k == cand_len:
            return np.tile(np.arange(cand_len, dtype=np.int64), (H, 1))
        allowed = np.ones((H, cand_len), bool)
        keep = np.zeros((H, cand_len), bool)
        s = min(self.sinks, k)
        keep[:, :s] = True
        allowed[:, :s] = False
        nv = min(self.reserved_values(), k - s)
        if nv > 0:
            vr = V[:cand_len].max(axis=2) - V[:cand_len].min(axis=2)  # (cand_len, H)
            idx = top_k(vr.T, nv, allowed)
            np.put_along_axis(keep, idx, True, axis=1)
            np.put_along_axis(allowed, idx, False, axis=1)
        rest = k - s - nv
        if rest > 0:
            sc = self.scores(K, V, Qw, cand_len, k_pos, q_pos, rng, state)
            if sc.shape != (H, cand_len) or not np.isfinite(sc).all():
                raise self._fail("scores", "non-finite scores (check K, V, Q for NaN or inf)")
            idx = self._pick(sc, rest, allowed, rng)
            np.put_along_axis(keep, idx, True, axis=1)
        out = np.nonzero(keep)[1].reshape(H, k)
        return out.astype(np.int64)

    def _pick(self, sc: np.ndarray, k: int, allowed: np.ndarray,
              rng: np.random.Generator | None) -> np.ndarray:
        return top_k(sc, k, allowed)


def _window_probs(K, Qw, k_pos, q_pos) -> np.ndarray:
    """Attention probabilities of the window queries over every visible cached key, (H_kv, g, w, n)."""
    return softmax_last(window_logits(K, Qw, k_pos, q_pos))


def _need_window(pol: TokenPolicy, Qw: np.ndarray) -> None:
    if Qw.shape[0] == 0:
        raise pol._fail("Q_window", "is empty; this policy scores with the latest queries")


@register
@dataclass
class FullCache(TokenPolicy):
    """No eviction: the whole cache is kept (the reference for the error metrics)."""

    name: ClassVar[str] = "full"
    evicts: ClassVar[bool] = False
    applies: ClassVar[tuple[str, ...] | None] = ()   # evicts nothing: no eviction parameter acts

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        return np.ones((K.shape[1], cand_len))


@register
@dataclass
class StreamingLLM(TokenPolicy):
    """StreamingLLM: ``sinks`` attention sinks + the most recent tokens.

    score_j = position j (newest wins); with the recent buffer the cache holds
    ``sinks`` + the latest ``budget - sinks + buffer`` tokens after every eviction.
    """

    name: ClassVar[str] = "streamingllm"
    sinks: int = 4

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        return np.tile(np.arange(cand_len, dtype=np.float64), (K.shape[1], 1))


@register
@dataclass
class RandomEviction(TokenPolicy):
    """Random: ``sinks`` + a uniform draw without replacement of the rest."""

    name: ClassVar[str] = "random"
    stochastic: ClassVar[bool] = True
    sinks: int = 4

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        return np.ones((K.shape[1], cand_len))

    def _pick(self, sc, k, allowed, rng):
        return sample_without_replacement(sc, k, allowed, rng)


@register
@dataclass
class H2O(TokenPolicy):
    """H2O (heavy hitters + recent): score_j = running sum of the attention token j received.

    ``score_j = sum_{t} sum_{h in group} a_{t,h,j}`` over every query since prefill (each
    query's attention over the cache it actually saw), summed over the GQA group. The
    recent part of H2O is the loop's buffer; ``sinks`` defaults to 0 as in H2O.
    The real runner must call :meth:`observe` after every step with the step's
    attention summed per KV head.

    Parameters
    ----------
    mean_over_queries : bool, default False
        Divide each token's sum by the number of observed queries that saw it,
        ``score_j = sum_t a_{t,j} / (n_q - p_j)`` with ``n_q`` queries observed (positions
        ``0 .. n_q - 1``, as both decode loops observe them) and ``p_j`` the token's
        position: the *mean* attention it received, as kvpress's
        ``ObservedAttentionPress`` scores. The plain sum (H2O's paper and code) favours
        old tokens, which more queries have seen; the mean does not.
    """

    name: ClassVar[str] = "h2o"
    needs_history: ClassVar[bool] = True
    sinks: int = 0
    mean_over_queries: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_bool("mean_over_queries")

    def init_state(self, n_kv_heads: int, n_cached: int) -> dict[str, Any]:
        # mass: total attention observed per KV head (never compacted) = group size * queries
        return {"acc": np.zeros((n_kv_heads, n_cached)), "mass": np.zeros(n_kv_heads)}

    def observe(self, state, attn):
        acc = state["acc"]
        n = attn.shape[1]
        if n > acc.shape[1]:
            acc = np.concatenate([acc, np.zeros((acc.shape[0], n - acc.shape[1]))], axis=1)
        acc[:, :n] += attn
        state["acc"] = acc
        state["mass"] = state.get("mass", 0.0) + attn.sum(axis=1)

    def compact(self, state, slots):
        acc = state["acc"]
        pad = int(slots.max()) + 1 - acc.shape[1] if slots.size else 0
        if pad > 0:
            acc = np.concatenate([acc, np.zeros((acc.shape[0], pad))], axis=1)
        state["acc"] = np.take_along_axis(acc, slots, axis=1)

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        acc = state.get("acc")
        if acc is None:
            raise self._fail("state", "H2O needs the accumulated attention (init_state + observe)")
        out = np.zeros((K.shape[1], cand_len))
        m = min(cand_len, acc.shape[1])
        out[:, :m] = acc[:, :m]
        if self.mean_over_queries:
            g = Q.shape[1] // K.shape[1]  # Q_window may hold no query but still has H_q heads
            if g < 1:
                raise self._fail("Q_window", "mean_over_queries needs the query head count (shape (0, H_q, D))")
            # every query softmaxes to 1 per query head: mass = g * n_q exactly up to rounding
            n_q = np.rint(np.asarray(state.get("mass", 0.0), dtype=np.float64) / g).reshape(-1, 1)
            pos = np.broadcast_to(k_pos[..., :cand_len], out.shape)
            out = out / np.maximum(n_q - pos, 1.0)
        return out


@register
@dataclass
class SnapKV(TokenPolicy):
    """SnapKV: attention of the observation window, pooled, deterministic top-k.

    ``score_j = mean_{h in group} AvgPool_k( mean_{i in window} softmax(q_i K^T / sqrt(D))_j )``
    over the last ``window`` queries (softmax over every visible cached key), average
    pooling of kernel ``kernel`` (zero padded), averaged over the GQA group.

    Parameters
    ----------
    window : int, default 32
    kernel : int, default 5
    sinks : int, default 0 (SnapKV keeps none explicitly)
    """

    name: ClassVar[str] = "snapkv"
    sinks: int = 0
    window: int = 32
    kernel: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_number("window", lo=1, integer=True)
        self._check_number("kernel", lo=1, integer=True)

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        _need_window(self, Q)
        p = _window_probs(K, Q, k_pos, q_pos)[..., :cand_len]  # (H, g, w, c)
        return avg_pool(p.mean(axis=2), self.kernel).mean(axis=1)


@register
@dataclass
class RKV(TokenPolicy):
    """R-KV: importance minus redundancy, deterministic top-k (its public code's defaults).

    ``score_j = lambda * A_j - (1 - lambda) * R_j`` where
    ``A = MaxPool_k( mean_{i in window} softmax_cand(max_{h in group} q_i K^T / sqrt(D)) )``
    (logits max-pooled over the GQA group, softmax over the candidates only) and
    ``R = softmax_j( mean_i cos(k_i, k_j) )`` over the KV head's whole cache, with the
    diagonal zeroed and, per row i, the cosine to the latest key more similar than
    ``threshold`` zeroed too (the code's ``retain_direction="last"``).

    Parameters
    ----------
    window : int, default 8
    kernel : int, default 7
    mix_lambda : float, default 0.1
    threshold : float, default 0.5
    sinks : int, default 0
    """

    name: ClassVar[str] = "rkv"
    sinks: int = 0
    window: int = 8
    kernel: int = 7
    mix_lambda: float = 0.1
    threshold: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_number("window", lo=1, integer=True)
        self._check_number("kernel", lo=1, integer=True)
        self._check_number("mix_lambda", lo=0, hi=1)
        self._check_number("threshold", lo=-1, hi=1)

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        _need_window(self, Q)
        lg = window_logits(K[:cand_len], Q, k_pos[..., :cand_len], q_pos).max(axis=1)  # (H, w, c)
        A = max_pool(softmax_last(lg).mean(axis=1), self.kernel)                 # (H, c)
        kn = K.transpose(1, 0, 2)                                                # (H, n, D)
        kn = kn / (np.linalg.norm(kn, axis=2, keepdims=True) + 1e-8)
        sim = np.matmul(kn, kn.transpose(0, 2, 1))                               # (H, n, n)
        n = sim.shape[1]
        sim[:, np.arange(n), np.arange(n)] = 0.0
        above = sim > self.threshold
        last = np.where(above, np.arange(n)[None, None, :], 0).max(axis=2)      # (H, n)
        np.put_along_axis(sim, last[..., None], 0.0, axis=2)
        R = softmax_last(sim.mean(axis=1))[:, :cand_len]
        lam = float(self.mix_lambda)
        return lam * A - (1.0 - lam) * R


def _window_normalise(x: np.ndarray, window: int) -> np.ndarray:
    """Divide each entry of ``x`` (H, n) by the sum of its window of ``window`` consecutive slots.

    Windows start at slot 0; the last one may be shorter (kvpress ``CURPress`` zero-pads it,
    which leaves its sum unchanged). ``window = 0``: one window over all ``n`` slots.
    """
    H, n = x.shape
    if window <= 0 or window >= n:
        return x / np.maximum(x.sum(axis=1, keepdims=True), 1e-300)
    m = -(-n // window) * window
    xp = np.zeros((H, m))
    xp[:, :n] = x
    xp = xp.reshape(H, m // window, window)
    xp = xp / np.maximum(xp.sum(axis=2, keepdims=True), 1e-300)
    return xp.reshape(H, m)[:, :n]


def _leverage(K: np.ndarray, V: np.ndarray, G: np.ndarray | None, window: int) -> np.ndarray:
    """CUR leverage ``lk_j * lv_j`` (kvpress ``CURPress``, ``leverage_type="kv_product"``).

    ``lk_j = ||k_j G||^2 / sum_{i in win(j)} ||k_i G||^2`` and the same for values, where
    ``win(j)`` is token j's window of ``window`` consecutive candidates (``use_local_approximation``;
    0 = all candidates) and ``G`` is the (D, rank) projection (None: none, ``||k_j||^2``).
    Normalising within local windows is what spreads the kept tokens along the sequence;
    over all candidates it is a constant factor that changes neither ranking nor sampling.
    The product is normalised over the candidates (a distribution; the order is unchanged).
    """
    if G is None:
        kg = (K.transpose(1, 0, 2) ** 2).sum(axis=2)
        vg = (V.transpose(1, 0, 2) ** 2).sum(axis=2)
    else:
        kg = (np.einsum("nhd,dr->hnr", K, G) ** 2).sum(axis=2)
        vg = (np.einsum("nhd,dr->hnr", V, G) ** 2).sum(axis=2)
    s = _window_normalise(kg, window) * _window_normalise(vg, window)
    return s / np.maximum(s.sum(axis=1, keepdims=True), 1e-300)


@register
@dataclass
class CurDKV(TokenPolicy):
    """CurDKV: CUR leverage with a fixed Gaussian projection, deterministic top-k.

    ``score_j = ||k_j G||^2 / sum_{i in win(j)} ||k_i G||^2 * ||v_j G||^2 / sum_{i in win(j)} ||v_i G||^2``
    where ``win(j)`` is j's window of ``local_window`` consecutive candidates (kvpress
    ``CURPress``: ``use_local_approximation=True, local_window_size=16``) and ``G`` (D, rank)
    is standard normal, drawn once from ``g_seed``.

    Parameters
    ----------
    rank : int, default 20
        Columns of G; 0 = no projection (leverage of K and V themselves, kvpress's default
        ``use_random_leverage=False``).
    g_seed : int, default 0
    local_window : int, default 16
        Leverage normalisation window (tokens); 0 = over all candidates (no spreading).
    sinks : int, default 4
    """

    name: ClassVar[str] = "curdkv"
    sinks: int = 4
    rank: int = 20
    g_seed: int = 0
    local_window: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_number("rank", lo=0, integer=True)
        self._check_number("g_seed", lo=0, integer=True)
        self._check_number("local_window", lo=0, integer=True)

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        G = np.random.default_rng(self.g_seed).standard_normal((K.shape[2], self.rank)) if self.rank else None
        return _leverage(K[:cand_len], V[:cand_len], G, self.local_window)


@dataclass
class _VASE(TokenPolicy):
    """Shared parameters of the VASE variants (see the subclasses for the score)."""

    stochastic: ClassVar[bool] = True
    sinks: int = 4
    value_frac: float = 0.125
    n_value: int | None = None
    temperature: float = 1.0
    deterministic: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_number("value_frac", lo=0, hi=1)
        self._check_number("temperature", lo=0, lo_open=True)
        self._check_bool("deterministic")
        if self.n_value is not None:
            self._check_number("n_value", lo=0, integer=True)
            if self.n_value > self.budget - self.sinks:
                raise self._fail("n_value", f"({self.n_value}) must not exceed budget - sinks "
                                            f"({self.budget - self.sinks})")

    def reserved_values(self) -> int:
        """N_v: ``n_value`` if set, else ``round(value_frac * budget)``, at most budget - sinks."""
        nv = self.n_value if self.n_value is not None else int(round(self.value_frac * self.budget))
        return max(0, min(nv, self.budget - self.sinks))

    def _pick(self, sc, k, allowed, rng):
        if self.deterministic:
            return top_k(sc, k, allowed)
        if (sc < 0).any():
            raise self._fail("scores", "negative scores cannot be sampled")
        # p ∝ score^(1/T) = exp(log(score) / T), in log space: score ** (1/T) underflows to 0
        # for every token at small T, which made a *lower* temperature uniformly random.
        with np.errstate(divide="ignore"):
            logw = np.log(sc) / float(self.temperature)
        return gumbel_top_k(logw, k, allowed, rng)


@register
@dataclass
class VASEAttnV(_VASE):
    """VASE-AttnV: sinks + N_v largest value ranges + sampling ∝ window attention.

    ``score_j = mean_{h in group} [AvgPool_5]( mean_{i in last B queries} softmax(q_i K^T / sqrt(D))_j )``
    (softmax over every visible cached key). Kept: the ``sinks`` first tokens, the N_v
    candidates with the largest ``max(v) - min(v)`` over the head dimension, then
    ``K - N_v - sinks`` drawn without replacement with p ∝ ``score ** (1 / temperature)``
    (Gumbel-top-k), or the top-k with ``deterministic=True``.

    Parameters
    ----------
    window : int, default 0 = the buffer B (the last B cached queries)
    pool : bool, default True (average pooling, kernel ``kernel``)
    kernel : int, default 5
    value_frac : float, default 0.125; n_value : int or None (overrides value_frac)
    temperature : float, default 1.0; deterministic : bool, default False
    sinks : int, default 4
    With ``n_value=0, deterministic=True, window=32, sinks=0`` it equals SnapKV.
    """

    name: ClassVar[str] = "vase-attnv"
    pool: bool = True
    kernel: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_bool("pool")
        self._check_number("kernel", lo=1, integer=True)
        if self.window == 0:
            self.window = self.buffer

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        _need_window(self, Q)
        p = _window_probs(K, Q, k_pos, q_pos)[..., :cand_len].mean(axis=2)
        if self.pool:
            p = avg_pool(p, self.kernel)
        return p.mean(axis=1)


@register
@dataclass
class VASEDKV(_VASE):
    """VASE-DKV: sinks + N_v largest value ranges + sampling ∝ CUR leverage.

    ``score_j`` is CurDKV's window-normalised leverage (``local_window`` tokens, as kvpress
    ``CURPress``), with ``G`` (D, rank) standard normal redrawn from the generator at every
    eviction. ``deterministic=True`` reproduces the paper's public code (top-K of the
    leverage, G still redrawn).

    Parameters
    ----------
    rank : int, default 20 (0 = no projection)
    local_window : int, default 16 (0 = normalise over all candidates)
    value_frac, n_value, temperature, deterministic, sinks : as VASE-AttnV
    """

    name: ClassVar[str] = "vase-dkv"
    rank: int = 20
    local_window: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_number("rank", lo=0, integer=True)
        self._check_number("local_window", lo=0, integer=True)

    def scores(self, K, V, Q, cand_len, k_pos, q_pos, rng, state):
        if rng is None:
            raise self._fail("rng", "VASE-DKV draws its projection from a numpy.random.Generator")
        G = rng.standard_normal((K.shape[2], self.rank)) if self.rank else None
        return _leverage(K[:cand_len], V[:cand_len], G, self.local_window)
