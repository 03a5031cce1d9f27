"""The serving block manager (sim/serving/kvcache.py): hash chain, references, eviction order, hit cap, memory."""
from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings, strategies as st

from policies.blocks import FIFO, LRU, RSBCM
from sim.serving.kvblock import token_blocks
from sim.serving.kvcache import BlockManager, KVCacheError, chain_keys
from sim.serving.scheduler import Request


def _req(rid, tokens, out=1, **kw):
    bs = kw.pop("bs", 4)
    full = token_blocks(tokens, bs)   # the prompt's blocks as the engine keys them; past them, a generated block k
    r = Request(rid, len(tokens), out, content=lambda k: full[k] if k < len(full) else ("gen", k), **kw)
    r.__dict__["_bs"] = bs
    return r


def _run_prompt(bm, req):
    blocks, hit = bm.find_cached(req)
    assert bm.allocate(req, req.num_tokens - hit, blocks, hit)
    req.num_computed_tokens = req.num_tokens
    return hit


def test_chain_reachability_middle_eviction_makes_later_blocks_misses():
    bm = BlockManager(4, 4, policy=RSBCM())
    toks = list(range(12)) + [99]
    a = _req("a", toks)
    _run_prompt(bm, a)
    keys = chain_keys(toks, 4)
    bm.free(a)
    assert bm.num_cached_free == 3
    bm.set_score(keys[0], 0.9)
    bm.set_score(keys[2], 0.9)
    bm.set_score(keys[1], 0.1)            # the middle block has the lowest omega
    other = _req("o", [50, 51, 52, 53, 54])
    _run_prompt(bm, other)                # 2 blocks: 1 clean + 1 evicted
    assert bm.evicted_log == [keys[1]]
    assert keys[2] in bm.cached           # still resident...
    b = _req("b", toks)
    blocks, hit = bm.find_cached(b)
    assert hit == 4                       # ...but unreachable: the chain stops at the evicted block
    assert [x.key for x in blocks] == [keys[0]]


def test_referenced_blocks_are_never_evicted_and_allocation_refuses():
    bm = BlockManager(3, 4)
    a = _req("a", list(range(8)))
    _run_prompt(bm, a)                    # a holds 2 blocks, running
    b = _req("b", list(range(100, 112)))
    blocks, hit = bm.find_cached(b)
    assert not bm.allocate(b, 12, blocks)  # needs 3, only 1 free: refused, nothing changed
    assert bm.num_used == 2 and bm.evictions == 0
    bm.check()
    bm.free(a)
    assert bm.allocate(b, 12, [])         # now a's cached blocks are evicted for b
    assert bm.evictions == 2 and bm.num_used == 3
    bm.check()


def test_whole_prompt_hit_is_capped_at_n_minus_1_in_whole_blocks():
    bm = BlockManager(100, 4)
    toks = list(range(8))
    a = _req("a", toks)
    _run_prompt(bm, a)
    bm.free(a)
    b = _req("b", toks)
    blocks, hit = bm.find_cached(b)
    # all 8 tokens cached: the hit is capped at n - 1 = 7 and rounded down to whole blocks (vLLM V1),
    # so the last block is recomputed, as policies.ExactPrefix plans it
    assert hit == 4 and len(blocks) == 1
    assert bm.allocate(b, 4, blocks, hit) and bm.num_used == 2  # one shared block + one new
    c = _req("c", toks, allow_full_hit=True)
    assert bm.find_cached(c)[1] == 8      # a zero-copy fork takes them all
    d = _req("d", toks + [77])
    assert bm.find_cached(d)[1] == 8


def test_lru_follows_vllm_free_queue_order_tail_first():
    bm = BlockManager(4, 2, policy=LRU())
    a = _req("a", [1, 2, 3, 4, 5], bs=2)  # blocks (1,2), (3,4) full + a partial one
    _run_prompt(bm, a)
    ka = chain_keys([1, 2, 3, 4], 2)
    bm.free(a)                            # frees tail first: (3,4) is older in the queue than (1,2)
    x = _req("x", [9, 9, 9, 9, 9], bs=2)
    _run_prompt(bm, x)                    # 3 blocks: 2 clean (one was a's partial), 1 evicted
    assert bm.evicted_log == [ka[1]]
    # FIFO evicts the first-cached block instead
    bm = BlockManager(4, 2, policy=FIFO())
    a = _req("a", [1, 2, 3, 4, 5], bs=2)
    _run_prompt(bm, a)
    bm.free(a)
    _run_prompt(bm, _req("x", [9, 9, 9, 9, 9], bs=2))
    assert bm.evicted_log == [ka[0]]


