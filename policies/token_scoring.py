"""Numpy building blocks of token eviction: window attention, pooling, top-k and sampling.

Arrays follow the trace layout: keys/values ``(n, H_kv, D)``, queries ``(w, H_q, D)``;
query head ``h`` uses KV head ``h // (H_q // H_kv)`` (Hugging Face ``repeat_kv``).
"""
from __future__ import annotations

import numpy as np


def window_logits(K: np.ndarray, Q: np.ndarray, k_pos: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Scaled logits ``q.k / sqrt(D)`` of window queries over cache keys, causally masked.

    ``k_pos`` is (n,) or, when the heads hold different tokens, (H_kv, n).
    Returns (H_kv, g, w, n) float64 with ``-inf`` where ``k_pos > q_pos``.
    """
    n, H, D = K.shape
    w, Hq, _ = Q.shape
    g = Hq // H
    q = Q.reshape(w, H, g, D).transpose(1, 2, 0, 3).reshape(H, g * w, D)
    k = K.transpose(1, 2, 0)  # (H, D, n)
    logits = np.matmul(q, k).reshape(H, g, w, n) / np.sqrt(D)
    if k_pos.ndim == 1:
        visible = (k_pos[None, :] <= q_pos[:, None])[None, None]      # (1, 1, w, n)
    else:
        visible = (k_pos[:, None, :] <= q_pos[None, :, None])[:, None]  # (H, 1, w, n)
    return np.where(visible, logits, -np.inf)


def softmax_last(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; rows that are all ``-inf`` give zeros."""
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def avg_pool(x: np.ndarray, kernel: int) -> np.ndarray:
    """1-D average pooling along the last axis, stride 1, zero padding ``kernel // 2``.

    Same as ``torch.nn.functional.avg_pool1d(x, kernel, 1, kernel // 2)`` (count_include_pad),
    for odd kernels; kernel 1 is the identity.
    """
    if kernel <= 1:
        return x
    p = kernel // 2
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)])
    c = np.cumsum(np.concatenate([np.zeros(x.shape[:-1] + (1,)), xp], axis=-1), axis=-1)
    n = x.shape[-1]
    return (c[..., kernel:kernel + n] - c[..., :n]) / kernel


def max_pool(x: np.ndarray, kernel: int) -> np.ndarray:
    """1-D max pooling along the last axis, stride 1, ``-inf`` padding ``kernel // 2``."""
    if kernel <= 1:
        return x
    p = kernel // 2
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)], constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=-1)
    return win.max(axis=-1)[..., : x.shape[-1]]


def top_k(score: np.ndarray, k: int, allowed: np.ndarray) -> np.ndarray:
    """Per row, the ``k`` allowed entries with the largest score; ties to the lower index."""
    idx = np.broadcast_to(np.arange(score.shape[-1]), score.shape)
    s = np.where(allowed, score, -np.inf)
    # lexsort: last key is primary -> disallowed last, then larger score, then lower index
    return np.lexsort((idx, -s, ~allowed), axis=-1)[:, :k]


def gumbel_top_k(logw: np.ndarray, k: int, allowed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per row, draw ``k`` allowed entries without replacement with probability ∝ ``exp(logw)``.

    Gumbel-top-k: the ``k`` largest ``logw + Gumbel`` — the same distribution as drawing one
    entry at a time proportionally to ``exp(logw)``, removing it, and repeating. Working with
    log-weights never underflows (``score ** (1 / T)`` does at small T). Entries with
    ``logw = -inf`` (zero weight) come only after every positive one, uniformly among
    themselves. One ``(H, n)`` Gumbel draw per call, so results depend only on the
    generator's state.
    """
    g = rng.gumbel(size=logw.shape)
    key = np.where(allowed, logw + g, -np.inf)
    tie = np.where(allowed & np.isneginf(logw), g, -np.inf)
    # primary: disallowed last; then larger key; then (zero weight) larger Gumbel
    return np.lexsort((-tie, -key, ~allowed), axis=-1)[:, :k]


def sample_without_replacement(weight: np.ndarray, k: int, allowed: np.ndarray,
                               rng: np.random.Generator) -> np.ndarray:
    """Per row, draw ``k`` allowed entries without replacement with probability ∝ weight.

    :func:`gumbel_top_k` of ``log(weight)`` (weights must be >= 0; zero-weight entries come
    after every positive one, uniformly among themselves).
    """
    with np.errstate(divide="ignore"):
        logw = np.log(np.where(weight > 0, weight, 0.0))
    return gumbel_top_k(logw, k, allowed, rng)
