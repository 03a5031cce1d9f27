"""KV caches as views: reuse without copying, and assembly of a decode batch.

``DynamicLayer`` holds ``[batch, H_kv, S, D]`` tensors; a reused prefix is a
slice (``keys[:, :, :n]``) and a KV shared by B branches is ``expand(B, ...)``
— both views of the same storage, nothing copied, nothing recomputed. The
first ``update`` of a decode step concatenates (Hugging Face's dynamic cache
does that for every policy alike).

Sliding-window layers (Gemma 3): the cache a model makes for itself
(``DynamicCache(config=...)``) keeps only the last ``sliding_window - 1``
tokens of a sliding layer, so a prefix or a row without its left padding
cannot be cut out of it once the window is full. Where views are cut,
prefill into :func:`full_kv_cache` (every layer keeps every token; the
sliding-window mask, built per layer type, limits what attention sees, so the
result is the same computation over more masked-out keys). :func:`kv_list`
refuses a layer that has dropped tokens instead of handing back a wrong view.
"""
from __future__ import annotations

import copy

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


def full_kv_cache(model) -> DynamicCache | None:
    """An empty cache whose every layer keeps all tokens, for a model with non-full-attention layers.

    ``None`` for a full-attention model: its own default cache already keeps every token.
    """
    types = getattr(model.config, "layer_types", None)
    if not types or all(t == "full_attention" for t in types):
        return None
    return DynamicCache()   # no config: a plain DynamicLayer per layer, nothing dropped


def cache_from(kvs: list[tuple[torch.Tensor, torch.Tensor]], like: list | None = None) -> DynamicCache:
    """A ``DynamicCache`` whose layers hold the given tensors themselves (no copy).

    ``like``: the source cache's layers when ``kvs`` hold the *same tokens* (only the batch
    differs); a sliding-window layer then stays one (its token count and window kept), so
    decoding on it computes what the model's own cache would.
    """
    layers = []
    for li, (k, v) in enumerate(kvs):
        src = like[li] if like is not None else None
        if src is not None and getattr(src, "is_sliding", False):
            lay = copy.copy(src)   # update() rebinds keys/values/cumulative_length on the copy only
        else:
            lay = DynamicLayer()
            lay.lazy_initialization(k, v)
        lay.keys, lay.values = k, v
        layers.append(lay)
    c = DynamicCache()
    c.layers = layers
    c.layer_class_to_replicate = None
    return c


def kv_list(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values), all tokens; raises on a sliding layer that has dropped some."""
    out = []
    for li, lay in enumerate(cache.layers):
        n = lay.keys.shape[-2]
        if n != lay.get_seq_length():
            raise ValueError(
                f"KV cache layer {li} ({type(lay).__name__}) holds {n} of its {lay.get_seq_length()} tokens "
                "(a sliding window dropped the rest): prefill into calibrate.kv.full_kv_cache(model) to cut views")
        out.append((lay.keys, lay.values))
    return out


def prefix_view(cache: DynamicCache, n: int, row: int = 0) -> DynamicCache:
    """The first ``n`` tokens of row ``row`` as a new cache of views (shares storage)."""
    return cache_from([(k[row:row + 1, :, :n], v[row:row + 1, :, :n]) for k, v in kv_list(cache)])


def expand_view(cache: DynamicCache, batch: int) -> DynamicCache:
    """A batch-1 cache seen as ``batch`` identical rows (``expand``: stride 0, no copy)."""
    kvs = [(lay.keys.expand(batch, -1, -1, -1), lay.values.expand(batch, -1, -1, -1)) for lay in cache.layers]
    return cache_from(kvs, like=cache.layers)


def seq_len(cache: DynamicCache | None) -> int:
    return 0 if cache is None else int(cache.get_seq_length())


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def left_padded_batch(caches: list[DynamicCache]) -> tuple[DynamicCache, torch.Tensor, list[int]]:
    """Stack per-branch caches (batch 1 each) into one left-padded batch (a copy).

    Returns the batch cache, the 2-D attention mask ``(B, S)`` (0 on padding)
    and each row's real length.
    """
    lens = [seq_len(c) for c in caches]
    S = max(lens)
    per_layer = []
    kvs = [kv_list(c) for c in caches]
    n_layers = len(caches[0].layers)
    for li in range(n_layers):
        ks, vs = [], []
        for kv, n in zip(kvs, lens):
            k, v = kv[li]
            if n < S:
                pad = (0, 0, S - n, 0)
                k = torch.nn.functional.pad(k, pad)
                v = torch.nn.functional.pad(v, pad)
            ks.append(k)
            vs.append(v)
        per_layer.append((torch.cat(ks, 0), torch.cat(vs, 0)))
    mask = torch.zeros(len(caches), S, dtype=torch.long, device=per_layer[0][0].device)
    for i, n in enumerate(lens):
        mask[i, S - n:] = 1
    return cache_from(per_layer), mask, lens
