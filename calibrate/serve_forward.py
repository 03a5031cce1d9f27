"""One continuous-batching iteration on a real model: packed tokens, paged KV.

This is how a serving engine (vLLM V1) runs an iteration, restated with the
modules of a Hugging Face Llama-family model:

* **Packed tokens.** The new tokens of every scheduled item (a decode step is
  one token, a prefill chunk ``n`` tokens) are concatenated into one row of
  ``T = sum_i n_i`` tokens. Embedding, norms, q/k/v/o projections and the MLP
  run once over that row: every weight is read once per iteration and the
  linear work is exactly ``2 P sum_i n_i`` flops — the terms
  ``sim.cost.terms.batch_terms`` charges. No padding reaches the linear layers
  (a left-padded batch would pay ``k * max_i n_i`` tokens).
* **Paged KV.** K and V live in one pool per layer of
  ``(num_blocks + 1) * block_size`` token slots; block ``j`` of the block
  manager *is* slots ``j*bs .. j*bs + bs - 1``. A sequence's context is its
  block table, so a prefix-cache hit reuses the rows of the cached blocks in
  place — nothing is copied and nothing recomputed, as in vLLM. A preempted
  sequence's blocks go back to the manager; whatever it recomputes is written
  again into the blocks it is given.
* **Attention per item over its own context.** Decode items are attended in
  one batched call (each query over its context gathered from its block table,
  padded to the longest context with masked entries — one gather and
  one ``scaled_dot_product_attention`` per layer, like a paged decode kernel);
  each prefill chunk is attended on its own with the causal mask offset by its
  cached tokens (query ``j`` of a chunk over ``c`` cached sees ``c + j + 1``
  keys).
* **LM head** only on the rows that sample (a decode step, or the chunk that
  completes a sequence's known tokens); a non-final chunk produces no logits.

The pools start small and double as the block manager hands out higher block
ids (lowest first), so their memory follows the blocks used, not the capacity.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Item:
    """One scheduled piece of work: ``tokens`` (new token ids) at positions ``start .. start + n - 1``.

    ``slots``: the KV slot of every token of the sequence's context after this
    iteration (``start + n`` entries: cached tokens first, then the new ones),
    from its block table. ``sample``: the LM head runs on the last new token.
    """

    key: object
    tokens: list[int]
    start: int
    slots: list[int]
    sample: bool


class PagedKV:
    """K/V pools of up to ``num_blocks`` blocks of ``block_size`` tokens, per layer.

    The pools grow (doubling) as higher block ids are handed out, so memory
    follows the blocks the manager actually used (it hands ids out lowest
    first), never the capacity asked for.
    """

    def __init__(self, lm, num_blocks: int, block_size: int, initial_blocks: int = 64):
        cfg = lm.model.config
        self.L = int(cfg.num_hidden_layers)
        self.Hkv = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.D = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.bs = int(block_size)
        self.num_blocks = int(num_blocks)
        self.dtype, self.device = lm.dtype, lm.device
        n = min(self.num_blocks, int(initial_blocks)) * self.bs
        self.k = [self._zeros(n) for _ in range(self.L)]
        self.v = [self._zeros(n) for _ in range(self.L)]

    def _zeros(self, n: int):
        return torch.zeros(n, self.Hkv, self.D, dtype=self.dtype, device=self.device)

    @property
    def n_slots(self) -> int:
        return int(self.k[0].shape[0])

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def _ensure(self, max_slot: int) -> None:
        if max_slot < self.n_slots:
            return
        if max_slot >= self.num_blocks * self.bs:
            raise RuntimeError(f"paged KV: slot {max_slot} beyond the capacity of {self.num_blocks} blocks")
        n = self.n_slots
        while n <= max_slot:
            n *= 2
        n = min(n, self.num_blocks * self.bs)
        self.k = [torch.cat([t, self._zeros(n - t.shape[0])]) for t in self.k]
        self.v = [torch.cat([t, self._zeros(n - t.shape[0])]) for t in self.v]

    def slots(self, block_ids, n_tokens: int) -> list[int]:
        """Slots of the first ``n_tokens`` tokens of a sequence with block table ``block_ids``."""
        bs = self.bs
        need = -(-n_tokens // bs)
        if need > len(block_ids):
            raise RuntimeError(f"paged KV: {n_tokens} tokens need {need} blocks, the block table has {len(block_ids)}")
        out = [int(block_ids[t // bs]) * bs + t % bs for t in range(n_tokens)]
        if out:
            self._ensure(max(out))
        return out



def _decode_gather(items: list[Item], spans, dev):
    """The decode rows (one new token) of an iteration: their item indices, each row's context slots padded to
    the longest (``gidx``, padding reads slot 0), the mask of real slots and each row's token position."""
    dec = [i for i, it in enumerate(items) if len(it.tokens) == 1]
    gidx = dmask = dpos = None
    if dec:
        cmax = max(len(items[i].slots) for i in dec)
        gidx = torch.zeros((len(dec), cmax), dtype=torch.long)   # padding reads slot 0, masked out
        dmask = torch.zeros((len(dec), 1, 1, cmax), dtype=torch.bool)
        for r, i in enumerate(dec):
            s = items[i].slots
            gidx[r, :len(s)] = torch.tensor(s, dtype=torch.long)
            dmask[r, 0, 0, :len(s)] = True
        gidx, dmask = gidx.to(dev), dmask.to(dev)
        dpos = torch.tensor([spans[i][0] for i in dec], dtype=torch.long, device=dev)
    return dec, gidx, dmask, dpos