def test_blocks_shared_by_two_requests_count_once_and_conserve():
    bm = BlockManager(10, 4)
    a = _req("a", list(range(9)))
    _run_prompt(bm, a)
    b = _req("b", list(range(8)) + [42, 43])
    hit = _run_prompt(bm, b)
    assert hit == 8 and bm.num_used == 3 + 1  # b adds one block; the two full ones are shared
    bm.check()
    bm.free(a)
    bm.check()
    assert bm.num_used == 3
    bm.free(b)
    bm.check()
    assert bm.num_used == 0


def test_memory_is_proportional_to_use_not_capacity():
    tracemalloc.start()
    bm = BlockManager(10 ** 12, 16)
    r = _req("a", list(range(64)), bs=16)
    _run_prompt(bm, r)
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000 and bm.num_free == 10 ** 12 - 4


@pytest.mark.parametrize("kw,flag", [({"num_blocks": -1}, "num_blocks"), ({"block_size": 0}, "block_size"),
                                     ({"block_size": 10 ** 9}, "block_size"), ({"num_blocks": "many"}, "num_blocks"),
                                     ({"num_blocks": 2.5}, "num_blocks")])
def test_bad_sizes_name_the_parameter(kw, flag):
    args = {"num_blocks": 10, "block_size": 16, **kw}
    with pytest.raises(KVCacheError, match=flag):
        BlockManager(**args)


class _HeapLRU(LRU):
    """LRU ranked through the heap path (the reference for the release-ordered queue)."""
    release_ordered = False


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14), st.booleans(), st.floats(0, 1)),
                min_size=1, max_size=30),
       st.integers(4, 9))
def test_release_ordered_lru_evicts_as_the_heap_does(ops, num_blocks):
    """LRU's release-ordered queue (no heap) picks the same victims, hits and final state as the heap."""
    managers = [BlockManager(num_blocks, 4, policy=LRU()), BlockManager(num_blocks, 4, policy=_HeapLRU())]
    assert managers[0]._ordered and not managers[1]._ordered
    logs = [[], []]
    for i, m in enumerate(managers):
        live = []
        for n, (prefix, length, release, score) in enumerate(ops):
            toks = [prefix * 100 + j for j in range(length)]   # four shared prefixes: hits and re-use
            r = _req(f"r{n}", toks)
            blocks, hit = m.find_cached(r)
            if m.allocate(r, r.num_tokens - hit, blocks, hit):
                r.num_computed_tokens = r.num_tokens
                live.append(r)
                logs[i].append(("hit", n, hit))
                for k in chain_keys(toks, 4)[:1]:
                    m.set_score(k, score)                     # LRU ignores the score
            if release and live:
                m.free(live.pop(len(live) // 2))              # out of admission order
            m.check()
        logs[i].append(sorted(m.cached))
    assert managers[0].evicted_log == managers[1].evicted_log
    assert logs[0] == logs[1]


class _OneByOne(BlockManager):
    """Takes an allocation's blocks one by one (the reference for :meth:`BlockManager._take_n`)."""

    def _take_n(self, n):
        return [self._take() for _ in range(n)]


@pytest.mark.parametrize("policy,groups,log", [(LRU, False, True), (FIFO, False, True), (LRU, True, True),
                                               (LRU, False, False), (FIFO, False, False)])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(0, 2)), min_size=1, max_size=30),
       num_blocks=st.integers(6, 24))
