"""Model shapes and hardware profiles: the cost model's two inputs.

Presets are YAML (or JSON) files under ``sim/presets/models`` and
``sim/presets/hardware``; every value carries its public source in a comment.
Users add their own by passing a file path instead of a name, or by pointing
``RKSIM_PRESETS`` at a directory holding ``models/*.yaml`` and/or
``hardware/*.yaml`` (user files shadow the shipped ones of the same name).

Profiles a user fits (``rksim calibrate fit``, ``rksim calibrate host``) live
outside the package, in the *user profile directory*
(:func:`user_profile_dir`: ``$RKSIM_PROFILE_DIR``, else
``$XDG_CONFIG_HOME/rksim``, else ``~/.config/rksim``; profiles in its
``hardware/``). A name resolves from ``RKSIM_PRESETS``, then the user profile
directory, then the package: a user's fit shadows a shipped preset of the same
name and never overwrites it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import OutOfCalibrationError, PresetError  # defined there: sim.cost.fingerprint and sim.cost.ranges raise them too
from sim.cost.fields import check_choice, check_field
from sim.cost.roofline import ROOFLINES, seconds
from sim.cost.overheads import FrontendCost, HostStepCost, frontend_from_preset, host_step_from_preset

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"   # sim/presets
USER_PRESETS_ENV = "RKSIM_PRESETS"
PROFILE_DIR_ENV = "RKSIM_PROFILE_DIR"


def user_profile_dir() -> Path:
    """Where a user's fitted profiles go: ``$RKSIM_PROFILE_DIR``, ``$XDG_CONFIG_HOME/rksim`` or ``~/.config/rksim``."""
    d = os.environ.get(PROFILE_DIR_ENV)
    if d:
        return Path(d)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "rksim"


