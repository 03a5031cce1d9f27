"""The one way rksim sees a layer's Q, K and V: from inside the attention call.

A Hugging Face decoder attention module projects the hidden states, applies
whatever its architecture applies to them — ``q_norm``/``k_norm`` (Qwen3,
Gemma 3), RoPE of the right flavour (default, scaled, per-layer local/global
bases in Gemma 3), the cache update — and then calls the attention function
named by ``config._attn_implementation`` through ``ALL_ATTENTION_FUNCTIONS``
with ``(module, query, key, value, attention_mask, ...)``. Recomputing those
steps outside the model is how a recorder goes wrong on the next architecture;
so this module registers one more attention function, ``rksim_sdpa``, which is
Hugging Face's own ``sdpa_attention_forward`` preceded by a *tap*: a callable
set on the attention module that sees exactly the tensors attention receives
and may return a reduced ``(key, value)`` (the evicting cache does).

Shapes at the tap: ``query`` (B, H_q, q_len, D) — the new positions only;
``key``/``value`` (B, H_kv, S, D) — the whole cache after the update, the new
positions being its last ``q_len`` rows (every cache appends). Q is what
attention multiplies *before* the ``scaling`` factor (HF passes ``scaling``
separately; it is ``1/sqrt(D)`` except where a config says otherwise, e.g.
Gemma 3's ``query_pre_attn_scalar``).

Users: :class:`traces.capture_ops.QKVRecorder` (the long-decode K/V/Q of a
trace) and ``calibrate.evicting_cache.EvictingCache`` (the real runner's token
eviction). Both read the new rows with :func:`new_rows`, so a trace and a real
run record the very same tensors.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATTN_IMPL = "rksim_sdpa"
_TAP_ATTR = "_rksim_tap"

Tap = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor] | None"]


def _rksim_sdpa(module, query, key, value, attention_mask, **kwargs):
    tap = getattr(module, _TAP_ATTR, None)
    if tap is not None:
        out = tap(module.layer_idx, query, key, value)
        if out is not None:
            key, value = out
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


# Registered once at import; numerically this *is* sdpa (same function, same masks).
ALL_ATTENTION_FUNCTIONS.register(ATTN_IMPL, _rksim_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, sdpa_mask)


def new_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, row: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions this attention call adds, for batch row ``row``, as (q_len, H, D) views.

    ``query`` holds only the new positions; the new K/V are the last ``q_len``
    rows of the updated cache.
    """
    n = query.shape[2]
    return (query[row].transpose(0, 1), key[row, :, -n:, :].transpose(0, 1),
            value[row, :, -n:, :].transpose(0, 1))


def attention_modules(model) -> list:
    """The attention module of every decoder layer, in layer order (``model.model.layers[i].self_attn``)."""
    return [layer.self_attn for layer in model.model.layers]


class AttentionTap:
    """Install ``tap(layer_idx, query, key, value)`` on chosen layers' attention calls.

    Parameters
    ----------
    model : a Hugging Face causal LM loaded with ``attn_implementation="sdpa"``.
    tap : called inside attention with the tensors it receives; returns None
        (record only) or the ``(key, value)`` attention should use instead.
    layers : 0-based decoder layers to tap (default: all).

    Entering switches the model to ``rksim_sdpa`` (numerically identical to
    ``sdpa``); leaving removes the taps and restores the previous
    implementation. A layer carries at most one tap at a time.
    """

    def __init__(self, model, tap: Tap, layers: Sequence[int] | None = None):
        self.model, self.tap = model, tap
        mods = attention_modules(model)
        idx = range(len(mods)) if layers is None else [int(i) for i in layers]
        bad = [i for i in idx if not 0 <= i < len(mods)]
        if bad:
            raise ValueError(f"layers: {bad} outside the model's 0..{len(mods) - 1}")
        self.modules = [mods[i] for i in idx]
        self._prev_impl: str | None = None
        self._attached = False

    def attach(self) -> "AttentionTap":
        impl = getattr(self.model.config, "_attn_implementation", None)
        if impl not in ("sdpa", ATTN_IMPL):
            raise ValueError(f"model attention implementation {impl!r}: recording Q/K/V needs 'sdpa' "
                             f"(load with attn_implementation='sdpa')")
        busy = [m.layer_idx for m in self.modules if getattr(m, _TAP_ATTR, None) is not None]
        if busy:
            raise ValueError(f"layers {busy} already carry a Q/K/V tap (one recorder or evicting cache at a time)")
        self._prev_impl = impl
        self.model.config._attn_implementation = ATTN_IMPL
        for m in self.modules:
            setattr(m, _TAP_ATTR, self.tap)
        self._attached = True
        return self

    def detach(self) -> None:
        if not self._attached:
            return
        for m in self.modules:
            setattr(m, _TAP_ATTR, None)
        self.model.config._attn_implementation = self._prev_impl
        self._attached = False

    def __enter__(self) -> "AttentionTap":
        return self.attach()

    def __exit__(self, *exc) -> bool:
        self.detach()
        return False