def test_taking_an_allocations_blocks_at_once_hands_out_the_same_blocks(policy, groups, log, ops, num_blocks):
    """Spare ids lowest first, then new ids, then the policy's victims in order: the same block tables, evictions
    and pool as one take per block (prompts of shared prefixes: hits, duplicates, evictions). Without an eviction
    log an ordered queue's victims are taken in one loop (``_evict_n``)."""
    managers = [BlockManager(num_blocks, 4, policy=policy(), log_evictions=log),
                _OneByOne(num_blocks, 4, policy=policy(), log_evictions=log)]
    seen = [[], []]
    for i, m in enumerate(managers):
        if groups:
            m.set_kv_groups(2, 1, 8)
        live = []
        for n, (prefix, length, release) in enumerate(ops):
            toks = [prefix * 100 + j for j in range(length)]
            r = _req(f"r{n}", toks)
            blocks, hit = m.find_cached(r)
            if m.allocate(r, r.num_tokens - hit, blocks, hit):
                r.num_computed_tokens = r.num_tokens
                live.append(r)
                seen[i].append((m.blocks_of(r.req_id), [b.block_id for b in m._extra.get(r.req_id, ())]))
            for _ in range(release):
                if live:
                    m.free(live.pop(0))
            m.check()
        seen[i].append((m.evicted_log, m.evictions, m.last_evicted, m.n_clean, sorted(m._spare_ids), m._next_id, list(m._evictable),
                        sorted(m.cached), m.peak_used))
    assert seen[0] == seen[1]


class _GeneralDecode(BlockManager):
    """Every decode step through :meth:`BlockManager.allocate` (the reference for ``allocate_one``'s lanes)."""

    def allocate_one(self, req, key=True):
        return self.allocate(req, 1)


@settings(max_examples=80, deadline=None)
@given(groups=st.sampled_from([(2, 1, 8), (1, 1, 5), (1, 2, 12), (2, 0, 0), (1, 3, 4)]),
       ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14), st.integers(0, 9), st.booleans(),
                              st.integers(0, 2), st.one_of(st.none(), st.integers(0, 6))), min_size=1, max_size=25),
       num_blocks=st.integers(6, 40))
def test_a_hybrid_caches_decode_step_allocates_as_allocate_does(groups, ops, num_blocks):
    """``allocate_one`` on a hybrid cache (full and sliding-window groups in one pool): the same answers, block
    tables, other groups' blocks, releases, keys, victims and peak as ``allocate(req, 1)``, under pool pressure (a
    step that does not fit changes nothing), with ``key=False`` too (a hybrid cache keys what fills), and for
    token-evicted requests (``kv_cap``: the full groups capped, the window groups counting every token)."""
    managers = [BlockManager(num_blocks, 4, log_evictions=True), _GeneralDecode(num_blocks, 4, log_evictions=True)]
    seen = [[], []]
    for i, m in enumerate(managers):
        m.set_kv_groups(*groups)
        live = []
        for n, (prefix, length, steps, key, release, cap) in enumerate(ops):
            toks = [prefix * 100 + j for j in range(length)]
            r = _req(f"r{n}", toks, out=steps + 1, kv_cap=None if cap is None else length + cap)
            blocks, hit = m.find_cached(r)
            if m.allocate(r, r.num_tokens - hit, blocks, hit):
                r.num_computed_tokens = r.num_tokens
                live.append(r)
            for r in live[-3:]:
                for _ in range(steps):
                    ok = m.allocate_one(r, key=key)
                    seen[i].append((r.req_id, ok, m.blocks_of(r.req_id), [b.block_id for b in m._extra[r.req_id]]))
                    if not ok:
                        break
                    r.num_computed_tokens += 1
                    r.num_tokens += 1
            for _ in range(release):
                if live:
                    m.free(live.pop(0))
            m.check()
        seen[i].append((m.evicted_log, m.n_clean, sorted(m._spare_ids), list(m._evictable), sorted(m.cached),
                        m.peak_used, {k: v for k, v in m._n_keyed.items() if v}))
    assert seen[0] == seen[1]


def test_set_scores_is_set_score_of_each_key():
    """A branch's scores at once: the same scores on every copy as one set_score per key; 0 changes nothing."""
    toks = list(range(12))
    out = []
    for bulk in (False, True):
        bm = BlockManager(16, 4, policy=RSBCM())
        a, b = _req("a", toks + [1]), _req("b", toks)    # b recomputes its last block: a duplicate
        _run_prompt(bm, a)
        _run_prompt(bm, b)
        keys = chain_keys(toks, 4)
        for s in (0.0, 0.5, 0.25, 0.75):
            if bulk:
                bm.set_scores(keys[1:], s)
            else:
                for k in keys[1:]:
                    bm.set_score(k, s)
        out.append([(x.block_id, x.score) for x in bm.req_blocks["a"] + bm.req_blocks["b"]])
    assert out[0] == out[1]
    assert [s for _, s in out[1]] == [0.0, 0.75, 0.75, 0.0, 0.0, 0.75, 0.75]
