"""The torch operations the real runner times: prefill, ASKS gate, batched decode, verification.

Each function does one phase and records it on a :class:`calibrate.timing.PhaseTimer`
with the items the cost model charges (``sim.cost.batch_terms``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from calibrate import kv as KV
from calibrate import layerwise as LW
from calibrate.timing import PhaseTimer


@dataclass
class SamplingConfig:
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 24


def branch_generator(seed: int, problem: int, branch: int) -> torch.Generator:
    """The sampling stream of one branch: the same whatever context it decodes on (own or root's)."""
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence([int(seed), int(problem), int(branch)]).generate_state(1)[0]))
    return g


def sample(logits: torch.Tensor, gens: list[torch.Generator], cfg: SamplingConfig) -> tuple[list[int], list[float]]:
    """One token per row; returns ids and their log-prob under the temperature-1 distribution."""
    lf = logits.float()
    logp1 = torch.log_softmax(lf, dim=-1)
    ids, lps = [], []
    for r, g in enumerate(gens):
        if cfg.temperature <= 0:
            t = int(torch.argmax(lf[r]))
        else:
            p = torch.softmax(lf[r] / cfg.temperature, dim=-1)
            if cfg.top_p < 1.0:
                sp, si = torch.sort(p, descending=True)
                keep = torch.cumsum(sp, 0) - sp < cfg.top_p
                p = torch.zeros_like(p).scatter(0, si[keep], sp[keep])
                p = p / p.sum()
            t = int(torch.multinomial(p, 1, generator=g))
        ids.append(t)
        lps.append(float(logp1[r, t]))
    return ids, lps


@torch.no_grad()
def prefill(model, ids: list[int], past=None, timer: PhaseTimer | None = None, phase: str = "prefill",
            branch: int = -1):
    """Prefill ``ids`` over ``past`` (a cache of views or None); returns (last logits (1, V), cache)."""
    c0 = KV.seq_len(past)
    cache = past if past is not None else KV.cache_from([])
    if past is None:
        from transformers.cache_utils import DynamicCache
        cache = DynamicCache()
    x = torch.tensor([ids], dtype=torch.long)
    pos = torch.arange(c0, c0 + len(ids)).unsqueeze(0)
    with _phase(timer, phase, branch) as row:
        out = model(x, cache=cache, use_cache=True, position_ids=pos, logits_to_keep=1)
        if row is not None:
            row.items([len(ids)], [c0])
    return out.logits[:, -1, :], cache


class _NullCtx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _phase(timer, name, branch=-1, kind="forward"):
    return timer.phase(name, kind=kind, branch=branch) if timer is not None else _NullCtx()


