"""The cost model's vocabulary: :class:`OpTerms` (the work terms), the kernels per forward, and the
coefficients of non-dense shapes (:class:`Variant`).

The formulas that fill these terms are in :mod:`sim.cost.terms`'s docstring (the dense model); the
non-dense shapes change them as follows.

Mixture of experts, multi-head latent attention, sliding windows (:class:`sim.cost.model_shape.ModelShape`; a
dense model takes none of this and its terms are the ones above, unchanged). ``rows`` token rows route
to ``k`` of ``E`` experts each; under uniform, independent routing the expected number of distinct
experts an iteration's MoE layer hits is::

    E_hit(rows) = E (1 - (1 - k / E)^rows)

(derived, the balls-into-bins expectation: a token's k distinct choices miss a given expert with
probability ``1 - k / E``, independently across tokens; ``tests/test_moe.py`` holds it against seeded
sampling of the same routing. Uniform routing is an assumption, not a measurement: a trained router is
skewed, which hits fewer distinct experts at a batch, so this is the upper end of the weights read).
Then, with ``Lm / L`` the MoE layers' share and
``B_e`` one routed expert's bytes (:attr:`~sim.cost.model_shape.ModelShape.routed_expert_bytes`)::

    f_lin = sum_i 2 P_act n_i l_i                                 # P_act: mean active params per layer
                                                                   # (router d E, k + S experts: 2 T k P_e)
    b_lin = max_i(l_i) (W_layer - (Lm / L) (E - E_hit(rows)) B_e)  # experts no token routed to are not read

MLA (DeepSeek-V2 §2.1; vLLM's MLA backends): one token's KV is ``r + dr`` elements per layer; a decode row
runs attention with the absorbed weights over the latent, ``2 H (r + dr)`` flops per key for QK^T and
``2 H r`` for AV; a prefill row runs it expanded to heads, ``2 H (dn + dr) + 2 H dv`` per key (the
up-projection of cached latents for a chunked prefill is not counted)::

    a_decode = 2 H (2 r + dr),   a_prefill = 2 H (dn + dr + dv)    (dense: both 4 H Dh)

Sliding-window layers (``L_sw`` of ``L``, window ``W``): the new token ``j`` of an item attends to
``min(c + j, W)`` keys and the layer reads ``min(c, W - 1) + n`` tokens of KV (vLLM's window is the
current token and the ``W - 1`` before it)::

    keys_i = (1 - L_sw / L) (n c + n (n + 1) / 2) + (L_sw / L) sum_j min(c + j, W)
    kv_i   = (1 - L_sw / L) (c + n) + (L_sw / L) (min(c, W - 1) + n)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cost.model_shape import ModelShape
from sim.cost.routing import distinct_experts


# Kernels per decoder layer: 2 norms, fused qkv, rope, attention, o_proj, gate_up, act*mul, down, 2 residual adds.
K_LAYER = 11
# Kernels per forward outside the layers: embedding gather, final norm, LM head, sampling.
K_FWD = 4
# Kernels per logit-lens probe: final norm, d x V matmul, softmax/entropy reduction.
K_PROBE = 3

# Every field of OpTerms, in order: the rows of the calibration design matrix (``as_full_array``).
TERM_NAMES = ("flops", "bytes", "kernels", "layers", "samples", "iters", "graph_kernels",
              "f_lin", "b_lin", "f_att", "b_att", "f_head", "b_head", "b_elem", "b_lin_mv", "b_head_mv", "rows",
              "b_kv_shared", "f_att_pad", "b_att_pad", "f_lin_fp8")


@dataclass(frozen=True)
class OpTerms:
    """Hardware-independent work of one operation (fields are floats or equal-shape arrays).

    The first four are the whole-iteration roofline's; the others default to 0 so that
    ``OpTerms(flops, bytes, kernels, layers)`` keeps its meaning (with the per-operator
    roofline such terms count as one operator).
    """

    flops: np.ndarray | float
    bytes: np.ndarray | float
    kernels: np.ndarray | float
    layers: np.ndarray | float
    samples: np.ndarray | float = 0.0        # vocabulary entries sorted by top-p sampling (rows x V)
    iters: np.ndarray | float = 0.0          # forward calls (host time per iteration)
    graph_kernels: np.ndarray | float = 0.0  # kernels replayed from a CUDA graph (instead of launched)
    f_lin: np.ndarray | float = 0.0
    b_lin: np.ndarray | float = 0.0
    f_att: np.ndarray | float = 0.0
    b_att: np.ndarray | float = 0.0
    f_head: np.ndarray | float = 0.0
    b_head: np.ndarray | float = 0.0
    b_elem: np.ndarray | float = 0.0         # element-wise traffic: charged by the per-operator roofline only
    b_lin_mv: np.ndarray | float = 0.0       # the part of b_lin read by matrix-vector products (one token row)
    b_head_mv: np.ndarray | float = 0.0      # the part of b_head read by matrix-vector products (one token row)
    rows: np.ndarray | float = 0.0           # token rows of the linear layers (sum_i n_i): BLAS row blocking
    b_kv_shared: np.ndarray | float = 0.0    # the part of b_att re-read from KV blocks an earlier item of the
                                             # iteration read too ("Shared KV reads")
    f_att_pad: np.ndarray | float = 0.0      # attention over padding when one-token rows are padded to the
    b_att_pad: np.ndarray | float = 0.0      # longest context ("Padded decode attention"); not in flops/bytes
    f_lin_fp8: np.ndarray | float = 0.0      # the part of f_lin whose weights are FP8 ("Precision"): all of it or 0

    def __add__(self, other: "OpTerms") -> "OpTerms":
        """Two operations run one after the other (not batched)."""
        return OpTerms(*(getattr(self, k) + getattr(other, k) for k in TERM_NAMES))

    def as_array(self) -> np.ndarray:
        """``(4, ...)`` array [flops, bytes, kernels, layers] (the whole-iteration roofline's terms)."""
        return np.stack(np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in
                                              (self.flops, self.bytes, self.kernels, self.layers))))

    def as_full_array(self) -> np.ndarray:
        """``(len(TERM_NAMES), ...)`` array of every term (``calibrate.fit``'s design matrix)."""
        return np.stack(np.broadcast_arrays(*(np.asarray(getattr(self, k), dtype=np.float64) for k in TERM_NAMES)))

    @classmethod
    def from_array(cls, a: np.ndarray) -> "OpTerms":
        """Inverse of :meth:`as_full_array` (rows beyond those given are 0)."""
        return cls(*(a[i] for i in range(a.shape[0])))


