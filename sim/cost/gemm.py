"""Wave quantisation of matrix products: whole waves of CTA tiles on ``sm_count`` SMs.

``HardwareProfile.sm_count`` (None: off). A GEMM of
``r`` token rows through a ``K x N`` weight runs as CTA tiles of ``tm x tn`` outputs, one tile
per SM at a time (cuBLAS-like: 128 x 128; ``tm`` 64 at r <= 64, one Hopper warpgroup's
wgmma M): its compute takes whole waves of ``sm`` tiles::

    tiles = ceil(r / tm) ceil(N / tn),   F_q = ceil(tiles / sm) sm tm tn 2 K   (>= 2 r K N)

and each product is its own roofline ``max(F_q / rc, B / rm)`` (constants, not fitted).

Used by the per-operator roofline (:class:`sim.cost.hardware.HardwareProfile`, :class:`sim.cost.terms.ScalarCost`)
and by the public-profile fits (:mod:`calibrate.public_profiles`): one formula. ``m`` below is a
:class:`sim.cost.model_shape.ModelShape`.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

GEMM_TILE_M, GEMM_TILE_M_SMALL, GEMM_TILE_N = 128, 64, 128
_NP = SimpleNamespace(where=np.where, ceil=np.ceil, maximum=np.maximum)


def gemm_wave_flops(rows, K, N, sms, ops=None):
    """``F_q``: the flops of whole waves of CTA tiles (formula above); 0 at 0 rows. Arrays broadcast
    (``ops``: None for numpy arrays, or :data:`sim.cost.roofline.FLOAT` for plain floats)."""
    if ops is None:
        ops, rows = _NP, np.asarray(rows, dtype=np.float64)
    tm = ops.where(rows <= GEMM_TILE_M_SMALL, GEMM_TILE_M_SMALL, GEMM_TILE_M)
    tiles = ops.ceil(rows / tm) * ops.ceil(N / GEMM_TILE_N)
    return ops.ceil(tiles / sms) * sms * tm * GEMM_TILE_N * 2.0 * K


def grouped_wave_flops(groups, grows, K, N, sms, ops=None):
    """``F_q`` of a grouped GEMM: ``groups`` products of ``grows`` rows each through ``K x N``, every group padded
    to whole tiles and the tiles of all groups in whole waves::

        tiles = groups ceil(grows / tm) ceil(N / tn),   F_q = ceil(tiles / sm) sm tm tn 2 K

    (``groups = 1``: :func:`gemm_wave_flops`). The routed experts of an MoE layer run this way
    (:func:`variant_gemms`); ``calibrate/moe_kernels.py`` holds it against vLLM's fused-MoE kernel timings."""
    o = ops or _NP
    tm = o.where(grows <= GEMM_TILE_M_SMALL, GEMM_TILE_M_SMALL, GEMM_TILE_M)
    tiles = groups * o.ceil(grows / tm) * o.ceil(N / GEMM_TILE_N)
    return o.ceil(tiles / sms) * sms * tm * GEMM_TILE_N * 2.0 * K


def layer_gemms(m) -> tuple:
    """``(K, N)`` of one layer's matrix products as vLLM fuses them: qkv, o, gate_up, down (``sum K N = P - 2 d``)."""
    d, H, Hkv, Dh, F = m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim, m.intermediate_size
    return ((d, (H + 2 * Hkv) * Dh), (H * Dh, d), (d, 2 * F), (F, d))


def variant_gemms(m, rows, ops=None):
    """A non-dense layer's products, mean over layers: ``[(K, N, layer_share, groups, rows_per_group, params)]``.

    Attention: ``qkv`` and ``o`` (GQA) or MLA's ``q_a``/``q_b`` (or ``q_proj``), ``kv_a``, ``kv_b``, ``o``.
    Dense-MLP layers (share ``(L - Lm) / L``): ``gate_up``, ``down``. MoE layers (share ``Lm / L``): the router,
    the shared experts, and each routed expert as one group of a grouped GEMM: ``E_hit`` groups
    (:func:`sim.cost.routing.distinct_experts`) of ``rows k / E_hit`` rows, each padded to whole tiles -- the grouped
    GEMM's waste at few tokens per expert. ``params`` is the product's weight count read per layer
    (routed experts: ``E_hit`` of them), the weight share of the stream.
    """
    from sim.cost.routing import distinct_experts

    d, H = m.hidden_size, m.n_heads
    out = []
    if m.is_mla:
        r, rq, dn, dr, dv = m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        att = ([(d, rq), (rq, H * (dn + dr))] if rq else [(d, H * (dn + dr))]) + [(d, r + dr), (r, H * (dn + dv)),
                                                                                (H * dv, d)]
    else:
        Hkv, Dh = m.n_kv_heads, m.head_dim
        att = [(d, (H + 2 * Hkv) * Dh), (H * Dh, d)]
    out += [(K, N, 1.0, 1.0, rows, float(K * N)) for K, N in att]
    L, Lm = m.n_layers, m.n_moe_layers
    if L - Lm:
        F = m.intermediate_size
        out += [(d, 2 * F, (L - Lm) / L, 1.0, rows, (L - Lm) / L * 2.0 * d * F),
                (F, d, (L - Lm) / L, 1.0, rows, (L - Lm) / L * F * d)]
    if Lm:
        f, Fe, Fs = Lm / L, m.moe_intermediate_size, m.shared_width
        out.append((d, m.num_experts, f, 1.0, rows, f * d * m.num_experts))
        if Fs:
            out += [(d, 2 * Fs, f, 1.0, rows, f * 2.0 * d * Fs), (Fs, d, f, 1.0, rows, f * Fs * d)]
        hit = distinct_experts(m, rows)
        per = rows * m.local_k / (hit + 1e-30)
        # params weigh the stream by bytes: MXFP4 experts are read at expert_elem_bytes, not weight_elem_bytes
        x = f * (m.expert_elem_bytes / m.weight_elem_bytes if m.quantization == "mxfp4" else 1.0)
        out += [(d, 2 * Fe, f, hit, per, x * hit * 2.0 * d * Fe), (Fe, d, f, hit, per, x * hit * Fe * d)]
    return out


