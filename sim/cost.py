"""Analytical cost model: every operation of DESIGN §5 as work terms.

An operation is first reduced to hardware-independent *terms*
(:class:`OpTerms`: flops, bytes moved, kernels launched, layers run) from the
model shape alone; a :class:`sim.profiles.HardwareProfile` turns terms into
seconds::

    t = max(flops / (peak * eff_c), bytes / (bw * eff_m)) + kernels * per_kernel_s + layers * per_layer_s

Keeping the two apart is what lets ``calibrate`` fit ``eff_c``, ``eff_m``,
``per_kernel_s`` and ``per_layer_s`` with ``scipy.optimize.least_squares``
against measured phases: it computes the terms of every measured phase once
and only re-evaluates ``HardwareProfile.time`` inside the residual.

Notation (model shape): ``L`` layers, ``d`` hidden size, ``H`` query heads,
``Hkv`` KV heads, ``Dh`` head dim, ``F`` MLP intermediate size, ``V`` vocab,
``s`` bytes per element, ``P`` = parameters per layer (see
:class:`sim.profiles.ModelShape`).

One forward *iteration* batches items ``i`` (a prefill chunk, a decode token,
a verification pass, an ASKS gate pass), each with ``n_i`` new tokens over
``c_i`` cached ones, run through ``l_i <= L`` layers, with ``p_i`` logit-lens
probes and ``g_i`` full LM-head rows::

    flops = sum_i [ 2 P n_i l_i                                  # linear layers
                    + 4 H Dh l_i (n_i c_i + n_i (n_i + 1) / 2)  # QK^T and AV, causal, exact per item
                    + 2 d V (p_i + g_i) ]                        # LM head / logit-lens probes
    bytes = s [ max_i(l_i) P                                     # layer weights, read once per iteration
                + (max_i p_i + max_i g_i) d V                    # LM-head weight, once per probed layer
                + sum_i l_i 2 Hkv Dh (c_i + n_i)                 # KV read (cached) and written (new)
                + sum_i 2 d n_i ]                                # embedding rows gathered + last hidden written
    kernels = K_LAYER max_i(l_i) + K_FWD + K_PROBE max_i(p_i)
    layers  = max_i(l_i)

Mixed context lengths in a batch are summed item by item (exact), never
replaced by their mean. Activations other than the residual stream are not
counted (they stay in cache/SRAM for the fused kernels this models).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .profiles import ModelShape

# Kernels per decoder layer: 2 norms, fused qkv, rope, attention, o_proj, gate_up, act*mul, down, 2 residual adds.
K_LAYER = 11
# Kernels per forward outside the layers: embedding gather, final norm, LM head, sampling.
K_FWD = 4
# Kernels per logit-lens probe: final norm, d x V matmul, softmax/entropy reduction.
K_PROBE = 3


@dataclass(frozen=True)
class OpTerms:
    """Hardware-independent work of one operation (fields are floats or equal-shape arrays)."""

    flops: np.ndarray | float
    bytes: np.ndarray | float
    kernels: np.ndarray | float
    layers: np.ndarray | float

    def __add__(self, other: "OpTerms") -> "OpTerms":
        """Two operations run one after the other (not batched)."""
        return OpTerms(self.flops + other.flops, self.bytes + other.bytes,
                       self.kernels + other.kernels, self.layers + other.layers)

    def as_array(self) -> np.ndarray:
        """``(4, ...)`` array [flops, bytes, kernels, layers] (the calibration design matrix rows)."""
        return np.stack(np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in
                                              (self.flops, self.bytes, self.kernels, self.layers))))


ZERO = OpTerms(0.0, 0.0, 0.0, 0.0)


def batch_terms(m: ModelShape, n, c, layers=None, probes=0, logits=1, copy_tokens=0, mask=None) -> OpTerms:
    """Terms of one batched forward iteration (formula in the module docstring).

    Parameters
    ----------
    m : ModelShape
    n, c : array_like, shape (..., k)
        New and cached tokens of each of the ``k`` items (the last axis is the batch).
    layers : array_like, optional
        Layers each item runs (default ``L``).
    probes : array_like
        Logit-lens probes each item evaluates (one ``d x V`` matmul each).
    logits : array_like
        Full LM-head rows each item needs (1 for a prefill or decode step, 0 for the ASKS gate).
    copy_tokens : array_like
        Tokens of KV each item copies (partial-block copy-on-write), see :func:`kv_copy_terms`.
    mask : array_like of bool, optional
        Items present (False entries are ignored); lets callers vectorise over padded batches.

    Returns
    -------
    OpTerms
        Reduced over the last axis; an iteration with no item costs nothing.
    """
    n = np.asarray(n, dtype=np.float64)
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), n.shape)
    L = m.n_layers
    ell = np.broadcast_to(np.asarray(L if layers is None else layers, dtype=np.float64), n.shape)
    p = np.broadcast_to(np.asarray(probes, dtype=np.float64), n.shape)
    g = np.broadcast_to(np.asarray(logits, dtype=np.float64), n.shape)
    cp = np.broadcast_to(np.asarray(copy_tokens, dtype=np.float64), n.shape)
    if mask is None:
        mask = np.ones(n.shape, dtype=bool)
    else:
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), n.shape)
    w = mask.astype(np.float64)
    d, H, Hkv, Dh, V, s = m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab_size, m.dtype_bytes
    P = m.params_per_layer
    runs = w * (n > 0)  # items that run through the layers
    flops = np.sum(runs * (2.0 * P * n * ell + 4.0 * H * Dh * ell * (n * c + n * (n + 1.0) / 2.0))
                   + w * 2.0 * d * V * (p + g), axis=-1)
    lmax = np.max(runs * ell, axis=-1, initial=0.0)
    pmax = np.max(w * p, axis=-1, initial=0.0)
    gmax = np.max(w * g * (n > 0), axis=-1, initial=0.0)
    kv_tok = 2.0 * Hkv * Dh
    cp_any = np.max(w * (cp > 0), axis=-1, initial=0.0)
    bytes_ = s * (lmax * P + (pmax + gmax) * d * V
                  + np.sum(runs * (ell * kv_tok * (c + n) + 2.0 * d * n), axis=-1)
                  + np.sum(w * 2.0 * cp, axis=-1) * L * kv_tok)
    kernels = np.where(lmax > 0, K_LAYER * lmax + K_FWD, 0.0) + K_PROBE * pmax + cp_any
    return OpTerms(flops, bytes_, kernels, lmax)


def prefill_terms(m: ModelShape, n_new, n_cached=0) -> OpTerms:
    """Prefill of ``n`` new tokens over ``c`` cached ones, one sequence, producing the first token's logits.

    ``flops = 2 P n L + 4 H Dh L (n c + n (n + 1) / 2) + 2 d V`` -- the second
    term is attention's quadratic part: new token ``j`` attends to ``c + j`` keys.
    """
    return batch_terms(m, np.atleast_1d(n_new)[..., None] if np.ndim(n_new) else [n_new],
                       np.atleast_1d(n_cached)[..., None] if np.ndim(n_cached) else [n_cached])


def decode_step_terms(m: ModelShape, contexts, mask=None) -> OpTerms:
    """One decode step of a batch; ``contexts[..., i]`` = tokens already cached for sequence ``i``.

    ``flops = sum_i [2 P L + 4 H Dh L (c_i + 1) + 2 d V]``, ``bytes = s [L P + d V + sum_i L 2 Hkv Dh (c_i + 1) + ...]``:
    weights are read once for the whole batch, each sequence reads its own KV.
    """
    contexts = np.asarray(contexts, dtype=np.float64)
    return batch_terms(m, np.ones_like(contexts), contexts, mask=mask)


def verify_terms(m: ModelShape, n_new, n_cached, layers, probes=0, full_head=True) -> OpTerms:
    """Verification pass of one branch: ``n_new`` tokens over ``n_cached`` through ``layers`` layers.

    With early exit the pass stops at ``layers`` and scores with that layer's
    logit lens; each monitored layer costs a ``d x V`` probe (``2 d V`` flops,
    ``d V s`` bytes); ``full_head`` adds the final LM head when the pass reaches layer L.
    """
    return batch_terms(m, [n_new], [n_cached], layers=[layers], probes=[probes], logits=[1 if full_head else 0])


def probe_terms(m: ModelShape, n_probes) -> OpTerms:
    """``n_probes`` logit-lens probes of one position: ``flops = 2 d V n``, ``bytes = s d V n``."""
    n_probes = np.asarray(n_probes, dtype=np.float64)
    d, V, s = m.hidden_size, m.vocab_size, m.dtype_bytes
    return OpTerms(2.0 * d * V * n_probes, s * d * V * n_probes, K_PROBE * n_probes, 0.0 * n_probes)


def gate_terms(m: ModelShape, span_tokens) -> OpTerms:
    """ASKS gate: a full-depth pass over the variant span only (no LM head)::

        flops = 2 P n L + 4 H Dh L n (n + 1) / 2
    """
    return batch_terms(m, [span_tokens], [0], logits=[0])


def kv_copy_terms(m: ModelShape, n_tokens) -> OpTerms:
    """Copy ``n_tokens`` of KV (copy-on-write of a shared partial block): ``bytes = 2 * n * 2 L Hkv Dh s`` (read + write)."""
    n_tokens = np.asarray(n_tokens, dtype=np.float64)
    return OpTerms(0.0 * n_tokens, 2.0 * n_tokens * m.kv_bytes_per_token, (n_tokens > 0) * 1.0, 0.0 * n_tokens)


def eviction_scoring_terms(m: ModelShape, cand_tokens, window, n_layers=None, value_range=True) -> OpTerms:
    """Scoring the KV-eviction candidates of one sequence across ``n_layers`` layers.

    Attention-based scores (H2O, SnapKV, R-KV, VASE-AttnV) recompute the
    attention of the last ``window`` queries over the candidates::

        flops = n_layers (2 H Dh w C + 5 H w C)        # QK^T + softmax/pool per head
        bytes = s n_layers (Hkv Dh C (1 + value_range) + H Dh w)   # keys (+ values for max-min) and queries

    Leverage scores (CurDKV, VASE-DKV) have the same order of work (a
    ``Dh x r`` projection of K and V). Selection adds one top-k kernel per layer.
    """
    C = np.asarray(cand_tokens, dtype=np.float64)
    lay = m.n_layers if n_layers is None else n_layers
    H, Hkv, Dh, s = m.n_heads, m.n_kv_heads, m.head_dim, m.dtype_bytes
    flops = lay * (2.0 * H * Dh * window * C + 5.0 * H * window * C)
    bytes_ = s * lay * (Hkv * Dh * C * (2.0 if value_range else 1.0) + H * Dh * window)
    return OpTerms(flops, bytes_, 3.0 * lay * (C > 0), 0.0 * C)


class ScalarCost:
    """:func:`batch_terms` + ``HardwareProfile.time`` for one iteration, in plain Python floats.

    The simpy engine prices one iteration at a time with a handful of items;
    numpy's per-call overhead would dominate there. Same formula, same
    results (to rounding) as the vectorised path.
    """

    def __init__(self, m: ModelShape, hw):
        self.L = float(m.n_layers)
        self.P = float(m.params_per_layer)
        self.att = 4.0 * m.n_heads * m.head_dim
        self.dV = float(m.hidden_size * m.vocab_size)
        self.d = float(m.hidden_size)
        self.s = float(m.dtype_bytes)
        self.kvt = 2.0 * m.n_kv_heads * m.head_dim
        self.rate_c = hw.peak_flops * hw.eff_c
        self.rate_m = hw.mem_bw * hw.eff_m
        self.pk = hw.per_kernel_s
        self.pl = hw.per_layer_s

    def seconds(self, items) -> float:
        """``items``: iterable of ``(n, c, layers, probes, logits, copy)`` tuples (layers None = L)."""
        flops = 0.0
        kv = 0.0
        emb = 0.0
        cp = 0.0
        lmax = pmax = gmax = 0.0
        cp_any = 0.0
        L = self.L
        for n, c, ell, p, g, copy in items:
            if ell is None:
                ell = L
            if n > 0:
                flops += 2.0 * self.P * n * ell + self.att * ell * (n * c + n * (n + 1.0) / 2.0)
                kv += ell * self.kvt * (c + n)
                emb += 2.0 * self.d * n
                if ell > lmax:
                    lmax = ell
                if g > gmax:
                    gmax = g
            flops += 2.0 * self.dV * (p + g)
            if p > pmax:
                pmax = p
            if copy > 0:
                cp += 2.0 * copy
                cp_any = 1.0
        byts = self.s * (lmax * self.P + (pmax + gmax) * self.dV + kv + emb + cp * L * self.kvt)
        kernels = (K_LAYER * lmax + K_FWD if lmax > 0 else 0.0) + K_PROBE * pmax + cp_any
        t = flops / self.rate_c
        tm = byts / self.rate_m
        return (t if t > tm else tm) + kernels * self.pk + lmax * self.pl


def decode_steps_terms(m: ModelShape, contexts, mask) -> OpTerms:
    """Terms of many decode iterations at once; ``contexts (J, B)`` cached tokens, ``mask (J, B)`` present.

    Same as :func:`decode_step_terms` row by row, reduced in closed form: with
    ``k_j`` sequences and ``S_j = sum_b (c_jb + 1)``::

        flops_j = k_j (2 P L + 2 d V) + 4 H Dh L S_j
        bytes_j = s [ (L P + d V) [k_j > 0] + L 2 Hkv Dh S_j + 2 d k_j ]
    """
    c = np.asarray(contexts, dtype=np.float64)
    w = np.asarray(mask, dtype=bool)
    k = w.sum(axis=-1).astype(np.float64)
    S = np.where(w, c + 1.0, 0.0).sum(axis=-1)
    L, d, V, s = float(m.n_layers), float(m.hidden_size), float(m.vocab_size), float(m.dtype_bytes)
    P = float(m.params_per_layer)
    anyk = (k > 0).astype(np.float64)
    flops = k * (2.0 * P * L + 2.0 * d * V) + 4.0 * m.n_heads * m.head_dim * L * S
    bytes_ = s * ((L * P + d * V) * anyk + L * 2.0 * m.n_kv_heads * m.head_dim * S + 2.0 * d * k)
    return OpTerms(flops, bytes_, anyk * (K_LAYER * L + K_FWD), anyk * L)
