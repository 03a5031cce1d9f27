"""Analytical cost model: every operation of DESIGN §5 as work terms.

An operation is first reduced to hardware-independent *terms*
(:class:`OpTerms`: flops, bytes moved, kernels launched, layers run) from the
model shape alone; a :class:`sim.cost.hardware.HardwareProfile` turns terms into
seconds::

    t = max(flops / (peak * eff_c), (bytes - b_mv) / (bw * eff_m) + b_mv / (bw * eff_mv))
        + kernels * per_kernel_s + layers * per_layer_s + samples * sample_s_per_vocab + iters * host_per_iter_s

with ``b_mv = b_lin_mv + b_head_mv`` the weight bytes read by matrix-vector
products (below; ``eff_mv`` None means ``eff_m``, and the formula is the plain roofline),
and attention's flops and KV bytes (``f_att``, ``b_att``) at their own ``eff_att`` /
``eff_kv`` where the profile sets them

(the per-operator roofline and CUDA-graph kernels: :class:`sim.cost.hardware.HardwareProfile`).
Keeping the two apart is what lets ``calibrate`` fit ``eff_c``, ``eff_m``,
``per_kernel_s``, ``per_layer_s`` and the new terms with ``scipy.optimize.least_squares``
against measured phases: it computes the terms of every measured phase once
and only re-evaluates ``HardwareProfile.time`` inside the residual.

Notation (model shape): ``L`` layers, ``d`` hidden size, ``H`` query heads,
``Hkv`` KV heads, ``Dh`` head dim, ``F`` MLP intermediate size, ``V`` vocab,
``s`` bytes per element, ``P`` = parameters per layer (see
:class:`sim.cost.model_shape.ModelShape`).

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
    samples = V sum_i r_i                                        # top-p sort over the vocabulary, r_i rows sampled
    iters   = [max_i(l_i) > 0]                                   # one forward call: host time per iteration

Operator groups for the per-operator roofline (``roofline: operator``; each a
subset of the totals above, except ``b_elem``)::

    f_lin = sum_i 2 P n_i l_i,          b_lin = s max_i(l_i) P          # linear layers (weights)
    f_att = attention's flops,          b_att = the KV bytes            # QK^T, AV
    f_head = 2 d V sum_i (p_i + g_i),   b_head = s (max p + max g) d V  # LM head, probes
    b_elem = s sum_i n_i l_i (10 d + 2 (H + Hkv) Dh + 3 F)             # norms, RoPE, act*mul, residual adds

Matrix-vector regime (one token row)::

    b_lin_mv  = b_lin  [sum_i n_i == 1]        # the weight bytes of linear layers read by a GEMV
    b_head_mv = b_head [sum_i n_i == 1]        # and of the LM head

A forward whose linear layers see a single token row (one sequence
decoding, nothing else in the iteration) multiplies every weight matrix by a
vector: BLAS takes its matrix-vector path, which streams the weights once,
while two or more rows take the matrix-matrix path, which packs the weight
panels first and costs much more per byte at small M (measured on SmolLM2,
one CPU thread: 37-41 ms for a 1-row decode, 59-65 ms for 2 rows). The
profile prices these bytes at their own efficiency, ``eff_mv``
(:class:`sim.cost.hardware.HardwareProfile`; None = ``eff_m``: off, the same
formula as before). Both terms are subsets of ``b_lin`` / ``b_head``, and of
``bytes``. Logit-lens probes (``probe_terms``) are not counted here.

``b_elem`` is the element-wise traffic (2 RMSNorms read+write ``d``, RoPE on q
and k, SiLU*mul reads ``2F`` writes ``F``, 2 residual adds read ``2d`` write
``d``) that the whole-iteration roofline treats as fused away; the rest of
``flops``/``bytes`` (embedding gather, KV copies) is one more operator.

Row blocking (``rows = sum_i n_i``): a BLAS GEMM with few token rows (the
small-M path) computes the rows in blocks of ``mr`` and streams the weight
panels once per block. Measured on SmolLM2, one thread of a Sapphire Rapids
core: a decode iteration takes 61 ms at 1 row, 80 at 3, 112 at 4, 160 at 7,
209 at 10, 249 at 13 (a step of about 25 ms -- the weights once more -- every 3
rows), then 236 ms at 16 rows, where another kernel takes over. The profile
prices the small-M path (:class:`sim.cost.hardware.HardwareProfile`, off unless
``gemm_row_block`` is set) as that many passes over the weights at the
matrix-vector rate::

    weights: ceil(rows / mr) (b_lin + b_head) / (bw eff_mv)   for 2 <= rows <= m_small

Shared KV reads: when several items of one iteration attend over the same KV
blocks (branches of one prompt, requests with a common prefix: one physical
block, by prefix caching or a fork), every read of a block after its first in
the iteration finds it in cache on a CPU. ``h_i`` (``shared``) is the number of
item ``i``'s cached tokens in such blocks: full blocks an earlier item of the
iteration also reads (:func:`sim.serving.kvshare.shared_tokens`). Those bytes::

    b_kv_shared = s sum_i l_i 2 Hkv Dh h_i              # a subset of b_att

are priced at ``mem_bw * eff_kv_shared`` instead of ``eff_kv``'s rate
(:class:`sim.cost.hardware.HardwareProfile`; None: off, the same formula as before).
Measured on SmolLM2, one CPU thread: a decode of 8 sequences at context 512
over one shared prefix takes 5.8% less CPU time than over distinct blocks.

Padded decode attention: a kernel that attends every one-token row (decode
steps) in one call padded to the longest context among them (the CPU loop of
:mod:`calibrate.serve_forward` and ``calibrate run``'s left-padded decode
batch) does the work of ``c_max = max_{i: n_i = 1} c_i`` keys for every such
row. The extra work over the exact sums above::

    f_att_pad = 4 H Dh sum_{i: n_i = 1} l_i (c_max - c_i)
    b_att_pad = s 2 Hkv Dh sum_{i: n_i = 1} l_i (c_max - c_i)

is charged only by a profile with ``decode_attention: padded``
(:class:`sim.cost.hardware.HardwareProfile`; ``paged``, the default, is vLLM's paged
kernel, which reads each sequence's own blocks).

Precision (vLLM's ``--quantization fp8`` / ``--kv-cache-dtype fp8``: :meth:`sim.cost.model_shape.ModelShape.with_precision`):
the linear layers' weights are ``w`` bytes per element (1 under fp8) and the KV cache ``s_kv`` (1 under an fp8
cache); embeddings, norms, the LM head and activations stay at ``s``::

    b_lin = max_i(l_i) (w (P - 2 d) + s 2 d),   every KV byte above at s_kv instead of s
    f_lin_fp8 = f_lin [quantization == fp8]     # run at the FP8 rate where the device has one

(:func:`sim.cost.roofline.seconds` prices ``f_lin_fp8`` at ``peak_flops_fp8 eff_c_fp8`` on FP8 tensor cores,
``fp8_weights: w8a8``; at the 16-bit rate where FP8 weights are dequantised into 16-bit GEMMs, ``w8a16``).

Mixture of experts, multi-head latent attention, sliding windows: their coefficients and formulas are in
:mod:`sim.cost.opterms` (:class:`~sim.cost.opterms.Variant`); a dense model takes none of them.

Mixed context lengths in a batch are summed item by item (exact), never
replaced by their mean. Activations other than the residual stream are not
counted (they stay in cache/SRAM for the fused kernels this models).
"""
from __future__ import annotations

