"""A ``transformers`` cache that evicts tokens during decode exactly as a ``policies/`` token policy says.

Built on ``DynamicCache`` / ``DynamicLayer`` (transformers 5.x): every layer's
keys and values live in ``[1, H_kv, S, D]`` tensors as usual; on an eviction
event the cache hands numpy views of that layer's K, V (``(S, H_kv, D)``) and
of the last queries (``(w, H_q, D)``, post-RoPE, recorded by the attention
hook below) to ``policy.select`` and keeps, per KV head, the rows it returns
(plus the recent buffer), with one ``torch.gather``.

Because kept tokens keep their original positions (RoPE was applied when they
were cached), the decode loop passes explicit ``position_ids``; the cache only
tracks which original position each kept row holds (``positions``).

Queries are recorded by an attention function registered as ``rksim_sdpa``:
it is Hugging Face's ``sdpa_attention_forward`` unchanged, preceded by a copy
of the query of the last position into the cache when one listens. The mask
function registered under the same name is ``sdpa_mask``, so numerics are
those of ``sdpa``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATTN_IMPL = "rksim_sdpa"


def _rksim_sdpa(module, query, key, value, attention_mask, **kwargs):
    sink = getattr(module, "_rksim_q_sink", None)
    if sink is not None:
        sink(module.layer_idx, query)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


ALL_ATTENTION_FUNCTIONS.register(ATTN_IMPL, _rksim_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, sdpa_mask)


def use_recording_attention(model) -> None:
    """Switch ``model`` to ``rksim_sdpa`` (numerically ``sdpa``) so a cache can record queries."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("sdpa", ATTN_IMPL):
        raise ValueError(f"model attention implementation {impl!r}: the evicting cache needs 'sdpa'")
    model.config._attn_implementation = ATTN_IMPL
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and cfg is not model.config and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = ATTN_IMPL


def attention_modules(model) -> list[torch.nn.Module]:
    return [layer.self_attn for layer in model.model.layers]


class EvictingLayer(DynamicLayer):
    """A ``DynamicLayer`` that remembers the original position of each cached row, per KV head."""

    def __init__(self):
        super().__init__()
        self.positions: torch.Tensor | None = None  # (H_kv, S) int64

    def update(self, key_states, value_states, *args, **kwargs):
        start = self.get_seq_length()
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        n_new = key_states.shape[-2]
        h = key_states.shape[1]
        base = 0 if self.positions is None or self.positions.numel() == 0 else int(self.positions[0, -1]) + 1
        new = torch.arange(base, base + n_new, dtype=torch.long).unsqueeze(0).expand(h, n_new)
        self.positions = new.clone() if start == 0 else torch.cat([self.positions, new], dim=1)
        return keys, values

    def keep(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` ((H_kv, n) indices into the current rows, per head), in the given order."""
        b, h, _, d = self.keys.shape
        g = idx.unsqueeze(0).unsqueeze(-1).expand(b, h, idx.shape[1], d)
        self.keys = torch.gather(self.keys, 2, g)
        self.values = torch.gather(self.values, 2, g)
        self.positions = torch.gather(self.positions, 1, idx)


class EvictingCache(DynamicCache):
    """KV cache for one sequence (batch 1) whose layers evict on ``maybe_evict``.

    Parameters
    ----------
    n_layers : decoder layers of the model.
    select : ``select(layer, K, V, Q_window, cand_len) -> (H_kv, k)`` indices in ``[0, cand_len)``, the
        rows to keep among the first ``cand_len`` (the candidates); the rows after ``cand_len`` (the
        recent buffer) are always kept. ``K, V``: ``(S, H_kv, D)``; ``Q_window``: ``(w, H_q, D)``.
    q_window : how many recent queries per layer to retain for ``select``.
    """

    def __init__(self, n_layers: int, select: Callable, q_window: int = 32):
        super().__init__(ddp_cache_data=None)
        self.layers = [EvictingLayer() for _ in range(n_layers)]
        self.layer_class_to_replicate = None
        self.select = select
        self.q_window = int(q_window)
        self._q: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        self.events: list[dict] = []  # one per (eviction step, layer): kept original positions
        self._attached: list[torch.nn.Module] = []

    # -- query recording
    def _sink(self, layer_idx: int, query: torch.Tensor) -> None:
        # query: [1, H_q, q_len, D]; keep the last q_window positions, as (H_q, D) rows
        q = query[0].detach()
        buf = self._q[layer_idx]
        for t in range(max(0, q.shape[1] - self.q_window), q.shape[1]):
            buf.append(q[:, t, :].clone())
        del buf[: max(0, len(buf) - self.q_window)]

    def attach(self, model) -> "EvictingCache":
        use_recording_attention(model)
        for m in attention_modules(model):
            m._rksim_q_sink = self._sink
            self._attached.append(m)
        return self

    def detach(self) -> None:
        for m in self._attached:
            m._rksim_q_sink = None
        self._attached.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()

    # -- views for the policy
    def numpy_kv(self, layer_idx: int) -> tuple[np.ndarray, np.ndarray]:
        lay = self.layers[layer_idx]
        return lay.keys[0].permute(1, 0, 2).numpy(), lay.values[0].permute(1, 0, 2).numpy()

    def numpy_q(self, layer_idx: int) -> np.ndarray:
        buf = self._q[layer_idx]
        return torch.stack(buf, 0).numpy() if buf else np.zeros((0, 0, 0), np.float32)

    def positions(self, layer_idx: int) -> np.ndarray:
        return self.layers[layer_idx].positions.numpy()

    def evict(self, layer_idx: int, cand_len: int, step: int) -> np.ndarray:
        """One eviction decision on one layer: candidates are rows ``[0, cand_len)``; returns kept positions."""
        lay = self.layers[layer_idx]
        K, V = self.numpy_kv(layer_idx)
        keep = np.asarray(self.select(layer_idx, K, V, self.numpy_q(layer_idx), cand_len))
        h, s = lay.positions.shape
        if keep.ndim != 2 or keep.shape[0] != h:
            raise ValueError(f"evicting cache: policy.select returned shape {keep.shape}, expected ({h}, k)")
        if keep.size and (keep.min() < 0 or keep.max() >= cand_len):
            raise ValueError(f"evicting cache: policy.select returned an index outside [0, {cand_len})")
        recent = np.broadcast_to(np.arange(cand_len, s), (h, s - cand_len))
        idx = torch.from_numpy(np.ascontiguousarray(np.concatenate([keep, recent], axis=1), dtype=np.int64))
        lay.keep(idx)
        kept_pos = lay.positions.numpy().copy()
        self.events.append({"step": int(step), "layer": int(layer_idx), "kept": kept_pos})
        return kept_pos
