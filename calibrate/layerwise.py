"""Decoder layers run one at a time, so a forward can stop at a layer.

CGEE level 2 needs the verification pass to *really* stop at the exit layer
``l*``: the layers above it are never computed. Hugging Face's ``forward``
runs every layer, so this module re-states the decoder loop of the installed
transformers' ``LlamaModel.forward`` / ``Gemma3TextModel.forward`` (embedding,
causal mask(s), rotary embedding(s), layers, final norm, LM head and any final
logit soft-capping) step by step, with the same calls in the same order, so
that running all ``L`` layers here gives bit-for-bit the logits of
``model(...)`` on the same device and dtype.

Models whose ``config.layer_types`` mixes ``full_attention`` and
``sliding_attention`` (Gemma 3) get one mask per layer type
(``create_causal_mask`` / ``create_sliding_window_causal_mask``) and, where
``config.rope_parameters`` is keyed by layer type, one rotary embedding per
type; block ``i`` receives those of ``layer_types[i]``.

Logit lens (DESIGN §4): ``p_l = softmax(W_U · FinalNorm(h_l))`` where ``h_l``
is the raw output of decoder block ``l`` (``l = 1..L``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

FULL, SLIDING = "full_attention", "sliding_attention"
# the mask builder of each layer type this module runs (as the models' forwards call them)
_MASK_FNS = {FULL: create_causal_mask, SLIDING: create_sliding_window_causal_mask}


def backbone(model, allow_sliding: bool = False):
    """The decoder stack (``model.model`` for ``*ForCausalLM``).

    ``allow_sliding=False`` (the default, for callers that re-implement attention
    themselves, e.g. ``calibrate.serve_forward``) rejects any layer type but full
    attention; this module's own functions pass ``True``.
    """
    inner = getattr(model, "model", None)
    for attr in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if inner is None or not hasattr(inner, attr):
            raise ValueError(
                f"model {type(model).__name__}: layer-by-layer execution needs a Llama-style decoder "
                f"(model.model.{attr} missing)"
            )
    types = set(layer_types(model))
    allowed = set(_MASK_FNS) if allow_sliding else {FULL}
    if not types <= allowed:
        raise ValueError(f"model {type(model).__name__}: config.layer_types={sorted(types)}; "
                         f"supported here: {sorted(allowed)}")
    if allow_sliding and getattr(model.config, "use_bidirectional_attention", False):
        raise ValueError(f"model {type(model).__name__}: config.use_bidirectional_attention=True is not supported")
    return inner


def layer_types(model) -> list[str]:
    """``config.layer_types``, or all ``full_attention`` where the config has none (Llama)."""
    types = getattr(model.config, "layer_types", None)
    return list(types) if types else [FULL] * n_layers(model)


def _rope_per_type(model) -> bool:
    """Whether the model computes one rotary embedding per layer type (``rope_parameters`` keyed by type)."""
    rp = getattr(model.config, "rope_parameters", None)
    types = set(layer_types(model))
    return isinstance(rp, dict) and types <= set(rp) and all(isinstance(rp[t], dict) for t in types)


@dataclass
class LayerState:
    """What every decoder layer needs besides the hidden states.

    ``masks`` and ``position_embeddings`` are keyed by layer type; a model with a
    single rotary embedding has the same (cos, sin) under every type.
    """

    hidden: torch.Tensor
    masks: dict
    position_embeddings: dict
    position_ids: torch.Tensor
    types: list[str]
    next_layer: int = 0  # 0-based index of the next decoder block to run

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the batch rows ``keep`` (rows that exited leave the batch)."""
        self.hidden = self.hidden.index_select(0, keep)
        self.position_ids = self.position_ids.index_select(0, keep)
        self.position_embeddings = {t: tuple(x.index_select(0, keep) for x in pe)
                                    for t, pe in self.position_embeddings.items()}
        self.masks = {t: (m.index_select(0, keep) if m is not None and m.shape[0] > 1 else m)
                      for t, m in self.masks.items()}


def begin(model, input_ids: torch.Tensor, cache=None, position_ids: torch.Tensor | None = None,
          attention_mask: torch.Tensor | None = None) -> LayerState:
    """Embed ``input_ids`` and build masks and rotary embeddings, as the model's own ``forward`` does."""
    inner = backbone(model, allow_sliding=True)
    types = layer_types(model)
    embeds = inner.embed_tokens(input_ids)
    if position_ids is None:
        past = cache.get_seq_length() if cache is not None else 0
        position_ids = (torch.arange(embeds.shape[1], device=embeds.device) + past).unsqueeze(0)
    kw = dict(config=model.config, inputs_embeds=embeds, attention_mask=attention_mask, cache=cache,
              position_ids=position_ids)
    # in the order Gemma3TextModel.forward builds them: full first, then sliding
    masks = {t: _MASK_FNS[t](**kw) for t in _MASK_FNS if t in types}
    if _rope_per_type(model):
        pos_emb = {t: inner.rotary_emb(embeds, position_ids, t) for t in dict.fromkeys(types)}
    else:
        pe = inner.rotary_emb(embeds, position_ids=position_ids)
        pos_emb = {t: pe for t in dict.fromkeys(types)}
    return LayerState(hidden=embeds, masks=masks, position_embeddings=pos_emb, position_ids=position_ids,
                      types=types)


def step(model, state: LayerState, cache=None) -> torch.Tensor:
    """Run the next decoder block; returns its raw output ``h_l`` (l = state.next_layer after the call)."""
    inner = backbone(model, allow_sliding=True)
    i = state.next_layer
    t = state.types[i]
    state.hidden = inner.layers[i](state.hidden, attention_mask=state.masks[t],
                                   position_embeddings=state.position_embeddings[t],
                                   position_ids=state.position_ids, cache=cache, use_cache=cache is not None)
    state.next_layer += 1
    return state.hidden


def n_layers(model) -> int:
    return int(model.config.num_hidden_layers)


def _head(model, normed: torch.Tensor) -> torch.Tensor:
    """``lm_head`` then, if the config sets ``final_logit_softcapping`` = c, ``c · tanh(logits / c)``."""
    logits = model.lm_head(normed)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = logits / cap
        logits = torch.tanh(logits)
        logits = logits * cap
    return logits


def final_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """``head(norm(h_L))`` — what ``model(...).logits`` is."""
    inner = backbone(model, allow_sliding=True)
    return _head(model, inner.norm(hidden))


def lens_logits(model, hidden_last: torch.Tensor, norm: bool = True) -> torch.Tensor:
    """Logit lens at one position: ``W_U · FinalNorm(h_l)`` (``norm=False``: the RKSC notebook's un-normed lens).

    The model's own head (soft-capping included, where the config has it), so that at
    ``l = L`` the lens is the model's output.
    """
    inner = backbone(model, allow_sliding=True)
    h = inner.norm(hidden_last) if norm else hidden_last
    return _head(model, h)


def forward_all(model, input_ids: torch.Tensor, cache=None, position_ids=None, attention_mask=None) -> torch.Tensor:
    """All layers, layer by layer; equals ``model(input_ids, ...).logits``."""
    st = begin(model, input_ids, cache, position_ids, attention_mask)
    for _ in range(n_layers(model)):
        step(model, st, cache)
    return final_logits(model, st.hidden)
