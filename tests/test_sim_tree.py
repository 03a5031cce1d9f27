"""Tree search (RSBCM) in the simulator: sim/replay/tree.py and `rksim tree`. No torch."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from sim.cost.profiles import load_model
from sim.replay.tree import BLOCK_POLICIES, TreeError, TreeSpec, tree_structure, compare_tree, simulate_tree, walk_tree

from trace_files import BUNDLED, HAS_BUNDLED  # noqa: E402
SUFFIX, STOP = [7, 8, 9], [2]


def make_tree(prompt_len, levels, scores, step_tokens=8):
    """A TreeSpec: ``levels`` = per depth, list of (parent, n_tokens) in id order; ``scores`` per node."""
    rows = [dict(node=0, parent=-1, depth=0, n_tokens=prompt_len, context_len=0,
                 token_ids=list(range(10, 10 + prompt_len)))]
    for d, level in enumerate(levels, start=1):
        for parent, n in level:
            p = rows[parent]
            rows.append(dict(node=len(rows), parent=parent, depth=d, n_tokens=n,
                             context_len=p["context_len"] + p["n_tokens"], token_ids=[100 + len(rows)] * n))
    for r in rows:
        r["score"] = float(scores[r["node"]])
        r["expanded"] = any(q["parent"] == r["node"] for q in rows)
        r["answer"], r["correct"] = "", False
    kids = [sum(1 for q in rows if q["parent"] == r["node"]) for r in rows]
    meta = {"depth": len(levels), "step_tokens": step_tokens, "branching": max(kids),
            "expand_k": max(sum(1 for r in rows if r["depth"] == d and r["expanded"]) for d in range(len(levels)))}
    return TreeSpec(nodes=pd.DataFrame(rows), meta=meta, verify_suffix_ids=SUFFIX, stop_ids=STOP, name="hand")


# root (8 tokens) -> nodes 1, 2, 3 (5 tokens); 1 and 2 expand (3 finished): 1 -> 4, 5 and 2 -> 6, 7
# (3 tokens); 5 and 7 expand -> 8, 9 and 10, 11 (2 tokens)
HAND = make_tree(8, [[(0, 5)] * 3, [(1, 3), (1, 3), (2, 3), (2, 3)], [(5, 2), (5, 2), (7, 2), (7, 2)]],
                 [0.5, 0.9, 0.6, 0.95, 0.3, 0.7, 0.4, 0.8, 0.1, 0.2, 0.3, 0.4])


def _sim(spec, policy="rsbcm", **kw):
    kw.setdefault("model_preset", "smollm2-135m")
    # the smollm2-135m preset is bf16; local-cpu is a float32 fit and refuses it (issue 12: dtype in the range)
    kw.setdefault("hardware", "h100-sxm")
    return simulate_tree(spec, policy, **kw)


def test_rsbcm_eviction_order_worked_out_by_hand():
    """Block size 4, budget 9 blocks; the order worked out by hand (docs/simulator.md, Tree section).

    Prompt (0,0) (0,1); level 1 takes (1,0) (2,0) (3,0) from the 9 clean blocks, node 3 (finished)
    is freed: (3,0) is the only evictable block. Level 2: 1's tail (1,1), 4's and 5's blocks and 2's
    tail (2,1) take the last clean blocks; 6 takes (3,0) (evicted 1st); 7 finds nothing free: the newest
    waiting node, 5 (unverified, score 0), is preempted and (5,0) evicted (2nd). After verification
    4 and 6 are pruned: (4,0) omega .3/3 = .1, (6,0) .4/3 = .133, (1,1) .7/2, (1,0) .9/2. Level 3:
    5 resumes, its chain hits up to (1,1) and (5,0) is recomputed over the lowest omega, (4,0) (3rd);
    8 takes (6,0) (4th); 9 preempts 7, whose (7,0) (.8/3) goes before (2,0) and (2,1) (.8/2) (5th).
    7 resumes ((7,0) recomputed) after preempting 9 ((9,0), score 0: 6th); 10 preempts 8 ((8,0),
    0: 7th); 11 takes the lowest omega left, the recomputed (5,0), which kept its known score .7/3
    (8th) -- not 0, and not (1,1) or (1,0), which a shared block's highest branch keeps higher.
    """
    w = walk_tree(HAND, "rsbcm", budget_blocks=9, block_size=4)
    tb = w.blocks
    assert tb.evicted_log == [(3, 0), (5, 0), (4, 0), (6, 0), (7, 0), (9, 0), (8, 0), (5, 0)]
    assert tb.preemptions == 4 and tb.refetches == 2 and tb.recompute_tokens == 2 + 2
    assert w.ops["recompute"] == [([2], [13]), ([2], [13])]     # (5,0) and (7,0), each over 13 tokens
    assert tb.floor == 7 and tb.peak == 9
    r = _sim(HAND, "rsbcm", budget_blocks=9, block_size=4)
    assert r["eviction_order"] == [list(b) for b in tb.evicted_log] and r["recompute_tokens"] == 4


def test_rsbcm_scores_known_kept_and_shared_blocks_keep_their_highest_branch():
    """Budget 8 on the hand tree. (1,0) is on the paths of 1 (.9), 4 (.3) and 5 (.7): it keeps .9, omega .45,
    and is never evicted, while (1,1) (4 and 5: .7, omega .35) and then (2,1) (.8 / 2) go last; a score
    overwritten by the last branch (.7) would rank (1,0) with (1,1) and evict it first (older). (1,1) is
    recomputed when 5 resumes and keeps its known .7, so it goes after the unverified (8,0) and (9,0)
    (score 0); a recomputed block restarted at 0 would go before them."""
    tb = walk_tree(HAND, "rsbcm", budget_blocks=8, block_size=4).blocks
    assert tb.evicted_log == [(3, 0), (5, 0), (1, 1), (4, 0), (6, 0), (7, 0), (2, 0), (8, 0), (9, 0), (5, 0),
                              (1, 1), (2, 1)]
    assert (1, 0) not in tb.evicted_log and tb.known[(1, 0)] == 0.9 and tb.known[(1, 1)] == 0.7


def test_policies_decide_differently_on_hand_tree():
    res = {p: walk_tree(HAND, p, budget_blocks=9, block_size=4).blocks for p in BLOCK_POLICIES}
    fifo = res["fifo"].evicted_log
    # FIFO drops node 2's blocks (cached first) while 7 still needs them: 7 recomputes its whole chain
    assert fifo[:6] == [(3, 0), (5, 0), (4, 0), (6, 0), (2, 0), (2, 1)]
    assert res["rsbcm"].evicted_log != fifo
    assert res["rsbcm"].recompute_tokens == 4 < res["fifo"].recompute_tokens == 2 + 4 + 1 + 2
    # at 8 blocks RSBCM and LRU part ways too
    assert walk_tree(HAND, "rsbcm", budget_blocks=8, block_size=4).blocks.evicted_log != \
        walk_tree(HAND, "lru", budget_blocks=8, block_size=4).blocks.evicted_log


def test_chain_rule_a_miss_makes_every_later_block_a_miss():
    """Block size 2, budget 11, RSBCM. Node 2 (blocks (2,0) (2,1), same score and depth) waits while node 1
    expands; 1's second child finds no block free, 2 is preempted and only the older (2,0) is evicted.
    When 2 resumes, (2,1) is still cached, but its chain breaks at (2,0): both are recomputed, each over
    the KV before it (5 and 7 tokens) -- not (2,0) alone, as a cache keyed per block would."""
    spec = make_tree(5, [[(0, 5), (0, 5)], [(1, 5), (1, 5), (2, 5), (2, 5)]], [0.5, 0.9, 0.6, 0.3, 0.7, 0.4, 0.8])
    w = walk_tree(spec, "rsbcm", budget_blocks=11, block_size=2)
    tb = w.blocks
    assert tb.evicted_log[0] == (2, 0) and tb.evicted_log.index((2, 1)) > 0
    assert tb.path_log[-1] == (2, [True, True, True, False, False])
    assert w.ops["recompute"] == [([2], [5]), ([2], [7])] and tb.recompute_tokens == 4


def test_budget_below_one_expansion_is_refused_by_name():
    with pytest.raises(TreeError, match=r"^--budget-blocks: 6 blocks cannot hold the expansion of node 5 .* 7 blocks"):
        walk_tree(HAND, "rsbcm", budget_blocks=6, block_size=4)
    # a fraction below that floor is raised to it, and says so
    r = _sim(HAND, "lru", budget_frac=0.1, block_size=4)
    assert r["budget_blocks"] == r["floor_blocks"] == 7


def _floor(spec, bs):
    """One expansion's working set, from the tree alone: the parent's path (all its tokens) and its children."""
    parent, depth, ntok, score, toks, children, levels = tree_structure(spec)

    def path_blocks(n):
        out = 0
        while n >= 0:
            out += math.ceil(ntok[n] / bs)
            n = parent[n]
        return out
    return max(path_blocks(p) + sum(math.ceil((ntok[c] - 1) / bs) for c in children[p])
               for front in levels for p in front)


def _check_walk(w, budget, spec):
    tb, bm = w.blocks, w.blocks.bm
    assert tb.peak <= budget and bm.peak_used <= budget
    bm.check()
    assert tb.floor == _floor(spec, tb.bs)
    # recompute = tokens of blocks computed before and needed again: one recompute op per block
    rec = w.ops["recompute"]
    assert tb.refetches == len(rec)
    assert tb.recompute_tokens == sum(n[0] for n, _ in rec)
    assert all(1 <= n[0] <= tb.bs for n, _ in rec)
    # chain rule: within one path, the hits are a prefix (a miss at block k makes every later block a miss)
    for node, hits in tb.path_log:
        assert hits == sorted(hits, reverse=True), (node, hits)
    if bm.evictions == 0:
        assert tb.recompute_tokens == 0 and not rec


@st.composite
def random_trees(draw):
    prompt_len = draw(st.integers(2, 40))
    depth = draw(st.integers(1, 3))
    branching = draw(st.integers(1, 3))
    expand_k = draw(st.integers(1, 2))
    levels, frontier, nid, scores = [], [0], 1, [draw(st.floats(0, 1))]
    for _ in range(depth):
        level = []
        for p in frontier:
            for _ in range(branching):
                level.append((p, draw(st.integers(1, 12))))
                scores.append(draw(st.floats(0, 1)))
        ids = list(range(nid, nid + len(level)))
        nid += len(level)
        levels.append(level)
        frontier = sorted(ids, key=lambda i: (-scores[i], i))[:expand_k]
    return make_tree(prompt_len, levels, scores, step_tokens=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_trees(), st.integers(1, 30), st.sampled_from([2, 4, 16]), st.sampled_from(BLOCK_POLICIES))
def test_pool_never_exceeds_budget_and_recompute_matches_evictions(spec, budget, bs, policy):
    if budget < _floor(spec, bs):     # referenced blocks are never evicted: one expansion must fit
        with pytest.raises(TreeError, match="^--budget-blocks: .* cannot hold the expansion"):
            walk_tree(spec, policy, budget_blocks=budget, block_size=bs)
        return
    w = walk_tree(spec, policy, budget_blocks=budget, block_size=bs)
    _check_walk(w, budget, spec)


@settings(max_examples=30, deadline=None)
@given(random_trees(), st.sampled_from([4, 16]))
def test_unlimited_budget_no_evictions_all_policies_equal(spec, bs):
    res = [_sim(spec, p, budget_blocks=None, budget_frac=None, block_size=bs) for p in BLOCK_POLICIES]
    for r in res:
        assert r["evictions"] == r["refetches"] == r["recompute_tokens"] == 0 and r["recompute_s"] == 0
        assert r["peak_blocks"] <= r["budget_blocks"]
    assert res[0]["latency_s"] == res[1]["latency_s"] == res[2]["latency_s"] > 0
    # budget = the unconstrained peak: still nothing to evict
    full = _sim(spec, "fifo", budget_frac=1.0, block_size=bs)
    assert full["evictions"] == 0 and full["latency_s"] == res[0]["latency_s"]


def test_latency_adds_recompute_of_evicted_blocks():
    free = _sim(HAND, "rsbcm", budget_frac=None, block_size=4)
    tight = _sim(HAND, "rsbcm", budget_blocks=9, block_size=4)
    for k in ("verify_s", "decode_s", "assemble_s"):
        assert tight[k] == free[k]
    assert tight["recompute_s"] > 0 and tight["latency_s"] == pytest.approx(free["latency_s"] + tight["recompute_s"])
    assert tight["prefill_s"] == free["prefill_s"]
    assert free["peak_kv_bytes"] == free["peak_blocks"] * 4 * load_model("smollm2-135m").kv_bytes_per_token
    assert tight["peak_blocks"] == 9 and tight["recompute_tokens"] == 4


def test_deterministic():
    a = _sim(HAND, "lru", budget_blocks=8, block_size=4)
    b = _sim(HAND, "lru", budget_blocks=8, block_size=4)
    assert a["evictions"] > 0 and a["recompute_tokens"] > 0
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("kw, flag", [
    (dict(policy="nope"), "--policy"),
    (dict(policy="asks"), "--policy"),
    (dict(policy="rsbcm", params={"bogus": 1}), "--set"),
    (dict(budget_blocks=0), "--budget-blocks"),
    (dict(budget_blocks=-3), "--budget-blocks"),
    (dict(budget_blocks=2.5), "--budget-blocks"),
    (dict(budget_blocks=True), "--budget-blocks"),
    (dict(budget_frac=0.0), "--budget-frac"),
    (dict(budget_frac=float("nan")), "--budget-frac"),
    (dict(budget_frac="half"), "--budget-frac"),
    (dict(block_size=0), "--block-size"),
])
def test_bad_input_clear_error(kw, flag):
    with pytest.raises(TreeError) as e:
        simulate_tree(HAND, model_preset="smollm2-135m", **kw)
    msg = str(e.value)
    assert msg.startswith(flag) and "\n" not in msg


def test_bad_tree_names_the_column():
    df = HAND.nodes.copy()
    df.loc[3, "depth"] = 5
    with pytest.raises(TreeError, match="column depth"):
        walk_tree(TreeSpec(df, HAND.meta, SUFFIX, STOP, name="hand"))
    with pytest.raises(TreeError, match="--model-preset"):
        simulate_tree(HAND)


@pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace missing")
def test_bundled_tree_policies():
    df = compare_tree(BUNDLED, budget_frac=0.5)
    assert list(df.index) == list(BLOCK_POLICIES)
    assert (df["peak_blocks"] <= df["budget_blocks"]).all() and (df["evictions"] > 0).all()
    # the same tree, same non-cache work: only recompute differs between policies
    for col in ("verify_s", "decode_s", "assemble_s"):
        assert df[col].nunique() == 1
    # a tree of depth 2 never needs a pruned block again: at the floor every policy makes the same choices
    assert (df["budget_blocks"] == df["floor_blocks"]).all()
    free = compare_tree(BUNDLED, budget_frac=None)
    assert (free["evictions"] == 0).all() and free["latency_s"].nunique() == 1
    assert math.isclose(df.loc["rsbcm", "latency_s"] - df.loc["rsbcm", "recompute_s"], free.loc["rsbcm", "latency_s"])


@pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace missing")
def test_cli_tree_end_to_end(capsys):
    assert main(["tree", "--trace", str(BUNDLED), "--budget-frac", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    assert set(out) == set(BLOCK_POLICIES)
    ref = simulate_tree(BUNDLED, "rsbcm", budget_frac=0.5)
    assert out["rsbcm"]["latency_s"] == ref["latency_s"] and out["rsbcm"]["evictions"] == ref["evictions"]
    assert main(["tree", "--trace", str(BUNDLED), "--budget-blocks", "18", "--model-preset", "qwen2.5-7b",
                 "--hardware", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "budget 18 blocks" in text and "qwen2.5-7b on h100-sxm" in text
    assert all(any(line.startswith(p) for line in text.splitlines()) for p in BLOCK_POLICIES)
    for argv, flag in ((["--budget-blocks", "0"], "--budget-blocks"), (["--budget-frac", "-1"], "--budget-frac"),
                       (["--hardware", "nope"], "--hardware"), (["--tree", "3"], "tree"),
                       (["--budget-blocks", "9"], "--budget-blocks")):
        assert main(["tree", "--trace", str(BUNDLED), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert flag in err and len(err.splitlines()) == 1


def _drive_like_the_runner(spec, policy, budget, bs):
    """Drive TreeBlocks through its hooks the way calibrate/real_tree.py does, with token ids standing in for KV.

    ``store`` plays the runner's K/V pool, keyed by the manager's physical block id (slot): a block's
    "KV" is the token ids it covers, so an assembled context must equal the sequence itself, and every
    block a live node references must still hold its own tokens (a referenced block evicted and handed
    out again would hold another block's). Returns the TreeBlocks and the contexts built.
    """
    from policies import get_policy
    from sim.replay.tree import TreeBlocks, select_frontier

    parent, depth, ntok, score, toks, children, levels = tree_structure(spec)
    store: dict = {}
    tb = TreeBlocks(get_policy(policy), budget, bs)
    seqs = {0: list(toks[0])}
    ctxs = []

    def put(bid, lo, hi, slot):
        store[slot] = list(toks[bid[0]][lo:hi])

    def in_step():
        tb.bm.check()
        for n in tb.live:
            req = tb.reqs[n]
            for (bid, lo, hi, _), blk in zip(tb._plan(n, ntok[n] - 1), tb.bm.req_blocks[n]):
                have = store[blk.block_id]
                assert len(have) == tb.fill[blk.block_id] >= hi - lo and have[:hi - lo] == toks[bid[0]][lo:hi]
            assert len(req.blocks) == len(tb.bm.req_blocks[n])

    tb.admit(0, -1, ntok[0] - 1, 0, on_block=put)
    tb.scored(0, score[0])
    in_step()
    for d, frontier in enumerate(levels, start=1):
        level = []
        for p in frontier:
            parts, phases = [], []

            def block(bid, lo, hi, pos, phase, slot):
                assert pos == sum(map(len, parts))
                if phase is None:
                    parts.append(store[slot][:hi - lo])
                else:
                    phases.append((phase, hi - lo, pos))
                    put(bid, lo, hi, slot)
                    parts.append(store[slot])

            computes, n_ctx = tb.path(p, on_block=block)
            in_step()
            assert phases == computes
            ctx = [t for q in parts for t in q]
            assert ctx == seqs[p][:-1] and n_ctx == len(ctx)
            ctxs.append(ctx)
            tb.tail(p, on_block=put)
            in_step()
            for c in children[p]:
                seqs[c] = seqs[p] + toks[c]
                level.append(c)
                tb.admit(c, p, ntok[c] - 1, d, on_block=put)
                in_step()
            tb.done(p)
            in_step()
        for c in level:
            tb.scored(c, score[c])
        nxt = select_frontier(level, {c: score[c] for c in level}, {c: c not in levels[d] for c in level},
                              len(levels[d])) if d < len(levels) else []
        for c in level:
            if c not in nxt:
                tb.finish(c)
        in_step()
    return tb, ctxs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_trees(), st.integers(1, 30), st.sampled_from([2, 4, 16]), st.sampled_from(BLOCK_POLICIES))
def test_hooks_keep_the_runners_kv_in_step(spec, budget, bs, policy):
    """The runner's hooks (calibrate/real_tree.py): the KV it holds for every live node is its own tokens, every
    context it assembles from cached and (re)computed blocks is the path's sequence, and the hook-driven walk
    is the trace walk, touch for touch."""
    if budget < _floor(spec, bs):
        return
    tb, ctxs = _drive_like_the_runner(spec, policy, budget, bs)
    assert len(ctxs) == sum(len(f) for f in tree_structure(spec)[-1])
    assert not tb.live       # everything freed at the end: only the evictable cache is left
    w = walk_tree(spec, policy, budget_blocks=budget, block_size=bs)
    assert tb.touches == w.blocks.touches and tb.recompute_tokens == w.blocks.recompute_tokens
    assert tb.evicted_log == w.blocks.evicted_log and tb.preemptions == w.blocks.preemptions


def test_huge_budget_and_block_size_bounds():
    """A budget of 10^9 blocks allocates nothing per block (issue 10 item 8); absurd sizes are refused by name."""
    import tracemalloc
    import pytest
    from sim.replay.tree import TreeError, simulate_tree
    tracemalloc.start()
    r = simulate_tree(None, "rsbcm", budget_blocks=10 ** 9, budget_frac=None)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r["evictions"] == 0 and peak < 200_000_000
    with pytest.raises(TreeError, match="--block-size"):
        simulate_tree(None, "rsbcm", block_size=10 ** 9)
    with pytest.raises(TreeError, match="--budget-blocks"):
        simulate_tree(None, "rsbcm", budget_blocks=10 ** 15)


def test_tree_refused_when_its_kv_peak_exceeds_the_capacity(tmp_path):
    import pytest
    from sim.replay.tree import TreeError, simulate_tree
    hw = tmp_path / "tiny.yaml"
    hw.write_text("peak_flops: 1.0e13\nmem_bw: 1.0e11\nmem_capacity: 1.4e9\n")   # weights fit, KV does not
    with pytest.raises(TreeError, match="short"):
        simulate_tree(None, "rsbcm", hardware=str(hw))
    r = simulate_tree(None, "rsbcm", hardware="h100-sxm")
    assert 0 < r["peak_kv_bytes"] <= r["kv_capacity_bytes"]


def test_tree_target_comes_from_the_one_resolver():
    # issue 31: tree mode resolves its target by Target.resolve, so a bad preset is the ConfigError naming its
    # field that every other mode raises, and the bare tree's missing / unknown model names --model-preset
    from sim.base.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        simulate_tree(None, "rsbcm", hardware="no-such-gpu")
    assert e.value.field == "hardware" and "no-such-gpu" in str(e.value)
    with pytest.raises(ConfigError) as e:
        simulate_tree(None, "rsbcm", model_preset="no-such-model")
    assert e.value.field == "model"
    with pytest.raises(TreeError, match="^--model-preset: .*no-such-model"):
        simulate_tree(HAND, model_preset="no-such-model")
    r = simulate_tree(HAND, model_preset="smollm2-135m", hardware="h100-sxm")
    assert (r["cost_model"], r["hardware"], r["decisions_model"]) == ("smollm2-135m", "h100-sxm", "")
