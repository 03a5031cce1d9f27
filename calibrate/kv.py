"""KV caches as views: reuse without copying, and assembly of a decode batch.

``DynamicLayer`` holds ``[batch, H_kv, S, D]`` tensors; a reused prefix is a
slice (``keys[:, :, :n]``) and a KV shared by B branches is ``expand(B, ...)``
— both views of the same storage, nothing copied, nothing recomputed. The
first ``update`` of a decode step concatenates (Hugging Face's dynamic cache
does that for every policy alike).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


def cache_from(kvs: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A ``DynamicCache`` whose layers hold the given tensors themselves (no copy)."""
    layers = []
    for k, v in kvs:
        lay = DynamicLayer()
        lay.lazy_initialization(k, v)
        lay.keys, lay.values = k, v
        layers.append(lay)
    c = DynamicCache()
    c.layers = layers
    c.layer_class_to_replicate = None
    return c


def kv_list(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(lay.keys, lay.values) for lay in cache.layers]


def prefix_view(cache: DynamicCache, n: int, row: int = 0) -> DynamicCache:
    """The first ``n`` tokens of row ``row`` as a new cache of views (shares storage)."""
    return cache_from([(k[row:row + 1, :, :n], v[row:row + 1, :, :n]) for k, v in kv_list(cache)])


def expand_view(cache: DynamicCache, batch: int) -> DynamicCache:
    """A batch-1 cache seen as ``batch`` identical rows (``expand``: stride 0, no copy)."""
    return cache_from([(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in kv_list(cache)])


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
    n_layers = len(caches[0].layers)
    for li in range(n_layers):
        ks, vs = [], []
        for c, n in zip(caches, lens):
            k, v = c.layers[li].keys, c.layers[li].values
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
