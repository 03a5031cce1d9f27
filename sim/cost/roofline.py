"""The one cost formula: seconds of an operation's terms on a hardware profile.

Written once against a small namespace of element-wise operations (:data:`NUMPY` for the
vectorised path, :data:`FLOAT` for the engine's per-iteration path in plain Python floats, :data:`MIXED` for
terms some of which are floats and some arrays), so
``HardwareProfile.time`` (arrays of terms: the fits, the fast path, the token replays) and
``sim.cost.terms.ScalarCost`` (one iteration at a time inside the simpy engine, where numpy's per-call
overhead would dominate) evaluate the same expression. The formula, with the rates
``rc = peak_flops eff_c``, ``rm = mem_bw eff_m``, ``rmv = mem_bw eff_mv``, ``ra = peak_flops eff_att``,
``rkv = mem_bw eff_kv``, ``rks = mem_bw eff_kv_shared`` (each None: its parent rate)::

    t_kv = (b_att - b_kv_shared) / rkv + b_kv_shared / rks [+ b_att_pad / rkv if padded]
    iteration:  roof = max((flops - f_att - f_lin_fp8) / rc + f_lin_fp8 / rc8 + (f_att + f_pad) / ra,
                           (bytes - b_mv - b_att) / rm + mult b_mv / rmv + t_kv)
    operator:   roof = lin + max((f_att + f_pad) / ra, t_kv) + head
                       + max(f_rest / rc, b_rest / rm) + b_elem / (mem_bw eff_elem)
    t = roof + kernels per_kernel_s + graph_kernels per_kernel_graph_s + layers per_layer_s
          + samples sample_s_per_vocab + iters host_per_iter_s
    t = max(t, kernels eager_launch_s)      # launched kernels cannot start faster than the host issues them

with ``rc8 = peak_flops_fp8 eff_c_fp8`` (``fp8_weights: w8a8``; else ``rc``: FP8 weights dequantised into
16-bit GEMMs) the rate of the FP8 linear layers' flops ``f_lin_fp8``, ``lin``'s compute
``(f_lin - f_lin_fp8) / rc + f_lin_fp8 / rc8``, ``b_mv = b_lin_mv + b_head_mv`` (one token row: BLAS's matrix-vector path) or, on the small-M
path (``2 <= rows <= gemm_small_m_max``), ``b_lin + b_head`` read ``mult = ceil(rows / gemm_row_block)``
times; ``lin = max(f_lin / rc, m_lin)``, ``head = max(f_head / rc, m_head)`` with the weight-stream
seconds ``m = (b - b_mv) / rm + mult b_mv / rmv``, or under wave quantisation (``sm_count``)
:func:`sim.cost.gemm.wave_linear_head` (an MoE layer's routed experts there at their own rate,
:func:`sim.cost.gemm.expert_rate`: ``eff_c_moe``, ``eff_c_moe_fp8``, ``eff_c_moe_mxfp4``). Every term is defined in :mod:`sim.cost.terms`'s docstring and every
field in :class:`sim.cost.hardware.HardwareProfile`'s.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from sim.cost.gemm import expert_rate, wave_linear_head

ROOFLINES = ("iteration", "operator")

# element-wise operations the formula uses, for numpy arrays and for plain floats
NUMPY = SimpleNamespace(maximum=np.maximum, where=np.where, ceil=np.ceil,
                        any_positive=lambda x: bool(np.any(np.asarray(x) > 0)))
FLOAT = SimpleNamespace(maximum=lambda a, b: a if a > b else b, where=lambda c, a, b: a if c else b,
                        ceil=math.ceil, any_positive=lambda x: x > 0)


def _is_array(x) -> bool:
    return type(x) is np.ndarray


# MIXED: plain floats where no operand is an array, numpy where one is (the same operations, so the same floats
# element by element): a run of iterations whose batch size is one number prices its batch-size-only terms
# (the matrix products, the LM head) once, in floats, and only the context-dependent ones per iteration
MIXED = SimpleNamespace(
    maximum=lambda a, b: np.maximum(a, b) if _is_array(a) or _is_array(b) else (a if a > b else b),
    where=lambda c, a, b: np.where(c, a, b) if _is_array(c) or _is_array(a) or _is_array(b) else (a if c else b),
    ceil=lambda x: np.ceil(x) if _is_array(x) else math.ceil(x),
    any_positive=lambda x: NUMPY.any_positive(x) if _is_array(x) else x > 0)


def linear_rates(hw) -> tuple:
    """``(rc, rc8)``: the matrix products' compute rate and that of FP8 linear layers (module docstring)."""
    rc = hw.peak_flops * hw.eff_c
    # FP8 linear layers: at the FP8 tensor-core rate (w8a8), else dequantised into 16-bit GEMMs (w8a16)
    rc8 = rc if hw.fp8_weights != "w8a8" else hw.peak_flops_fp8 * (hw.eff_c if hw.eff_c_fp8 is None else hw.eff_c_fp8)
    return rc, rc8


