"""The first step of a fast-forward window when it is vLLM V1's mixed step: its plan, made before anything changes.

:func:`plan` plans the step (:class:`Admission`): the decodes, then the running tail's next prompt chunk, then the
waiting requests the scheduler admits, the last possibly a chunk; :class:`sim.serving.ff_window.Window` applies it
(``Window._admit_step``). :func:`plain_branch`, :func:`plain_waiting` and :func:`continues` say which requests a
window can take. Module docstring of :mod:`sim.serving.fastforward`: "Admission in the first step".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cost.pricing import step_counts
from sim.serving.ff_blocks import clean_first, hybrid_takes
from sim.serving.scheduler import RUNNING, chunk


def plain_branch(req) -> bool:
    """A request a window can advance: a branch's generation (kind 1) -- the one branch of a plain problem, or one
    of several (its siblings' gate passes, sources and verification run stepped; a branch held for a verification
    that reads its KV idles in the running list once it is done: ``FastForward.idle``) -- no token-eviction cache,
    not extended by its verification."""
    p, kind, b = req.data
    return kind == 1 and p.job.long is None and req.kv_cap is None and not p.ext[b]


@dataclass(frozen=True)
class Admission:
    """The plan of a window's first step, vLLM V1's mixed step (:func:`plan`): the admitted requests' scheduled
    items, in order, with their ``(cost tuples, kind)`` and the token budget each is admitted with (one more entry:
    the budget a failed try is given), the long-prefill threshold, ``tries`` (the scheduler's admission attempts: one
    more than the items where the next request did not fit), the step's seconds, its host seconds ``(host_s,
    host_serial_s)`` (None: not priced) and whether those are past the measured range; the running tail's item and
    its ``(cost tuples, kind)`` (None: every running request decodes); the request the step leaves mid-prompt (the
    tail's chunk short of its prompt's end, or the last admission a chunk; None: every item samples)."""

    items: list
    priced: list
    budgets: list
    thr: int
    tries: int
    dt: float
    host: tuple | None
    extrapolated: int
    tail: object = None
    tail_priced: tuple = None
    open_req: object = None


class _Victims:
    """One step's takes against the pool's eviction order (vLLM's free-block queue: LRU), planned before the step:
    the decodes' takes (:func:`decode_takes`: ``clean`` blocks left, ``evict`` taken off the queue's front), then
    each admission's (:meth:`admit`). The blocks an admission hits leave the queue (``held``) before its own takes;
    the queue is read only as far as asked."""

    def __init__(self, kv, clean: int, evict: int):
        self.kv, self.clean, self.evict = kv, int(clean), int(evict)
        self.held: set = set()
        self.it = kv.eviction_queue()
        self.seen: list = []

    def take(self, n: int) -> None:
        """``n`` blocks taken: clean ones first, then the queue's front."""
        self.clean, ev = clean_first(n, self.clean)
        self.evict += ev

    def cut(self, blocks):
        """How many of ``blocks`` (a request's cached chain, in order) the takes so far leave it: the chain stops at
        the first they evict (takes beyond the clean blocks evict the queue's front, the held blocks skipped); None
        where the order is not a queue."""
        n_evict = self.evict
        if n_evict <= 0 or not blocks:
            return len(blocks)
        if self.it is None:
            return None      # a scored policy (a heap): not planned
        held = self.held
        live = [b for b in self.seen if b not in held]
        while len(live) < n_evict:
            b = next(self.it, None)
            if b is None:
                break
            self.seen.append(b)
            if b not in held:
                live.append(b)
        victims = set(live[:n_evict])
        for k, b in enumerate(blocks):
            if b in victims:
                return k
        return len(blocks)

    def admit(self, req, n: int, blocks, hit: int) -> None:
        """``req`` admitted with ``n`` new tokens over its hit ``blocks`` (``hit`` tokens): they leave the queue,
        and its new blocks are taken (``BlockManager.new_blocks``; a hybrid cache's other groups' too)."""
        self.held.update(blocks)
        kv = self.kv
        n_take = kv.new_blocks(req, n, blocks, hit)
        if kv.kv_groups is not None:   # a fresh or resumed request holds no other groups' blocks yet
            n_take += max(kv._extra_blocks(req, n, blocks, hit) - len(kv._extra.get(req.req_id, ())), 0)
        self.take(n_take)