ZERO = OpTerms(0.0, 0.0, 0.0, 0.0)


def elem_bytes_per_token_layer(m: ModelShape) -> float:
    """Element-wise traffic of one token through one layer: ``s (10 d + 2 (H + Hkv) Dh + 3 F)``.

    MoE / MLA layers: ``F`` is the mean over layers of the MLP width a token runs (``(k + S) Fe`` on an MoE
    layer) and RoPE touches ``H dr + dr`` elements under MLA (the rope part of q and the shared rope key).
    """
    if m.is_plain:
        return float(m.dtype_bytes * (10 * m.hidden_size + 2 * (m.n_heads + m.n_kv_heads) * m.head_dim
                                      + 3 * m.intermediate_size))
    return float(m.dtype_bytes * (10 * m.hidden_size + 2 * _rope_elems(m) + 3 * _mlp_width(m)))


def _rope_elems(m: ModelShape) -> int:
    return (m.n_heads + 1) * m.qk_rope_head_dim if m.is_mla else (m.n_heads + m.n_kv_heads) * m.head_dim


def _mlp_width(m: ModelShape) -> float:
    """Mean over layers of the MLP width one token runs: ``F`` on dense layers, ``(k + S) Fe`` on MoE ones."""
    Lm, L = m.n_moe_layers, m.n_layers
    return ((L - Lm) * m.intermediate_size + Lm * (m.local_k * m.moe_intermediate_size + m.shared_width)) / L


@dataclass(frozen=True)
class Variant:
    """The per-layer constants of a non-dense shape the three term builders share (module docstring)."""

    a_dec: float      # attention flops per key and query row, decode rows (MLA absorbed; dense 4 H Dh)
    a_pre: float      # ... prefill rows (MLA expanded to heads)
    kvt: float        # KV elements per token and layer
    f_sw: float       # L_sw / L: share of sliding-window layers
    window: float     # W (0: none)
    w_fixed: float    # mean weight bytes per layer outside the routed experts
    w_expert: float   # (Lm / L) B_e: mean bytes per layer of one routed expert

    def lin_bytes(self, m: ModelShape, rows, routing=None):
        """Mean weight bytes per layer an iteration of ``rows`` token rows reads: ``W_fixed + (Lm/L) E_hit B_e``
        (``routing``: None for the expectation, or a :class:`SampledRouting`)."""
        hit = distinct_experts(m, rows) if routing is None else routing.distinct(m, rows)
        return self.w_fixed + self.w_expert * hit


def variant(m: ModelShape) -> Variant:
    """:class:`Variant` of ``m`` (a dense model's values give the dense formulas)."""
    H = m.n_heads
    if m.is_mla:
        r, dr, dn, dv = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        a_dec, a_pre = 2.0 * H * (2 * r + dr), 2.0 * H * (dn + dr + dv)
    else:
        a_dec = a_pre = 4.0 * H * m.head_dim
    we = m.n_moe_layers / m.n_layers * m.routed_expert_bytes
    return Variant(a_dec, a_pre, float(m.kv_elems_per_token_layer), m.n_sliding_layers / m.n_layers,
                   float(m.sliding_window), float(m.layer_weight_bytes) - we * m.local_experts, we)


def window_keys(n, c, W, lo=np.maximum, hi=np.minimum):
    """``sum_{j=1..n} min(c + j, W)``: keys the ``n`` new tokens over ``c`` cached attend to in a window of
    ``W``; with ``j0 = min(max(W - c, 0), n)`` queries inside it, ``j0 c + j0 (j0 + 1) / 2 + (n - j0) W``."""
    j0 = hi(lo(W - c, 0.0), n)
    return j0 * c + j0 * (j0 + 1.0) / 2.0 + (n - j0) * W