# --------------------------------------------------------------------------- model
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
        for f in _VARIANT_INT_FIELDS:
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
        """Routed experts per token that run here, in expectation: ``k / EP`` (``k`` without EP)."""
        return self.experts_per_token / self.expert_parallel_size if self.expert_parallel_size > 1 \
            else self.experts_per_token

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
        KV cache stores one byte per element (``fp8`` = ``fp8_e4m3``; ``fp8_e5m2``). Anything else is
        refused by name (a :class:`PresetError` naming the flag).
        """
        q = _CANON_QUANT.get(str(quantization or "").lower(), str(quantization or ""))
        k = str(kv_cache_dtype or "").lower()
        k = "" if k == "auto" else k
        for flag, v, ok in (("--quantization", q, QUANTIZATIONS), ("--kv-cache-dtype", k, KV_CACHE_DTYPES)):
            if v not in ok:
                raise PresetError(f"{flag} {v!r} is not priced (one of: {', '.join(x for x in ok if x)}"
                                  f"{', auto' if flag == '--kv-cache-dtype' else ''}); int4/AWQ/GPTQ and "
                                  "NVFP4 run other kernels the cost model does not hold")
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
    def dtype_name(self) -> str:
        """``dtype`` if known, else a name from ``dtype_bytes`` (2 bytes: ``bfloat16``, the presets' dtype)."""
        return self.dtype or {4: "float32", 2: "bfloat16", 1: "int8", 8: "float64"}.get(self.dtype_bytes, "")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("quantization", "kv_cache_dtype") + _VARIANT_INT_FIELDS + ("layer_types", "weights_format"):
            if not d[k]:   # stated only when set: a dense 16-bit model's dict is as before
                d.pop(k)
        if d["expert_parallel_size"] == 1:
            d.pop("expert_parallel_size")
        if "layer_types" in d:
            d["layer_types"] = list(d["layer_types"])
        return d


LAYER_TYPES = ("full_attention", "sliding_attention")
_VARIANT_INT_FIELDS = ("num_experts", "experts_per_token", "num_shared_experts", "moe_intermediate_size",
                       "first_k_dense", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                       "v_head_dim", "sliding_window", "shared_expert_intermediate_size")


# vLLM's --quantization and --kv-cache-dtype values the cost model prices ("" = the model's own dtype)
QUANTIZATIONS = ("", "fp8", "mxfp4")
# Bytes per MXFP4 weight: a 4-bit E2M1 value plus one 8-bit E8M0 scale per block of 32 (OCP Microscaling Formats
# (MX) Specification v1.0, §5: MXFP4 block size 32, scale E8M0): (4 + 8 / 32) / 8 = 0.53125
MXFP4_BYTES = (4 + 8 / 32) / 8
KV_CACHE_DTYPES = ("", "fp8", "fp8_e4m3", "fp8_e5m2")
_CANON_QUANT = {"none": "", "fp8_e4m3": "fp8", "float8": "fp8"}

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


def model_from_manifest(manifest: dict) -> ModelShape:
    """The shape of the model that produced a trace (``manifest.json`` ``model``)."""
    m = manifest.get("model") or {}
    try:
        dtype = str(m.get("dtype", "float32")).replace("torch.", "")
        if dtype not in DTYPE_BYTES:
            raise PresetError(f"manifest.json: model.dtype: unknown dtype {dtype!r}")
        name = str(m.get("name", "trace-model"))
        tied = m.get("tied_embeddings")
        if tied is None:
            # The manifest does not record tying: take it from a shipped preset of the same model.
            tied = False
            low = name.lower()
            for pname in list_presets("models"):
                pm = read_preset_file(_preset_path("models", pname))
                if str(pm.get("hf_id", "")).lower() in low or pname in low.replace("-instruct", ""):
                    tied = bool(pm.get("tied_embeddings", False))
                    break
            else:
                if "smollm2" in low:
                    tied = True
        return ModelShape(
            name=name, n_layers=int(m["n_layers"]), hidden_size=int(m["hidden_size"]),
            n_heads=int(m["n_heads"]), n_kv_heads=int(m["n_kv_heads"]), head_dim=int(m["head_dim"]),
            intermediate_size=int(m["intermediate_size"]), vocab_size=int(m["vocab_size"]),
            dtype_bytes=DTYPE_BYTES[dtype], tied_embeddings=bool(tied), source="trace manifest",
            dtype=CANON_DTYPE.get(dtype, dtype))
    except KeyError as exc:
        raise PresetError(f"manifest.json: model.{exc.args[0]}: missing (needed for the cost model)") from None


# --------------------------------------------------------------------------- hardware
DECODE_ATTENTION = ("paged", "padded")
# HardwareProfile.fp8_weights: FP8 GEMMs on FP8 tensor cores (Hopper, Ada) or FP8 weights dequantised into
# 16-bit GEMMs (vLLM's FP8 Marlin on Ampere); None: --quantization fp8 refused
FP8_WEIGHTS = (None, "w8a8", "w8a16")
# HardwareProfile.mxfp4_moe: the kernel vLLM 0.33.0 runs MXFP4 MoE experts with on the GPU (select_mxfp4_moe_backend,
# vllm/model_executor/layers/fused_moe/oracle/mxfp4.py: "triton" = OpenAI's triton_kernels matmul_ogs, SM 9.0 to
# 12.x; "marlin" = the Marlin MoE kernel, SM >= 7.5); both are weight-only (BF16 activations, the 4-bit weights
# dequantised in the GEMM), so they are priced alike: expert bytes at MXFP4_BYTES, flops at the 16-bit rate.
# None: --quantization mxfp4 refused
MXFP4_MOE = (None, "triton", "marlin")   # HardwareProfile.decode_attention (sim.cost.terms, "Padded decode attention")
UNCALIBRATED_NOTE = "uncalibrated: datasheet numbers with assumed efficiencies"
# What a profile's coefficients stand on: datasheet peaks with assumed efficiencies; fitted on public
# per-operator profiles of the device (not end to end); fitted end to end on measured runs on this device
# (``calibrated``); fitted on a trace capture's phases (``provisional``).
CALIBRATION_STATUSES = ("datasheet", "public-profiles", "end-to-end", "provisional")


@dataclass(frozen=True)
class HardwareProfile:
    """An accelerator for the roofline cost model.

    The time of an operation with terms (see :class:`sim.cost.terms.OpTerms`) is::

        t = roof + kernels * per_kernel_s + graph_kernels * per_kernel_graph_s + layers * per_layer_s
              + samples * sample_s_per_vocab + iters * host_per_iter_s

    with ``rc = peak_flops * eff_c``, ``rm = mem_bw * eff_m`` and ``roof`` either the
    whole-iteration roofline (``roofline: iteration``, the default)::

        roof = max(flops / rc, bytes / rm)

    which assumes compute-bound matrix products and memory-bound attention of one
    iteration overlap perfectly, or the per-operator roofline (``roofline: operator``,
    GenZ's)::

        roof = sum_op max(flops_op / rc, bytes_op / rm) + b_elem / (mem_bw * eff_elem)

    over the operator groups (linear layers, attention, LM head / probes, the rest),
    plus the element-wise traffic (norms, RoPE, activation, residual adds) that the
    whole-iteration form treats as fused away. ``samples`` counts vocabulary entries
    sorted by top-p sampling (rows sampled x V), ``iters`` forward calls (host time per
    iteration); ``per_kernel_graph_s`` (None: ``per_kernel_s``) prices kernels replayed
    from a CUDA graph.

    Matrix-vector regime: the weight bytes of a forward with a single token row
    (``b_lin_mv``, ``b_head_mv``: BLAS's GEMV path) are read at ``mem_bw * eff_mv``
    instead of ``rm`` (None: ``eff_m``, off). In the per-operator roofline the linear
    and LM-head operators become ``max(f / rc, (b - b_mv) / rm + b_mv / rmv)``; in the
    whole-iteration one ``roof = max(flops / rc, (bytes - b_mv) / rm + b_mv / rmv)``.

    Small-M path (``gemm_row_block`` = ``mr``, ``gemm_small_m_max`` = ``m_small``; None: off):
    an iteration of ``2 <= rows <= m_small`` token rows (``rows``, :mod:`sim.cost.terms`) streams
    the linear and LM-head weights ``ceil(rows / mr)`` times at ``mem_bw * eff_mv``, the
    matrix-vector rate (one row is the case ``mr >= 1``): ``(b_lin - b_sm) / rm +
    ceil(rows / mr) b_sm / rmv`` with ``b_sm = b_lin`` in that range. Above ``m_small`` the GEMM
    packs the weights and the roofline of the matrix-matrix regime applies.

    Attention at its own efficiencies: the attention operator's flops (``f_att``) run at
    ``ra = peak_flops * eff_att`` and its KV traffic (``b_att``) at ``rkv = mem_bw * eff_kv``
    (None: ``eff_c`` / ``eff_m``, the same formula as without them). A fused attention
    kernel is neither a GEMM nor a weight stream: on a CPU, eager SDPA with grouped-query
    heads expands and copies the KV every step; on an A100, Vidur's profile reads decode
    KV at about 1.1 TB/s where the weight stream reaches 1.6. In the per-operator roofline
    the attention term becomes ``max(f_att / ra, b_att / rkv)``; in the whole-iteration
    one ``roof = max((flops - f_att) / rc + f_att / ra, (bytes - b_mv - b_att) / rm
    + b_mv / rmv + b_att / rkv)``.

    Shared KV reads (``eff_kv_shared``; None: off): the part ``b_kv_shared`` of ``b_att``
    re-read from blocks another item of the iteration reads too (:mod:`sim.cost.terms`) runs at
    ``rks = mem_bw * eff_kv_shared``: ``b_att / rkv`` above becomes ``(b_att - b_kv_shared) / rkv
    + b_kv_shared / rks``.

    Padded decode attention (``decode_attention: padded``; ``paged``, the default, is vLLM's
    kernel): one-token rows attend in one call padded to their longest context, so the
    attention term adds ``f_att_pad`` to ``f_att`` and ``b_att_pad / rkv`` to its KV time
    (:mod:`sim.cost.terms`). The CPU loop that ``calibrate`` measures runs that kernel.

    Wave quantisation (``sm_count``, the datasheet's SM count; None: off; per-operator
    roofline only): each matrix product's compute is whole waves of ``sm_count`` CTA tiles,
    ``F_q = ceil(tiles / sm) sm tm tn 2 K`` (:func:`sim.cost.gemm.gemm_wave_flops`, fixed
    cuBLAS-like tiles), and the linear layers and LM head become one roofline per product
    (:func:`sim.cost.gemm.wave_linear_head`), which needs the model's shape: :meth:`time` takes
    ``model``.

    ``fitted_range`` (None for analytical datasheet profiles) bounds the
    queries a *fitted* profile may answer: ``max_context_tokens``,
    ``max_new_tokens`` (tokens of one forward item), ``max_batch``, ``models``
    (names of the models it was fitted on), ``device`` and ``dtypes`` (what the
    measurements ran on). Anything outside is refused.

    ``calibrated`` is True only for a profile fitted end to end on measured runs;
    ``calibration_status`` (one of :data:`CALIBRATION_STATUSES`; empty: derived from
    ``calibrated`` / ``provisional``, else ``datasheet``) tells ``datasheet``,
    ``public-profiles`` and ``end-to-end`` apart; :attr:`calibration_note` says in words
    what the numbers are.
    """

    name: str
    peak_flops: float
    mem_bw: float
    mem_capacity: float
    eff_c: float = 1.0
    eff_m: float = 1.0
    per_kernel_s: float = 0.0
    per_layer_s: float = 0.0
    calibrated: bool = False
    provisional: bool = False
    fitted_range: dict | None = None
    source: str = ""
    sample_s_per_vocab: float = 0.0
    host_per_iter_s: float = 0.0
    per_kernel_graph_s: float | None = None
    roofline: str = "iteration"
    eff_elem: float | None = None   # element-wise kernels' fraction of bandwidth (None: eff_m); operator roofline only
    eff_mv: float | None = None     # matrix-vector products' (one token row) fraction of bandwidth (None: eff_m)
    eff_att: float | None = None    # attention's (QK^T, AV) fraction of peak flops (None: eff_c)
    eff_kv: float | None = None     # attention's KV traffic's fraction of bandwidth (None: eff_m)
    eff_kv_shared: float | None = None  # KV re-read from blocks another item of the iteration read (None: eff_kv)
    decode_attention: str = "paged"     # DECODE_ATTENTION: paged (vLLM) or padded to the longest context (CPU loop)
    calibration_status: str = ""    # CALIBRATION_STATUSES; "" = derived from calibrated / provisional
    gemm_row_block: int | None = None      # rows per weight pass of the small-M path (None: only 1 row is)
    gemm_small_m_max: int | None = None    # most token rows the small-M path takes (None: every count)
    sm_count: int | None = None     # streaming multiprocessors (datasheet): matrix products wave-quantised (None: off)
    cuda_graphs: bool = False       # the engine replays CUDA graphs (vLLM V1 on a CUDA GPU): sim.cost.graphs
    eager_launch_s: float = 0.0     # host seconds to launch one kernel eagerly: bounds an eager iteration from below
    fp8_weights: str | None = None  # FP8_WEIGHTS: how --quantization fp8 runs here (None: refused)
    peak_flops_fp8: float | None = None   # FP8 tensor-core peak, dense (datasheet); needed by fp8_weights: w8a8
    eff_c_fp8: float | None = None  # FP8 matrix products' fraction of peak_flops_fp8 (None: eff_c's fraction)
    # host time per engine step and the API server's time (sim.cost.overheads; None: not priced). A GPU preset's
    # kernels are fitted on device-side timings, so these are not inside eff_* / per_kernel_s; a profile fitted
    # end to end (local-cpu) holds its host time in host_per_iter_s instead and carries neither.
    host_step: HostStepCost | None = None
    frontend: FrontendCost | None = None
    mxfp4_moe: str | None = None    # MXFP4_MOE: vLLM's MXFP4 MoE kernel here (None: --quantization mxfp4 refused)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        where = f"hardware preset {self.source or self.name}"
        if isinstance(self.host_step, dict):   # to_dict()'s form back (HardwareProfile(**d))
            object.__setattr__(self, "host_step", host_step_from_preset({"host_step": self.host_step}, where))
        if isinstance(self.frontend, dict):
            object.__setattr__(self, "frontend", frontend_from_preset({"frontend": self.frontend}, where))
        for f, cls in (("host_step", HostStepCost), ("frontend", FrontendCost)):
            v = getattr(self, f)
            if v is not None and not isinstance(v, cls):
                raise PresetError(f"{where}: field {f!r} must be a mapping of {cls.__name__}'s fields or null, got {v!r}")
        # host_step's model-runner part holds the sampler's host side and its kernels (Vidur's sampler_e2e) and
        # the engine core's per-step work: a fitted per-forward host time or sampling term beside it counts twice
        if self.host_step is not None and (self.host_per_iter_s or self.sample_s_per_vocab):
            raise PresetError(f"{where}: fields 'host_per_iter_s' / 'sample_s_per_vocab' must be 0 when 'host_step' "
                              "is given (both would price the step's host time and sampling)")
        label = f"hardware preset {self.source or self.name}: field"
        for rule, names in (("positive", ("peak_flops", "mem_bw", "mem_capacity", "eff_c", "eff_m")),
                            ("positive or null", ("eff_elem", "eff_mv", "eff_att", "eff_kv", "eff_kv_shared",
                                                  "peak_flops_fp8", "eff_c_fp8")),
                            ("count or null", ("gemm_row_block", "gemm_small_m_max", "sm_count")),
                            ("nonneg", ("per_kernel_s", "per_layer_s", "sample_s_per_vocab", "host_per_iter_s",
                                        "eager_launch_s")),
                            ("bool", ("cuda_graphs",))):
            for f in names:
                check_field(f"{label} {f!r}", getattr(self, f), rule)
        if self.per_kernel_graph_s is not None:
            check_field(f"{label} 'per_kernel_graph_s'", self.per_kernel_graph_s, "nonneg")
        for f, choices in (("fp8_weights", FP8_WEIGHTS), ("mxfp4_moe", MXFP4_MOE)):
            check_choice(f"{label} {f!r}", getattr(self, f), choices)
        if self.fp8_weights == "w8a8" and self.peak_flops_fp8 is None:
            raise PresetError(f"hardware preset {self.source or self.name}: field 'peak_flops_fp8' is needed by "
                              "fp8_weights: w8a8 (FP8 tensor cores)")
        for f, choices in (("decode_attention", DECODE_ATTENTION), ("roofline", ROOFLINES)):
            check_choice(f"{label} {f!r}", getattr(self, f), choices)
        st = self.calibration_status or ("end-to-end" if self.calibrated else
                                         "provisional" if self.provisional else "datasheet")
        if st not in CALIBRATION_STATUSES or (st == "end-to-end") != bool(self.calibrated):
            raise PresetError(f"hardware preset {self.source or self.name}: field 'calibration_status' must be one of "
                              f"{', '.join(CALIBRATION_STATUSES)} and 'end-to-end' exactly when calibrated is true; "
                              f"got {self.calibration_status!r} with calibrated {self.calibrated!r}")
        object.__setattr__(self, "calibration_status", st)

    @property
    def calibration_note(self) -> str:
        """In words: fitted end to end, fitted on published operator profiles, provisional, or uncalibrated."""
        note = self.extra.get("calibration_note")
        if note:
            return str(note)
        if self.calibrated:
            fo = self.extra.get("fitted_on") or {}
            what = " ".join(str(x) for x in (fo.get("model"), fo.get("dtype")) if x)
            dev = self.extra.get("device") or (self.fitted_range or {}).get("device") or "?"
            return f"fitted end to end on {dev}" + (f" ({what})" if what else "")
        if self.provisional:
            return "provisional: fitted on the phases a trace capture measured, not by `rksim calibrate fit`"
        if self.calibration_status == "public-profiles":
            return "fitted on public per-operator profiles; not end to end"
        return UNCALIBRATED_NOTE

    @property
    def priced_dtypes(self) -> tuple[str, ...]:
        """Dtypes the coefficients stand for: ``fitted_range.dtypes``, else the 16-bit types of a datasheet peak."""
        fr = self.fitted_range or {}
        dts = fr.get("dtypes") or ([fr["dtype"]] if fr.get("dtype") else ["float16", "bfloat16"])
        return tuple(CANON_DTYPE.get(str(x), str(x)) for x in dts)

    def check_dtype(self, dtype: str) -> None:
        """Refuse, by name, a dtype this profile cannot price (FP8, INT8, 4-bit: :data:`UNPRICED_DTYPES`).

        Such a model is never priced as if it were bf16: the peak and efficiencies are the
        16-bit tensor cores' (or the fitted dtypes'), not the 8-/4-bit rates.
        """
        name = CANON_DTYPE.get(str(dtype), str(dtype))
        if name in UNPRICED_DTYPES and name not in self.priced_dtypes:
            raise OutOfCalibrationError(
                f"hardware {self.name}: dtype {name} cannot be priced: the profile's peak_flops and efficiencies are "
                f"for {'/'.join(self.priced_dtypes)}, and {name}'s tensor-core rate and scale traffic are not modelled; "
                f"refusing rather than pricing it as {self.priced_dtypes[-1]}")

    def time(self, terms, roofline: str | None = None, model: ModelShape | None = None) -> np.ndarray | float:
        """Seconds for ``terms`` (an :class:`sim.cost.terms.OpTerms`, scalar or array fields).

        ``roofline`` overrides the profile's (``"iteration"`` or ``"operator"``); ``model``, the
        shape the terms are of, is needed where ``sm_count`` quantises matrix products.
        """
        return seconds(self, terms, roofline=roofline, model=model)

    def check_precision(self, model: ModelShape) -> None:
        """Refuse, naming the flag, a ``--quantization`` / ``--kv-cache-dtype`` this profile cannot price.

        ``--quantization fp8`` needs ``fp8_weights`` (``w8a8``: FP8 tensor cores at
        ``peak_flops_fp8``; ``w8a16``: FP8 weights dequantised into 16-bit GEMMs, vLLM's FP8 Marlin
        kernel on GPUs without FP8 tensor cores). A profile fitted end to end on measured runs timed
        its attention at the dtypes it ran (``fitted_range.dtypes``), so an fp8 KV cache is refused
        there unless fp8 was among them; datasheet and public-profile GPU profiles price KV reads as
        bytes over bandwidth, whatever the element size.
        """
        if model.quantization == "mxfp4" and self.mxfp4_moe is None:
            raise OutOfCalibrationError(
                f"hardware {self.name}: --quantization mxfp4 cannot be priced: the profile names no MXFP4 MoE kernel "
                "(mxfp4_moe: vLLM runs MXFP4 experts with its Triton kernels on SM 9.0+ and Marlin on SM 7.5+ GPUs)")
        if model.quantization == "fp8" and self.fp8_weights is None:
            raise OutOfCalibrationError(
                f"hardware {self.name}: --quantization fp8 cannot be priced: the profile has no fp8_weights "
                "(FP8 tensor-core peak or FP8 weight-only kernel)")
        fr = self.fitted_range or {}
        dts = [CANON_DTYPE.get(str(x), str(x)) for x in (fr.get("dtypes") or [])]
        end_to_end = self.calibration_status in ("end-to-end", "provisional")
        if model.kv_cache_dtype and end_to_end and not any(x.startswith("float8") for x in dts):
            raise OutOfCalibrationError(
                f"hardware {self.name}: --kv-cache-dtype {model.kv_cache_dtype} cannot be priced: the profile was "
                f"fitted on {'/'.join(dts)} KV only")

    def check_query(self, model: ModelShape, max_context: int, max_new: int = 0, max_batch: int = 0,
                    device: str | None = None, tokens: int = 0, mixed: bool = False,
                    allow_extrapolation: bool = False) -> list[str]:
        """Refuse a query outside the fitted range (raises :class:`OutOfCalibrationError`).

        Sizes are checked per dimension by :func:`sim.cost.ranges.check` (sequences ``max_batch`` and
        ``tokens`` of one iteration, ``max_context``, ``max_new`` tokens of one item, ``mixed``
        prefill + decode iterations); with ``allow_extrapolation`` a size outside is let through
        and the returned notes (one per dimension) mark the result. Model, dtype and device are
        always refused.

        The range covers the device and dtype the fit measured as well as sizes: a
        ``model`` in another dtype (``model.dtype_name``), or a ``device`` (when the
        caller knows where it runs, e.g. ``calibrate report``) other than the fit's,
        is refused with a message naming both; a dtype no profile prices (FP8, INT8, 4-bit) is
        refused by name (:meth:`check_dtype`).
        """
        self.check_dtype(model.dtype_name)
        self.check_precision(model)
        if model.weight_bytes > self.mem_capacity:
            raise OutOfCalibrationError(
                f"hardware {self.name}: model {model.name} needs {model.weight_bytes / 1e9:.1f} GB of weights, "
                f"more than the {self.mem_capacity / 1e9:.1f} GB of memory")
        fr = self.fitted_range
        if not fr:
            return []
        fdev = fr.get("device")
        if device is not None and fdev and not _same_device(str(device), str(fdev)):
            raise OutOfCalibrationError(
                f"hardware {self.name}: fitted on device {fdev}; refusing a query on device {device} "
                f"(fit this device with `rksim calibrate fit`)")
        dts = fr.get("dtypes") or ([fr["dtype"]] if fr.get("dtype") else [])
        if dts:
            dts = [CANON_DTYPE.get(str(x), str(x)) for x in dts]
            mine = model.dtype_name
            ok = (mine in dts) if model.dtype else any(DTYPE_BYTES.get(x) == model.dtype_bytes for x in dts)
            if not ok:
                raise OutOfCalibrationError(
                    f"hardware {self.name}: fitted on dtype {'/'.join(dts)} on device {fdev or '?'}; refusing to "
                    f"extrapolate to model {model.name} in dtype {mine or '?'} ({model.dtype_bytes}-byte elements)")
        models = fr.get("models")
        if models and model.name not in models:
            raise OutOfCalibrationError(
                f"hardware {self.name}: calibrated on model(s) {', '.join(models)} only; refusing to extrapolate to "
                f"{model.name} (fit this hardware for that model with `rksim calibrate fit`)")
        from sim.cost.ranges import RangeQuery, check
        return check(self.name, fr, RangeQuery(seqs=max_batch, tokens=tokens, context=max_context,
                                               item_tokens=max_new, mixed=mixed), allow_extrapolation)

    @property
    def fingerprint(self) -> dict | None:
        """The host (CPU) or device (GPU) the profile was fitted on (:mod:`sim.cost.fingerprint`); None if not recorded."""
        fp = self.extra.get("fingerprint")
        return dict(fp) if isinstance(fp, dict) else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra", None)
        d["calibration_note"] = self.calibration_note
        return d


def _same_device(a: str, b: str) -> bool:
    """``cuda:0`` and ``cuda`` are one device kind; names compare case-insensitively."""
    norm = lambda x: x.strip().lower().split(":")[0]  # noqa: E731
    return norm(a) == norm(b)


_HW_FIELDS = {f.name for f in dataclasses.fields(HardwareProfile)} - {"extra", "source"}
_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelShape)} - {"source"}