def _prefill_contexts(items: list[Item], dev) -> list:
    """``(item index, context slots, causal mask)`` of each prefill item (more than one new token)."""
    pre_ctx = []
    for i, it in enumerate(items):
        if len(it.tokens) <= 1:
            continue
        n, c = len(it.tokens), it.start
        idx = torch.tensor(it.slots[:c + n], dtype=torch.long, device=dev)
        # query j (position c + j) sees keys 0 .. c + j
        m = torch.ones((n, c + n), dtype=torch.bool, device=dev).tril(diagonal=c)
        pre_ctx.append((i, idx, m))
    return pre_ctx


@torch.inference_mode()
def run_iteration(lm, kv: PagedKV, items: list[Item]) -> dict:
    """Run one iteration; returns ``{key: logits (V,) float32}`` for the items that sample."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = lm.model
    from calibrate.layerwise import backbone
    inner = backbone(model)
    dev = lm.device
    ids, pos, new_slots, spans = [], [], [], []
    t = 0
    for it in items:
        n = len(it.tokens)
        ids.extend(it.tokens)
        pos.extend(range(it.start, it.start + n))
        new_slots.extend(it.slots[it.start:it.start + n])
        spans.append((t, t + n))
        t += n
    T = t
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    p = torch.tensor([pos], dtype=torch.long, device=dev)
    new_idx = torch.tensor(new_slots, dtype=torch.long, device=dev)
    h = inner.embed_tokens(x)
    cos, sin = inner.rotary_emb(h, position_ids=p)

    dec, gidx, dmask, dpos = _decode_gather(items, spans, dev)
    pre_ctx = _prefill_contexts(items, dev)

    H = int(model.config.num_attention_heads)
    D = kv.D
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        resid = h
        z = layer.input_layernorm(h)
        q = attn.q_proj(z).view(1, T, H, D).transpose(1, 2)
        k = attn.k_proj(z).view(1, T, kv.Hkv, D).transpose(1, 2)
        v = attn.v_proj(z).view(1, T, kv.Hkv, D).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        K, V = kv.k[li], kv.v[li]
        K.index_copy_(0, new_idx, k[0].transpose(0, 1))
        V.index_copy_(0, new_idx, v[0].transpose(0, 1))
        out = torch.empty((1, H, T, D), dtype=q.dtype, device=dev)
        if dec:
            qd = q[0, :, dpos, :].transpose(0, 1).unsqueeze(2)           # (k, H, 1, D)
            kd = K[gidx].permute(0, 2, 1, 3)                             # (k, Hkv, cmax, D)
            vd = V[gidx].permute(0, 2, 1, 3)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=dmask, scale=attn.scaling, enable_gqa=True)
            out[0, :, dpos, :] = od.squeeze(2).transpose(0, 1)
        for i, idx, m in pre_ctx:
            a, b = spans[i]
            kp = K.index_select(0, idx).permute(1, 0, 2).unsqueeze(0)   # (1, Hkv, c + n, D)
            vp = V.index_select(0, idx).permute(1, 0, 2).unsqueeze(0)
            out[:, :, a:b, :] = F.scaled_dot_product_attention(q[:, :, a:b, :], kp, vp, attn_mask=m,
                                                               scale=attn.scaling, enable_gqa=True)
        o = attn.o_proj(out.transpose(1, 2).reshape(1, T, H * D))
        h = resid + o
        resid = h
        h = resid + layer.mlp(layer.post_attention_layernorm(h))
    rows = [spans[i][1] - 1 for i, it in enumerate(items) if it.sample]
    if not rows:
        return {}
    last = h[0, torch.tensor(rows, dtype=torch.long, device=dev)]
    logits = model.lm_head(inner.norm(last)).float()
    keys = [it.key for it in items if it.sample]
    return {k: logits[r] for r, k in enumerate(keys)}
