"""Decoder layers run one at a time, so a forward can stop at a layer.

CGEE level 2 needs the verification pass to *really* stop at the exit layer
``l*``: the layers above it are never computed. Hugging Face's ``forward``
runs every layer, so this module re-states the Llama-family decoder loop
(embedding, rotary embedding, causal mask, layers, final norm) step by step,
with the same calls in the same order, so that running all ``L`` layers here
gives bit-for-bit the logits of ``model(...)`` on the same device and dtype.

Logit lens (DESIGN §4): ``p_l = softmax(W_U · FinalNorm(h_l))`` where ``h_l``
is the raw output of decoder block ``l`` (``l = 1..L``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.masking_utils import create_causal_mask


def _backbone(model):
    """The decoder stack (``model.model`` for ``*ForCausalLM``)."""
    inner = getattr(model, "model", None)
    for attr in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if inner is None or not hasattr(inner, attr):
            raise ValueError(
                f"model {type(model).__name__}: layer-by-layer execution needs a Llama-style decoder "
                f"(model.model.{attr} missing)"
            )
    types = getattr(model.config, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        raise ValueError(f"model {type(model).__name__}: only full-attention decoders are supported (layer_types={set(types)})")
    return inner


@dataclass
class LayerState:
    """What every decoder layer needs besides the hidden states."""

    hidden: torch.Tensor
    mask: torch.Tensor | None
    position_embeddings: tuple[torch.Tensor, torch.Tensor]
    position_ids: torch.Tensor
    next_layer: int = 0  # 0-based index of the next decoder block to run


def begin(model, input_ids: torch.Tensor, cache=None, position_ids: torch.Tensor | None = None,
          attention_mask: torch.Tensor | None = None) -> LayerState:
    """Embed ``input_ids`` and build mask and rotary embeddings, as ``LlamaModel.forward`` does."""
    inner = _backbone(model)
    embeds = inner.embed_tokens(input_ids)
    if position_ids is None:
        past = cache.get_seq_length() if cache is not None else 0
        position_ids = (torch.arange(embeds.shape[1], device=embeds.device) + past).unsqueeze(0)
    mask = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=attention_mask,
                              cache=cache, position_ids=position_ids)
    pos_emb = inner.rotary_emb(embeds, position_ids=position_ids)
    return LayerState(hidden=embeds, mask=mask, position_embeddings=pos_emb, position_ids=position_ids)


def step(model, state: LayerState, cache=None) -> torch.Tensor:
    """Run the next decoder block; returns its raw output ``h_l`` (l = state.next_layer after the call)."""
    inner = _backbone(model)
    layer = inner.layers[state.next_layer]
    state.hidden = layer(state.hidden, attention_mask=state.mask, position_embeddings=state.position_embeddings,
                         position_ids=state.position_ids, cache=cache, use_cache=cache is not None)
    state.next_layer += 1
    return state.hidden


def n_layers(model) -> int:
    return int(model.config.num_hidden_layers)


def final_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """``lm_head(norm(h_L))`` — what ``model(...).logits`` is."""
    inner = _backbone(model)
    return model.lm_head(inner.norm(hidden))


def lens_logits(model, hidden_last: torch.Tensor, norm: bool = True) -> torch.Tensor:
    """Logit lens at one position: ``W_U · FinalNorm(h_l)`` (``norm=False``: the RKSC notebook's un-normed lens)."""
    inner = _backbone(model)
    h = inner.norm(hidden_last) if norm else hidden_last
    return model.lm_head(h)


def forward_all(model, input_ids: torch.Tensor, cache=None, position_ids=None, attention_mask=None) -> torch.Tensor:
    """All layers, layer by layer; equals ``model(input_ids, ...).logits``."""
    st = begin(model, input_ids, cache, position_ids, attention_mask)
    for _ in range(n_layers(model)):
        step(model, st, cache)
    return final_logits(model, st.hidden)