# --------------------------------------------------------------------------- loading
def read_preset_file(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PresetError(f"{path}: cannot read preset file ({exc.strerror})") from None
    try:
        if str(path).endswith(".json"):
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
    except Exception as exc:  # yaml/json syntax errors: name the file
        raise PresetError(f"{path}: not valid {'JSON' if str(path).endswith('.json') else 'YAML'}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise PresetError(f"{path}: a preset file must hold a mapping of fields")
    return data


def _dirs(kind: str) -> list[Path]:
    dirs = []
    user = os.environ.get(USER_PRESETS_ENV)
    if user:
        dirs.append(Path(user) / kind)
    dirs.append(user_profile_dir() / kind)
    dirs.append(PRESET_DIR / kind)
    return dirs


def preset_origin(path: Path) -> str:
    """``package`` (shipped), ``user`` (the user profile directory), ``RKSIM_PRESETS`` or ``file``."""
    p = Path(path).resolve()
    for name, root in (("package", PRESET_DIR), ("user", user_profile_dir()),
                       (USER_PRESETS_ENV, Path(os.environ.get(USER_PRESETS_ENV) or "/nonexistent"))):
        try:
            p.relative_to(Path(root).resolve())
            return name
        except ValueError:
            continue
    return "file"


def is_shipped(path: Path) -> bool:
    """``path`` lies in the package's presets (a shipped preset: overwritten only with ``--force``)."""
    return preset_origin(path) == "package"


def preset_path(kind: str, name_or_path) -> Path:
    """The file a preset name (or path) resolves to (first match: RKSIM_PRESETS, user directory, package)."""
    return resolve_preset(kind, name_or_path)


def list_presets(kind: str) -> list[str]:
    """Names of the presets of ``kind`` (``"models"`` or ``"hardware"``)."""
    names: set[str] = set()
    for d in _dirs(kind):
        if d.is_dir():
            for p in d.iterdir():
                if p.suffix in (".yaml", ".yml", ".json"):
                    names.add(p.stem)
    return sorted(names)


def _preset_path(kind: str, name: str) -> Path:
    for d in _dirs(kind):
        for ext in (".yaml", ".yml", ".json"):
            p = d / f"{name}{ext}"
            if p.is_file():
                return p
    what = "model" if kind == "models" else "hardware"
    raise PresetError(f"unknown {what} preset {name!r}; valid: {', '.join(list_presets(kind))} "
                      f"(or a path to a .yaml/.json file)")


def resolve_preset(kind: str, name_or_path: str | os.PathLike) -> Path:
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml", ".json")) or os.sep in s:
        p = Path(s)
        if not p.is_file():
            raise PresetError(f"{s}: preset file not found")
        return p
    return _preset_path(kind, s)


def load_model(name_or_path: str | os.PathLike) -> ModelShape:
    """A :class:`ModelShape` from a preset name or a YAML/JSON file path."""
    path = resolve_preset("models", name_or_path)
    data = read_preset_file(path)
    unknown = set(data) - _MODEL_FIELDS - {"hf_id"}
    if unknown:
        raise PresetError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(_MODEL_FIELDS))}")
    missing = _MODEL_FIELDS - set(data) - {"name", "dtype", "quantization", "kv_cache_dtype", "layer_types",
                                           "weights_format", "expert_parallel_size"} - set(_VARIANT_INT_FIELDS)
    if missing:
        raise PresetError(f"{path}: missing field(s) {', '.join(sorted(missing))}")
    data.setdefault("name", path.stem)
    data.pop("hf_id", None)
    return ModelShape(source=str(path), **data)