import numpy as np

# the vocabulary lives in sim.cost.opterms; re-exported so ``sim.cost.terms`` stays the one face of the cost terms
from sim.cost.opterms import (K_FWD, K_LAYER, K_PROBE, TERM_NAMES, ZERO, OpTerms, Variant,  # noqa: F401
                              elem_bytes_per_token_layer, variant, window_keys)
from sim.cost.model_shape import ModelShape
from sim.cost.routing import ROUTINGS, SampledRouting, distinct_experts, routing_for  # noqa: F401 (re-exported)
# ScalarCost (the per-iteration float path) lives in sim.cost.scalar; re-exported for the callers of sim.cost.terms
from sim.cost.scalar import ScalarCost, with_shared  # noqa: F401


def _item_arrays(m: ModelShape, n, c, layers, probes, logits, copy_tokens, mask):
    """:func:`batch_terms`'s per-item arguments as float arrays of ``n``'s shape; ``mask`` as 0/1 weights."""
    n = np.asarray(n, dtype=np.float64)
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), n.shape)
    ell = np.broadcast_to(np.asarray(m.n_layers if layers is None else layers, dtype=np.float64), n.shape)
    p = np.broadcast_to(np.asarray(probes, dtype=np.float64), n.shape)
    g = np.broadcast_to(np.asarray(logits, dtype=np.float64), n.shape)
    cp = np.broadcast_to(np.asarray(copy_tokens, dtype=np.float64), n.shape)
    if mask is None:
        mask = np.ones(n.shape, dtype=bool)
    else:
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), n.shape)
    return n, c, ell, p, g, cp, mask.astype(np.float64)