def decode_takes(kv, m, f):
    """Step 1's decodes as the scheduler runs them, each member's ``allocate_one`` in running order (``f``: the step
    each opens a block at): ``(free, clean, evict)`` -- the free blocks after them, the clean ones left and those
    taken off the queue's front -- or None where one would not fit at its turn (it preempts, and the scheduler
    then admits nobody in the step). A hybrid cache's are followed member by member
    (:func:`sim.serving.ff_blocks.hybrid_takes`)."""
    opens = f == 1
    if kv.kv_groups is None:
        t = int(np.count_nonzero(opens))
        return None if t > kv.num_free else (kv.num_free - t, *clean_first(t, kv.n_clean))
    free, clean, evict, fail = hybrid_takes(kv, m.c0, m.nb, m.rids, opens)
    return None if fail is not None else (free, clean, evict)


def may_admit(eng, head: bool = True) -> bool:
    """Whether a window's first step may be vLLM V1's mixed step (``vllm-v1``; :func:`plan`) with a closed form (a
    sliding-window shape's given its decodes' window key sum); ``head``: admitting the admissible waiting head,
    :func:`plain_waiting`."""
    sched, cost = eng.sched, eng.cost
    sw = getattr(cost, "sliding_window", None)
    return (sched.cfg.policy == "vllm-v1" and (cost.closed_form() or (sw is not None and sw() is not None))
            and (not head or plain_waiting(sched.waiting[0])))


def _decodes_after_prompt(req, computed: int) -> bool:
    """Whether the end of ``req``'s prompt samples a token and leaves it decoding: a :func:`plain_branch` request,
    no zero-copy fork, no extension, at least two tokens left to sample; fresh (no first token yet, never
    preempted, its high-water mark ``computed``: what it computed so far) or resumed after preemptions (its first
    token out, its tokens to recompute)."""
    if (req.allow_full_hit or req.max_output_tokens - req.num_output_tokens < 2
            or req.num_tokens != req.prompt_tokens + req.num_output_tokens or not plain_branch(req)):
        return False
    p, _, b = req.data
    if p.first[b] != p.first[b]:    # no first token yet: fresh
        return not (req.num_preemptions or req.num_output_tokens) and req.high_water == computed
    return req.num_preemptions > 0


def continues(req) -> bool:
    """Whether the newest running request ``req``, mid-prompt (two tokens or more to compute), may take its next
    chunk in a window's first step (:func:`_decodes_after_prompt`)."""
    c = req.num_computed_tokens
    return req.status == RUNNING and req.num_tokens - c >= 2 and _decodes_after_prompt(req, c)


def plain_waiting(req) -> bool:
    """Whether the waiting request ``req``, nothing computed, may be admitted in a window's first step
    (:func:`_decodes_after_prompt`)."""
    return not req.num_computed_tokens and _decodes_after_prompt(req, 0)


HEAD_SHORT = "head short"   # plan's answer where the step's decodes leave the waiting head short: it admits nobody


