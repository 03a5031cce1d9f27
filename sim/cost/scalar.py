"""One forward iteration priced item by item in plain Python floats: :class:`ScalarCost`.

The simpy engine prices one iteration at a time with a handful of items, where numpy's per-call overhead
would dominate; :class:`ScalarCost` sums the same terms as :func:`sim.cost.terms.batch_terms` (formulas in
:mod:`sim.cost.terms`'s docstring; tested equal) and prices them with :func:`sim.cost.roofline.seconds`.
"""
from __future__ import annotations

import bisect
import itertools

import numpy as np

from sim.cost.opterms import K_FWD, K_LAYER, K_PROBE, OpTerms, elem_bytes_per_token_layer, variant, window_keys
from sim.cost.model_shape import ModelShape
from sim.cost.roofline import FLOAT, MIXED, NUMPY, seconds

# fast-forward stretches of at most this many iterations are priced one by one in plain floats (same floats);
# of one batch size, MIXED prices its batch-size-only terms once, cheaper from 3 iterations (measured)
SCALAR_STEPS = 8
SCALAR_STEPS_ONE_B = 2


def _fmax(a, b):
    return a if a > b else b


def _fmin(a, b):
    return a if a < b else b


class ScalarCost:
    """:func:`batch_terms` for one iteration in plain Python floats, priced by the one formula.

    The simpy engine prices one iteration at a time with a handful of items; numpy's per-call
    overhead would dominate there. The terms are summed item by item here (the same sums as
    :func:`batch_terms`'s, tested equal) and priced by :func:`sim.cost.roofline.seconds` with plain-float
    operations: the formula itself is written once, for this path and ``HardwareProfile.time``.
    """

    def __init__(self, m: ModelShape, hw, cuda_graph: bool = False, sample_vocab: int | None = None, graphs=None,
                 routing=None):
        # sample_vocab: entries the sampler sorts per row when it differs from m.vocab_size (a tensor-parallel
        # rank holds V / TP of the LM head but samples over the gathered V logits: sim.cost.parallel)
        # cuda_graph: every kernel replayed from a graph; graphs (sim.cost.graphs.CudaGraphs): vLLM's choice per
        # iteration -- padded to a capture size, full (uniform decode) or piecewise, eager above the largest
        self.m, self.hw, self.cuda_graph, self.graphs = m, hw, bool(cuda_graph), graphs
        self.L = float(m.n_layers)
        self.P = float(m.params_per_layer)
        self.att = 4.0 * m.n_heads * m.head_dim
        self.dV = float(m.hidden_size * m.vocab_size)
        self.V = float(m.vocab_size if sample_vocab is None else sample_vocab)
        self.d = float(m.hidden_size)
        self.s = float(m.dtype_bytes)
        self.sk = float(m.kv_elem_bytes)
        self.wl = float(m.layer_weight_bytes)
        self.fp8 = m.quantization == "fp8"
        self.kvt = 2.0 * m.n_kv_heads * m.head_dim
        self.elem = elem_bytes_per_token_layer(m)
        self.prices_shared = hw.eff_kv_shared is not None   # callers skip counting shared blocks when nothing prices them
        # MoE / MLA / sliding-window shapes: the per-item sums with their coefficients (module docstring)
        self.v = None if m.is_plain else variant(m)
        self.routing = routing   # MoE: None (expected distinct experts) or a SampledRouting
        self._waves: dict = {}   # roofline.seconds' memo of the wave-quantised matrix products (this hw and shape)

    def _item_sums(self, items, start=None):
        """:meth:`terms`'s per-item sums over ``items`` (plain floats, accumulated in item order), from ``start``
        (the same tuple: the sums of items before these) or zero.

        Returns ``(f_lin, f_att, f_head, kv, kvs, d_ell, d_ellc, d_cmax, emb, cp, nl, rows, rows_n, lmax, pmax,
        gmax, cp_any, uniform)``:
        the flops and KV elements of each operator group, the one-token rows' ``sum l_i``, ``sum l_i c_i`` and
        ``max c_i`` (padded attention), the maxima over items, and whether every running item decodes one token.
        """
        if start is None:
            f_lin = f_att = f_head = 0.0
            kv = kvs = 0.0
            d_ell = d_ellc = d_cmax = 0.0   # one-token rows: sum l_i, sum l_i c_i, max c_i (padded attention)
            emb = cp = nl = rows = rows_n = 0.0
            lmax = pmax = gmax = cp_any = 0.0
            uniform = True    # every running item decodes one token (vLLM's uniform decode batch)
        else:
            (f_lin, f_att, f_head, kv, kvs, d_ell, d_ellc, d_cmax, emb, cp, nl, rows, rows_n, lmax, pmax, gmax, cp_any,
             uniform) = start
        L = self.L
        v = self.v
        for it in items:
            n, c, ell, p, g, copy = it[:6]
            if ell is None:
                ell = L
            if n > 0:
                if n != 1.0:
                    uniform = False
                f_lin += 2.0 * self.P * n * ell
                if v is None:
                    f_att += self.att * ell * (n * c + n * (n + 1.0) / 2.0)
                    kv += ell * self.kvt * (c + n)
                    if len(it) > 7:
                        kvs += ell * self.kvt * it[7]
                else:
                    full = 1.0 - v.f_sw
                    keys = full * (n * c + n * (n + 1.0) / 2.0)
                    toks = full * (c + n)
                    if v.f_sw:
                        keys += v.f_sw * window_keys(n, c, v.window, _fmax, _fmin)
                        toks += v.f_sw * (_fmin(c, v.window - 1.0) + n)
                    f_att += (v.a_dec if n == 1.0 else v.a_pre) * ell * keys
                    kv += ell * v.kvt * toks
                    if len(it) > 7:
                        kvs += ell * v.kvt * it[7] * full
                if n == 1.0:
                    d_ell += ell
                    d_ellc += ell * c
                    if c > d_cmax:
                        d_cmax = c
                emb += 2.0 * self.d * n
                nl += n * ell
                rows_n += n
                rows += (it[6] if len(it) > 6 else (1.0 if g > 0 else 0.0))
                if ell > lmax:
                    lmax = ell
                if g > gmax:
                    gmax = g
            f_head += 2.0 * self.dV * (p + g)
            if p > pmax:
                pmax = p
            if copy > 0:
                cp += 2.0 * copy
                cp_any = 1.0
        return f_lin, f_att, f_head, kv, kvs, d_ell, d_ellc, d_cmax, emb, cp, nl, rows, rows_n, lmax, pmax, gmax, cp_any, uniform

    def terms(self, items) -> OpTerms:
        """``items``: iterable of ``(n, c, layers, probes, logits, copy[, sampled[, shared]])`` tuples (layers
        None = L); the :class:`OpTerms` of their iteration, every field a float.

        Without the 7th field an item with an LM-head row and new tokens samples one row; the 8th is
        ``h_i`` of "Shared KV reads" (default 0).
        """
        return self._terms(self._item_sums(items))

    def mixed_seconds(self, B: int, S: int, cmax: int, items, Ssw=None) -> float:
        """:meth:`seconds` of ``B`` one-token decodes ``(1, c_i, None, 0, 1, 0)`` (``S = sum_i c_i``, the longest
        ``cmax``) followed by ``items``: the decodes' sums in closed form (:meth:`closed_form`), then the items'
        added to them in turn, as :meth:`_item_sums` adds the stepped batch's::

            f_lin = 2 P L B,  f_att = a L (S + B),  f_head = 2 d V B,  kv = L kvt (S + B),
            d_ell = L B,  d_ellc = L S,  emb = 2 d B,  nl = L B,  rows = rows_n = B,
            d_cmax = cmax,  lmax = L,  gmax = 1

        (``a``, ``kvt``: the dense or the variant's attention and KV constants). A sliding-window shape
        (:meth:`sliding_window`) reads ``X = (1 - f_sw)(S + B) + f_sw Ssw`` keys for ``S + B`` in ``f_att`` and ``kv``,
        given ``Ssw = sum_i min(c_i + 1, W)`` (each decode's ``window_keys(1, c_i, W)``). Equal to :meth:`seconds` of
        the decodes and items one by one while each decode's terms are integers below 2^53 (multiples of 1/4 with
        sliding layers; :meth:`exact_integers`): the decodes' sums are then exact, and the items come after them,
        as in the stepped order."""
        if not self.closed_form() and (Ssw is None or self.sliding_window() is None):
            raise ValueError("mixed_seconds: the closed form prices dense, MoE and MLA layers, and sliding-window "
                             "layers given Ssw")
        start = None
        if B:
            L, B, S, cmax = self.L, float(B), float(S), float(cmax)
            att, kvt = (self.att, self.kvt) if self.v is None else (self.v.a_dec, self.v.kvt)
            X = self._decode_keys(B, S, Ssw, FLOAT)[0]
            start = (2.0 * self.P * L * B, att * L * X, 2.0 * self.dV * B, L * kvt * X, 0.0, L * B, L * S,
                     cmax, 2.0 * self.d * B, 0.0, B * L, B, B, L, 0.0, 1.0, 0.0, True)
        return seconds(self.hw, self._terms(self._item_sums(items, start)), FLOAT, model=self.m, memo=self._waves)

    def _terms(self, sums) -> OpTerms:
        """The :class:`OpTerms` of an iteration from :meth:`_item_sums`' sums."""
        (f_lin, f_att, f_head, kv, kvs, d_ell, d_ellc, d_cmax, emb, cp, nl, rows, rows_n, lmax, pmax, gmax, cp_any,
         uniform) = sums
        L = self.L
        v = self.v
        s, sk = self.s, self.sk
        gemm_rows = rows_n
        kernels = (K_LAYER * lmax + K_FWD if lmax > 0 else 0.0) + K_PROBE * pmax + cp_any
        kernels, gk = (0.0, kernels) if self.cuda_graph else (kernels, 0.0)
        tp = self.graphs.padded(rows_n) if self.graphs is not None and lmax > 0 else None
        if tp is not None:
            # padding rows run the captured layers (not the LM head: logits are computed on the real rows)
            pad = tp - rows_n
            f_lin += 2.0 * self.P * pad * lmax
            nl += pad * lmax
            gemm_rows = float(tp)
            launched = 0.0 if uniform else lmax   # piecewise: attention launched eagerly, once per layer
            kernels, gk = launched, kernels + gk - launched
        b_lin = lmax * self.wl
        b_head = s * (pmax + gmax) * self.dV
        b_att = sk * kv
        mv = 1.0 if rows_n == 1.0 else 0.0
        gap = d_cmax * d_ell - d_ellc
        if v is not None:
            # experts read: those the iteration's real rows route to (CUDA-graph padding rows are not counted)
            b_lin = lmax * v.lin_bytes(self.m, rows_n, self.routing)
            full = 1.0 - v.f_sw
            return OpTerms(f_lin + f_att + f_head, b_lin + b_head + b_att + s * emb + sk * cp * L * v.kvt, kernels,
                           lmax, rows * self.V, 1.0 if lmax > 0 else 0.0, gk, f_lin, b_lin, f_att, b_att, f_head,
                           b_head, nl * self.elem, mv * b_lin, mv * b_head, gemm_rows, sk * kvs,
                           v.a_dec * full * gap, sk * v.kvt * full * gap, f_lin if self.fp8 else 0.0)
        return OpTerms(f_lin + f_att + f_head, b_lin + b_head + b_att + s * emb + sk * cp * L * self.kvt, kernels,
                       lmax, rows * self.V, 1.0 if lmax > 0 else 0.0, gk, f_lin, b_lin, f_att, b_att, f_head, b_head,
                       nl * self.elem, mv * b_lin, mv * b_head, gemm_rows, sk * kvs, self.att * gap, sk * self.kvt * gap,
                       f_lin if self.fp8 else 0.0)

    def seconds(self, items) -> float:
        """Seconds of one iteration of ``items`` (see :meth:`terms`): :func:`sim.cost.roofline.seconds`."""
        return seconds(self.hw, self.terms(items), FLOAT, model=self.m, memo=self._waves)

    def exact_integers(self) -> bool:
        """Every constant a decode batch's sums add is an integer (their float sums are then exact, in any order):
        one decode's linear flops ``2 P L`` included, though the mean parameters per layer ``P`` need not be one (a
        shape with dense first layers: DeepSeek); ``w_layer`` and ``elem`` enter one product each."""
        v = () if self.v is None else (self.v.a_dec, self.v.kvt)
        return all(float(x).is_integer() for x in (self.L, 2.0 * self.P * 1.0 * self.L, self.att, self.dV, self.V,
                                                    self.d, self.s, self.sk, self.kvt, *v))

    def closed_form(self) -> bool:
        """Whether a uniform decode batch's terms are a function of ``(B, S, cmax)`` (:meth:`decode_batch_terms`):
        dense, MoE and MLA layers (the experts a batch reads depend on its rows alone); not sliding-window layers
        (their keys are ``min(c_i, W)`` per request, not a function of ``S``)."""
        return self.v is None or not self.v.f_sw

    def sliding_window(self):
        """The window ``W`` of a shape's sliding-window layers where a uniform decode batch's terms have a closed form
        given the per-step sum ``Ssw = sum_i min(c_i + 1, W)`` (:meth:`decode_batch_terms`): their share ``f_sw`` of
        the layers a multiple of 1/4 (gpt-oss: 1/2), so each decode's keys ``(1 - f_sw)(c_i + 1) + f_sw min(c_i + 1,
        W)`` are multiples of 1/4 and their float sums exact in any order; else None (no sliding layers, or a share
        such as Gemma 3's 5/6 whose sums depend on their order: such a shape steps)."""
        v = self.v
        if v is None or not v.f_sw or not (v.f_sw * 4.0).is_integer():
            return None
        return int(v.window)

    def _lin_bytes(self, B, one: bool):
        """``v.lin_bytes`` of ``B`` rows (:meth:`_terms`' ``b_lin / lmax``), in Python floats per distinct ``B``."""
        if one:
            return self.v.lin_bytes(self.m, B, self.routing)
        u, inv = np.unique(B, return_inverse=True)
        return np.array([self.v.lin_bytes(self.m, float(x), self.routing) for x in u], np.float64)[inv]

    def decode_batch_terms(self, B, S, cmax, ops=NUMPY, Ssw=None) -> OpTerms:
        """:meth:`terms` of uniform decode iterations in closed form, vectorised: ``B`` requests decoding one token
        each (the items ``(1, c_i, None, 0, 1, 0)`` the engine prices) over ``S = sum_i c_i`` cached tokens, the
        longest ``cmax``; arrays broadcast (one entry per iteration; ``ops``: :data:`~sim.cost.roofline.FLOAT` for
        one iteration in plain floats, :data:`~sim.cost.roofline.MIXED` for one batch size ``B`` over arrays ``S``,
        ``cmax``, the batch-size-only terms in floats: the same operations). With ``L`` layers::

            f_lin = 2 P L (B + pad),  f_att = 4 H Dh L (S + B),  f_head = 2 d V B,  b_att = s_kv 2 Hkv Dh L (S + B)
            b_lin = L w_layer,  b_head = s d V,  emb = 2 d B,  rows = B,  gap = L (B cmax - S)
            pad = graphs.padded(B) - B (0 without graphs or above the largest capture size)

        and the kernels of one forward, replayed from the full graph when padded. An MoE / MLA shape
        (:meth:`closed_form`) takes its variant's constants: ``f_att = a_dec L (S + B)``, ``b_att = s_kv kvt L (S +
        B)`` (MLA: the absorbed decode attention, the latent KV) and ``b_lin = L (W_fixed + (Lm/L) E_hit(B) B_e)``,
        the experts ``B`` rows read, in Python floats per batch size as :meth:`terms` computes them. A shape with
        sliding-window layers (:meth:`sliding_window`) takes ``Ssw = sum_i min(c_i + 1, W)`` per iteration and reads
        ``X = (1 - f_sw)(S + B) + f_sw Ssw`` for ``S + B`` in ``f_att`` and ``b_att``, its gap terms scaled by
        ``1 - f_sw``. Equal to :meth:`terms` bit for bit while every term is an integer (a multiple of 1/4 with
        sliding layers) below 2^53 (:meth:`exact_integers`; ``tests/test_fastforward.py``).
        """
        one = ops is not NUMPY   # B one number (FLOAT: S and cmax too; MIXED: arrays)
        if ops is FLOAT:
            B, S, cmax = float(B), float(S), float(cmax)
        elif one:
            B = float(B)
            S = np.asarray(S, np.float64)
            cmax = np.asarray(cmax, np.float64)
        else:
            B = np.asarray(B, np.float64)
            S = np.asarray(S, np.float64)
            cmax = np.asarray(cmax, np.float64)
        L = self.L
        kern = K_LAYER * L + K_FWD
        if self.graphs is not None:
            sizes = self.graphs.capture_sizes
            if one:
                graphed = 0 < B <= sizes[-1]
                tp = float(sizes[bisect.bisect_left(sizes, B)]) if graphed else B
            else:
                sizes = np.asarray(sizes, np.float64)
                pos = np.searchsorted(sizes, B, side="left")
                graphed = (B > 0) & (B <= sizes[-1])
                tp = np.where(graphed, sizes[np.minimum(pos, len(sizes) - 1)], B)
        else:
            graphed = False if one else np.zeros(B.shape, bool)
            tp = B
        pad = tp - B
        f_lin = 2.0 * self.P * L * B + 2.0 * self.P * pad * L
        v = self.v
        if v is None:
            att, kvt = self.att, self.kvt
            b_lin = L * self.wl + 0.0 * B
        else:   # MoE / MLA (closed_form): the variant's attention and KV constants, the experts B rows read
            att, kvt = v.a_dec, v.kvt
            b_lin = L * self._lin_bytes(B, one) + 0.0 * B
        X, full = self._decode_keys(B, S, Ssw, ops)
        f_att = att * L * X
        f_head = 2.0 * self.dV * B
        kv = L * kvt * X
        s, sk = self.s, self.sk
        b_head = s * self.dV + 0.0 * B
        b_att = sk * kv
        if self.cuda_graph:
            kernels, gk = 0.0 * B, kern + 0.0 * B
        else:
            kernels, gk = ops.where(graphed, 0.0, kern), ops.where(graphed, kern, 0.0)
        mv = (B == 1.0) * 1.0
        gap = cmax * (B * L) - L * S
        nl = B * L + pad * L
        zero = 0.0 * B
        return OpTerms(f_lin + f_att + f_head, b_lin + b_head + b_att + s * (2.0 * self.d * B), kernels, L + zero,
                       B * self.V, 1.0 + zero, gk, f_lin, b_lin, f_att, b_att, f_head, b_head, nl * self.elem,
                       mv * b_lin, mv * b_head, tp + zero, zero, att * gap if full == 1.0 else att * full * gap,
                       sk * kvt * gap if full == 1.0 else sk * kvt * full * gap, f_lin if self.fp8 else zero)

    def _decode_keys(self, B, S, Ssw, ops):
        """``(X, 1 - f_sw)``: the keys a uniform decode batch's attention reads per layer, ``S + B``, or with
        sliding-window layers ``(1 - f_sw)(S + B) + f_sw Ssw`` (:meth:`decode_batch_terms`)."""
        v = self.v
        if v is None or not v.f_sw:
            return S + B, 1.0
        if Ssw is None:
            raise ValueError("decode_batch_terms: a sliding-window shape needs Ssw = sum_i min(c_i + 1, W)")
        full = 1.0 - v.f_sw
        return full * (S + B) + v.f_sw * (float(Ssw) if ops is FLOAT else np.asarray(Ssw, np.float64)), full

    def decode_batch_seconds(self, B, S, cmax, Ssw=None) -> np.ndarray:
        """Seconds of the iterations of :meth:`decode_batch_terms`: one numpy pass of :func:`sim.cost.roofline.seconds`,
        or, for a few iterations, each in plain floats (:data:`~sim.cost.roofline.FLOAT`: the same operations, so
        the same floats, without numpy's per-call cost, which dominates a short fast-forward stretch). A batch size
        given as one number (a stretch of steps of one batch) prices its batch-size-only terms once, in floats
        (:data:`~sim.cost.roofline.MIXED`). ``Ssw``: each iteration's sliding-window key sum (:meth:`sliding_window`;
        None without sliding layers)."""
        sw = Ssw if Ssw is not None else 0
        if (np.ndim(B) == 0 and type(S) is np.ndarray and type(cmax) is np.ndarray and S.ndim == 1
                and S.shape == cmax.shape and (Ssw is None or np.shape(Ssw) == S.shape)):
            # a window's stretch of one batch size (its common call): without broadcasting, in floats for a few steps
            if len(S) > SCALAR_STEPS_ONE_B:
                t = self.decode_batch_terms(B, S, cmax, MIXED, Ssw)
                # a new float64 array of S's shape (S enters every attention term): one entry per iteration
                return seconds(self.hw, t, MIXED, model=self.m, memo=self._waves)
            steps = zip(itertools.repeat(B.item() if isinstance(B, np.generic) else B), S.tolist(), cmax.tolist(),
                        np.broadcast_to(sw, S.shape).tolist())
        else:
            shape = np.broadcast_shapes(np.shape(B), np.shape(S), np.shape(cmax), np.shape(sw))
            if not (len(shape) == 1 and shape[0] <= (SCALAR_STEPS_ONE_B if np.ndim(B) == 0 else SCALAR_STEPS)):
                ops = MIXED if np.ndim(B) == 0 else NUMPY
                t = self.decode_batch_terms(B, S, cmax, ops, Ssw)
                return np.broadcast_to(np.asarray(seconds(self.hw, t, ops, model=self.m, memo=self._waves), np.float64),
                                       shape).copy()
            steps = zip(*(np.broadcast_to(x, shape).tolist() for x in (B, S, cmax, sw)))
        hw, m, waves = self.hw, self.m, self._waves
        return np.array([seconds(hw, self.decode_batch_terms(b, x, c, FLOAT, None if Ssw is None else w), FLOAT,
                                 model=m, memo=waves) for b, x, c, w in steps], np.float64)


def with_shared(item: tuple, h: float) -> tuple:
    """``item`` (a :meth:`ScalarCost.seconds` tuple) with ``h_i`` as its 8th field; an absent 7th field (rows
    sampled) gets its default, one row when the item has an LM-head row."""
    if not h:
        return item
    sampled = item[6] if len(item) > 6 else (1.0 if item[4] > 0 else 0.0)
    return tuple(item[:6]) + (sampled, float(h))