def load_hardware(name_or_path: str | os.PathLike) -> HardwareProfile:
    """A :class:`HardwareProfile` from a preset name or a YAML/JSON file path."""
    path = resolve_preset("hardware", name_or_path)
    data = read_preset_file(path)
    # host time per step and front-end time: their own mappings, checked field by field (sim.cost.overheads)
    for key, load in (("host_step", host_step_from_preset), ("frontend", frontend_from_preset)):
        if key in data:
            data[key] = load(data, where=str(path))
    extra = {k: data.pop(k) for k in list(data) if k not in _HW_FIELDS}
    allowed_extra = {"fit", "notes", "device", "fitted_on", "residuals", "calibration_note", "reference", "fingerprint",
                     "band_fits"}
    unknown = set(extra) - allowed_extra
    if unknown:
        raise PresetError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; valid: "
                          f"{', '.join(sorted(_HW_FIELDS | allowed_extra))}")
    for req in ("peak_flops", "mem_bw", "mem_capacity"):
        if req not in data:
            raise PresetError(f"{path}: missing field {req!r}")
    data.setdefault("name", path.stem)
    for k in ("peak_flops", "mem_bw", "mem_capacity", "eff_c", "eff_m", "per_kernel_s", "per_layer_s",
              "sample_s_per_vocab", "host_per_iter_s", "per_kernel_graph_s", "eff_elem", "eff_mv", "eff_att",
              "eff_kv", "eff_kv_shared", "peak_flops_fp8", "eff_c_fp8", "eager_launch_s"):
        if k in data and isinstance(data[k], (int, str)) and not isinstance(data[k], bool):
            try:
                data[k] = float(data[k])
            except ValueError:
                raise PresetError(f"{path}: field {k!r} must be a number, got {data[k]!r}") from None
    return HardwareProfile(source=str(path), extra=extra, **data)


def load_presets() -> dict[str, list[str]]:
    """``{"models": [...], "hardware": [...]}``: every preset name available."""
    return {"models": list_presets("models"), "hardware": list_presets("hardware")}
