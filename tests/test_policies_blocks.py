"""RSBCM, LRU, FIFO: their eviction order, in a test pool (tests/block_pool.py) (DESIGN §4 'RSBCM')."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from block_pool import BlockPool
from policies import FIFO, LRU, RSBCM, PolicyError, get_policy


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.integers(0, 3)), min_size=1, max_size=30))
def test_rsbcm_orders_by_ascending_omega_then_insertion_then_id(blocks):
    n = len(blocks)
    score = np.array([b[0] for b in blocks])
    depth = np.array([b[1] for b in blocks])
    ids = np.arange(n)[::-1].copy()          # ids in reverse of insertion
    inserted = np.arange(n) // 2             # pairs inserted together
    order = get_policy("rsbcm").victim_order(ids, score, depth, np.zeros(n), inserted)
    omega = score / (depth + 1)
    keys = [(omega[i], inserted[i], ids[i]) for i in order]
    assert keys == sorted(keys)
    assert sorted(order.tolist()) == list(range(n))
    # deterministic: the same inputs give the same order
    assert np.array_equal(order, get_policy("rsbcm").victim_order(ids, score, depth, np.zeros(n), inserted))


def test_rsbcm_hand_example_and_tie_break_on_ids():
    pol = RSBCM()
    ids = ["b", "a", "c", "d"]
    score = [0.9, 0.6, 0.6, 0.2]
    depth = [2, 1, 1, 0]        # omega = 0.3, 0.3, 0.3, 0.2
    order = pol.victim_order(ids, score, depth, [0, 0, 0, 0], [0, 0, 0, 0])
    assert [ids[i] for i in order] == ["d", "a", "b", "c"]


def test_unscored_compat_mode_ignores_scores():
    """score_source="unscored" (the RKSC code) must rank as if every score were unscored_value.

    Each case is chosen so that the given scores rank the blocks differently: a policy that ignored
    score_source (used the given scores) fails every assertion on the unscored orders."""
    ids, ins, last = [0, 1, 2], [0, 1, 2], [0, 0, 0]
    # value 0: every omega is 0, so insertion order decides (FIFO); the given scores would say [0, 2, 1]
    score, depth = [0.1, 0.9, 0.5], [0, 0, 0]
    assert RSBCM().victim_order(ids, score, depth, last, ins).tolist() == [0, 2, 1]
    assert RSBCM(score_source="unscored").victim_order(ids, score, depth, last, ins).tolist() == [0, 1, 2]
    # a positive constant: omega = 1 / (depth + 1), deepest first; the given scores would say [0, 2, 1]
    score, depth = [0.05, 0.9, 0.5], [0, 2, 1]
    assert RSBCM().victim_order(ids, score, depth, last, ins).tolist() == [0, 2, 1]
    unscored = RSBCM(score_source="unscored", unscored_value=1.0)
    assert unscored.victim_order(ids, score, depth, last, ins).tolist() == [1, 2, 0]
    np.testing.assert_allclose(unscored.omega(score, depth), [1.0, 1 / 3, 0.5])
    # the scalar rank the serving block manager uses, and a pool's victim, obey the mode too
    keys = [unscored.evict_key(s_, d, 0, i) for s_, d, i in zip(score, depth, ins)]
    assert sorted(range(3), key=keys.__getitem__) == [1, 2, 0]
    pool = BlockPool(3, RSBCM(score_source="unscored"))
    for i, s_ in zip(ids, [0.1, 0.9, 0.5]):
        pool.access(i, score=s_, depth=0, now=float(i))
    pool.access(3, score=1.0, depth=0, now=3.0)
    assert pool.evicted_log[0][0] == 0            # oldest, although block 0's score is the lowest anyway...
    pool.access(4, score=1.0, depth=0, now=4.0)
    assert pool.evicted_log[1][0] == 1            # ...block 1 (score 0.9) goes next: scores are ignored


def test_lru_and_fifo_in_a_pool():
    lru, fifo = BlockPool(2, LRU()), BlockPool(2, FIFO())
    for pool in (lru, fifo):
        assert pool.access("a", now=0) is False
        assert pool.access("b", now=1) is False
        assert pool.access("a", now=2) is True      # a becomes most recent
        assert pool.access("c", now=3) is False     # evicts b (LRU) / a (FIFO)
    assert sorted(lru.blocks()) == ["a", "c"] and sorted(fifo.blocks()) == ["b", "c"]
    assert lru.access("b", now=4) is False and lru.refetches == 1   # b was evicted: recompute
    assert fifo.access("a", now=4) is False and fifo.refetches == 1


def test_rsbcm_pool_keeps_high_score_shallow_blocks():
    pool = BlockPool(3, get_policy("rsbcm"))
    pool.access("root", score=1.0, depth=0)
    pool.access("good", score=0.9, depth=1)   # 0.45
    pool.access("bad", score=0.2, depth=1)    # 0.1
    pool.access("new", score=0.5, depth=2)    # evicts 'bad'
    assert sorted(pool.blocks()) == ["good", "new", "root"]
    pool.update("root", score=0.0)            # verification says the root path is poor
    pool.access("x", score=0.5, depth=0)
    assert "root" not in pool and pool.evictions == 2
    assert [i for i, _ in pool.evicted_log] == ["bad", "root"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 6), st.sampled_from(["rsbcm", "lru", "fifo"]),
       st.lists(st.tuples(st.integers(0, 12), st.floats(0, 1), st.integers(0, 4)), max_size=80))
def test_pool_never_exceeds_budget_and_counts_add_up(budget, name, accesses):
    pool = BlockPool(budget, get_policy(name))
    ever_evicted = set()
    refetch = 0
    for now, (bid, score, depth) in enumerate(accesses):
        before = bid in pool
        if not before and bid in ever_evicted:
            refetch += 1
            ever_evicted.discard(bid)
        n_ev = pool.evictions
        hit = pool.access(bid, score, depth, float(now))
        assert hit == before
        assert pool.size <= budget and pool.peak <= budget
        for victim, _ in pool.evicted_log[n_ev:]:
            ever_evicted.add(victim)
    assert pool.refetches == refetch
    assert pool.hits + pool.misses == len(accesses)
    if budget:
        assert pool.misses - pool.evictions == pool.size
    else:
        assert pool.size == 0 and pool.hits == 0


def test_all_equal_scores_evict_in_insertion_order():
    pool = BlockPool(2, RSBCM())
    for i, b in enumerate(["x", "y", "z", "w"]):
        pool.access(b, score=0.5, depth=1, now=0.0)
    assert [v for v, _ in pool.evicted_log] == ["x", "y"]


def test_pinned_blocks_are_never_victims():
    pool = BlockPool(2, FIFO())
    pool.access(1)
    pool.access(2)
    pool.pin(1)
    pool.access(3)
    assert 1 in pool and 2 not in pool
    pool.pin(3)
    with pytest.raises(PolicyError, match="pinned"):
        pool.access(4)
    assert pool.free(3) and pool.size == 1 and pool.evictions == 1


def test_bad_inputs():
    with pytest.raises(PolicyError, match="budget_blocks"):
        BlockPool(-1, LRU())
    with pytest.raises(PolicyError, match="policy"):
        BlockPool(2, get_policy("snapkv"))
    pool = BlockPool(2, RSBCM())
    with pytest.raises(PolicyError, match="score"):
        pool.access("a", score=float("nan"))
    with pytest.raises(PolicyError, match="score: contains NaN"):
        RSBCM().victim_order([0, 1], [np.nan, 1.0], [0, 0], [0, 0], [0, 1])
    assert RSBCM().victim_order([], [], [], [], []).tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["rsbcm", "lru", "fifo"]),
       st.lists(st.tuples(st.sampled_from([0.0, 0.3, 0.6]), st.integers(0, 2), st.integers(0, 3), st.booleans()),
                min_size=1, max_size=20))
def test_victim_order_is_the_documented_order(name, rows):
    """The order each policy states once (``evict_key``), then the lower id, equals its documented rule."""
    pol = get_policy(name)
    score = np.array([r[0] for r in rows])
    depth = np.array([r[1] for r in rows], dtype=float)
    last = np.array([r[2] for r in rows], dtype=float)
    ins = np.array([float(r[3]) for r in rows])   # ties on purpose: the id breaks them
    ids = np.arange(len(rows))[::-1].copy()
    want = {"rsbcm": np.lexsort((ids, ins, score / (depth + 1.0))), "lru": np.lexsort((ids, ins, last)),
            "fifo": np.lexsort((ids, ins))}[name]
    assert pol.victim_order(ids, score, depth, last, ins).tolist() == want.tolist()


def test_pool_memory_grows_with_blocks_held_not_budget():
    import tracemalloc
    tracemalloc.start()
    pool = BlockPool(10 ** 9, LRU())
    for i in range(200):
        pool.access(i, now=float(i))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert pool.size == 200 and peak < 2_000_000
    with pytest.raises(PolicyError, match="budget_blocks"):
        BlockPool(10 ** 15, LRU())
