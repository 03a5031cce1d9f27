"""The serving block manager: paged KV blocks with vLLM's prefix-cache semantics (pure Python).

One object, driven step by step by :class:`sim.serving.scheduler.Scheduler` (which the
simpy engine and a real torch runner both call), holds the KV memory of a
server: ``num_blocks`` blocks of ``block_size`` tokens.

Rules (vLLM V1 ``KVCacheManager`` / ``BlockPool``; SGLang's radix cache has the
same reachability):

* **Hash chain.** A *full* block's key is ``hash((parent_key, content))``
  (:func:`block_key`); the first block's parent is :data:`ROOT_KEY`. Content is
  the block's token ids, or any hashable the caller uses in their place. A
  block is therefore reusable only when every block before it is cached too:
  :meth:`BlockManager.find_cached` walks the chain and stops at the first
  miss, so evicting a middle block makes the later ones misses.
* **Hit cap.** A prompt whose every token hits gets ``n - 1`` tokens at most,
  rounded down to whole blocks, as vLLM V1 caps it (``max_cache_hit_length =
  num_tokens - 1``): the last position must be computed to have logits. A request may waive the cap
  (``allow_full_hit``: a zero-copy fork whose first token is its source's).
* **Same-step hits.** Full blocks covering the tokens scheduled are keyed when
  allocated (vLLM caches them in ``allocate_slots``), so a request admitted
  later in the same step hits blocks an earlier one has just allocated.
* **Duplicates.** A block computed while a copy with the same key is cached
  (the recomputed last block of a whole-prompt hit, a block two requests
  filled in the same steps) is keyed too; lookups return the earliest
  surviving copy and evicting it hands the key to the next, as vLLM's
  ``BlockHashToBlockMap`` does (it never de-duplicates, so block tables stay
  append-only).
* **References.** A block used by a running request has ``ref > 0`` and is
  never evicted. Freed blocks (``ref == 0``) with a key form the *evictable
  cache*; blocks without a key (partial, or caching off) go back to the free
  pool at once.
* **Eviction order.** Clean blocks (never used, or without a key) are taken
  first, then the evictable block the block policy ranks lowest
  (``policy.evict_key(score, depth, last_used, inserted)`` of
  :mod:`policies.blocks`): LRU = vLLM's free-queue order (``last_used`` = the
  tick the block was freed; a request frees its blocks last-first so its tail
  goes first, as vLLM's ``free`` does), FIFO (``inserted`` = tick it was first
  cached), RSBCM (``omega = score / (depth + 1)``). A policy whose key grows
  with the release order (``policy.release_ordered``: LRU, whose key leads
  with ``last_used``, a fresh tick at every release) needs no heap: the
  evictable blocks are kept in release order and the oldest goes first, as
  vLLM's ``FreeKVCacheBlockQueue`` does, with the same victims (and no block
  keeps the rank fields nobody reads then: ticks, depth, heap versions).
* **RSBCM score.** A block's score is only what is known when it is ranked:
  0 until :meth:`BlockManager.set_score` raises it (the caller calls it when
  the branch's score becomes known); a block shared by several branches keeps
  the highest (DESIGN §4).

Memory is proportional to the blocks in use or cached, never to
``num_blocks`` (clean blocks are a counter; block ids are handed out lazily),
so ``num_blocks`` may be the capacity of an 141 GB device or unlimited.

API (docs/sim-api.md)::

    bm = BlockManager(num_blocks, block_size, policy=LRU(), caching=True)
    blocks, n_hit = bm.find_cached(req)           # longest cached chain (hit capped at n - 1 tokens)
    ok = bm.allocate(req, n_new, blocks, n_hit)    # False: not enough free blocks
    bm.free(req)                                   # request done or preempted
    bm.set_score(key, s)                           # RSBCM: a branch's score is known

``req`` is any object with ``req_id``, ``num_tokens``, ``num_computed_tokens``,
``cacheable``, ``allow_full_hit`` and ``block_content(k)`` / ``block_depth(k)``
(:class:`sim.serving.scheduler.Request` is one).
"""
from __future__ import annotations

import heapq
from collections import OrderedDict

