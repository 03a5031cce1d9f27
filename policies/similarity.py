"""The one cosine of the ASKS gate: capture, the real runner's live gate and replay all call it.

DESIGN §4: identical variant spans give sigma = 1, so ASKS with ``tau = 1`` shares them.
A plain ``a.b / (|a| |b|)`` in float64 misses that: on identical float32 vectors it
returns 0.9999999999999994 for about one vector in six (331 of 2,000 measured), so
``sigma >= 1`` fails. Hence :func:`cosine` normalises each vector first, clips to
[-1, 1] and returns exactly 1 where the two vectors are equal element by element.

Traces captured before this rule hold the old floats; :func:`identical_spans` lets replay
recover the exact 1 from the token ids (the gate pools each variant span on its own, so
equal span tokens are equal gate inputs and equal pooled vectors).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def cosine(a, b) -> np.ndarray:
    """Cosine similarity along the last axis (broadcasting), float64, in [-1, 1].

    ``cos(a, b) = clip(<a / |a|, b / |b|>, -1, 1)``; exactly 1.0 where ``a == b`` in every
    component (identical vectors, a zero vector included); 0.0 where one vector is zero
    and the other is not.

    Parameters
    ----------
    a, b : array_like, broadcastable, (..., d)

    Returns
    -------
    (...,) float64 array.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    na = np.linalg.norm(a, axis=-1, keepdims=True)
    nb = np.linalg.norm(b, axis=-1, keepdims=True)
    # Normalise before the dot product (the rounding of |a||b| is not that of a.a).
    ua = a / np.where(na > 0, na, 1.0)
    ub = b / np.where(nb > 0, nb, 1.0)
    c = np.clip(np.einsum("...d,...d->...", ua, ub), -1.0, 1.0)
    c = np.where((na[..., 0] > 0) & (nb[..., 0] > 0), c, 0.0)
    return np.where(np.all(a == b, axis=-1), 1.0, c)


def identical_spans(prompt_ids: Sequence, spans, root: int = 0) -> np.ndarray:
    """(B,) bool: branch b's variant-span tokens equal the root's (the root itself included).

    ``spans`` is (B, 2) ``[start, end)`` into each branch's prompt ids.
    """
    sp = np.asarray(spans, dtype=np.int64)
    n = len(prompt_ids)
    out = np.zeros(n, bool)
    if n == 0:
        return out
    r = np.asarray(prompt_ids[root])[sp[root, 0]:sp[root, 1]]
    for b in range(n):
        x = np.asarray(prompt_ids[b])[sp[b, 0]:sp[b, 1]]
        out[b] = x.shape == r.shape and bool(np.array_equal(x, r))
    return out