# the profile field that holds the routed experts' compute fraction, by the model's weight format (quantization)
EXPERT_FIELDS = {"": "eff_c_moe", "fp8": "eff_c_moe_fp8", "mxfp4": "eff_c_moe_mxfp4"}


def _expert_fraction(hw, m) -> tuple:
    """``(field, peak)`` of the experts' format on ``hw``; ``(None, None)`` for FP8 weights dequantised into 16-bit
    GEMMs (w8a16), which run at the dense FP8 path's rate."""
    if m.quantization == "fp8":
        return ("eff_c_moe_fp8", hw.peak_flops_fp8) if hw.fp8_weights == "w8a8" else (None, None)
    return EXPERT_FIELDS[m.quantization], hw.peak_flops


def expert_rate(hw, m, rc: float, rc_lin: float):
    """The compute rate of an MoE layer's routed-expert products (vLLM's fused-MoE grouped GEMMs), by the experts'
    weight format; each ``None`` coefficient falls back to the dense products' rate (``rc``, or ``rc_lin`` for FP8
    weights), the rate before these coefficients existed::

        fp8 on FP8 tensor cores (fp8_weights: w8a8):  peak_flops_fp8 eff_c_moe_fp8
        mxfp4 (weight-only, 16-bit math):              peak_flops eff_c_moe_mxfp4
        16-bit:                                        peak_flops eff_c_moe

    (fitted by ``calibrate/moe_kernels.py`` on per-operator fused-MoE kernel timings: the Triton grouped GEMM runs
    far below a dense GEMM's fraction at prefill sizes, docs/calibration.md "Fused-MoE kernels").
    """
    field, peak = _expert_fraction(hw, m)
    v = None if field is None else getattr(hw, field)
    if v is None:
        return rc_lin if m.quantization == "fp8" else rc
    return peak * v


def expert_rate_words(hw, m) -> str | None:
    """In words, the rate an MoE model's routed experts are priced at on ``hw`` (:func:`expert_rate`), for a run's
    provenance; None where the profile does not price the products one by one (no ``sm_count`` or not the
    per-operator roofline: :func:`sim.cost.roofline.seconds` then has no routed products to rate)."""
    if not (hw.sm_count and hw.roofline == "operator"):
        return None
    field, _ = _expert_fraction(hw, m)
    if field is None:
        return "routed experts at the dense FP8 (w8a16) rate"
    v = getattr(hw, field)
    if v is None:
        return f"routed experts at the dense products' rate ({field} not fitted: no fused-MoE kernel timing)"
    peak = "the FP8 peak" if field == "eff_c_moe_fp8" else "the 16-bit peak"
    return f"routed experts at {field} {v:g} of {peak} (fitted on vLLM's fused-MoE kernel timings)"


def wave_linear_head(m, sms: int, rows, layers, head_rows, rc, mem_lin, mem_head, ops=None, rc_lin=None,
                     rc_moe=None):
    """Linear layers' and LM head's time under wave quantisation (``sim.cost.hardware.HardwareProfile.sm_count``).

    ``rows`` token rows through ``layers`` layers (every running item's rows through the deepest
    item's layers), ``head_rows = f_head / (2 d V)`` LM-head / probe rows as one ``d x V``
    product; ``mem_lin`` / ``mem_head`` their weight-stream seconds, split over the products by
    weight share (the norm weights' ``2 d`` streamed alone); ``rc_lin`` (None: ``rc``) is the linear
    layers' rate where it differs from the LM head's (FP8 weights on FP8 tensor cores), ``rc_moe`` (None:
    ``rc_lin``) the routed experts' (:func:`expert_rate`; the last two products of :func:`variant_gemms`)::

        t = sum_j max(layers F_q(rows, K_j, N_j) / rc, mem_lin K_j N_j / P) + mem_lin 2 d / P
            + max(F_q(head_rows, d, V) / rc, mem_head)
    """
    mx = (ops or _NP).maximum
    if not m.is_plain:
        # MoE / MLA layers: each product of variant_gemms in whole waves (routed experts: groups of padded
        # tiles), the weight stream split by the weights each reads
        o = ops or _NP
        gs = variant_gemms(m, rows, ops)
        tot = 2.0 * m.hidden_size
        for g in gs:
            tot = tot + g[5]
        t = mem_lin * (2.0 * m.hidden_size / tot)
        lin = rc if rc_lin is None else rc_lin
        routed = len(gs) - 2 if m.n_moe_layers else len(gs)   # variant_gemms puts the routed experts last
        for j, (K, N, share, groups, grows, params) in enumerate(gs):
            fq = grouped_wave_flops(groups, grows, K, N, sms, o)
            r = rc_moe if j >= routed and rc_moe is not None else lin
            t = t + mx(share * layers * fq / r, mem_lin * (params / tot))
        return t + mx(gemm_wave_flops(head_rows, m.hidden_size, m.vocab_size, sms, ops) / rc, mem_head)
    P = float(m.params_per_layer)
    t = mem_lin * (2.0 * m.hidden_size / P)
    for K, N in layer_gemms(m):
        t = t + mx(layers * gemm_wave_flops(rows, K, N, sms, ops) / (rc if rc_lin is None else rc_lin),
                   mem_lin * (K * N / P))
    return t + mx(gemm_wave_flops(head_rows, m.hidden_size, m.vocab_size, sms, ops) / rc, mem_head)