@torch.no_grad()
def gate_pooled(model, span_ids: list[int], timer: PhaseTimer | None = None, branch: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """ASKS gate: a full-depth pass over the variant span only (no LM head).

    Returns the mean- and last-token-pooled hidden states of every layer, ``(L, d)`` float32 each
    (layer l = output of decoder block l, raw, as in the trace schema).
    """
    x = torch.tensor([span_ids], dtype=torch.long)
    with _phase(timer, "gate", branch) as row:
        st = LW.begin(model, x)
        means, lasts = [], []
        for _ in range(LW.n_layers(model)):
            h = LW.step(model, st)
            means.append(h[0].mean(dim=0))
            lasts.append(h[0, -1])
        if row is not None:
            row.items([len(span_ids)], [0], logits=0)
    return torch.stack(means).float().numpy(), torch.stack(lasts).float().numpy()


@dataclass
class DecodeResult:
    gen_ids: list[list[int]]
    logprobs: list[list[float]]
    cache: object                 # the batch cache after decode (left padded)
    row_len: list[int]            # tokens in each row's KV (prompt + generated that were fed)
    pad: list[int]                # left padding of each row in the batch cache
    steps: int = 0


@torch.no_grad()
def batched_decode(model, caches: list, first_logits: list[torch.Tensor], gens: list[torch.Generator],
                   cfg: SamplingConfig, eos_ids: set[int], timer: PhaseTimer | None = None,
                   assemble_phase: str = "assemble") -> DecodeResult:
    """Decode all branches as one batch (iteration-level batching), each from its own cache.

    The per-branch caches are stacked into one left-padded batch (a copy, timed as
    ``assemble``); rows that emit EOS or reach ``max_new_tokens`` stop being counted
    (they stay in the batch as padding rows to keep the KV layout; their tokens are
    not charged as items).
    """
    B = len(caches)
    with _phase(timer, assemble_phase, kind="copy") as row:
        cache, mask, lens = KV.left_padded_batch(caches)
        if row is not None:
            row.cand = int(sum(lens))
    S0 = mask.shape[1]
    pad = [S0 - n for n in lens]
    gen_ids: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    logits = torch.cat(first_logits, 0)
    active = [True] * B
    ctx = list(lens)
    steps = 0
    while True:
        toks, lp = sample(logits, gens, cfg)
        for b in range(B):
            if active[b]:
                gen_ids[b].append(toks[b])
                lps[b].append(lp[b])
                if toks[b] in eos_ids or len(gen_ids[b]) >= cfg.max_new_tokens:
                    active[b] = False
        if not any(active):
            break
        x = torch.tensor([[t] for t in toks], dtype=torch.long)
        mask = torch.cat([mask, torch.tensor([[1 if a else 0] for a in active], dtype=torch.long)], 1)
        pos = torch.tensor([[c] for c in ctx], dtype=torch.long)
        live = [b for b in range(B) if active[b]]
        with _phase(timer, "decode") as row:
            out = model(x, cache=cache, use_cache=True, attention_mask=mask, position_ids=pos)
            if row is not None:
                row.items([1] * len(live), [ctx[b] for b in live])
        logits = out.logits[:, -1, :]
        for b in range(B):
            ctx[b] += 1
        steps += 1
    # row_len: tokens of the row's own sequence held in the cache (last sampled token not fed)
    return DecodeResult(gen_ids, lps, cache, [lens[b] + len(gen_ids[b]) - 1 for b in range(B)], pad, steps)


@dataclass
class VerifyResult:
    score: float                  # p(Yes) / (p(Yes) + p(No)) at the exit layer
    exit_layer: int               # 1..L
    entropy: list[float] = field(default_factory=list)   # per layer probed (index l-1), NaN where not probed
    p_yes: list[float] = field(default_factory=list)
    p_no: list[float] = field(default_factory=list)


def lens_stats(model, h_last: torch.Tensor, yes: list[int], no: list[int], norm: bool = True) -> tuple[float, float, float]:
    """Entropy (nats, full vocabulary), p(Yes), p(No) of the logit lens at one position."""
    logits = LW.lens_logits(model, h_last, norm=norm).float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    ent = float(-(p * logp).sum())
    return ent, float(p[yes].sum()), float(p[no].sum())


@torch.no_grad()
def verify(model, ids: list[int], past, yes: list[int], no: list[int], exit_policy=None,
           timer: PhaseTimer | None = None, branch: int = -1, phase: str = "verify") -> VerifyResult:
    """One verification pass: ``ids`` over ``past`` (None = recompute from scratch).

    Without ``exit_policy`` all L layers run and the score is the final layer's.
    With a CGEE policy the decoder layers run one by one; from layer ``l_min - 1`` on,
    each layer's logit lens is probed and ``exit_policy.should_exit(l, H_l, H_{l-1})``
    decides whether to stop — the layers above are never computed.
    """
    L = LW.n_layers(model)
    c0 = KV.seq_len(past)
    from transformers.cache_utils import DynamicCache
    cache = past if past is not None else DynamicCache()
    x = torch.tensor([ids], dtype=torch.long)
    pos = torch.arange(c0, c0 + len(ids)).unsqueeze(0)
    ent = [float("nan")] * L
    py = [float("nan")] * L
    pn = [float("nan")] * L
    probes = 0
    with _phase(timer, phase, branch) as row:
        st = LW.begin(model, x, cache, position_ids=pos)
        exit_l = L
        first_probe = max(int(getattr(exit_policy, "l_min", L)), 2) - 1 if exit_policy is not None else L
        for l in range(1, L + 1):
            h = LW.step(model, st, cache)
            if exit_policy is not None and first_probe <= l < L:
                e, a, b = lens_stats(model, h[0, -1], yes, no)
                probes += 1
                ent[l - 1], py[l - 1], pn[l - 1] = e, a, b
                prev = ent[l - 2] if l >= 2 and not np.isnan(ent[l - 2]) else None
                if exit_policy.should_exit(l, e, prev):
                    exit_l = l
                    break
        if exit_l == L:
            e, a, b = lens_stats(model, st.hidden[0, -1], yes, no)
            ent[L - 1], py[L - 1], pn[L - 1] = e, a, b
        if row is not None:
            row.items([len(ids)], [c0], layers=exit_l, probes=probes, logits=1 if exit_l == L else 0)
    den = py[exit_l - 1] + pn[exit_l - 1]
    score = py[exit_l - 1] / den if den > 0 else 0.5
    return VerifyResult(score=float(score), exit_layer=exit_l, entropy=ent, p_yes=py, p_no=pn)


@torch.no_grad()
def gate_batch(lm, spans: list[list[int]], pad_id: int, timer: PhaseTimer | None = None):
    """ASKS gate: one full-depth pass over the variant spans only (left-padded batch, no LM head).

    Returns mean- and last-token-pooled hidden states, ``(B, L, d)`` float32 each, pooled
    with ``traces.capture_ops.pool_span`` (layer l = output of decoder block l).
    """
    from traces import capture_ops as CO

    ids, mask, pos = CO.left_pad(spans, pad_id, lm.device)
    T = ids.shape[1]
    with _phase(timer, "gate") as row:
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                       output_hidden_states=True, logits_to_keep=1)
        if row is not None:
            row.items([T] * len(spans), [0] * len(spans), logits=0)
    # hidden_states[L] is final-normed in HF outputs; the gate pools raw block outputs like capture does
    return CO.pool_span(out.hidden_states, [(0, len(s)) for s in spans], [T - len(s) for s in spans])


