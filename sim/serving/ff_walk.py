"""A fast-forward window's block events applied to the block manager (:mod:`sim.serving.fastforward`, module
docstring): :class:`BlockWalk`, a mixin of :class:`sim.serving.ff_window.Window` (which holds the state it reads)."""
from __future__ import annotations

from sim.serving.ff_blocks import SMALL_BATCH, cached_prefix


class BlockWalk:
    """:meth:`process` (block events of steps that take within the pool, as ``allocate_one`` makes them),
    :meth:`preempt_step` (the step whose takes exceed it: the scheduler's own preemptions)."""

    def process(self, a: int, b: int) -> None:
        """Block events of steps a..b (no take fails), as ``allocate_one`` makes them (a hybrid cache's: ``allocate``
        itself); the head's lookups."""
        self.ensure(b)
        kv, keys, used, bs = self.kv, self.keys, self.used, self.bs
        evs, who, ep, L, hits = self.evs, self.who, self.ep, self.L, self.hits
        al, blist, cl, reg, rids, R = self.al, self.blist, self.cl, self.reg, self.rids, self.R
        nkeyed = kv._n_keyed
        cur = a
        ev0 = kv.evictions
        n = len(evs)
        if self.pf and keys is not None:
            hits += L            # prefill-first looks the head up before the step's decodes allocate
        take, register, eager, nblocks = kv._take, kv._register, self.eager, kv.num_blocks
        groups = self.groups is not None
        if not eager and not groups and len(R) > SMALL_BATCH:
            # every event opens a block and keys nothing: a step's opens in one _take_n (a few members' events are
            # cheaper one by one, below); the loop below then has none left
            ep, cur, L, hits = self._opens(b, ep, cur, L, hits)
        while ep < n and evs[ep] <= b:
            st, i = evs[ep], who[ep]
            ep += 1
            if not al[i]:
                continue
            if st != cur:
                if keys is not None:
                    hits += L * (st - cur)
                used.append((cur, kv.num_used))
                cur = st
            if groups:   # a hybrid cache: the stepped allocation itself (its groups' takes and releases, in order)
                R[i].num_computed_tokens = cl[i] + st - 1
                if not kv.allocate_one(R[i]):   # pragma: no cover - planned within the pool (allocate(req, 1)'s lane)
                    raise RuntimeError("fast-forward: a planned block allocation failed")
                if keys is not None and kv.evictions != ev0:   # its takes may evict several blocks
                    L = cached_prefix(keys, kv.cached, L)
                    ev0 = kv.evictions
                continue
            blks = blist[i]
            tokens = cl[i] + st                 # the token this step computes, 1-based
            if tokens > len(blks) * bs:         # it opens a block (allocate_one's second lane)
                free = kv.n_clean + len(kv._evictable)
                if free < 1:   # pragma: no cover - planned within the pool
                    raise RuntimeError("fast-forward: a planned block allocation failed")
                blks.append(take())
                u = nblocks - free + 1          # num_used after the take
                if u > kv.peak_used:
                    kv.peak_used = u
                if eager and reg[i] and nkeyed.get(rids[i], 0) < tokens // bs:   # else _register is a no-op
                    register(R[i], blks, tokens // bs)
                if keys is not None and kv.evictions != ev0:   # the take evicted (one block at most)
                    pos = keys.get(kv.last_evicted)
                    if pos is not None and pos < L:
                        L = pos
                    ev0 = kv.evictions
            elif reg[i] and tokens % bs == 0:   # it fills one: its key (the first lane)
                register(R[i], blks, tokens // bs)
        if keys is not None:
            hits += L * (b - cur if self.pf else b + 1 - cur)
            kv.queries += self.nblk * (b + 1 - a)
            kv.hits += hits
            hits = 0
        used.append((cur, kv.num_used))
        if cur < b:
            used.append((b, kv.num_used))
        self.ep, self.L, self.hits = ep, L, hits

    def _opens(self, b: int, ep: int, cur: int, L: int, hits: int):
        """:meth:`process`' events through step ``b`` where each opens a block and keys none (no eager keys, one KV
        group): each step's openers, in running order, take their blocks in one ``_take_n`` (the blocks ``allocate_one``
        hands them in turn); the head's cached chain is read after the step's takes, where its lookup comes.
        ``(ep, cur, L, hits)`` after them (the head's hits of the steps before ``cur`` counted)."""
        kv, keys, used, evs, who, al = self.kv, self.keys, self.used, self.evs, self.who, self.al
        n, ev0 = len(evs), kv.evictions
        while ep < n and evs[ep] <= b:
            st = evs[ep]
            if st != cur:
                if keys is not None:
                    hits += L * (st - cur)
                used.append((cur, kv.num_used))
                cur = st
            takers = []
            while ep < n and evs[ep] == st:
                i = who[ep]
                ep += 1
                if al[i]:
                    takers.append(i)
            if not takers:
                continue
            free = kv.n_clean + len(kv._evictable)
            if free < len(takers):   # pragma: no cover - planned within the pool
                raise RuntimeError("fast-forward: a planned block allocation failed")
            self._give(takers, free)
            if keys is not None and kv.evictions != ev0:   # the takes evicted: the head's chain up to the first gone
                L = cached_prefix(keys, kv.cached, L)
                ev0 = kv.evictions
        return ep, cur, L, hits

    def _give(self, takers: list, free: int) -> None:
        """Each of ``takers`` (members, in running order) opens a block: ``allocate_one``'s second lane each, the
        blocks handed out in turn by one ``_take_n``; the peak after them (``free``: the free pool before)."""
        kv, blist = self.kv, self.blist
        for i, blk in zip(takers, kv._take_n(len(takers))):
            blist[i].append(blk)
        u = kv.num_blocks - free + len(takers)   # num_used after the takes
        if u > kv.peak_used:
            kv.peak_used = u

    def preempt_step(self, st: int) -> None:
        """Step ``st``, whose takes exceed the pool: the scheduler's own preemptions (newest first) as
        ``_run_running`` makes them; no admission in this step."""
        self.ensure(st)
        kv, sched = self.kv, self.sched
        pre_l = []
        if self.pf and self.keys is not None:   # prefill-first tried the head before the decodes preempted
            kv.queries += self.nblk
            kv.hits += self.L
        evs, who, lazy = self.evs, self.who, self.lazy
        bulk, al = lazy and self.groups is None, self.al
        while self.ep < len(evs) and evs[self.ep] <= st:
            if bulk:
                # the opens the pool can give, in running order: allocate_one's second lane each, in one _take_n
                free, q, takers = kv.n_clean + len(kv._evictable), self.ep, []
                while q < len(evs) and evs[q] <= st and len(takers) < free:
                    if al[who[q]]:
                        takers.append(who[q])
                    q += 1
                if takers:
                    self._give(takers, free)
                self.ep = q
                if not (q < len(evs) and evs[q] <= st):
                    break
            i = who[self.ep]
            self.ep += 1
            if not al[i]:
                continue
            req = self.R[i]
            req.num_computed_tokens = self.cl[i] + st - 1
            # lazy: every event opens a block, its filled blocks keyed where the request leaves (key_filled)
            while not kv.allocate_one(req, key=not lazy):
                victim = sched._victim()
                if self._index is None:
                    self._index = {id(r): i for i, r in enumerate(self.R)}
                vi = self._index[id(victim)]
                self.settle(vi, st - 1)
                self.key_filled(vi)
                self.alive[vi] = False
                al[vi] = False
                self.last[vi] = st - 1
                sched._preempt(victim, pre_l)
                if victim is req:
                    break
        if not pre_l and not self.pf and self.keys is not None:   # none preempted (a hybrid cache's step): the
            self.L = cached_prefix(self.keys, kv.cached, self.L)    # scheduler then looks the waiting head up
            kv.queries += self.nblk
            kv.hits += self.L
        self.used.append((st, kv.num_used))
