"""Reusable torch building blocks for capture and the real runner.

Every function takes a :class:`~traces.models.LoadedModel` and plain tensors
or lists (no capture state), so ``calibrate/`` can call the same code:

- :func:`left_pad` — batch token lists with left padding, attention mask and
  position ids;
- :func:`prefill` — one batched forward that returns the last-position
  logits, the KV cache and (optionally) every layer's hidden states;
- :func:`expand_cache` — the root's KV shared by n rows (``expand``: no copy
  until the cache grows);
- :func:`sample_decode` — seeded sampling with a KV cache, batched over
  branches, one ``torch.Generator`` per row so a row's tokens depend only on
  its own seed and logits;
- :func:`logit_lens_last` — verification pass: the last position of every
  layer through the logit lens, with and without the final norm.

Layer numbering: layer ``l = 1..L`` is the output of decoder block ``l``.
``hidden_states[L]`` of a Hugging Face forward is already final-normed; the
lens here reads the raw decoder-block outputs with hooks and applies the final
norm exactly once.
"""
from __future__ import annotations

import inspect
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch

from traces.models import LoadedModel


def seed_for(*parts: int) -> int:
    """A 63-bit seed derived from integers (seed, problem, branch, stream)."""
    ss = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts])
    return int(ss.generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)


def make_generator(lm: LoadedModel, seed: int) -> torch.Generator:
    g = torch.Generator(device=lm.device)
    g.manual_seed(int(seed))
    return g


@dataclass
class Timer:
    """Collects measured phases as rows of ``timings.parquet``."""

    lm: LoadedModel
    rows: list[dict] = field(default_factory=list)

    @contextmanager
    def phase(self, phase: str, n_new: int, n_cached: int = 0, batch: int = 1, branch: int = -1) -> Iterator[None]:
        self.lm.sync()
        t0 = time.perf_counter()
        yield
        self.lm.sync()
        self.rows.append({"phase": phase, "branch": int(branch), "n_new": int(n_new), "n_cached": int(n_cached),
                          "batch": int(batch), "seconds": time.perf_counter() - t0})

    def columns(self) -> dict:
        keys = ("phase", "branch", "n_new", "n_cached", "batch", "seconds")
        return {k: [r[k] for r in self.rows] for k in keys}


_CACHE_KW: str | None = None


def _cache_kw(lm: LoadedModel) -> str:
    """transformers >= 5 calls the KV argument ``cache``; older ones ``past_key_values``."""
    global _CACHE_KW
    if _CACHE_KW is None:
        params = inspect.signature(lm.model.forward).parameters
        _CACHE_KW = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW


def _out_cache(out):
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (n, T_max), left-padded.

    Position ids count real tokens only (0 at each row's first real token) so a
    padded row computes exactly the positions it would alone.
    """
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, T - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, T - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


@torch.inference_mode()
def prefill(lm: LoadedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None, hidden_states: bool = False, cache=None):
    """One forward over ``input_ids``; returns (last logits (n, V) float32, cache, hidden_states or None).

    ``hidden_states`` is the Hugging Face tuple (L+1 entries, [L] final-normed).
    """
    kw = {_cache_kw(lm): cache} if cache is not None else {}
    out = lm.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=True, output_hidden_states=hidden_states, logits_to_keep=1, **kw)
    return out.logits[:, -1, :].float(), _out_cache(out), (out.hidden_states if hidden_states else None)


def expand_cache(cache, n: int):
    """A cache whose n rows all view the (batch 1) ``cache``'s tensors (``expand``, no copy).

    The first decode step concatenates onto these views, which allocates each
    row's own storage; until then nothing is copied.
    """
    from transformers.cache_utils import DynamicCache

    new = DynamicCache()
    for li, layer in enumerate(cache.layers):
        k, v = layer.keys, layer.values
        new.update(k.expand(n, *k.shape[1:]), v.expand(n, *v.shape[1:]), li)
    return new


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    cum = probs.cumsum(-1)
    remove = cum - probs > top_p  # keep the smallest set whose mass reaches top_p (always the top-1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def sample_tokens(logits: torch.Tensor, generators: Sequence[torch.Generator | None], temperature: float,
                  top_p: float) -> torch.Tensor:
    """One token per row; row i uses only ``generators[i]`` (None = greedy)."""
    if temperature <= 0:
        return logits.argmax(-1)
    scaled = _filter_top_p(logits / temperature, top_p)
    probs = scaled.softmax(-1)
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for i, g in enumerate(generators):
        if g is None:
            out[i] = logits[i].argmax()
        else:
            out[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    return out


@dataclass
class DecodeResult:
    gen_ids: list[list[int]]     # per row, up to and including the stop token
    logprobs: list[list[float]]  # per row, log p(token) under the temperature-1 logits
    cache: object = None         # the KV after the loop (rows past their stop token hold filler)
    steps: int = 0


@torch.inference_mode()
def sample_decode(lm: LoadedModel, first_logits: torch.Tensor, cache, attention_mask: torch.Tensor,
                  next_positions: torch.Tensor, max_new_tokens: int,
                  generators: Sequence[torch.Generator | None], temperature: float = 0.7, top_p: float = 0.95,
                  stop_ids: Sequence[int] = (), min_new_tokens: int = 0,
                  step_hook=None) -> DecodeResult:
    """Seeded sampling loop with a KV cache, batched over rows.

    Parameters
    ----------
    first_logits : (n, V) logits at each row's last prompt position.
    cache : the rows' KV (from :func:`prefill` or :func:`expand_cache`).
    attention_mask : (n, T_ctx) mask of the cached context (1 = real token).
    next_positions : (n,) position id of each row's first generated token.
    generators : one per row; a row's samples depend only on its generator
        and its logits, so a branch decodes the same tokens whatever the batch.
    stop_ids : a row stops after emitting one of these (kept in its output).
    min_new_tokens : stop tokens are masked out before this many tokens.
    step_hook : optional ``f(step, tokens (n,))`` called before each forward.

    The loop stops when every row has stopped or after ``max_new_tokens``.
    Finished rows keep being fed their stop token (their outputs are ignored)
    so the batch keeps one shape.
    """
    n = first_logits.shape[0]
    stop = torch.tensor(sorted(set(int(s) for s in stop_ids)), dtype=torch.long, device=first_logits.device)
    done = torch.zeros(n, dtype=torch.bool, device=first_logits.device)
    gen: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    logits = first_logits
    mask = attention_mask
    pos = next_positions.clone().view(n, 1)
    kw = _cache_kw(lm)
    steps = 0
    for t in range(max_new_tokens):
        lg = logits.float()
        if t < min_new_tokens and stop.numel():
            lg = lg.clone()
            lg[:, stop] = float("-inf")
        tok = sample_tokens(lg, generators, temperature, top_p)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, tok.view(n, 1)).view(n)
        tok_l, lp_l, done_l = tok.tolist(), logp.tolist(), done.tolist()
        for i in range(n):
            if not done_l[i]:
                gen[i].append(tok_l[i])
                lps[i].append(lp_l[i])
        if stop.numel():
            done = done | torch.isin(tok, stop)
        steps = t + 1
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        feed = torch.where(done, stop[0], tok) if stop.numel() else tok
        if step_hook is not None:
            step_hook(t, feed)
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=mask.device)], dim=1)
        out = lm.model(input_ids=feed.view(n, 1), attention_mask=mask, position_ids=pos, use_cache=True,
                       logits_to_keep=1, **{kw: cache})
        cache = _out_cache(out)
        logits = out.logits[:, -1, :]
        pos = pos + 1
    return DecodeResult(gen, lps, cache, steps)


def pool_span(hidden: Sequence[torch.Tensor], spans: Sequence[tuple[int, int]], offsets: Sequence[int]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and last-token pooling of token spans, for every layer.

    Parameters
    ----------
    hidden : the HF hidden_states tuple (L+1 entries of (n, T, d)); entry 0
        (embeddings) is skipped.
    spans : per row [start, end) in the row's own (unpadded) token positions.
    offsets : per row, the left-padding length (added to the span).

    Returns
    -------
    (mean, last): float32 arrays (n, L, d).
    """
    hs = hidden[1:]
    n, L, d = hs[0].shape[0], len(hs), hs[0].shape[-1]
    mean = np.zeros((n, L, d), np.float32)
    last = np.zeros((n, L, d), np.float32)
    for i, ((s, e), off) in enumerate(zip(spans, offsets)):
        # one row at a time: never a float32 copy of every layer's full sequence
        seg = torch.stack([h[i, off + s: off + e, :] for h in hs]).float()  # (L, e - s, d)
        mean[i] = seg.mean(dim=1).cpu().numpy()
        last[i] = seg[:, -1, :].cpu().numpy()
    return mean, last


@torch.no_grad()
def gate_pool(lm: LoadedModel, spans: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The ASKS gate's computation: one full-depth pass over the variant spans *only*.

    The spans (token ids, one list per branch) form one left-padded batch; no KV
    is kept and no LM head runs (the decoder stack alone). Capture records the ASKS
    signals with this function and the real runner's gate calls it too, so a trace
    and a real run see bit-identical similarities (decision parity).

    Returns
    -------
    (mean, last): float32 arrays (n, L, d), pooled per layer with :func:`pool_span`.
    """
    ids, mask, pos = left_pad([list(x) for x in spans], pad_id, lm.device)
    T = ids.shape[1]
    # the decoder stack alone (HF's `base_model`): the gate needs hidden states, not logits
    out = lm.model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                              output_hidden_states=True)
    return pool_span(out.hidden_states, [(0, len(x)) for x in spans], [T - len(x) for x in spans])


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The ASKS gate's cosine: :func:`policies.similarity.cosine` (the one rule capture, the live
    gate and replay share: float64, clipped to [-1, 1], exactly 1 for identical vectors)."""
    from policies.similarity import cosine as _cosine
    return _cosine(a, b)


@dataclass
class LensResult:
    """Per row and layer (n, L) arrays; ``*_nonorm`` skip the final norm below layer L."""

    entropy: np.ndarray
    p_yes: np.ndarray
    p_no: np.ndarray
    top1: np.ndarray
    entropy_nonorm: np.ndarray
    p_yes_nonorm: np.ndarray
    p_no_nonorm: np.ndarray
    top1_nonorm: np.ndarray
    score: np.ndarray  # (n,) full-depth p(Yes)/(p(Yes)+p(No)) at layer L


def _lens_stats(logits: torch.Tensor, yes: torch.Tensor, no: torch.Tensor):
    logp = torch.log_softmax(logits.float(), -1)
    p = logp.exp()
    ent = -(p * logp).sum(-1)
    ly = torch.logsumexp(logp[..., yes], -1)
    ln = torch.logsumexp(logp[..., no], -1)
    return ent, ly, ln, logits.argmax(-1)


@torch.inference_mode()
def logit_lens_last(lm: LoadedModel, seqs: Sequence[Sequence[int]], yes_ids: Sequence[int],
                    no_ids: Sequence[int], pad_id: int, layers: Sequence[int] | None = None) -> LensResult:
    """Verification pass over full sequences with a logit lens at the last position.

    For each layer l (1-based) the last position's decoder-block output h_l is
    read by a hook. Normed lens: ``lm_head(final_norm(h_l))`` for every l (at
    l = L this is the model's own output: the norm is applied once). The
    ``nonorm`` lens is the RKSC notebook's: ``lm_head(hidden_states[l])``,
    i.e. no norm for l < L and the model output at l = L (HF's
    ``hidden_states[L]`` is already normed). Entropy is in nats over the full
    vocabulary; p(Yes), p(No) are summed over the tokenizer's variants; the
    score is ``p_yes / (p_yes + p_no)`` computed as a sigmoid of the log-odds
    so it never divides 0 by 0.
    """
    L = lm.n_layers
    ids, mask, pos = left_pad(seqs, pad_id, lm.device)
    grabbed: dict[int, torch.Tensor] = {}

    def hook(li):
        def f(_mod, _args, out):
            h = out[0] if isinstance(out, tuple) else out
            grabbed[li] = h[:, -1, :]
        return f

    handles = [layer.register_forward_hook(hook(li)) for li, layer in enumerate(lm.layers)]
    try:
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    final_logits = out.logits[:, -1, :].float()
    yes = torch.as_tensor(list(yes_ids), device=lm.device)
    no = torch.as_tensor(list(no_ids), device=lm.device)
    hs = torch.stack([grabbed[i] for i in range(L)], dim=1)  # (n, L, d) raw block outputs
    normed = lm.final_norm(hs)
    lg_norm = lm.lm_head(normed).float()
    lg_raw = lm.lm_head(hs[:, :-1, :]).float()
    lg_raw = torch.cat([lg_raw, final_logits[:, None, :]], dim=1)
    e, ly, ln, t1 = _lens_stats(lg_norm, yes, no)
    e2, ly2, ln2, t2 = _lens_stats(lg_raw, yes, no)
    _, fy, fn, _ = _lens_stats(final_logits, yes, no)
    to = lambda x: x.detach().float().cpu().numpy().astype(np.float64)  # noqa: E731
    return LensResult(
        entropy=to(e), p_yes=to(ly.exp()), p_no=to(ln.exp()), top1=t1.cpu().numpy().astype(np.int32),
        entropy_nonorm=to(e2), p_yes_nonorm=to(ly2.exp()), p_no_nonorm=to(ln2.exp()),
        top1_nonorm=t2.cpu().numpy().astype(np.int32),
        score=to(torch.sigmoid(fy - fn)),
    )


@torch.inference_mode()
def forward_tokens(lm: LoadedModel, seqs: Sequence[Sequence[int]], pad_id: int) -> None:
    """A plain full-depth batched forward (no cache): the ASKS gate's cost."""
    ids, mask, pos = left_pad(seqs, pad_id, lm.device)
    lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=1)


class QKVRecorder:
    """Records Q, K and V of chosen layers exactly as the attention call receives them.

    A tap (:class:`traces.capture_qkv.AttentionTap`) inside each chosen layer's
    attention call reads the new positions' query and the new rows of the
    updated key/value cache: post-projection, post-``q_norm``/``k_norm`` where
    the architecture has them (Qwen3, Gemma 3), post-RoPE — nothing is
    recomputed, so K and V are what the layer caches and Q what it attends
    with, on any architecture. Keeps batch row 0 only; float32 on the CPU.
    The real runner's evicting cache records through the same tap.
    """

    def __init__(self, lm: LoadedModel, layers: Sequence[int]):
        self.lm = lm
        self.layers = [int(l) for l in layers]  # 1-based
        self.q: dict[int, list[torch.Tensor]] = {l: [] for l in self.layers}
        self.k: dict[int, list[torch.Tensor]] = {l: [] for l in self.layers}
        self.v: dict[int, list[torch.Tensor]] = {l: [] for l in self.layers}
        self._tap = None

    def _record(self, li: int, query, key, value) -> None:
        from traces.capture_qkv import new_rows

        q, k, v = new_rows(query, key, value)  # (t, H, D) each
        l = li + 1
        self.q[l].append(q.to(torch.float32).cpu())
        self.k[l].append(k.to(torch.float32).cpu())
        self.v[l].append(v.to(torch.float32).cpu())

    def __enter__(self):
        from traces.capture_qkv import AttentionTap

        self._tap = AttentionTap(self.lm.model, self._record, [l - 1 for l in self.layers]).attach()
        return self

    def __exit__(self, *exc):
        if self._tap is not None:
            self._tap.detach()
            self._tap = None
        return False

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(K, V, Q) as float32 arrays (n_layers, T, H, D)."""
        st = lambda d: np.stack([torch.cat(d[l], 0).numpy() for l in self.layers])  # noqa: E731
        return st(self.k), st(self.v), st(self.q)
