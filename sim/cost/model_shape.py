"""The model shape: the cost model's first input (a decoder-only transformer: dense, mixture-of-experts,
multi-head latent attention, sliding-window layers), with the dtype and quantization names it prices.
Loaded from presets by :func:`sim.cost.profiles.load_model`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.base.errors import PresetError


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer with gated MLPs: dense (Llama/Qwen/Mistral), mixture-of-experts
    (Mixtral, Qwen3-MoE, gpt-oss, DeepSeek), multi-head latent attention (DeepSeek-V2/V3) and sliding-window
    layers (gpt-oss).

    Parameters per dense decoder layer (norm weights included)::

        P_layer = A + 3*d*F + 2*d,     A = d*(H*Dh) + 2*d*(Hkv*Dh) + (H*Dh)*d

    (q, k, v, o projections; gate, up, down of the gated MLP; two RMSNorms).

    Mixture of experts (``num_experts`` E > 0; every layer from ``first_k_dense`` on; HF's
    ``first_k_dense_replace``): the MLP is a router ``d*E``, E routed experts of ``3*d*Fe`` (``Fe`` =
    ``moe_intermediate_size``) of which each token runs ``experts_per_token`` k, and ``num_shared_experts``
    S experts of the same width that every token runs (DeepSeekMoE)::

        P_moe_layer(stored) = A + d*E + (E + S)*3*d*Fe + 2*d
        P_moe_layer(active) = A + d*E + (k + S)*3*d*Fe + 2*d

    Multi-head latent attention (``kv_lora_rank`` r > 0; DeepSeek-V2, arXiv 2405.04434 §2.1): with
    ``qk_nope_head_dim`` dn, ``qk_rope_head_dim`` dr, ``v_head_dim`` dv and ``q_lora_rank`` rq (0: a full
    ``q_proj``) the attention weights are::

        A_mla = [rq > 0] (d*rq + rq + rq*H*(dn + dr)) + [rq = 0] d*H*(dn + dr)     # q_a, q_a_norm, q_b | q_proj
                + d*(r + dr) + r + r*H*(dn + dv) + H*dv*d                          # kv_a, kv_a_norm, kv_b, o

    and one token stores ``r + dr`` KV elements per layer (the compressed latent and the shared rope key).

    Sliding window (``sliding_window`` W > 0 with ``layer_types``, HF's list of ``"sliding_attention"`` /
    ``"full_attention"`` per layer): a sliding layer attends to the last W tokens and keeps their KV only.
    """

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    tied_embeddings: bool
    source: str = ""
    dtype: str = ""   # torch dtype name when known (a trace manifest); presets give only dtype_bytes
    quantization: str = ""     # vLLM's --quantization: "" (the weights' own dtype) or "fp8" (QUANTIZATIONS)
    kv_cache_dtype: str = ""   # vLLM's --kv-cache-dtype: "" / "auto" (dtype_bytes) or fp8 (KV_CACHE_DTYPES)
    # mixture of experts (0: a dense MLP in every layer)
    num_experts: int = 0              # routed experts per MoE layer (num_experts / num_local_experts / n_routed_experts)
    experts_per_token: int = 0        # top-k (num_experts_per_tok)
    num_shared_experts: int = 0       # experts every token runs (n_shared_experts), each moe_intermediate_size wide
    moe_intermediate_size: int = 0    # one expert's MLP width
    first_k_dense: int = 0            # the first k layers keep a dense MLP of intermediate_size (first_k_dense_replace)
    # multi-head latent attention (0: grouped-query attention with n_kv_heads x head_dim)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0              # 0: a full q_proj (DeepSeek-V2-Lite's q_lora_rank: null)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention (0: every layer attends to the whole context)
    sliding_window: int = 0
    layer_types: tuple = ()           # per layer "sliding_attention" | "full_attention" (HF's layer_types)
    weights_format: str = ""          # the released checkpoint's weight format when not dtype_bytes (information:
                                      # priced only through --quantization)
    # one rank's shard (sim.cost.parallel.rank_model), not preset fields: the shared experts' total width when it is
    # not num_shared_experts x moe_intermediate_size (TP-sharded under expert parallelism), and the expert
    # parallel size whose rank this shape is (it holds num_experts / expert_parallel_size whole experts)
    shared_expert_intermediate_size: int = 0
    expert_parallel_size: int = 1
    # token rows this rank's routed experts see per row of its own batch: D under vLLM's DP attention + EP (each
    # DP rank's experts run over every DP rank's tokens, all-gathered: sim.cost.alltoall), else 1
    expert_rows_factor: int = 1

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "dtype_bytes"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise PresetError(f"model preset {self.source or self.name}: field {f!r} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise PresetError(f"model preset {self.source or self.name}: n_heads must be a multiple of n_kv_heads")
        if self.quantization not in QUANTIZATIONS:
            raise PresetError(f"model {self.name}: --quantization {self.quantization!r} is not priced; "
                              f"one of: {', '.join(q for q in QUANTIZATIONS if q)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise PresetError(f"model {self.name}: --kv-cache-dtype {self.kv_cache_dtype!r} is not priced; "
                              f"one of: {', '.join(k for k in KV_CACHE_DTYPES if k)}")
        self._check_variants()

    def _check_variants(self) -> None:
        """MoE / MLA / sliding-window fields: consistent, each error naming the field."""
        where = f"model preset {self.source or self.name}"
        for f in VARIANT_INT_FIELDS:
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise PresetError(f"{where}: field {f!r} must be a non-negative integer, got {v!r}")
        if self.num_experts:
            for f in ("experts_per_token", "moe_intermediate_size"):
                if not getattr(self, f):
                    raise PresetError(f"{where}: field {f!r} must be positive when num_experts is set")
            if self.experts_per_token > self.num_experts:
                raise PresetError(f"{where}: field 'experts_per_token' ({self.experts_per_token}) exceeds "
                                  f"num_experts ({self.num_experts})")
            if self.first_k_dense >= self.n_layers:
                raise PresetError(f"{where}: field 'first_k_dense' ({self.first_k_dense}) leaves no MoE layer of "
                                  f"{self.n_layers}")
        else:
            for f in ("experts_per_token", "num_shared_experts", "moe_intermediate_size", "first_k_dense",
                      "shared_expert_intermediate_size"):
                if getattr(self, f):
                    raise PresetError(f"{where}: field {f!r} needs num_experts > 0")
        if self.kv_lora_rank:
            for f in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if not getattr(self, f):
                    raise PresetError(f"{where}: field {f!r} must be positive with kv_lora_rank (multi-head latent "
                                      "attention)")
        else:
            for f in ("q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if getattr(self, f):
                    raise PresetError(f"{where}: field {f!r} needs kv_lora_rank > 0 (multi-head latent attention)")
        lt = self.layer_types
        if isinstance(lt, list):
            lt = tuple(lt)
            object.__setattr__(self, "layer_types", lt)
        if not isinstance(lt, tuple) or any(x not in LAYER_TYPES for x in lt):
            raise PresetError(f"{where}: field 'layer_types' must be a list of {' / '.join(LAYER_TYPES)}, got {lt!r}")
        if lt and len(lt) != self.n_layers:
            raise PresetError(f"{where}: field 'layer_types' lists {len(lt)} layers, n_layers is {self.n_layers}")
        if bool(self.sliding_window) != ("sliding_attention" in lt):
            raise PresetError(f"{where}: fields 'sliding_window' and 'layer_types' go together: a window needs "
                              "sliding_attention layers and sliding_attention layers need a window")
        if self.sliding_window and self.kv_lora_rank:
            raise PresetError(f"{where}: field 'sliding_window' with kv_lora_rank: no released MLA model slides")
        ep = self.expert_parallel_size
        if not isinstance(ep, (int, np.integer)) or isinstance(ep, bool) or ep < 1 or (self.num_experts % ep):
            raise PresetError(f"{where}: field 'expert_parallel_size' must be a positive integer dividing "
                              f"num_experts ({self.num_experts}), got {ep!r}")
        f = self.expert_rows_factor
        if not isinstance(f, (int, np.integer)) or isinstance(f, bool) or f < 1:
            raise PresetError(f"{where}: field 'expert_rows_factor' must be a positive integer, got {f!r}")
        if not isinstance(self.weights_format, str):
            raise PresetError(f"{where}: field 'weights_format' must be a string, got {self.weights_format!r}")

    # ------------------------------------------------------------------ layer kinds
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (``L - first_k_dense``; 0 for a dense model)."""
        return self.n_layers - self.first_k_dense if self.num_experts else 0

    @property
    def n_sliding_layers(self) -> int:
        return sum(1 for x in self.layer_types if x == "sliding_attention")

    @property
    def is_plain(self) -> bool:
        """Dense MLPs, grouped-query attention over the whole context in every layer: the original shape."""
        return not (self.num_experts or self.kv_lora_rank or self.sliding_window)

    @property
    def attn_params_per_layer(self) -> int:
        """``A`` (dense: q, k, v, o) or ``A_mla`` (class docstring)."""
        d, H = self.hidden_size, self.n_heads
        if not self.kv_lora_rank:
            Hkv, Dh = self.n_kv_heads, self.head_dim
            return d * H * Dh + 2 * d * Hkv * Dh + H * Dh * d
        r, rq, dn, dr, dv = (self.kv_lora_rank, self.q_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
                             self.v_head_dim)
        q = (d * rq + rq + rq * H * (dn + dr)) if rq else d * H * (dn + dr)
        return q + d * (r + dr) + r + r * H * (dn + dv) + H * dv * d

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down projections: ``3 d Fe``."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def shared_width(self) -> int:
        """The shared experts' total MLP width: ``S Fe`` (or ``shared_expert_intermediate_size`` when set)."""
        return self.shared_expert_intermediate_size or self.num_shared_experts * self.moe_intermediate_size

    @property
    def local_experts(self) -> float:
        """Routed experts this shape holds per MoE layer: ``E / EP`` (``E`` on one GPU or under TP)."""
        return self.num_experts / self.expert_parallel_size if self.expert_parallel_size > 1 else self.num_experts

    @property
    def local_k(self) -> float:
        """Routed experts that run here per row of this rank's batch, in expectation: ``k / EP`` (``k`` without
        EP); under DP attention ``D k / EP`` (``expert_rows_factor`` D: the experts run over all D ranks' rows)."""
        k = self.experts_per_token * self.expert_rows_factor
        return k / self.expert_parallel_size if self.expert_parallel_size > 1 else k

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def dense_layer_params(self) -> int:
        """A dense layer: ``A + 3 d F + 2 d``."""
        return self.attn_params_per_layer + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size

    @property
    def moe_layer_params(self) -> int:
        """An MoE layer as stored: ``A + d E + (E + S) 3 d Fe + 2 d``."""
        return (self.attn_params_per_layer + self.router_params + self.local_experts * self.expert_params
                + 3 * self.hidden_size * self.shared_width + 2 * self.hidden_size)

    @property
    def moe_layer_active_params(self) -> int:
        """An MoE layer as one token runs it: ``A + d E + (k + S) 3 d Fe + 2 d``."""
        return (self.attn_params_per_layer + self.router_params + self.local_k * self.expert_params
                + 3 * self.hidden_size * self.shared_width + 2 * self.hidden_size)

    @property
    def layers_params(self) -> int:
        """Parameters of all decoder layers as stored."""
        if self.is_plain:
            return self.n_layers * self.params_per_layer
        Lm = self.n_moe_layers
        return (self.n_layers - Lm) * self.dense_layer_params + Lm * self.moe_layer_params

    @property
    def total_params(self) -> int:
        """Every parameter: layers, final norm, embedding and (unless tied) the LM head."""
        emb = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.layers_params + self.hidden_size + emb

    def active_params(self, embedding: bool = False) -> int:
        """Parameters one token runs: every layer's active ones, the final norm and the LM head (its product),
        plus the embedding table when ``embedding`` (model cards differ: the embedding is a row gather)."""
        d, L, V = self.hidden_size, self.n_layers, self.vocab_size
        Lm = self.n_moe_layers
        layers = (L - Lm) * self.dense_layer_params + Lm * self.moe_layer_active_params
        return layers + d + d * V + (d * V if embedding else 0)

    @property
    def kv_elems_per_token_layer(self) -> int:
        """KV elements one token stores in one attention layer: ``2 Hkv Dh``, or ``r + dr`` under MLA (vLLM's
        ``MLAAttentionSpec``: one latent head of ``kv_lora_rank + qk_rope_head_dim``)."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def kv_group_layers(self) -> int:
        """Layers of one KV-cache group of vLLM's hybrid allocator: every layer when all attend alike, else
        the smaller kind's count (the larger's when it is under 1.5 times the smaller), as
        ``_get_kv_cache_groups_uniform_page_size`` (vllm/v1/core/kv_cache_planning.py, vLLM 0.33.0) sets
        ``group_size``."""
        ns = self.n_sliding_layers
        nf = self.n_layers - ns
        if not ns or not nf:
            return self.n_layers
        lo, hi = min(ns, nf), max(ns, nf)
        return hi if hi < 1.5 * lo else lo

    @property
    def kv_cache_groups(self) -> tuple:
        """``(full_groups, sliding_groups, sliding_window)`` of vLLM's hybrid KV cache manager: groups of
        :attr:`kv_group_layers` layers of one kind (a kind's layers padded up to whole groups, as
        ``_get_kv_cache_groups_uniform_page_size`` pads them), each group holding its own blocks of one pool;
        ``(1, 0, 0)`` when every layer attends alike (one group of every layer)."""
        ns = self.n_sliding_layers
        if not ns or ns == self.n_layers:
            return (1, 0, 0)
        g = self.kv_group_layers
        return (-(-(self.n_layers - ns) // g), -(-ns // g), int(self.sliding_window))

    def layer_kinds(self) -> dict:
        """What a run states about a non-dense target: its experts, attention kind and KV per layer kind."""
        out = {"attention": "mla" if self.is_mla else "gqa", "kv_bytes_per_token_by_kind": self.kv_bytes_by_kind(),
               "kv_group_layers": self.kv_group_layers, "total_params": self.total_params,
               "active_params": self.active_params()}
        if self.num_experts:
            out.update({"num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
                        "num_shared_experts": self.num_shared_experts, "moe_layers": self.n_moe_layers})
        if self.sliding_window:
            out.update({"sliding_window": self.sliding_window, "sliding_layers": self.n_sliding_layers})
        if self.weights_format:
            out["weights_format_released"] = self.weights_format
        return out

    def kv_bytes_by_kind(self) -> dict:
        """KV bytes one token stores, per layer kind: ``{"full": L_full e s_kv, "sliding": L_sw e s_kv}``
        (``e`` = :attr:`kv_elems_per_token_layer`); a sliding layer holds at most ``sliding_window`` tokens."""
        e, sk, ns = self.kv_elems_per_token_layer, self.kv_elem_bytes, self.n_sliding_layers
        return {"full": (self.n_layers - ns) * e * sk, "sliding": ns * e * sk}

    def with_precision(self, quantization: str | None = None, kv_cache_dtype: str | None = None) -> "ModelShape":
        """The model served with vLLM's ``--quantization`` / ``--kv-cache-dtype`` (None or "": unchanged).

        ``fp8``: every linear layer's weight is one byte (vLLM's ``Fp8LinearMethod``; embeddings, norms
        and the LM head stay in ``dtype_bytes``, as vLLM quantises only ``LinearBase`` layers); an fp8
        KV cache stores one byte per element (``fp8`` = ``fp8_e4m3``; ``fp8_e5m2``). ``none``: the weights
        at ``dtype_bytes`` (a model released quantized, e.g. gpt-oss, in a 16-bit re-release). Anything else is
        refused by name (a :class:`PresetError` naming the flag).
        """
        if str(quantization or "").lower() == "none":
            return dataclasses.replace(self, quantization="").with_precision(None, kv_cache_dtype)
        q = _CANON_QUANT.get(str(quantization or "").lower(), str(quantization or ""))
        k = str(kv_cache_dtype or "").lower()
        k = "" if k == "auto" else k
        for flag, v, ok in (("--quantization", q, QUANTIZATIONS), ("--kv-cache-dtype", k, KV_CACHE_DTYPES)):
            if v not in ok:
                raise PresetError(f"{flag} {v!r} is not priced (one of: {', '.join(x for x in ok if x)}"
                                  f"{', auto' if flag == '--kv-cache-dtype' else ', none'}); int4/AWQ/GPTQ and "
                                  "NVFP4 run other kernels the cost model does not hold")
        if q and self.weights_format and self.quantization == self.weights_format and q != self.weights_format:
            # vLLM's ModelConfig._verify_quantization: a checkpoint's own quant_method and a different --quantization
            # are refused ("Quantization method specified in the model config (X) does not match ...")
            raise PresetError(f"--quantization {q}: {self.name} is released in {self.weights_format} (its config.json's "
                              f"quantization_config), and vLLM refuses a different --quantization for a quantized "
                              f"checkpoint; leave the flag out, or --quantization none for a 16-bit re-release")
        if q == "mxfp4" and not self.num_experts:
            # vLLM's Mxfp4Config.get_quant_method: LinearBase -> UnquantizedLinearMethod, attention skipped; only
            # the MoE experts (RoutedExperts) take MXFP4 (vllm/model_executor/layers/quantization/mxfp4.py, 0.33.0)
            raise PresetError(f"--quantization mxfp4: {self.name} has no MoE experts; vLLM's MXFP4 method "
                              "quantizes only the routed experts (its linear layers and attention stay unquantized)")
        if not q and not k:
            return self
        return dataclasses.replace(self, quantization=q or self.quantization, kv_cache_dtype=k or self.kv_cache_dtype)

    @property
    def weight_elem_bytes(self) -> int:
        """Bytes per element of the linear layers' weights: 1 under ``quantization: fp8``, else ``dtype_bytes``."""
        return 1 if self.quantization == "fp8" else self.dtype_bytes

    @property
    def expert_elem_bytes(self) -> float:
        """Bytes per routed-expert weight: :data:`MXFP4_BYTES` under ``quantization: mxfp4`` (vLLM's MXFP4
        method quantizes the routed experts only), else :attr:`weight_elem_bytes`."""
        return MXFP4_BYTES if self.quantization == "mxfp4" else self.weight_elem_bytes

    @property
    def _routed_params(self) -> float:
        """Routed-expert parameters this shape stores over all its layers: ``Lm (E / EP) 3 d Fe``."""
        return self.n_moe_layers * self.local_experts * self.expert_params

    @property
    def kv_elem_bytes(self) -> int:
        """Bytes per KV-cache element: 1 under an fp8 ``kv_cache_dtype``, else ``dtype_bytes``."""
        return 1 if self.kv_cache_dtype.startswith("fp8") else self.dtype_bytes

    @property
    def layer_weight_bytes(self) -> int | float:
        """Weight bytes of one decoder layer: ``w (P - 2 d) + s 2 d`` (linear weights at ``w`` bytes, the two
        norms at ``s``); ``s P`` when the weights are not quantised. With MoE layers: the mean over layers of
        the weights as stored (every expert), ``(w (P_total - 2 d L) + s 2 d L) / L``."""
        d = self.hidden_size
        if self.is_plain:
            return self.weight_elem_bytes * (self.params_per_layer - 2 * d) + self.dtype_bytes * 2 * d
        L = self.n_layers
        if self.quantization == "mxfp4":   # routed experts at 4.25 bits, the other linear weights at w
            R = self._routed_params
            return (self.weight_elem_bytes * (self.layers_params - 2 * d * L - R) + MXFP4_BYTES * R
                    + self.dtype_bytes * 2 * d * L) / L
        return (self.weight_elem_bytes * (self.layers_params - 2 * d * L) + self.dtype_bytes * 2 * d * L) / L

    @property
    def routed_expert_bytes(self) -> int:
        """Weight bytes of one routed expert (``w 3 d Fe``): what a step reads per distinct expert it hits."""
        return self.expert_elem_bytes * self.expert_params

    @property
    def params_per_layer(self) -> int | float:
        """Dense: ``P_layer``. With MoE / MLA layers: the mean over layers of the parameters one token runs
        (``P_moe_layer(active)`` on MoE layers): the linear layers' flops are ``2 P`` per token and layer."""
        d, H, Hkv, Dh, F = self.hidden_size, self.n_heads, self.n_kv_heads, self.head_dim, self.intermediate_size
        if self.is_plain:
            return d * H * Dh + 2 * d * Hkv * Dh + H * Dh * d + 3 * d * F + 2 * d
        Lm, L = self.n_moe_layers, self.n_layers
        return ((L - Lm) * self.dense_layer_params + Lm * self.moe_layer_active_params) / L

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @property
    def weight_bytes(self) -> int:
        """All weights: layers + final norm + embeddings (+ separate LM head unless tied)."""
        emb = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        if self.is_plain:
            return self.n_layers * self.layer_weight_bytes + self.dtype_bytes * (emb + self.hidden_size)
        d, L = self.hidden_size, self.n_layers
        if self.quantization == "mxfp4":
            R = self._routed_params
            return int(self.weight_elem_bytes * (self.layers_params - 2 * d * L - R) + MXFP4_BYTES * R
                       + self.dtype_bytes * (2 * d * L + emb + d))
        return int(self.weight_elem_bytes * (self.layers_params - 2 * d * L) + self.dtype_bytes * (2 * d * L + emb + d))

    @property
    def kv_bytes_per_token(self) -> int:
        """``2 * L * Hkv * Dh * s_kv``: K and V of one token over all layers (``s_kv`` = :attr:`kv_elem_bytes`).

        MLA: ``L (r + dr) s_kv`` (DeepSeek-V2 §2.1: DeepSeek-V3 at 16 bits, (512 + 64) 61 2 = 70,272 B).
        Sliding-window layers (vLLM's hybrid allocator): the bytes of one token slot of a block of the shared
        pool, ``G e s_kv`` with ``G`` = :attr:`kv_group_layers` (a block is one page of each of a group's ``G``
        layers; every group draws its blocks from the pool, vllm/v1/core/kv_cache_planning.py
        ``get_kv_cache_config_from_groups``: ``num_blocks = available // bytes_per_block``).
        """
        if self.is_plain:
            return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.kv_elem_bytes
        return self.kv_group_layers * self.kv_elems_per_token_layer * self.kv_elem_bytes

    @property
    def priced_name(self) -> str:
        """The name, with what its weights and KV are priced at where below the 16-bit shape (:func:`precision_words`):
        ``gpt-oss-20b (mxfp4 experts)``; what every caption says the costs came from."""
        w = precision_words(self.quantization, self.kv_cache_dtype)
        return f"{self.name} ({w})" if w else self.name

    @property
    def dtype_name(self) -> str:
        """``dtype`` if known, else a name from ``dtype_bytes`` (2 bytes: ``bfloat16``, the presets' dtype)."""
        return self.dtype or {4: "float32", 2: "bfloat16", 1: "int8", 8: "float64"}.get(self.dtype_bytes, "")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("quantization", "kv_cache_dtype") + VARIANT_INT_FIELDS + ("layer_types", "weights_format"):
            if not d[k]:   # stated only when set: a dense 16-bit model's dict is as before
                d.pop(k)
        for k in ("expert_parallel_size", "expert_rows_factor"):
            if d[k] == 1:
                d.pop(k)
        if "layer_types" in d:
            d["layer_types"] = list(d["layer_types"])
        return d