@dataclass
class BatchVerify:
    scores: np.ndarray       # (B,) p_yes / (p_yes + p_no) at the exit layer
    exit_layer: np.ndarray   # (B,) 1..L
    entropy: np.ndarray      # (B, L) NaN where the lens was not evaluated
    p_yes: np.ndarray
    p_no: np.ndarray
    probes: np.ndarray       # (B,) logit-lens probes evaluated


@torch.no_grad()
def verify_batch(lm, seqs: list[list[int]], yes: list[int], no: list[int], pad_id: int, exit_policy=None,
                 timer: PhaseTimer | None = None) -> BatchVerify:
    """Verification passes of all branches, one left-padded batch, run layer by layer.

    Without ``exit_policy`` every row runs all L layers and is scored at layer L. With a
    CGEE policy, from layer ``max(l_min, 2) - 1`` on each live row's last position goes
    through the logit lens (``lm_head(final_norm(h_l))``, the statistics of
    ``traces.capture_ops``); a row for which ``exit_policy.should_exit(l, H_l, H_{l-1})``
    holds is scored at layer l and *removed from the batch*: the layers above are never
    computed for it, and the pass ends when no row is left. Per-row results do not depend
    on which other rows share the batch (same padded length), so scores equal the
    capture's full-depth lens wherever the pass reaches the same layer.
    """
    from policies import yes_score
    from traces import capture_ops as CO

    model = lm.model
    L = LW.n_layers(model)
    B = len(seqs)
    ids, mask, pos = CO.left_pad(seqs, pad_id, lm.device)
    T = ids.shape[1]
    yes_t = torch.as_tensor(list(yes), device=lm.device)
    no_t = torch.as_tensor(list(no), device=lm.device)
    ent = np.full((B, L), np.nan)
    py = np.full((B, L), np.nan)
    pn = np.full((B, L), np.nan)
    exit_l = np.full(B, L, np.int64)
    probes = np.zeros(B, np.int64)
    first_probe = max(int(exit_policy.l_min), 2) - 1 if exit_policy is not None else L
    alive = np.arange(B)
    with _phase(timer, "verify") as row:
        st = LW.begin(model, ids, None, position_ids=pos, attention_mask=mask)
        for l in range(1, L + 1):
            h = LW.step(model, st)
            probe = (exit_policy is not None and first_probe <= l < L) or l == L
            if not probe:
                continue
            logits = LW.lens_logits(model, h[:, -1, :])
            e, ly, ln, _ = CO._lens_stats(logits, yes_t, no_t)
            e = e.double().numpy()
            a = ly.exp().double().numpy()
            b_ = ln.exp().double().numpy()
            ent[alive, l - 1], py[alive, l - 1], pn[alive, l - 1] = e, a, b_
            if l == L:
                break
            probes[alive] += 1
            stop = np.array([exit_policy.should_exit(l, float(ent[r, l - 1]),
                                                     None if l < 2 or np.isnan(ent[r, l - 2]) else float(ent[r, l - 2]))
                             for r in alive], bool)
            if stop.any():
                exit_l[alive[stop]] = l
                keep = torch.as_tensor(np.flatnonzero(~stop))
                alive = alive[~stop]
                if alive.size == 0:
                    break
                st.hidden = st.hidden.index_select(0, keep)
                st.position_ids = st.position_ids.index_select(0, keep)
                st.position_embeddings = tuple(x.index_select(0, keep) for x in st.position_embeddings)
                if st.mask is not None and st.mask.shape[0] > 1:
                    st.mask = st.mask.index_select(0, keep)
        if row is not None:
            row.items([T] * B, [0] * B, layers=exit_l.tolist(), probes=probes.tolist(),
                      logits=(exit_l == L).astype(int).tolist())
    rows = np.arange(B)
    scores = yes_score(py[rows, exit_l - 1], pn[rows, exit_l - 1])
    return BatchVerify(scores, exit_l, ent, py, pn, probes)
