"""Wave quantisation of matrix products: whole waves of CTA tiles on ``sm_count`` SMs.

``HardwareProfile.sm_count`` (None: off). A GEMM of
``r`` token rows through a ``K x N`` weight runs as CTA tiles of ``tm x tn`` outputs, one tile
per SM at a time (cuBLAS-like: 128 x 128; ``tm`` 64 at r <= 64, one Hopper warpgroup's
wgmma M): its compute takes whole waves of ``sm`` tiles::

    tiles = ceil(r / tm) ceil(N / tn),   F_q = ceil(tiles / sm) sm tm tn 2 K   (>= 2 r K N)

and each product is its own roofline ``max(F_q / rc, B / rm)`` (constants, not fitted).

Used by the per-operator roofline (:class:`sim.cost.profiles.HardwareProfile`, :class:`sim.cost.terms.ScalarCost`)
and by the public-profile fits (:mod:`calibrate.public_profiles`): one formula. ``m`` below is a
:class:`sim.cost.profiles.ModelShape`.
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


def layer_gemms(m) -> tuple:
    """``(K, N)`` of one layer's matrix products as vLLM fuses them: qkv, o, gate_up, down (``sum K N = P - 2 d``)."""
    d, H, Hkv, Dh, F = m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim, m.intermediate_size
    return ((d, (H + 2 * Hkv) * Dh), (H * Dh, d), (d, 2 * F), (F, d))


def wave_linear_head(m, sms: int, rows, layers, head_rows, rc, mem_lin, mem_head, ops=None, rc_lin=None):
    """Linear layers' and LM head's time under wave quantisation (``sim.cost.profiles.HardwareProfile.sm_count``).

    ``rows`` token rows through ``layers`` layers (every running item's rows through the deepest
    item's layers), ``head_rows = f_head / (2 d V)`` LM-head / probe rows as one ``d x V``
    product; ``mem_lin`` / ``mem_head`` their weight-stream seconds, split over the products by
    weight share (the norm weights' ``2 d`` streamed alone); ``rc_lin`` (None: ``rc``) is the linear
    layers' rate where it differs from the LM head's (FP8 weights on FP8 tensor cores)::

        t = sum_j max(layers F_q(rows, K_j, N_j) / rc, mem_lin K_j N_j / P) + mem_lin 2 d / P
            + max(F_q(head_rows, d, V) / rc, mem_head)
    """
    mx = (ops or _NP).maximum
    P = float(m.params_per_layer)
    t = mem_lin * (2.0 * m.hidden_size / P)
    for K, N in layer_gemms(m):
        t = t + mx(layers * gemm_wave_flops(rows, K, N, sms, ops) / (rc if rc_lin is None else rc_lin),
                   mem_lin * (K * N / P))
    return t + mx(gemm_wave_flops(head_rows, m.hidden_size, m.vocab_size, sms, ops) / rc, mem_head)
