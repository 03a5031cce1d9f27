"""Quality proxies of token eviction, per decode step: attention-output error and mass recall."""
from __future__ import annotations

import numpy as np

from .base import PolicyError
from .token_loop import EvictionResult
from .token_scoring import window_logits


def _attend(logits: np.ndarray, Vs: np.ndarray):
    """Masked logits (H, g, w, n), Vs (H, n, D) -> outputs (w, H*g, D), lse (w, H*g).

    Every row has at least its own position visible, so no row is all ``-inf``.
    """
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=-1, keepdims=True)
    H, g, w, n = logits.shape
    o = np.matmul((e / s).reshape(H, g * w, n), Vs).reshape(H, g, w, -1)
    lse = (np.log(s) + m)[..., 0]                      # (H, g, w)
    return o.transpose(2, 0, 1, 3).reshape(w, H * g, -1), lse.transpose(2, 0, 1).reshape(w, H * g)


class FullAttention:
    """Full-cache attention of the decode queries of one layer (policy independent; reuse it).

    ``o`` (n_dec, H_q, D) outputs and ``lse`` (n_dec, H_q) log-partition of
    ``softmax(q_t K_{0..t}^T / sqrt(D))`` for t = prompt_len..T-1.
    """

    def __init__(self, K, V, Q, prompt_len: int, chunk: int = 128):
        K = np.asarray(K, dtype=np.float64)
        V = np.asarray(V, dtype=np.float64)
        Q = np.asarray(Q, dtype=np.float64)
        for name, x in (("K", K), ("V", V), ("Q", Q)):
            if x.ndim != 3 or not np.isfinite(x).all():
                raise PolicyError(f"token metrics: {name}: must be a finite (T, heads, D) array")
        T = K.shape[0]
        if not 0 <= prompt_len <= T:
            raise PolicyError(f"token metrics: prompt_len: must be in 0..{T}, got {prompt_len}")
        self.prompt_len, self.seq_len = int(prompt_len), T
        self.K, self.V, self.Q = K, V, Q
        Vh = V.transpose(1, 0, 2)
        outs, lses = [], []
        for a in range(prompt_len, T, chunk):
            b = min(a + chunk, T)
            o, lse = _attend(window_logits(K[:b], Q[a:b], np.arange(b), np.arange(a, b)), Vh[:, :b])
            outs.append(o)
            lses.append(lse)
        Hq, D = Q.shape[1], V.shape[2]
        self.o = np.concatenate(outs) if outs else np.zeros((0, Hq, D))
        self.lse = np.concatenate(lses) if lses else np.zeros((0, Hq))


def attention_metrics(res: EvictionResult, K=None, V=None, Q=None, prompt_len: int | None = None,
                      full: FullAttention | None = None) -> dict:
    """Attention-output relative error and attention-mass recall of an eviction run.

    Per decode step t and query head h (then averaged over heads, then over steps)::

        err_t    = ||o_full - o_kept|| / ||o_full||
        recall_t = sum_{j kept} softmax(q K_{0..t}^T / sqrt(D))_j = exp(lse_kept - lse_full)

    Pass ``full`` (a :class:`FullAttention`) to reuse the full-cache pass across policies.

    Returns
    -------
    dict with ``attn_output_rel_error``, ``attn_mass_recall`` (floats) and the per-step
    arrays ``rel_error_per_step``, ``recall_per_step`` (length T - prompt_len).
    """
    if full is None:
        if K is None or V is None or Q is None or prompt_len is None:
            raise PolicyError("token metrics: give K, V, Q, prompt_len or a FullAttention")
        full = FullAttention(K, V, Q, prompt_len)
    if (full.prompt_len, full.seq_len) != (res.prompt_len, res.seq_len):
        raise PolicyError("token metrics: res: prompt_len/length differ from the full-attention pass")
    if len(res.steps) != len(res.event_positions):
        raise PolicyError("token metrics: res: was run with record=False; rerun with record=True")
    P, T = full.prompt_len, full.seq_len
    n_dec = T - P
    err = np.zeros(n_dec)
    rec = np.ones(n_dec)
    Vh = full.V.transpose(1, 0, 2)
    H = Vh.shape[0]
    ev = res.event_positions
    for i, (e, kept) in enumerate(res.steps):
        end = ev[i + 1] if i + 1 < len(ev) else T
        recent = np.arange(e + 1, end)
        pos = np.concatenate([kept, np.tile(recent, (H, 1))], axis=1)          # (H, n)
        Ks = full.K[pos.T, np.arange(H)[None, :]]                            # (n, H, D)
        Vs = np.take_along_axis(Vh, pos[..., None], axis=1)                   # (H, n, D)
        o, lse = _attend(window_logits(Ks, full.Q[e:end], pos, np.arange(e, end)), Vs)
        of = full.o[e - P:end - P]
        num = np.linalg.norm(of - o, axis=2)
        den = np.linalg.norm(of, axis=2)
        err[e - P:end - P] = (num / np.where(den > 0, den, 1.0)).mean(axis=1)
        rec[e - P:end - P] = np.minimum(np.exp(lse - full.lse[e - P:end - P]), 1.0).mean(axis=1)
    return {"attn_output_rel_error": float(err.mean()) if n_dec else 0.0,
            "attn_mass_recall": float(rec.mean()) if n_dec else 1.0,
            "rel_error_per_step": err, "recall_per_step": rec}