def batch_terms(m: ModelShape, n, c, layers=None, probes=0, logits=1, copy_tokens=0, mask=None,
                sampled=None, cuda_graph=False, shared=0, routing=None, sliding_context=None) -> OpTerms:
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
    sampled : array_like, optional
        Rows each item samples a token from (top-p sort over the vocabulary); default: one per
        item with an LM-head row (``logits > 0``) and new tokens. Pass 0 for a verification
        pass, which scores yes/no without sampling.
    cuda_graph : bool
        The iteration replays a CUDA graph: its kernels are counted as ``graph_kernels``.
    shared : array_like
        Cached tokens of each item in KV blocks an earlier item of the iteration reads too
        (``h_i`` of "Shared KV reads"; at most ``c``).
    routing : SampledRouting, optional
        MoE models: the distinct experts an iteration hits, sampled (default: the expectation).
    sliding_context : array_like, optional
        Tokens each item's sliding-window layers hold before the step (default ``c``; token eviction leaves them).

    Returns
    -------
    OpTerms
        Reduced over the last axis; an iteration with no item costs nothing.
    """
    n, c, ell, p, g, cp, w = _item_arrays(m, n, c, layers, probes, logits, copy_tokens, mask)
    L, sk, P = m.n_layers, m.kv_elem_bytes, m.params_per_layer
    d, H, Hkv, Dh, V, s = m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab_size, m.dtype_bytes
    runs = w * (n > 0)  # items that run through the layers
    f_lin = np.sum(runs * 2.0 * P * n * ell, axis=-1)
    f_att = np.sum(runs * 4.0 * H * Dh * ell * (n * c + n * (n + 1.0) / 2.0), axis=-1)
    f_head = np.sum(w * 2.0 * d * V * (p + g), axis=-1)
    flops = f_lin + f_att + f_head
    lmax = np.max(runs * ell, axis=-1, initial=0.0)
    pmax = np.max(w * p, axis=-1, initial=0.0)
    gmax = np.max(w * g * (n > 0), axis=-1, initial=0.0)
    kv_tok = 2.0 * Hkv * Dh
    cp_any = np.max(w * (cp > 0), axis=-1, initial=0.0)
    b_lin = lmax * m.layer_weight_bytes
    b_head = s * (pmax + gmax) * d * V
    b_att = sk * np.sum(runs * ell * kv_tok * (c + n), axis=-1)
    h = np.broadcast_to(np.asarray(shared, dtype=np.float64), n.shape)
    b_kvs = sk * np.sum(runs * ell * kv_tok * h, axis=-1)
    one = runs * (n == 1.0)
    gap = one * ell * (np.max(np.where(one > 0, c, 0.0), axis=-1, initial=0.0)[..., None] - c)
    f_pad = 4.0 * H * Dh * np.sum(gap, axis=-1)
    b_pad = sk * kv_tok * np.sum(gap, axis=-1)
    if not m.is_plain:
        f_att, b_att, b_kvs, f_pad, b_pad, b_lin, kv_tok = _variant_sums(m, n, c, ell, runs, h, gap, lmax, routing,
                                                                         sliding_context)
        flops = f_lin + f_att + f_head
    bytes_ = (b_lin + b_head + b_att + s * np.sum(runs * 2.0 * d * n, axis=-1)
              + sk * np.sum(w * 2.0 * cp, axis=-1) * L * kv_tok)
    b_elem = np.sum(runs * n * ell, axis=-1) * elem_bytes_per_token_layer(m)
    mv = (np.sum(runs * n, axis=-1) == 1.0) * 1.0   # one token row: every product is a matrix-vector one
    r = (g > 0) * 1.0 if sampled is None else np.broadcast_to(np.asarray(sampled, dtype=np.float64), n.shape)
    samples = np.sum(runs * r, axis=-1) * float(V)
    kernels = np.where(lmax > 0, K_LAYER * lmax + K_FWD, 0.0) + K_PROBE * pmax + cp_any
    iters = (lmax > 0) * 1.0
    zero = 0.0 * kernels
    kernels, gk = (zero, kernels) if cuda_graph else (kernels, zero)
    return OpTerms(flops, bytes_, kernels, lmax, samples, iters, gk, f_lin, b_lin, f_att, b_att, f_head, b_head, b_elem,
                   mv * b_lin, mv * b_head, np.sum(runs * n, axis=-1), b_kvs, f_pad, b_pad,
                   f_lin if m.quantization == "fp8" else zero)


def _variant_sums(m: ModelShape, n, c, ell, runs, h, gap, lmax, routing, csw=None):
    """:func:`batch_terms`'s attention, KV and weight sums for MoE / MLA / sliding-window layers: the same sums
    with the coefficients of :class:`sim.cost.opterms.Variant` (formulas in :mod:`sim.cost.opterms`); ``csw``:
    the tokens the sliding-window layers hold (default ``c``).

    Returns ``(f_att, b_att, b_kv_shared, f_att_pad, b_att_pad, b_lin, kv elements per token per layer)``.
    """
    sk = m.kv_elem_bytes
    v = variant(m)
    a = np.where(n == 1.0, v.a_dec, v.a_pre)
    full = 1.0 - v.f_sw
    keys = full * (n * c + n * (n + 1.0) / 2.0)
    toks = full * (c + n)
    if v.f_sw:
        csw = c if csw is None else np.broadcast_to(np.asarray(csw, dtype=np.float64), n.shape)
        keys = keys + v.f_sw * window_keys(n, csw, v.window)
        toks = toks + v.f_sw * (np.minimum(csw, v.window - 1.0) + n)
    f_att = np.sum(runs * a * ell * keys, axis=-1)
    b_att = sk * np.sum(runs * ell * v.kvt * toks, axis=-1)
    b_kvs = sk * np.sum(runs * ell * v.kvt * h * full, axis=-1)
    f_pad = v.a_dec * full * np.sum(gap, axis=-1)
    b_pad = sk * v.kvt * full * np.sum(gap, axis=-1)
    b_lin = lmax * v.lin_bytes(m, np.sum(runs * n, axis=-1), routing)
    return f_att, b_att, b_kvs, f_pad, b_pad, b_lin, v.kvt


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
    return batch_terms(m, [n_new], [n_cached], layers=[layers], probes=[probes], logits=[1 if full_head else 0],
                       sampled=[0])


def probe_terms(m: ModelShape, n_probes) -> OpTerms:
    """``n_probes`` logit-lens probes of one position: ``flops = 2 d V n``, ``bytes = s d V n``."""
    n_probes = np.asarray(n_probes, dtype=np.float64)
    d, V, s = m.hidden_size, m.vocab_size, m.dtype_bytes
    f, b = 2.0 * d * V * n_probes, s * d * V * n_probes
    return OpTerms(f, b, K_PROBE * n_probes, 0.0 * n_probes, f_head=f, b_head=b)


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
    if not m.is_plain:
        # Sliding-window layers keep only their window: eviction does not apply there, and only the full
        # layers score. MLA: queries absorbed into the latent score it (2 H (r + dr) per key), and keys and
        # values are the one latent, read once.
        lay = lay * (1.0 - m.n_sliding_layers / m.n_layers)
        if m.is_mla:
            e = m.kv_lora_rank + m.qk_rope_head_dim
            flops = lay * (2.0 * H * e * window * C + 5.0 * H * window * C)
            bytes_ = lay * (m.kv_elem_bytes * e * C + s * H * e * window)
            return OpTerms(flops, bytes_, 3.0 * lay * (C > 0), 0.0 * C, f_att=flops, b_att=bytes_)
    flops = lay * (2.0 * H * Dh * window * C + 5.0 * H * window * C)
    bytes_ = lay * (m.kv_elem_bytes * Hkv * Dh * C * (2.0 if value_range else 1.0) + s * H * Dh * window)
    return OpTerms(flops, bytes_, 3.0 * lay * (C > 0), 0.0 * C, f_att=flops, b_att=bytes_)


def decode_steps_terms(m: ModelShape, contexts, mask, cuda_graph: bool = False, shared=0.0, routing=None) -> OpTerms:
    """Terms of many decode iterations at once; ``contexts (J, B)`` cached tokens, ``mask (J, B)`` present,
    ``shared (J,)`` the iteration's shared cached tokens ``sum_b h_jb`` ("Shared KV reads").

    Same as :func:`decode_step_terms` row by row, reduced in closed form: with
    ``k_j`` sequences and ``S_j = sum_b (c_jb + 1)``::

        flops_j = k_j (2 P L + 2 d V) + 4 H Dh L S_j
        bytes_j = s [ (L P + d V) [k_j > 0] + L 2 Hkv Dh S_j + 2 d k_j ]
        samples_j = k_j V,  iters_j = [k_j > 0]
        b_lin_mv_j = s L P [k_j == 1],  b_head_mv_j = s d V [k_j == 1]
        b_kv_shared_j = s L 2 Hkv Dh shared_j
        f_att_pad_j = 4 H Dh L (k_j max_b c_jb - sum_b c_jb),  b_att_pad_j = s 2 Hkv Dh L (...)
    """
    c = np.asarray(contexts, dtype=np.float64)
    w = np.asarray(mask, dtype=bool)
    if not m.is_plain:
        # MoE / MLA / sliding-window shapes: the per-item sums (exact; the closed form below is the dense one's).
        # The iteration's shared tokens go on its first item: every term is linear in them.
        h = np.zeros(c.shape)
        if c.shape[-1]:
            h[..., 0] = np.broadcast_to(np.asarray(shared, np.float64), c.shape[:-1])
        return batch_terms(m, w * 1.0, c, mask=w, cuda_graph=cuda_graph, shared=h, routing=routing)
    k = w.sum(axis=-1).astype(np.float64)
    S = np.where(w, c + 1.0, 0.0).sum(axis=-1)
    gap = float(m.n_layers) * (k * np.max(np.where(w, c, 0.0), axis=-1, initial=0.0) - np.where(w, c, 0.0).sum(axis=-1))
    L, d, V, s = float(m.n_layers), float(m.hidden_size), float(m.vocab_size), float(m.dtype_bytes)
    sk = float(m.kv_elem_bytes)
    P = float(m.params_per_layer)
    anyk = (k > 0).astype(np.float64)
    f_lin = k * 2.0 * P * L
    f_head = k * 2.0 * d * V
    f_att = 4.0 * m.n_heads * m.head_dim * L * S
    b_lin = L * float(m.layer_weight_bytes) * anyk
    b_head = s * d * V * anyk
    b_att = sk * L * 2.0 * m.n_kv_heads * m.head_dim * S
    bytes_ = b_lin + b_head + b_att + s * 2.0 * d * k
    kern = anyk * (K_LAYER * L + K_FWD)
    zero = 0.0 * kern
    kernels, gk = (zero, kern) if cuda_graph else (kern, zero)
    one = (k == 1).astype(np.float64)
    return OpTerms(f_lin + f_head + f_att, bytes_, kernels, anyk * L, k * V, anyk, gk,
                   f_lin, b_lin, f_att, b_att, f_head, b_head, k * L * elem_bytes_per_token_layer(m),
                   one * b_lin, one * b_head, k,
                   sk * L * 2.0 * m.n_kv_heads * m.head_dim * np.broadcast_to(np.asarray(shared, np.float64), k.shape),
                   4.0 * m.n_heads * m.head_dim * gap, sk * 2.0 * m.n_kv_heads * m.head_dim * gap,
                   f_lin if m.quantization == "fp8" else 0.0 * f_lin)