def precision_words(quantization: str | None, kv_cache_dtype: str | None) -> str:
    """``"mxfp4 experts"`` / ``"fp8 weights"`` and ``"fp8 KV cache"``, joined: what a run priced below the model's
    16-bit shape (``kv_cache_dtype`` ``auto`` or empty: its dtype); ``""`` for none."""
    q, k = quantization or "", "" if kv_cache_dtype in (None, "", "auto") else kv_cache_dtype
    return ", ".join(x for x in ((f"{q} {'experts' if q == 'mxfp4' else 'weights'}" if q else ""),
                                 (f"{k} KV cache" if k else "")) if x)


LAYER_TYPES = ("full_attention", "sliding_attention")
VARIANT_INT_FIELDS = ("num_experts", "experts_per_token", "num_shared_experts", "moe_intermediate_size",
                       "first_k_dense", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                       "v_head_dim", "sliding_window", "shared_expert_intermediate_size")


# vLLM's --quantization and --kv-cache-dtype values the cost model prices ("" = the model's own dtype)
QUANTIZATIONS = ("", "fp8", "mxfp4")
# release formats a model preset's weights_format names that are served as released (sim.cost.profiles.load_model):
# vLLM takes a checkpoint's quantization_config without --quantization
RELEASE_QUANTIZATIONS = ("fp8", "mxfp4")
# Bytes per MXFP4 weight: a 4-bit E2M1 value plus one 8-bit E8M0 scale per block of 32 (OCP Microscaling Formats
# (MX) Specification v1.0, §5: MXFP4 block size 32, scale E8M0): (4 + 8 / 32) / 8 = 0.53125
MXFP4_BYTES = (4 + 8 / 32) / 8
KV_CACHE_DTYPES = ("", "fp8", "fp8_e4m3", "fp8_e5m2")
_CANON_QUANT = {"fp8_e4m3": "fp8", "float8": "fp8"}

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2,
                "bfloat16": 2, "bf16": 2, "float64": 8, "int8": 1,
                "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "fp8": 1,
                "fp8_e4m3": 1, "fp8_e5m2": 1}
CANON_DTYPE = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
                "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
# Dtypes no profile prices unless its fitted_range lists them: a GPU preset's peak_flops is the 16-bit
# tensor-core rate, and 8-/4-bit formats run at other rates with scale traffic the cost model does not count.
UNPRICED_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int8", "int4", "uint4",
                   "fp4", "nvfp4", "mxfp4", "float4_e2m1fn_x2")
