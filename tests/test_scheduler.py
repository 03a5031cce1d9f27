"""The serving scheduler (sim/serving/scheduler.py): iteration composition, chunked prefill, preemption by recompute."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from policies.blocks import FIFO, LRU, RSBCM
from sim.serving.kvcache import BlockManager
from sim.serving.scheduler import Request, Scheduler, SchedulerConfig, SchedulerError


def _comp(out):
    return [(it.req.req_id, it.num_new, it.num_cached) for it in out.items]


def test_v1_iteration_composition_hand_computed():
    # budget 10 tokens, 3 seqs, no caching: running decodes first, then chunked prefill fills the budget.
    s = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=10), BlockManager(1000, 4, caching=False))
    for rid, p, o in (("A", 6, 3), ("B", 8, 2), ("C", 3, 1)):
        s.add(Request(rid, p, o))
    it = []
    while s.has_unfinished():
        out = s.schedule()
        it.append(_comp(out))
        s.update(out)
    assert it == [[("A", 6, 0), ("B", 4, 0)],                  # B's prompt chunked to the 4 tokens left
                  [("A", 1, 6), ("B", 4, 4), ("C", 3, 0)],     # A decodes, B finishes its prompt, C prefills
                  [("A", 1, 7), ("B", 1, 8)]]                  # C was done at once (1 output), A and B end
    assert s.preemptions == 0 and s.kv.num_used == 0


def test_prefill_first_batches_whole_prompts_then_decodes():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8, policy="prefill-first"), BlockManager(1000, 4))
    for i in range(4):
        s.add(Request(i, 4, 2))
    kinds = []
    while s.has_unfinished():
        out = s.schedule()
        kinds.append((out.kind, _comp(out)))
        s.update(out)
    assert kinds == [("prefill", [(0, 4, 0), (1, 4, 0)]), ("prefill", [(2, 4, 0), (3, 4, 0)]),
                     ("decode", [(0, 1, 4), (1, 1, 4), (2, 1, 4), (3, 1, 4)])]


def test_32_prompts_of_1024_with_4096_tokens_give_8_prefill_batches():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=4096, policy="prefill-first"), BlockManager(1 << 40, 16))
    for i in range(32):
        s.add(Request(i, 1024, 4))
    n_prefill = 0
    while s.has_unfinished():
        out = s.schedule()
        n_prefill += out.kind == "prefill"
        s.update(out)
    assert n_prefill == 8


def test_preemption_by_recompute_hand_built():
    # 4 blocks of 2 tokens: two requests of 3 prompt + 4 outputs cannot both grow past 4 tokens.
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100), BlockManager(4, 2, caching=False))
    s.add(Request("A", 3, 4))
    s.add(Request("B", 3, 4))
    log = []
    while s.has_unfinished():
        out = s.schedule()
        log.append((_comp(out), [r.req_id for r in out.preempted], [it.recompute for it in out.items]))
        assert s.kv.num_used <= 4
        s.update(out)
        s.kv.check()
    assert log == [([("A", 3, 0), ("B", 3, 0)], [], [0, 0]),
                   ([("A", 1, 3), ("B", 1, 3)], [], [0, 0]),
                   ([("A", 1, 4)], ["B"], [0]),          # A needs a third block: the newest (B) is preempted
                   ([("A", 1, 5)], [], [0]),             # B (5 tokens now) does not fit beside A's 3 blocks
                   ([("B", 5, 0)], [], [4]),             # B recomputes its 4 computed tokens + the sampled one
                   ([("B", 1, 5)], [], [0])]
    assert s.preemptions == 1 and s.recompute_tokens == 4


def test_hold_and_extend_reuse_the_kv():
    s = Scheduler(SchedulerConfig(), BlockManager(100, 4))
    s.add(Request("b", 5, 2, hold=True))
    outs = []
    for _ in range(4):
        out = s.schedule()
        outs.append(_comp(out))
        s.update(out)
    # prefill 5, one decode, then nothing to do while held (its last sampled token has no KV yet)
    assert outs[:2] == [[("b", 5, 0)], [("b", 1, 5)]] and outs[2:] == [[], []]
    s.extend("b", 3)                       # a verification prompt: the sampled token + 3 given tokens
    out = s.schedule()
    assert _comp(out) == [("b", 4, 6)]
    s.update(out)
    assert not s.has_unfinished() and s.kv.num_used == 0


@pytest.mark.parametrize("kw,flag", [({"max_num_seqs": 0}, "max_num_seqs"), ({"max_num_batched_tokens": -1},
                                     "max_num_batched_tokens"), ({"max_num_seqs": "x"}, "max_num_seqs"),
                                     ({"policy": "fcfs"}, "fcfs"), ({"max_num_batched_tokens": 10 ** 12},
                                                                    "max_num_batched_tokens")])
def test_bad_config_names_the_field(kw, flag):
    with pytest.raises(SchedulerError, match=flag):
        SchedulerConfig(**kw)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=8),
       st.integers(6, 30), st.integers(1, 40), st.sampled_from(["vllm-v1", "prefill-first"]),
       st.sampled_from([LRU(), FIFO(), RSBCM()]))
def test_random_workloads_conserve_blocks_and_finish(reqs, nblocks, budget, pol, block_pol):
    bs = 2
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=budget, policy=pol),
                  BlockManager(nblocks, bs, policy=block_pol))
    big = max(nblocks * bs - 2, 1)
    for i, (p, o, fam) in enumerate(reqs):
        p = min(p, big - o) if big - o >= 1 else 1
        o = min(o, big - p)
        # requests of one family share their token content, so prefixes hit across requests
        s.add(Request(i, p, o, content=lambda k, fam=fam: (fam, k)))
    for _ in range(2000):
        if not s.has_unfinished():
            break
        out = s.schedule()
        assert s.kv.num_used <= nblocks
        running = {id(r) for r in s.running}
        for it in out.items:
            assert id(it.req) in running
        # a block referenced by a running request is never in the evictable cache
        for r in s.running:
            for b in s.kv.req_blocks.get(r.req_id, ()):
                assert b.block_id not in s.kv._evictable
        assert out.num_batched_tokens <= budget or len(out.items) == 1
        s.update(out)
        s.kv.check()
    assert not s.has_unfinished()
    assert s.kv.num_used == 0