def seconds(hw, terms, ops=NUMPY, roofline: str | None = None, model=None,
            memo: dict | None = None):
    """Seconds of ``terms`` (an :class:`sim.cost.terms.OpTerms`) on ``hw`` (a :class:`sim.cost.hardware.HardwareProfile`).

    ``ops`` is :data:`NUMPY` (fields may be arrays; they broadcast), :data:`FLOAT` (every field a
    float) or :data:`MIXED` (``rows`` and ``layers`` floats, other fields either); ``roofline`` overrides the
    profile's; ``model`` (the terms' shape) is needed where ``sm_count`` quantises matrix products. ``memo``
    (a dict the caller owns, for one ``hw`` and ``model``): the wave-quantised matrix products' seconds
    remembered by their float inputs (a decode batch's are the same at every step of its size). Formula in
    the module docstring.
    """
    rc, rc8 = linear_rates(hw)
    rm = hw.mem_bw * hw.eff_m
    rmv = hw.mem_bw * (hw.eff_m if hw.eff_mv is None else hw.eff_mv)
    ra = hw.peak_flops * (hw.eff_c if hw.eff_att is None else hw.eff_att)
    rkv = hw.mem_bw * (hw.eff_m if hw.eff_kv is None else hw.eff_kv)
    rks = rkv if hw.eff_kv_shared is None else hw.mem_bw * hw.eff_kv_shared
    f8 = terms.f_lin_fp8
    mode = roofline or hw.roofline
    blm, bhm = terms.b_lin_mv, terms.b_head_mv
    mult = 1.0
    if hw.gemm_row_block:
        # small-M path (sim.cost.terms, "Row blocking"): 2 .. m_small token rows stream the weights
        # once per block of gemm_row_block rows, at the matrix-vector rate
        r = terms.rows
        hi = math.inf if hw.gemm_small_m_max is None else hw.gemm_small_m_max
        small = (r >= 2) & (r <= hi) if ops is NUMPY else (2 <= r <= hi)
        blm = ops.where(small, terms.b_lin, blm)
        bhm = ops.where(small, terms.b_head, bhm)
        mult = ops.where(small, ops.ceil(r / hw.gemm_row_block), 1.0)
    fa, ba, bks = terms.f_att, terms.b_att, terms.b_kv_shared
    t_kv = (ba - bks) / rkv + bks / rks
    fpad = 0.0
    if hw.decode_attention == "padded":
        fpad = terms.f_att_pad
        t_kv = t_kv + terms.b_att_pad / rkv
    if mode == "operator":
        fl, bl, fh, bh = terms.f_lin, terms.b_lin, terms.f_head, terms.b_head
        c_lin = (fl - f8) / rc + f8 / rc8
        fr = ops.maximum(terms.flops - fl - fa - fh, 0.0)
        br = ops.maximum(terms.bytes - bl - ba - bh, 0.0)
        ml, mh = (bl - blm) / rm + mult * blm / rmv, (bh - bhm) / rm + mult * bhm / rmv
        if hw.sm_count and (ops.any_positive(fl) or ops.any_positive(fh)):
            if model is None:
                raise ValueError(f"hardware {hw.name}: sm_count quantises matrix products; "
                                 "time() needs the terms' model shape (model=)")
            rc_lin = rc8 if ops.any_positive(f8) else rc
            key = (terms.rows, terms.layers, fh, ml, mh, rc, rc_lin) if memo is not None else None
            if key is not None and all(type(x) is float for x in key):   # plain floats: one pure function of them
                lin = memo.get(key)
            else:
                key = lin = None
            if lin is None:
                rc_moe = expert_rate(hw, model, rc, rc_lin) if model.n_moe_layers else None
                lin = wave_linear_head(model, hw.sm_count, terms.rows, terms.layers,
                                       fh / (2.0 * model.hidden_size * model.vocab_size), rc, ml, mh,
                                       None if ops is NUMPY else ops, rc_lin, rc_moe)
                if key is not None:
                    if len(memo) > 1 << 16:
                        memo.clear()
                    memo[key] = lin
            head = 0.0
        else:
            lin, head = ops.maximum(c_lin, ml), ops.maximum(fh / rc, mh)
        roof = (lin + ops.maximum((fa + fpad) / ra, t_kv) + head
                + ops.maximum(fr / rc, br / rm)
                + terms.b_elem / (hw.mem_bw * (hw.eff_m if hw.eff_elem is None else hw.eff_elem)))
    elif mode == "iteration":
        roof = ops.maximum((terms.flops - fa - f8) / rc + f8 / rc8 + (fa + fpad) / ra,
                           (terms.bytes - blm - bhm - ba) / rm + mult * (blm + bhm) / rmv + t_kv)
    else:
        raise ValueError(f"roofline: {mode!r} is not one of {', '.join(ROOFLINES)}")
    pkg = hw.per_kernel_s if hw.per_kernel_graph_s is None else hw.per_kernel_graph_s
    t = (roof + terms.kernels * hw.per_kernel_s + terms.layers * hw.per_layer_s
         + terms.graph_kernels * pkg + terms.samples * hw.sample_s_per_vocab
         + terms.iters * hw.host_per_iter_s)
    if hw.eager_launch_s:
        # kernels launched one by one from the host: the GPU cannot run ahead of the launches
        t = ops.maximum(t, terms.kernels * hw.eager_launch_s)
    return t
