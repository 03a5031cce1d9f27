"""What one problem asks of the accelerator under a configuration: its *job*.

The job is derived from the trace (token counts) and the policies' decisions
(sharing plan, CGEE decision); it is the common input of the simpy engine
(:mod:`sim.engine`) and of the closed-form fast path (:mod:`sim.fastpath`).

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

KV memory is counted in blocks of ``block_size`` tokens: a branch owns
``ceil((computed_b + copy_b + stored_b) / bs)`` blocks (``stored_b`` =
generated tokens whose KV is written); shared blocks count once, with their
owner. A verification pass adds its new tokens' KV for the layers it ran.
"""
from __future__ import annotations

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

    def __post_init__(self) -> None:
        self.has_prefill = (self.computed > 0) | (self.copy > 0)

    @property
    def decode_steps(self) -> np.ndarray:
        return np.maximum(self.gen - 1, 0)

    def waves(self) -> tuple[np.ndarray, np.ndarray]:
        """Iteration index (1-based, among the problem's prefill-class iterations) of each branch's prefill.

        ``ready_b = max(wave(source_b), 1 if gate_b else 0)``; ``wave_b = ready_b + 1`` if the branch
        has a prefill item else ``ready_b`` (its first token is available then, 0 = at arrival).
        Returns ``(wave, ready)``.
        """
        wave = np.zeros(self.B, np.int64)
        ready = np.zeros(self.B, np.int64)
        for b in range(self.B):
            s = int(self.source[b])
            r = max(int(wave[s]) if s >= 0 else 0, 1 if self.gate[b] > 0 else 0)
            ready[b] = r
            wave[b] = r + 1 if self.has_prefill[b] else r
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
              verify_reuses_kv: bool, no_kv: bool, l_min: int | None, score: np.ndarray) -> Job:
    """The :class:`Job` of problem ``f`` (a :class:`sim.features.ProblemFeatures`) under a decision."""
    share = np.asarray(plan.share_root, bool)
    reused = np.asarray(plan.reused, np.int64)
    computed = np.asarray(plan.computed, np.int64)
    ctx = reused + computed
    copy = np.where(share, ctx % bs, 0).astype(np.int64)
    gen = f.eff(share, "len").astype(np.int64)
    vlen = f.verify_len.astype(np.int64)
    if exit_layers is None:
        layers = np.full(f.B, L, np.int64)
        probes = np.zeros(f.B, np.int64)
    else:
        layers = np.asarray(exit_layers, np.int64)
        probes = probes_for(layers, L, l_min)
    head = (layers == L).astype(np.int64)
    if verify_reuses_kv and not no_kv:
        # The branch's last generated token has no KV yet: it enters with the verification prompt.
        v_new = np.where(gen > 0, 1, 0) + vlen
        v_cached = ctx + np.maximum(gen - 1, 0)
    else:
        v_new = ctx + gen + vlen
        v_cached = np.zeros(f.B, np.int64)
    return Job(B=f.B, L=L, bs=bs, reused=reused, computed=computed, copy=copy,
               gate=np.asarray(plan.gate_tokens, np.int64), source=np.asarray(plan.source, np.int64),
               share=share, ctx=ctx, gen=gen, own=computed + copy, verify_on=not skipped,
               v_new=v_new, v_cached=v_cached, v_layers=layers, v_probes=probes, v_head=head,
               v_kv_tokens=v_new, v_reuse=bool(verify_reuses_kv and not no_kv), score=np.asarray(score, np.float64))