from sim.serving.kvblock import (  # noqa: F401 - the block manager's units, imported from here too
    ROOT_KEY, UNLIMITED, Block, KVCacheError, block_key, chain_keys, check_size)


def group_blocks(kv_groups, bs: int, nb, computed, lo=max, hi=min, nb_sw=None):
    """Blocks a request holds in its other KV-cache groups (``kv_groups = (full, sliding, W)``,
    :meth:`BlockManager.set_kv_groups`) with ``nb`` blocks of tokens, ``computed`` of them computed::

        (full - 1) nb + sliding max(nb_sw - min(skipped, nb_sw), 0),   skipped = floor(max(0, computed - W + 1) / bs)

    (the sliding blocks wholly before the window freed: vLLM's ``remove_skipped_blocks``); ``nb_sw`` (default ``nb``):
    a token-evicted request's window groups count every token, its full groups the capped cache. Integers, or arrays
    with ``lo``, ``hi`` = ``numpy.maximum``, ``numpy.minimum``."""
    full, sliding, window = kv_groups
    skipped, nb_sw = lo(computed - window + 1, 0) // bs, nb if nb_sw is None else nb_sw
    return (full - 1) * nb + sliding * lo(nb_sw - hi(skipped, nb_sw), 0)


class BlockManager:
    """KV blocks of one server under a block policy (module docstring).

    Parameters
    ----------
    num_blocks : int
        Capacity in blocks (``UNLIMITED`` for none); nothing is allocated per block.
    block_size : int
        Tokens per block.
    policy : block policy of :mod:`policies.blocks`, optional
        Ranks the evictable cache; default LRU (vLLM's order).
    caching : bool
        Prefix caching on (vLLM ``enable_prefix_caching``); off: no block is ever reused.
    log_evictions : bool
        Keep every evicted key in order (``evicted_log``: the tree replay's eviction order, tests); off, only
        the last (``last_evicted``), so a long serving run's memory does not grow with its evictions.
    """

    def __init__(self, num_blocks: int, block_size: int, policy=None, caching: bool = True,
                 log_evictions: bool = True):
        self.num_blocks = check_size("num_blocks", num_blocks, lo=0, hi=UNLIMITED)
        self.block_size = check_size("block_size", block_size, lo=1, hi=4096)
        if policy is None:
            from policies.blocks import LRU
            policy = LRU()
        if not hasattr(policy, "evict_key"):
            raise KVCacheError(f"policy: must be a block policy of policies.blocks (rsbcm, lru, fifo), got {policy!r}")
        self.policy = policy
        self.caching = bool(caching)
        self._next_id = 0          # ids >= this were never handed out
        self._spare_ids: list = []  # ids returned to the free pool (reused lowest first)
        self.n_clean = self.num_blocks  # free blocks holding nothing useful
        self.cached: dict[int, Block] = {}   # key -> the block a lookup returns (referenced or evictable)
        self._dups: dict[int, dict] = {}     # key -> {block_id: block} of later copies, in insertion order
        # block_id -> block with ref 0 and a key; in release order when the policy's key follows it (no heap)
        self._ordered = bool(getattr(policy, "release_ordered", False))
        self._evictable: dict[int, Block] = OrderedDict() if self._ordered else {}
        self._heap: list = []
        self.req_blocks: dict = {}  # req_id -> [Block]
        self._n_keyed: dict = {}    # req_id -> blocks of the request already keyed
        self._chain: dict = {}      # id(req) -> (req, chain keys of its blocks)
        self.tick = 0.0
        self.evictions = 0
        self.hits = 0              # blocks found in the cache
        self.queries = 0           # blocks looked up
        self.peak_used = 0
        self.log_evictions = bool(log_evictions)
        self.evicted_log: list = []  # keys evicted, in order (with log_evictions; bounded by evictions)
        self.last_evicted = None     # the key of the last block evicted
        self.kv_groups = None       # (full_groups, sliding_groups, window): set_kv_groups
        self._extra: dict = {}      # req_id -> [Block] of its other groups (never keyed)

    def set_kv_groups(self, full_groups: int, sliding_groups: int, window: int) -> None:
        """A hybrid KV cache (vLLM's ``HybridKVCacheCoordinator``): every request holds the blocks of each of
        ``full_groups`` full-attention groups and ``sliding_groups`` sliding-window groups, all from this pool.

        The first full group's blocks are the request's block table (keyed, prefix-cached, as before); the
        others are anonymous blocks taken from and returned to the same pool. A full group holds ``ceil(t / B)``
        blocks of ``t`` tokens; a sliding group frees the blocks wholly before its window, as vLLM's
        ``SlidingWindowManager.remove_skipped_blocks`` does before each allocation (``get_num_skipped_tokens(c)
        = max(0, c - W + 1)`` of ``c`` computed tokens; vllm/v1/core/single_type_kv_cache_manager.py, vLLM
        0.33.0), so it holds ``ceil(t / B) - floor(max(0, c - W + 1) / B)``: at most ``ceil(W / B) + 1`` in a
        decode step, the whole chunk during a prefill. Sliding blocks are not prefix-cached here.
        """
        for name, v, lo in (("full_groups", full_groups, 1), ("sliding_groups", sliding_groups, 0),
                            ("window", window, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise KVCacheError(f"kv groups: {name} must be an integer >= {lo}, got {v!r}")
        if bool(sliding_groups) != bool(window):
            raise KVCacheError("kv groups: sliding_groups and window must be both 0 or both > 0")
        if self.req_blocks:
            raise KVCacheError("kv groups: set before any request holds blocks")
        self.kv_groups = None if (full_groups, sliding_groups) == (1, 0) else (full_groups, sliding_groups, window)

    # ------------------------------------------------------------------ counts
    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: clean + evictable."""
        return self.n_clean + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks referenced by a request."""
        return self.num_blocks - self.num_free

    @property
    def num_cached_free(self) -> int:
        return len(self._evictable)

    def check(self) -> None:
        """Conservation: clean + evictable + referenced == num_blocks; referenced blocks are held by requests."""
        refd = {}
        for blks in self.req_blocks.values():
            for b in blks:
                refd[b.block_id] = refd.get(b.block_id, 0) + 1
        for bid, n in refd.items():
            assert bid not in self._evictable, f"block {bid} referenced and evictable"
        n_ref = len(refd) + sum(len(x) for x in self._extra.values())
        assert self.n_clean + len(self._evictable) + n_ref == self.num_blocks, (
            self.n_clean, len(self._evictable), n_ref, self.num_blocks)
        for blks in self.req_blocks.values():
            for b in blks:
                assert b.ref == refd[b.block_id], (b.block_id, b.ref, refd[b.block_id])
        for b in self._evictable.values():
            assert b.ref == 0 and b.key is not None
            assert self.cached.get(b.key) is b or self._dups.get(b.key, {}).get(b.block_id) is b, b.block_id

    # ------------------------------------------------------------------ keys
    def _key_of(self, req, k: int) -> int:
        return self.keys_upto(req, k + 1)[k]

    def keys_upto(self, req, n: int) -> list:
        """The chain keys of ``req``'s first ``n`` blocks (at least; the manager's own list: read it, never change
        it). A request's keys are kept for the pool's life: its content never changes, preempted or not."""
        hit = self._chain.get(id(req))
        if hit is None:
            hit = self._chain[id(req)] = (req, [])  # the request is held so its id stays its own
        keys = hit[1]
        m = len(keys)
        if m < n:
            content = req.block_content
            parent = keys[-1] if m else ROOT_KEY
            if n == m + 1:          # a decode step filled a block: one key, no loop
                keys.append(hash((parent, content(m))))   # block_key, inline (once per block a decode fills)
                return keys
            append = keys.append
            for c in (req.block_contents(m, n) if hasattr(req, "block_contents") else map(content, range(m, n))):
                parent = hash((parent, c))   # block_key, inline: a prompt's keys in one pass
                append(parent)
        return keys

    def forget(self, req) -> None:
        """Drop ``req``'s chain keys: it is answered and never asks again (a preempted request keeps them). Its
        cached blocks keep their own keys."""
        self._chain.pop(id(req), None)

    def chain_keys(self, req) -> list:
        """The chain keys of ``req``'s blocks computed so far (empty before its first)."""
        hit = self._chain.get(id(req))
        return hit[1] if hit is not None else []

    def key(self, req, k: int) -> int:
        """Chain key of block ``k`` of ``req`` (computed from its content and its parents')."""
        return self._key_of(req, k)

    # ------------------------------------------------------------------ lookup
    def find_cached(self, req, count: bool = True) -> tuple[list, int]:
        """Longest chain of cached blocks of ``req``'s known tokens: ``(blocks, hit_tokens)``.

        Walks the full blocks and stops at the first miss (chain rule). The hit is capped at
        ``num_tokens - 1`` tokens unless ``req.allow_full_hit``: the last position is computed
        again so its logits exist (vLLM V1's ``max_cache_hit_length = num_tokens - 1``), and the hit
        is whole blocks within that limit, as vLLM V1's ``find_longest_cache_hit`` returns: a
        whole-prompt full-block match recomputes its last block. ``policies.ExactPrefix`` plans the
        same rule, so the fast path and this manager agree.
        """
        if not (self.caching and req.cacheable):
            return [], 0
        n = int(req.num_tokens)
        limit = n if getattr(req, "allow_full_hit", False) else n - 1
        nblk = n // self.block_size
        out = []
        cached = self.cached
        keys = self.keys_upto(req, 1) if nblk else ()
        for k in range(nblk):
            # keys one by one past the known ones: the walk stops at the first miss
            b = cached.get(keys[k] if k < len(keys) else self._key_of(req, k))
            if b is None:
                break
            out.append(b)
        if count:
            self.queries += nblk
            self.hits += len(out)
        keep = max(0, min(len(out) * self.block_size, limit)) // self.block_size
        return out[:keep], keep * self.block_size

    # ------------------------------------------------------------------ allocation
    def blocks_needed(self, req, n_new: int, computed: list = (), hit_tokens: int | None = None) -> int:
        """Blocks an :meth:`allocate` of ``n_new`` tokens would take from the free pool: its :meth:`new_blocks`, its
        cache hits nobody holds (evictable), and its other KV-cache groups' new blocks."""
        extra = 0 if self.kv_groups is None else max(
            self._extra_blocks(req, n_new, computed, hit_tokens) - len(self._extra.get(req.req_id, ())), 0)
        return self.new_blocks(req, n_new, computed, hit_tokens) + sum(1 for b in computed if b.ref == 0) + extra

    def new_blocks(self, req, n_new: int, computed: list = (), hit_tokens: int | None = None) -> int:
        """Blocks an :meth:`allocate` of ``n_new`` tokens takes (:meth:`_take_n`: clean ones first, else victims)."""
        have = len(self.req_blocks.get(req.req_id, ())) + len(computed)
        return max(self._total_blocks(req, n_new, computed, hit_tokens) - have, 0)

    def _extra_blocks(self, req, n_new: int, computed, hit_tokens=None) -> int:
        """Blocks of the request's other KV-cache groups once ``n_new`` more tokens are in (a kv_cap caps full ones)."""
        c = int(req.num_computed_tokens) + (len(computed) * self.block_size if hit_tokens is None else int(hit_tokens))
        return group_blocks(self.kv_groups, self.block_size, self._total_blocks(req, n_new, computed, hit_tokens), c,
                            nb_sw=None if req.kv_cap is None else -(-(c + int(n_new)) // self.block_size))

    def _total_blocks(self, req, n_new: int, computed, hit_tokens=None) -> int:
        """Blocks the request holds once ``n_new`` more tokens are in; a request with ``kv_cap`` (token
        eviction: at most K + B (+ sinks) tokens per sequence) never holds more than its cap."""
        hit = len(computed) * self.block_size if hit_tokens is None else int(hit_tokens)
        tokens = int(req.num_computed_tokens) + hit + int(n_new)
        cap = getattr(req, "kv_cap", None)
        if cap is not None and tokens > cap:
            tokens = int(cap)
        return -(-tokens // self.block_size)

    def can_allocate(self, req, n_new: int, computed: list = (), hit_tokens: int | None = None) -> bool:
        return self.blocks_needed(req, n_new, computed, hit_tokens) <= self.num_free

    def allocate(self, req, n_new: int, computed: list = (), hit_tokens: int | None = None) -> bool:
        """Reserve blocks for ``n_new`` more tokens of ``req`` (after its ``computed`` cache hits).

        ``computed``: blocks from :meth:`find_cached` (only on the request's first allocation
        after admission). Returns False, changing nothing, when the free pool is short.
        Full blocks covering the tokens scheduled are keyed at once (vLLM caches them at
        allocation), so a request admitted later in the same step can hit them.
        """
        if not self.can_allocate(req, n_new, computed, hit_tokens):
            return False
        hit = len(computed) * self.block_size if hit_tokens is None else int(hit_tokens)
        rid = req.req_id
        blks = self.req_blocks.setdefault(rid, [])
        for b in computed:
            if b.ref == 0:
                self._evictable.pop(b.block_id, None)
                b.version += 1
            b.ref += 1
            blks.append(b)
        if computed:
            self._n_keyed[rid] = len(blks)
        total = self._total_blocks(req, n_new, computed, hit_tokens)
        if total > len(blks):
            blks += self._take_n(total - len(blks))
        if self.kv_groups is not None:
            self._fit_groups(self._extra.setdefault(rid, []), self._extra_blocks(req, n_new, computed, hit_tokens))
        self._mark_peak()
        if self.caching and req.cacheable:
            full = (int(req.num_computed_tokens) + hit + int(n_new)) // self.block_size
            self._register(req, blks, full)
        return True

    def allocate_one(self, req, key: bool = True) -> bool:
        """:meth:`allocate` of one token (a decode step), with a fast lane when its block has room. ``key=False``
        (a fast-forward window under LRU, whose member's filled blocks are keyed where it leaves): the block-opening
        lane without keying (the caller makes sure the token opens a block)."""
        blks = self.req_blocks.get(req.req_id)
        if blks is not None and self.kv_groups is None:   # hybrid groups: the window moves every step
            tokens = req.num_computed_tokens + 1
            cap = req.kv_cap
            if cap is not None and tokens > cap:
                tokens = cap
            bs = self.block_size
            room = len(blks) * bs
            if tokens <= room:
                if key and tokens % bs == 0 and self.caching and req.cacheable:
                    self._register(req, blks, tokens // bs)
                return True
            if cap is None and tokens == room + 1:
                # one block more: allocate(req, 1)'s steps without its general bookkeeping (uncapped: allocate
                # registers the full blocks of the uncapped length)
                free = self.n_clean + len(self._evictable)
                if free < 1:
                    return False
                blks.append(self._take())
                used = self.num_blocks - free + 1     # num_used after the take
                if used > self.peak_used:
                    self.peak_used = used
                if key and self.caching and req.cacheable:
                    self._register(req, blks, tokens // bs)
                return True
        elif blks is not None:
            return self._allocate_one_groups(req, blks)
        return self.allocate(req, 1)

    def _allocate_one_groups(self, req, blks: list) -> bool:
        """:meth:`allocate` of one token of a hybrid cache's request holding blocks (no hit) without its bookkeeping;
        a ``kv_cap`` request's full groups hold its cap, its window groups every token (as ``_extra_blocks``)."""
        bs, c, cap = self.block_size, int(req.num_computed_tokens), req.kv_cap
        nb = -(-(c + 1 if cap is None or c + 1 <= cap else int(cap)) // bs)
        rid = req.req_id
        ext = self._extra.setdefault(rid, [])
        want = group_blocks(self.kv_groups, bs, nb, c, nb_sw=None if cap is None else -(-(c + 1) // bs))
        new = nb - len(blks) if nb > len(blks) else 0
        if new + (want - len(ext) if want > len(ext) else 0) > self.n_clean + len(self._evictable):
            return False
        if new:
            blks += self._take_n(new)
        self._fit_groups(ext, want)
        self._mark_peak()
        if self.caching and req.cacheable and (c + 1) // bs > self._n_keyed.get(rid, 0):
            self._register(req, blks, (c + 1) // bs)
        return True

    def _fit_groups(self, ext: list, want: int) -> None:
        """A request's other KV-cache groups' blocks ``ext`` brought to ``want``: taken, or the sliding blocks wholly
        before the window back to the pool, oldest first."""
        if want > len(ext):
            ext += self._take_n(want - len(ext))
        while len(ext) > want:
            self._release(ext.pop(0))

    def _mark_peak(self) -> None:
        self.peak_used = max(self.peak_used, self.num_used)

    def _register(self, req, blks: list, full: int) -> None:
        """Key the full blocks ``[n_keyed, full)`` of ``req`` (``blks`` its block table)."""
        rid = req.req_id
        n_keyed = self._n_keyed
        k0 = n_keyed.get(rid, 0)
        hi = full if full < len(blks) else len(blks)
        if hi <= k0:
            n_keyed[rid] = k0
            return
        keys = self.keys_upto(req, hi)
        cached, ordered, depth_of, tick = self.cached, self._ordered, req.block_depth, self.tick
        put = cached.setdefault
        for k in range(k0, hi):
            b = blks[k]
            if b.key is None:
                key = b.key = keys[k]
                if not ordered:   # a heap ranks by depth and insertion; an ordered queue's order is its rank
                    b.depth = int(depth_of(k))
                    tick += 1.0
                    b.inserted = tick
                first = put(key, b)   # b is not cached yet (no key): first is b where the key was new
                if first is not b:
                    # a duplicate (computed while the first copy existed) is cached too, as vLLM's
                    # BlockPool does; lookups return the earliest surviving copy
                    b.score = first.score   # every copy of a key has the same score (set_score)
                    self._dups.setdefault(key, {})[b.block_id] = b
        self.tick = tick
        n_keyed[rid] = hi

    def _take(self) -> Block:
        """One block for a request (``ref`` 1): a clean one (lowest spare id, else a never-used id), else the
        policy's victim."""
        if self.n_clean > 0:
            self.n_clean -= 1
            if self._spare_ids:
                bid = heapq.heappop(self._spare_ids)
            else:
                bid = self._next_id
                self._next_id += 1
            return Block(bid, None, 1)
        return self._evict()

    def _take_n(self, n: int) -> list:
        """``n`` blocks in the order ``n`` calls of :meth:`_take` hand them out (the clean ones at once)."""
        c = min(n, self.n_clean)
        if c <= 0:
            return self._evict_n(n)
        self.n_clean -= c
        spare = self._spare_ids
        if not spare:
            ids = range(self._next_id, self._next_id + c)
            self._next_id += c
        elif c >= len(spare):      # every spare id, lowest first, then never-used ids
            ids = sorted(spare)
            spare.clear()
            m = c - len(ids)
            ids += range(self._next_id, self._next_id + m)
            self._next_id += m
        else:
            pop = heapq.heappop
            ids = [pop(spare) for _ in range(c)]
        out = [Block(bid, None, 1) for bid in ids]
        if n > c:
            out += self._evict_n(n - c)
        return out

    def _evict_n(self, n: int) -> list:
        """``n`` victims in the order ``n`` calls of :meth:`_evict` hand them out; in one loop where the LRU queue's
        front gives them and no key has a duplicate (none can appear while blocks are only evicted)."""
        evictable = self._evictable
        if not self._ordered or self._dups or self.log_evictions or len(evictable) < n:
            return [self._evict() for _ in range(n)]
        pop, cached, out = evictable.popitem, self.cached, []
        key = None
        for _ in range(n):
            b = pop(last=False)[1]
            key = b.key
            del cached[key]    # b is the key's only copy
            b.key, b.ref, b.score, b.depth = None, 1, 0.0, 0
            out.append(b)
        if n:
            self.evictions += n
            self.last_evicted = key
        return out

    def _evict(self) -> Block:
        """The policy's victim, uncached and handed to a request (``ref`` 1)."""
        if self._ordered and self._evictable:   # the LRU queue's front: its order is the rank
            b = self._evictable.popitem(last=False)[1]
        else:
            b = self._pop_victim()
        self.evictions += 1
        key = b.key
        self.last_evicted = key
        if self.log_evictions:
            self.evicted_log.append(key)
        if self._dups:
            self._uncache(b)
        else:              # no duplicate anywhere: b is the key's only copy
            del self.cached[key]
        b.key, b.ref, b.score, b.depth = None, 1, 0.0, 0
        if not self._ordered:    # a heap entry's staleness (an ordered queue keeps none)
            b.version += 1
        return b

    def _uncache(self, b: Block) -> None:
        """Drop ``b``'s key from the cache; a later duplicate, if any, serves the key from now on."""
        key = b.key
        dups = self._dups.get(key)
        if self.cached.get(key) is b:
            if dups:
                self.cached[key] = dups.pop(next(iter(dups)))
            else:
                del self.cached[key]
        elif dups:
            dups.pop(b.block_id, None)
        if dups is not None and not dups:
            del self._dups[key]

    def eviction_queue(self):
        """The evictable blocks in eviction order (the LRU queue's front first; read only); None for a heap order."""
        return iter(self._evictable.values()) if self._ordered else None

    def _pop_victim(self) -> Block:
        """The heap's victim (a scored policy; :meth:`_evict` takes an ordered queue's front itself)."""
        heap = self._heap
        while heap:   # (an ordered queue keeps no heap: empty)
            _, _, version, bid = heapq.heappop(heap)
            b = self._evictable.get(bid)
            if b is not None and b.version == version:
                del self._evictable[bid]
                return b
        raise RuntimeError("block manager: no evictable block (can_allocate should have refused)")  # pragma: no cover

    def _push(self, b: Block) -> None:
        b.version += 1
        if self._ordered:
            return      # its place in _evictable is its rank
        heapq.heappush(self._heap, (self.policy.evict_key(b.score, b.depth, b.last_used, b.inserted),
                                    b.block_id, b.version, b.block_id))
        if len(self._heap) > 2 * len(self._evictable) + 64:  # drop stale entries
            self._heap = [e for e in self._heap if (x := self._evictable.get(e[3])) is not None and x.version == e[2]]
            heapq.heapify(self._heap)

    # ------------------------------------------------------------------ release
    def free(self, req) -> None:
        """Drop ``req``'s references, tail block first (vLLM's order: its tail is evicted first)."""
        rid = req.req_id
        blks = self.req_blocks.pop(rid, [])
        self._n_keyed.pop(rid, None)
        for b in reversed(self._extra.pop(rid, [])):
            self._release(b)
        caching, ordered, evictable, tick = self.caching, self._ordered, self._evictable, self.tick
        for b in reversed(blks):
            ref = b.ref - 1
            b.ref = ref
            if ref > 0:
                continue
            if b.key is not None and caching:
                evictable[b.block_id] = b   # the queue's tail: the release order is the rank (ordered policies)
                if not ordered:
                    tick += 1.0
                    b.last_used = tick
                    self._push(b)
            else:
                if b.key is not None:
                    self._uncache(b)
                    b.key = None
                self.n_clean += 1
                heapq.heappush(self._spare_ids, b.block_id)
        self.tick = tick

    def _release(self, b: Block) -> None:
        """An anonymous block of another KV-cache group back to the free pool."""
        b.ref = 0
        b.version += 1
        self.n_clean += 1
        heapq.heappush(self._spare_ids, b.block_id)

    def set_score(self, key: int, score: float) -> None:
        """RSBCM: the branch owning a block got its score; the block keeps the highest known."""
        b = self.cached.get(key)
        if b is None or not score > b.score:   # every copy of a key has the same score
            return
        dups = self._dups.get(key)
        for x in (b,) if dups is None else (b, *dups.values()):
            x.score = float(score)
            if x.ref == 0 and x.block_id in self._evictable:
                self._push(x)

    def set_scores(self, keys, score: float) -> None:
        """:meth:`set_score` of each of ``keys`` (a branch's chain), skipping the keys it would leave alone."""
        if not score > 0.0:    # scores start at 0 and only rise: nothing to raise (a plain benchmark's 0)
            return
        cached = self.cached
        for key in keys:
            b = cached.get(key)
            if b is not None and score > b.score:
                self.set_score(key, score)

    def blocks_of(self, req_id) -> list:
        """Block ids of a request, in sequence order (a real runner's block table)."""
        return [b.block_id for b in self.req_blocks.get(req_id, ())]

    def stats(self) -> dict:
        return {"num_blocks": self.num_blocks if self.num_blocks < UNLIMITED else None,
                "block_size": self.block_size, "evictions": self.evictions, "hit_blocks": self.hits,
                "queried_blocks": self.queries, "peak_used_blocks": self.peak_used,
                "prefix_hit_rate": self.hits / self.queries if self.queries else 0.0}
