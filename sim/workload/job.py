"""What one problem asks of the accelerator under a configuration: its *job*.

The job is derived from the trace (token counts) and the policies' decisions
(sharing plan, CGEE decision); it is the common input of the simpy engine
(:mod:`sim.serving.engine`) and of the closed-form fast path (:mod:`sim.replay.fastpath`).

Per branch ``b``:

* **gate item** (ASKS): ``gate_b`` tokens, full depth, no LM head;
* **prefill item**: ``computed_b`` new tokens over ``reused_b`` cached ones,
  plus a copy of ``copy_b`` tokens of KV (copy-on-write of the root's last,
  partial block when the branch shares the root's prompt KV). It waits for
  the branch's gate and for its KV source's prefill. It pays the LM head only
  when ``computed_b > 0`` (tokens of evicted blocks it recomputes do not make
  it produce a token). A branch with nothing to compute or copy has no item:
  its first token comes from the source's logits;
* ``gen_b - 1`` **decode steps** (the prefill produced token 1); step ``j``
  attends over ``ctx_b + j`` keys, ``ctx_b = reused_b + computed_b``;
* after *every* branch finished (selection needs all of them), unless CGEE
  skipped it, one **verification item** per branch: ``verify_reuses_kv`` →
  ``1 + verify_len`` new tokens over ``ctx_b + gen_b - 1`` cached (the
  branch's own KV); else (and always for No-KV) the whole sequence
  ``ctx_b + gen_b + verify_len`` from scratch; through ``exit_b`` layers, with
  ``probes_b`` logit-lens probes and the final LM head only if it ran all
  ``L`` layers.

KV memory is counted in blocks of ``block_size`` tokens: in the closed-form
fast path a branch owns ``ceil((computed_b + copy_b + stored_b) / bs)`` blocks
(``stored_b`` = generated tokens whose KV is written); shared blocks count
once, with their owner; a verification pass adds its new tokens' KV for the
layers it ran. The engine counts the blocks of its block manager
(:mod:`sim.serving.kvcache`) instead.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

KIND_GATE, KIND_PREFILL, KIND_DECODE, KIND_VERIFY = 0, 1, 2, 3
KIND_NAMES = ("gate", "prefill", "decode", "verify")


@dataclass
class Job:
    """Token counts of one problem under one configuration (arrays of length B)."""

    B: int
    L: int
    bs: int
    reused: np.ndarray
    computed: np.ndarray
    copy: np.ndarray
    gate: np.ndarray
    source: np.ndarray
    share: np.ndarray
    ctx: np.ndarray
    gen: np.ndarray
    own: np.ndarray               # KV tokens the branch owns after its prefill (computed + copy)
    verify_on: bool
    v_new: np.ndarray
    v_cached: np.ndarray
    v_layers: np.ndarray
    v_probes: np.ndarray
    v_head: np.ndarray            # 1 where the pass reached layer L (final LM head)
    v_kv_tokens: np.ndarray       # tokens whose KV the verification pass writes
    v_reuse: bool = False         # verification reads the branch's generation KV
    has_prefill: np.ndarray = field(default=None)
    score: np.ndarray = field(default=None)   # branch score for the block pool (RSBCM omega)
    # A token policy's long decode (sim.serving.long_decode.LongDecode): the per-step KV cap and eviction costs
    # the engine charges (None: an ordinary problem).
    long: object = field(default=None, repr=False, compare=False)
    # Memos of derived values (the job's arrays are not changed once built; a job derived from another starts
    # them afresh: MEMOS)
    query_range: tuple | None = field(default=None, repr=False, compare=False)  # (max context, max new tokens)
    plan_ids: list | None = field(default=None, repr=False, compare=False)      # sim.serving.engine stand-in token ids
    prob_init: tuple | None = field(default=None, repr=False, compare=False)    # sim.serving.lifecycle._Prob's arrays

    def __post_init__(self) -> None:
        self.has_prefill = (self.computed > 0) | (self.copy > 0)

    MEMOS = ("query_range", "plan_ids", "prob_init")   # the memo fields above (a derived job resets them: fresh())

    def fresh(self, **changes) -> "Job":
        """This job with ``changes`` (``dataclasses.replace``) and its memos of derived values reset."""
        return dataclasses.replace(self, **{**dict.fromkeys(self.MEMOS), **changes})

    @property
    def decode_steps(self) -> np.ndarray:
        return np.maximum(self.gen - 1, 0)

    def peak_blocks(self) -> int:
        """KV blocks the problem holds at its peak with nothing evicted (its unconstrained peak).

        ``max(gen, verify)`` with ``gen = sum_b ceil((own_b + steps_b) / bs)`` (every
        branch's prompt and generation resident at the end of decoding) and, when the
        verification runs as one batch, ``verify = sum_b ceil((own_b + steps_b + v_new_b) / bs)``
        if it extends the branch's KV (``v_reuse``), else ``sum_b ceil(v_new_b / bs)``
        (the from-scratch passes' own KV; the finished branches' blocks are free then).
        A budget below it throttles the verification batch as well as the decode.
        """
        gen = int(blocks(self.own + self.decode_steps, self.bs).sum())
        if not self.verify_on:
            return gen
        if self.v_reuse:
            ver = int(blocks(self.own + self.decode_steps + self.v_new, self.bs).sum())
        else:
            ver = int(blocks(self.v_new, self.bs).sum())
        return max(gen, ver)

    def waves(self) -> tuple[np.ndarray, np.ndarray]:
        """Iteration index (1-based, among the problem's prefill-class iterations) of each branch's prefill.

        See :func:`prefill_waves`. Returns ``(wave, ready)``.
        """
        return prefill_waves(self.source, self.gate, self.has_prefill)


def prefill_waves(source, gate, has_prefill) -> tuple[np.ndarray, np.ndarray]:
    """``ready_b = max(wave(source_b), 1 if gate_b else 0)``; ``wave_b = ready_b + 1`` if the branch
    has a prefill item else ``ready_b`` (its first token is available then, 0 = at arrival).

    Returns ``(wave, ready)``.
    """
    B = len(source)
    wave = np.zeros(B, np.int64)
    ready = np.zeros(B, np.int64)
    for b in range(B):
        s = int(source[b])
        r = max(int(wave[s]) if s >= 0 else 0, 1 if gate[b] > 0 else 0)
        ready[b] = r
        wave[b] = r + 1 if has_prefill[b] else r
    return wave, ready


def probes_for(exit_layers: np.ndarray, L: int, l_min: int) -> np.ndarray:
    """Logit-lens probes a CGEE verification pass evaluates.

    The exit test at layer ``l >= l_min`` needs ``H_l`` and ``H_(l-1)``, so the
    lens runs on layers ``max(l_min - 1, 1) .. min(exit, L - 1)``; at layer
    ``L`` the model's own LM head gives the entropy (no extra probe).
    """
    lo = max(int(l_min) - 1, 1)
    return np.maximum(np.minimum(exit_layers, L - 1) - lo + 1, 0).astype(np.int64)


def build_job(f, plan, exit_layers: np.ndarray | None, skipped: bool, *, L: int, bs: int,
              verify_reuses_kv: bool, no_kv: bool, l_min: int | None, score: np.ndarray,
              static: bool = False) -> Job:
    """The :class:`Job` of problem ``f`` (a :class:`sim.workload.features.ProblemFeatures`) under a decision.

    ``static``: the problem's branches run as static, left-padded batches (workload option
    ``batching = "static"``, see :func:`pad_static`) instead of a serving engine's
    continuous batching with variable-length rows.
    """
    share = np.asarray(plan.share_root, bool)
    reused = np.asarray(plan.reused, np.int64)
    computed = np.asarray(plan.computed, np.int64)
    ctx = reused + computed
    copy = np.where(share, ctx % bs, 0).astype(np.int64)
    gen = f.eff(share, "len").astype(np.int64)
    vlen = f.verify_len.astype(np.int64)
    gen0 = gen
    if exit_layers is None:
        layers = np.full(f.B, L, np.int64)
        probes = np.zeros(f.B, np.int64)
    else:
        layers = np.asarray(exit_layers, np.int64)
        probes = probes_for(layers, L, l_min)
    head = (layers == L).astype(np.int64)
    gate = np.asarray(plan.gate_tokens, np.int64)
    source = np.asarray(plan.source, np.int64)
    if static:
        gate, reused, computed, gen = pad_static(gate, source, reused, computed, gen)
        ctx = reused + computed
        copy = np.where(share, ctx % bs, 0).astype(np.int64)
    if verify_reuses_kv and not no_kv:
        # The branch's last generated token has no KV yet: it enters with the verification prompt.
        v_new = np.where(gen > 0, 1, 0) + vlen
        v_cached = ctx + np.maximum(gen - 1, 0)
    else:
        # static (the real module): each branch's own prompt + its own generation + the verification
        # prompt, also for a branch that decoded on the root's KV
        v_new = (ctx + gen + vlen) if not static else (np.asarray(f.prompt_len, np.int64) + gen0 + vlen)
        v_cached = np.zeros(f.B, np.int64)
    if static and f.B:
        # one left-padded batch: every row at the longest row's length
        v_new = np.full(f.B, int(v_new.max()), np.int64)
        v_cached = np.full(f.B, int(v_cached.max()), np.int64)
    return Job(B=f.B, L=L, bs=bs, reused=reused, computed=computed, copy=copy,
               gate=gate, source=source, share=share, ctx=ctx, gen=gen, own=computed + copy, verify_on=not skipped,
               v_new=v_new, v_cached=v_cached, v_layers=layers, v_probes=probes, v_head=head,
               v_kv_tokens=v_new, v_reuse=bool(verify_reuses_kv and not no_kv), score=np.asarray(score, np.float64))


def pad_static(gate, source, reused, computed, gen):
    """Token counts of one problem's branches run as static, left-padded batches.

    This is how an eager Hugging Face runner (rksim's real module, ``calibrate``)
    executes the branches, and what its timings measure: a batched forward computes
    every row at the batch's longest length, and a finished row stays in the decode
    batch until the last one finishes. So:

    * gate: every gated row runs ``max_b gate_b`` tokens;
    * prefill: rows that compute tokens in the same wave (:meth:`Job.waves`) run the
      wave's longest ``computed`` over its longest ``reused``;
    * decode: every branch runs ``max_b gen_b - 1`` steps, each row over its own context
      (a decode batch mixing rows of different contexts -- a root-sharing branch beside one
      that prefilled a longer prompt of its own -- is left-padded too; those few pad keys
      per step are not charged);
    * verification (in :func:`build_job`): every row is the longest row's pass, a row
      being the branch's own prompt + its generation + the verification prompt (the real
      module recomputes that sequence also for a branch that decoded on the root's KV).

    Padded tokens count as computed (and as KV, which a padded batch does hold). A
    serving engine with variable-length attention and continuous batching (vLLM, SGLang,
    and the simulator's default ``batching = "continuous"``) computes none of them.
    """
    B = len(gen)
    gate = gate.copy()
    g = gate > 0
    if g.any():
        gate[g] = int(gate[g].max())
    reused, computed = reused.copy(), computed.copy()
    wave, _ = prefill_waves(source, gate, computed > 0)   # only rows that compute tokens are padded
    for w in np.unique(wave[computed > 0]):
        rows = (wave == w) & (computed > 0)
        computed[rows] = int(computed[rows].max())
        reused[rows] = int(reused[rows].max())
    gen = np.full(B, int(gen.max()) if B else 0, np.int64)
    return gate, reused, computed, gen


def blocks(tokens, bs: int):
    """``ceil(tokens / bs)`` (vectorised)."""
    return -(-np.asarray(tokens) // bs)