def blocks(tokens, bs: int):
    """``ceil(tokens / bs)`` (vectorised)."""
    return -(-np.asarray(tokens) // bs)


class BlockLedger:
    """Maps a problem's KV (block by position) onto a :class:`policies.blocks.BlockPool`.

    Block ``k`` of branch ``b`` covers positions ``[k bs, (k + 1) bs)`` of its
    sequence; a block inside the reused prompt belongs to the source's owner
    (shared), the rest to ``b``. Blocks are touched when a branch prefills
    (its whole prompt context), when a decode step opens a new block (its
    whole context: the step reads it) and when a verification pass reuses the
    branch's KV. A touch that misses on a block the pool evicted is
    *recompute*: its tokens are computed again in that iteration. RSBCM's
    block score is the branch's score, its depth 0 for prompt blocks and 1 for
    generated ones. ``now`` is a logical clock (one tick per touch), so the
    decisions do not depend on timing.
    """

    def __init__(self, pool, job: Job, tag):
        self.pool, self.job, self.tag = pool, job, tag
        self.clock = 0
        self.recompute_tokens = 0
        self.owner_cache: dict = {}
        self._owner_lists: dict = {}
        self._created: set = set()  # blocks ever computed: a later miss on one of them is recompute

    def owner(self, b: int, k: int) -> int:
        key = (b, k)
        o = self.owner_cache.get(key)
        if o is None:
            j = self.job
            s = int(j.source[b])
            if s >= 0 and (k + 1) * j.bs <= int(j.reused[b]):
                o = self.owner(s, k)
            else:
                o = b
            self.owner_cache[key] = o
        return o

    def _owners(self, b: int, nblk: int) -> list:
        """``owner(b, k)`` for ``k < nblk`` (a list per branch, grown as the branch's context grows)."""
        lst = self._owner_lists.get(b)
        if lst is None:
            lst = self._owner_lists[b] = []
        for k in range(len(lst), nblk):
            lst.append(self.owner(b, k))
        return lst

    def _touch(self, b: int, upto_tokens: int) -> int:
        """Touch blocks of branch ``b`` covering positions ``[0, upto_tokens)``; return recompute tokens."""
        j = self.job
        bs = j.bs
        rec = 0
        nblk = -(-upto_tokens // bs)
        score = float(j.score[b])
        prompt_blocks = -(-int(j.ctx[b]) // bs)
        owners = self._owners(b, nblk)
        access, created, tag, clock = self.pool.access, self._created, self.tag, self.clock
        for k in range(nblk):
            bid = (tag, owners[k], k)
            clock += 1
            fresh = bid not in created  # never computed before: computed now, not recompute
            hit = access(bid, score, 0 if k < prompt_blocks else 1, float(clock))
            created.add(bid)
            if not hit and not fresh:
                rec += min(bs, upto_tokens - k * bs)
        self.clock = clock
        self.recompute_tokens += rec
        return rec

    def on_prefill(self, b: int) -> int:
        return self._touch(b, int(self.job.ctx[b]))

    def on_decode(self, b: int, step: int) -> int:
        """Decode step ``step`` (1-based) of ``b`` writes position ``ctx + step - 1``; touch when it opens a block."""
        j = self.job
        pos = int(j.ctx[b]) + step - 1
        if pos % j.bs:
            return 0
        return self._touch(b, pos + 1)

    def is_boundary(self, b: int, step: int) -> bool:
        return (int(self.job.ctx[b]) + step - 1) % self.job.bs == 0

    def on_verify(self, b: int) -> int:
        return self._touch(b, int(self.job.v_cached[b]))

    def release(self) -> None:
        for bid in list(self._created):
            self.pool.free(bid)


def ledger_key(job: Job, budget: int, block_params: tuple) -> tuple:
    """Everything the sequence of pool touches of a job depends on (not its exit layers or probes).

    ``block_params``: a hashable form of the block policy's name and parameters.
    """
    k = job.__dict__.get("_ledger_bytes")
    if k is None:
        parts = (job.ctx, job.reused, job.source, job.own, job.gen, job.v_cached, job.has_prefill, job.gate > 0,
                 job.score)
        k = job.__dict__["_ledger_bytes"] = b"|".join(np.ascontiguousarray(a).tobytes() for a in parts)
    return (k, job.bs, job.verify_on, job.v_reuse, int(budget), block_params)


class _SizeLog:
    """Stands in for the pool of a replayed ledger: size / evictions as they were after each touch."""

    def __init__(self, sizes: list, evictions: int):
        self._sizes, self.evictions, self.i = sizes, evictions, 0

    @property
    def size(self) -> int:
        return self._sizes[self.i]


class RecordingLedger(BlockLedger):
    """A :class:`BlockLedger` that records what each call returned and the pool size after it."""

    def __init__(self, pool, job: Job, tag):
        super().__init__(pool, job, tag)
        self.log: list = []
        self.sizes: list = [pool.size]

    def _rec(self, r: int) -> int:
        self.log.append(r)
        self.sizes.append(self.pool.size)
        return r

    def on_prefill(self, b):
        return self._rec(super().on_prefill(b))

    def on_decode(self, b, step):
        return self._rec(super().on_decode(b, step))

    def on_verify(self, b):
        return self._rec(super().on_verify(b))


class ReplayLedger:
    """Replays a :class:`RecordingLedger`'s results for a job with the same :func:`ledger_key`.

    The block pool's decisions do not depend on exit layers or probes, so a threshold
    sweep over CGEE need not run the pool again for every exit pattern.
    """

    def __init__(self, rec: RecordingLedger):
        self.job = rec.job
        self._log = rec.log
        self.pool = _SizeLog(rec.sizes, rec.pool.evictions)
        self.recompute_tokens = rec.recompute_tokens

    def _next(self) -> int:
        r = self._log[self.pool.i]
        self.pool.i += 1
        return r

    def on_prefill(self, b):
        return self._next()

    def on_decode(self, b, step):
        return self._next()

    def on_verify(self, b):
        return self._next()

    def is_boundary(self, b: int, step: int) -> bool:
        return (int(self.job.ctx[b]) + step - 1) % self.job.bs == 0
