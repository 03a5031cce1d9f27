"""The torch phases the real runner adds to ``traces.capture_ops``: the ASKS gate and the CGEE-aware verification.

Prefill, sampling and decode are ``traces.capture_ops``'s own functions (the
capture's computation paths, so that decisions replay bit for bit); this
module holds the two phases whose shape the policies change: the gate over
the variant spans only, and the verification pass that stops layer by layer.
Each records itself on a :class:`calibrate.timing.PhaseTimer` with the items
the cost model charges (``sim.cost.terms.batch_terms``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibrate import layerwise as LW
from calibrate.timing import PhaseTimer


class _NullCtx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _phase(timer, name, branch=-1, kind="forward"):
    return timer.phase(name, kind=kind, branch=branch) if timer is not None else _NullCtx()


@torch.no_grad()
def gate_batch(lm, spans: list[list[int]], pad_id: int, timer: PhaseTimer | None = None):
    """ASKS gate: one full-depth pass over the variant spans only (left-padded batch, no LM head).

    Returns mean- and last-token-pooled hidden states, ``(B, L, d)`` float32 each, pooled
    with ``traces.capture_ops.pool_span`` (layer l = output of decoder block l).
    """
    from traces import capture_ops as CO

    T = max((len(s) for s in spans), default=0)
    with _phase(timer, "gate") as row:
        pooled = CO.gate_pool(lm, spans, pad_id)  # the very computation capture records
        if row is not None:
            row.items([T] * len(spans), [0] * len(spans), logits=0)
    return pooled


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
    from traces import capture_ops as CO

    ids, mask, pos = CO.left_pad(seqs, pad_id, lm.device)
    T = ids.shape[1]
    return _layerwise_verify(lm, ids, None, pos, mask, yes, no, exit_policy, timer, n_new=T, n_cached=0)


def _layerwise_verify(lm, x, cache, pos, mask, yes, no, exit_policy, timer, n_new: int, n_cached: int
                      ) -> BatchVerify:
    """The verification pass of both entry points, one decoder layer at a time (CGEE level 2).

    ``cache`` is None when the whole sequence is recomputed, else each row's generation KV,
    whose upper layers drop the rows that exit.
    """
    from policies import yes_score
    from traces import capture_ops as CO

    model = lm.model
    L = LW.n_layers(model)
    B = x.shape[0]
    dev = x.device
    yes_t = torch.as_tensor(list(yes), device=dev)
    no_t = torch.as_tensor(list(no), device=dev)
    ent = np.full((B, L), np.nan)
    py = np.full((B, L), np.nan)
    pn = np.full((B, L), np.nan)
    exit_l = np.full(B, L, np.int64)
    probes = np.zeros(B, np.int64)
    first_probe = max(int(exit_policy.l_min), 2) - 1 if exit_policy is not None else L
    alive = np.arange(B)
    with _phase(timer, "verify") as row:
        st = LW.begin(model, x, cache, position_ids=pos, attention_mask=mask)
        for l in range(1, L + 1):
            h = LW.step(model, st, cache) if cache is not None else LW.step(model, st)
            if not ((exit_policy is not None and first_probe <= l < L) or l == L):
                continue
            e, ly, ln, _ = CO._lens_stats(LW.lens_logits(model, h[:, -1, :]), yes_t, no_t)
            ent[alive, l - 1] = e.double().cpu().numpy()
            py[alive, l - 1] = ly.exp().double().cpu().numpy()
            pn[alive, l - 1] = ln.exp().double().cpu().numpy()
            if l == L:
                break
            probes[alive] += 1
            stop = np.array([exit_policy.should_exit(l, float(ent[r, l - 1]),
                                                     None if l < 2 or np.isnan(ent[r, l - 2]) else float(ent[r, l - 2]))
                             for r in alive], bool)
            if stop.any():
                exit_l[alive[stop]] = l
                keep = torch.as_tensor(np.flatnonzero(~stop), device=dev)
                alive = alive[~stop]
                if alive.size == 0:
                    break
                st.select_rows(keep)
                if cache is not None:
                    for lay in cache.layers[l:]:   # the layers still to run see only the live rows
                        lay.keys = lay.keys.index_select(0, keep)
                        lay.values = lay.values.index_select(0, keep)
        if row is not None:
            row.items([n_new] * B, [n_cached] * B, layers=exit_l.tolist(), probes=probes.tolist(),
                      logits=(exit_l == L).astype(int).tolist())
    rows = np.arange(B)
    return BatchVerify(yes_score(py[rows, exit_l - 1], pn[rows, exit_l - 1]), exit_l, ent, py, pn, probes)


@torch.no_grad()
def verify_batch_reuse(lm, cache, mask, next_pos, gen_ids: list[list[int]], suffix: list[int], yes: list[int],
                       no: list[int], exit_policy=None, timer: PhaseTimer | None = None) -> BatchVerify:
    """Verification that reads each branch's KV from generation (``verify_reuses_kv``).

    ``cache``/``mask`` are the decode batch after ``sample_decode`` (row b holds its prompt and
    its generated tokens but the last; a row that stopped early holds filler after its end,
    masked out here). Each row feeds its last generated token and the verification prompt
    (``1 + len(suffix)`` tokens) over its own KV; with a CGEE policy the layers run one by
    one and exited rows leave the batch (their upper layers and cache rows are dropped).
    """
    B = len(gen_ids)
    dev = mask.device
    S = int(cache.get_seq_length())
    T0 = mask.shape[1]  # padded prompt length of the batch; the decode appended S - T0 columns
    m = torch.cat([mask, torch.ones(B, S - T0, dtype=mask.dtype, device=dev)], 1)
    for b, g in enumerate(gen_ids):
        m[b, T0 + max(len(g) - 1, 0):] = 0   # filler fed after the row stopped
    n_new = 1 + len(suffix)
    x = torch.tensor([[g[-1]] + list(suffix) for g in gen_ids], dtype=torch.long, device=dev)
    m = torch.cat([m, torch.ones(B, n_new, dtype=m.dtype, device=dev)], 1)
    start = torch.as_tensor([int(p) + len(g) - 1 for p, g in zip(next_pos.tolist(), gen_ids)], device=dev)
    pos = start[:, None] + torch.arange(n_new, device=dev)[None, :]
    return _layerwise_verify(lm, x, cache, pos, m, yes, no, exit_policy, timer, n_new=n_new, n_cached=S)