def plan(eng, m, f, step1, tail=None):
    """The plan of a window's first step (:class:`Admission`) where it is vLLM V1's mixed step (:func:`may_admit`),
    made without changing anything, or None (stepped). ``m``: the members (running, decoding), ``f``: the step each
    opens a block at, ``step1``: their decodes' takes in step 1 (:func:`decode_takes`: they fit), ``tail``: the
    newest running request, mid-prompt (:func:`continues`), or None.

    ``Scheduler._schedule_v1`` runs the running requests first (each member decodes, ``f == 1`` opening a block; the
    tail takes its next chunk within the budget left), then admits waiting requests in order while the token budget
    and ``max_num_seqs`` allow, until one does not fit. The window takes that step only where its outcome is known
    now: the decodes' and the tail's takes fit the free pool (no preemption); each admitted request is
    :func:`plain_waiting` and gets the whole rest of its prompt (it samples a token and decodes from step 2), or the
    last a chunk that ends the budget (its whole rest free: the scheduler's reserve); each request's prefix hit is
    known at its turn (:func:`_hit_at_turn`); the batch is within the fitted range; the step, priced as stepped
    (:func:`_price`), does not end exactly at the next event. The window ends after the step where a request is left
    mid-prompt (``open_req``), the next event falls in it or a waiting request could be admitted in the next.
    :data:`HEAD_SHORT`: no tail, and the head does not fit after the decodes' takes (a decode step: its lookup).
    """
    sched, kv, pricer = eng.sched, eng.kv, eng.pricer
    cfg = sched.cfg
    B0 = len(m.R)
    free = step1[0]
    budget = int(cfg.max_num_batched_tokens) - B0
    thr = sched._threshold()
    items, priced, budgets, keyed = [], [], [], set()
    lru = _Victims(kv, step1[1], step1[2])
    tries = 0
    bs = kv.block_size
    t_item = t_priced = open_req = None
    if tail is not None:
        got = _tail_chunk(sched, kv, tail, budget, thr, free, B0)
        if got is None:
            return None
        t_item, need, rel, open_req = got
        t_priced = pricer.item(t_item)
        free += rel - need
        lru.take(need)
        lru.clean += rel
        budget -= t_item.num_new
        if kv.caching and tail.cacheable:   # the blocks its allocation keys: no admission may hit them
            full = (tail.num_computed_tokens + t_item.num_new) // bs
            keyed.update(kv.keys_upto(tail, full)[:full])
    running = B0 + (tail is not None)
    for head in sched.waiting:
        if open_req is not None or not sched._room(budget, running + eng._ff.idle + len(items)):
            break
        tries += 1
        got = _hit_at_turn(kv, head, lru, keyed)
        if got is None:
            return None
        blocks, hit = got
        rest = head.num_tokens - hit
        n = chunk(rest, budget, thr)
        need = kv.blocks_needed(head, n, blocks, hit)
        if n < rest and cfg.reserve_full_prompt and kv.blocks_needed(head, rest, blocks, hit) > free:
            break             # its whole rest is not free (Scheduler._admit's reserve): tried, not admitted
        if need > free:
            break             # it does not fit (the scheduler tries it, counts its lookup, stops there)
        if n < 1 or not plain_waiting(head) or (n < rest and n != budget):
            return None       # a request that would not decode next, or a chunk with budget left after it
        if n < rest:
            open_req = head   # a chunk: the step's last admission, mid-prompt after it
        item = sched._item(head, n, True, hit, c=hit)
        items.append(item)
        priced.append(pricer.item(item))
        budgets.append(budget)
        budget -= n
        free -= need
        lru.admit(head, n, blocks, hit)
        if kv.caching and head.cacheable:
            keyed.update(kv.keys_upto(head, (hit + n) // bs)[:(hit + n) // bs])
    budgets.append(budget)   # what a failed try was given (tries > len(items))
    if not items and tail is None:   # the head, tried after the decodes' takes, does not fit: nobody is admitted
        return HEAD_SHORT if tries else None
    if eng.max_batch is not None and running + len(items) > eng.max_batch:
        return None
    price = _price(eng, m, priced if tail is None else [t_priced] + priced, items if tail is None else [t_item] + items)
    if price is None:
        return None
    dt, host, extrapolated = price
    return Admission(items, priced, budgets, thr, tries, float(dt), host, extrapolated, t_item, t_priced, open_req)


def queues_at(m, st: int) -> bool:
    """Whether a member sampling its last token at window step ``st`` may queue requests as it finishes: its problem's
    verification passes (the stepped path queues them at the step's end, after any event that fell in the step: a
    window steps such a step where the next event falls in it)."""
    return any(m.probs[i].job.verify_on for i in np.flatnonzero(m.fin == st).tolist())


def _branches_fit(eng, m, its, dt: float) -> bool:
    """Whether the window may take a mixed step of ``dt`` seconds whose items are ``its`` (the tail's, then the
    admitted), where problems of several branches, or verified ones, run (``FastForward.multi``): each item's
    problem has no member (``m``) and no other item -- the step then adds to its figures once (its iterations, its
    phases in the stepped order) -- and, where the next event falls in the step, nothing in it queues requests (a
    source's first token starts the branches that read its KV, a last finish queues verification passes: the
    stepped path queues them behind the event)."""
    mine = {id(p) for p in m.probs}
    seen = set()
    for it in its:
        p = it.req.data[0]
        if id(p) in mine or id(p) in seen:
            return False
        seen.add(id(p))
    return not (eng.env.now + dt > eng.peek_next()
                and (queues_at(m, 1) or any(not it.req.data[0].started.all() for it in its)))


def _hit_at_turn(kv, head, lru, keyed):
    """``head``'s prefix hit at its turn in the step, ``(blocks, hit tokens)``: its cached chain up to the first of
    the pool's LRU victims of the takes before it (:meth:`_Victims.cut`); None where that is not known now (not a
    queue, an evicted key another copy may serve, a hit block an earlier admission holds, or the block after its hit
    keyed by the tail or an earlier admission of the step)."""
    bs = kv.block_size
    blocks, hit = kv.find_cached(head, count=False)
    if hit:
        # the takes before its turn evict the pool's LRU front: its chain stops at the first they take (a
        # preempted request's own blocks are often there, tail first)
        k = lru.cut(blocks)
        if k is None or (k < len(blocks) and kv._dups):
            return None   # not a queue, or an evicted key another copy may serve
        blocks, hit = blocks[:k], k * bs
        if lru.held.intersection(blocks):
            return None   # an earlier admission of the step holds one of its hit blocks
    if keyed and kv.caching and head.cacheable and hit // bs < head.num_tokens // bs:
        if kv.keys_upto(head, hit // bs + 1)[hit // bs] in keyed:
            return None   # the tail or an earlier admission of the step keys the block after its hit
    return blocks, hit


def _tail_chunk(sched, kv, tail, budget: int, thr: int, free: int, B0: int):
    """The running tail's next chunk, scheduled after the ``B0`` decodes (``Scheduler._run_running``): ``(item,
    blocks it takes, blocks it releases, tail or None)`` -- a hybrid cache's sliding blocks wholly before the window
    go back to the clean pool after its takes; the tail where the chunk leaves it mid-prompt -- or None where its
    blocks do not fit (it would preempt), or a long-prefill threshold cuts it with budget left an admission would
    take."""
    pend = tail.num_tokens - tail.num_computed_tokens
    nt = chunk(pend, budget, thr)
    need = kv.blocks_needed(tail, nt)
    if budget <= 0 or nt < 1 or need > free:
        return None
    if nt < pend and budget - nt > 0 and sched.waiting and sched._room(budget - nt, B0 + 1):
        return None
    rel = 0 if kv.kv_groups is None else max(len(kv._extra.get(tail.req_id, ())) - kv._extra_blocks(tail, nt, ()), 0)
    return sched._item(tail, nt, False), need, rel, (tail if nt < pend else None)


def _price(eng, m, priced, items):
    """The mixed step's ``(seconds, host seconds, extrapolated)`` as the stepped path prices it -- the decodes' sums
    in closed form, then ``items``' cost tuples ``priced`` in turn (+ the eviction-scoring seconds: none here), its
    host time from the same counts -- or None where it takes no time, ends exactly at the next event (a tie:
    stepped), a fleet's answer falls in the step the next event falls in (after that event: stepped), or a problem
    of several branches adds to its figures twice in it or queues requests behind the event (:func:`_branches_fit`)."""
    W = eng._ff.window   # a sliding-window shape's: the decodes' window key sum
    dt = eng.cost.mixed_seconds(len(m.R), int(m.c0.sum()), int(m.c0.max()) if len(m.R) else 0,
                                [t for ts, _ in priced for t in ts],
                                None if W is None else int(np.minimum(m.c0 + 1, W).sum())) + 0.0
    host, extrapolated = None, 0
    if eng.host_step is not None:
        from sim.cost.overheads import step_seconds
        host, extrapolated = eng.pricer.host_counts(*step_counts(items, len(m.R)))
        dt = step_seconds(dt, host[0], eng.async_scheduling, host[1])
    t_next = eng.peek_next()
    if not dt > 0 or eng.env.now + dt == t_next:
        return None
    if eng.fleet and eng.env.now + dt > t_next and np.any((m.fin == 1) & m.ud):
        return None
    if eng._ff.multi and not _branches_fit(eng, m, items, dt):
        return None
    return dt, host, extrapolated
