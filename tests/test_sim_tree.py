"""Tree search (RSBCM) in the simulator: sim/tree.py and `rksim tree`. No torch."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from sim.api import default_trace_path
from sim.profiles import load_model
from sim.tree import BLOCK_POLICIES, TreeError, TreeSpec, _structure, compare_tree, simulate_tree, walk_tree

BUNDLED = default_trace_path()
HAS_BUNDLED = (BUNDLED / "manifest.json").is_file()
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


# root (9 tokens) -> nodes 1, 2 (5 tokens); node 1 -> 3, 4 (6 tokens); node 3 -> 5, 6 (3 tokens)
HAND = make_tree(9, [[(0, 5), (0, 5)], [(1, 6), (1, 6)], [(3, 3), (3, 3)]],
                 [0.5, 0.9, 0.2, 0.8, 0.27, 0.6, 0.4])


def _sim(spec, policy="rsbcm", **kw):
    kw.setdefault("model_preset", "smollm2-135m")
    # the smollm2-135m preset is bf16; local-cpu is a float32 fit and refuses it (issue 12: dtype in the range)
    kw.setdefault("hardware", "h100-sxm")
    return simulate_tree(spec, policy, **kw)


def test_rsbcm_evicts_lowest_omega_first_hand_tree():
    """Block size 4, budget 7: the eviction order worked out by hand from omega = score / (depth + 1).

    Children's blocks enter unscored (score 0, as the runner tags them before verification), so
    they go first while their level decodes; then node 4's block (0.27 / 3 = 0.09) goes before
    node 2's (0.2 / 2 = 0.1) although its raw score is higher: depth counts.
    """
    w = walk_tree(HAND, "rsbcm", budget_blocks=7, block_size=4)
    order = [b for b, _ in w.blocks.pool.evicted_log]
    assert order == [(3, 0), (3, 1), (4, 0), (4, 1), (2, 0), (3, 0), (5, 0)]
    assert w.blocks.pool.refetches == 2 and w.blocks.recompute_tokens == 4 + 1  # (3,0) whole, (3,1) one token
    r = _sim(HAND, "rsbcm", budget_blocks=7, block_size=4)
    assert r["eviction_order"] == [list(b) for b in order] and r["recompute_tokens"] == 5


def test_policies_decide_differently_on_hand_tree():
    res = {p: walk_tree(HAND, p, budget_blocks=7, block_size=4) for p in BLOCK_POLICIES}
    fifo = [b for b, _ in res["fifo"].blocks.pool.evicted_log]
    assert fifo[0] == (0, 0)  # FIFO drops the oldest block: the prompt's first
    assert [b for b, _ in res["rsbcm"].blocks.pool.evicted_log] != fifo
    assert res["rsbcm"].blocks.recompute_tokens < res["fifo"].blocks.recompute_tokens


def _check_walk(w, budget, spec):
    pool, tb = w.blocks.pool, w.blocks
    assert pool.peak <= budget and pool.size <= budget
    # recompute = tokens of evicted blocks needed again: each refetch is one recompute op of that block
    rec = w.ops["recompute"]
    assert pool.refetches == len(rec)
    assert tb.recompute_tokens == sum(n[0] for n, _ in rec)
    assert all(1 <= n[0] <= tb.bs for n, _ in rec)
    # replay the touches in time order: a miss on a block whose last event was an eviction is a refetch,
    # and the walk recomputed exactly that block (its tokens in that path: all, or all but the last)
    victims: dict = {}
    for b, t in pool.evicted_log:
        victims.setdefault(t, []).append(b)
    gone, refetched = set(), []
    for t in tb.touches:
        if not t.hit and t.block in gone:
            refetched.append(t.block)
            gone.discard(t.block)
        gone.update(victims.get(t.now, []))
    assert len(refetched) == len(rec)
    ntok = [int(x) for x in spec.nodes["n_tokens"]]
    for (node, k), (n, _) in zip(refetched, rec):
        assert n[0] in {min((k + 1) * tb.bs, m) - k * tb.bs for m in (ntok[node], ntok[node] - 1)}
    if pool.evictions == 0:
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
    tight = _sim(HAND, "rsbcm", budget_blocks=7, block_size=4)
    for k in ("verify_s", "decode_s", "assemble_s"):
        assert tight[k] == free[k]
    assert tight["recompute_s"] > 0 and tight["latency_s"] == pytest.approx(free["latency_s"] + tight["recompute_s"])
    assert tight["prefill_s"] == free["prefill_s"]
    assert free["peak_kv_bytes"] == free["peak_blocks"] * 4 * load_model("smollm2-135m").kv_bytes_per_token
    assert tight["peak_blocks"] == 7


def test_deterministic():
    a = _sim(HAND, "lru", budget_blocks=6, block_size=4)
    b = _sim(HAND, "lru", budget_blocks=6, block_size=4)
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
    assert df.loc["rsbcm", "recompute_tokens"] < df.loc["lru", "recompute_tokens"]
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
    assert main(["tree", "--trace", str(BUNDLED), "--budget-blocks", "9", "--model-preset", "qwen2.5-7b",
                 "--hardware", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "budget 9 blocks" in text and "qwen2.5-7b on h100-sxm" in text
    assert all(any(line.startswith(p) for line in text.splitlines()) for p in BLOCK_POLICIES)
    for argv, flag in ((["--budget-blocks", "0"], "--budget-blocks"), (["--budget-frac", "-1"], "--budget-frac"),
                       (["--hardware", "nope"], "--hardware"), (["--tree", "3"], "tree")):
        assert main(["tree", "--trace", str(BUNDLED), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert flag in err and len(err.splitlines()) == 1


def _drive_like_the_runner(spec, policy, budget, bs):
    """Drive TreeBlocks through its hooks the way calibrate/tree.py does, with token ids standing in for KV.

    ``store`` plays the runner's dict of K/V tensors: a block's "KV" is the token ids it covers, so an
    assembled context must equal the sequence itself. Returns the TreeBlocks and the contexts built.
    """
    from policies import BlockPool, get_policy
    from sim.tree import TreeBlocks

    parent, depth, ntok, score, toks, children, levels = _structure(spec)
    store: dict = {}
    tb = TreeBlocks(BlockPool(budget, get_policy(policy)), bs, on_drop=lambda b: store.pop(b))
    seqs = {0: list(toks[0])}
    ctxs = []

    def put(bid, lo, hi):
        store[bid] = list(toks[bid[0]][lo:hi])

    def in_step():
        assert store.keys() == tb.held.keys()
        assert all(len(store[b]) == n for b, n in tb.held.items())

    tb.admit(0, ntok[0] - 1, score[0], 0, on_block=put)
    in_step()
    for d, frontier in enumerate(levels, start=1):
        for p in frontier:
            sp, parts, phases = [], [], []
            n = p
            while n >= 0:
                sp.insert(0, n)
                n = parent[n]

            def block(bid, lo, hi, pos, phase):
                assert pos == sum(map(len, parts))
                if phase is None:
                    parts.append(store[bid][:hi - lo])
                else:
                    phases.append((phase, hi - lo, pos))
                    put(bid, lo, hi)
                    parts.append(store[bid])

            computes, n_ctx = tb.path([(s, ntok[s] - (s == p), score[s], depth[s]) for s in sp], on_block=block)
            in_step()
            assert phases == computes
            ctx = [t for q in parts for t in q]
            assert ctx == seqs[p][:-1] and n_ctx == len(ctx)
            ctxs.append(ctx)
            tb.tail(p, ntok[p], score[p], depth[p], on_block=put)
            in_step()
            for c in children[p]:
                seqs[c] = seqs[p] + toks[c]
                tb.admit(c, ntok[c] - 1, 0.0, d, on_block=put)
                in_step()
        for c in (c for p in frontier for c in children[p]):
            tb.scored(c, ntok[c], score[c])
    return tb, ctxs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_trees(), st.integers(0, 30), st.sampled_from([2, 4, 16]), st.sampled_from(BLOCK_POLICIES))
def test_hooks_keep_the_runners_kv_in_step(spec, budget, bs, policy):
    """The runner's hooks (calibrate/tree.py): the KV it holds is exactly TreeBlocks.held, every context it
    assembles from held and (re)computed blocks is the path's sequence, and the hook-driven walk is the
    trace walk, touch for touch."""
    tb, ctxs = _drive_like_the_runner(spec, policy, budget, bs)
    assert len(ctxs) == sum(len(f) for f in _structure(spec)[-1])
    if budget == 0:
        assert not tb.held and tb.pool.peak == 0
    else:
        w = walk_tree(spec, policy, budget_blocks=budget, block_size=bs)
        assert tb.touches == w.blocks.touches and tb.recompute_tokens == w.blocks.recompute_tokens
        assert tb.pool.evicted_log == w.blocks.pool.evicted_log


def test_huge_budget_and_block_size_bounds():
    """A budget of 10^9 blocks allocates nothing per block (issue 10 item 8); absurd sizes are refused by name."""
    import tracemalloc
    import pytest
    from sim.tree import TreeError, simulate_tree
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
    from sim.tree import TreeError, simulate_tree
    hw = tmp_path / "tiny.yaml"
    hw.write_text("peak_flops: 1.0e13\nmem_bw: 1.0e11\nmem_capacity: 1.7e9\n")   # weights fit, KV does not
    with pytest.raises(TreeError, match="short"):
        simulate_tree(None, "rsbcm", hardware=str(hw))
    r = simulate_tree(None, "rsbcm", hardware="h100-sxm")
    assert 0 < r["peak_kv_bytes"] <= r["kv_capacity_bytes"]
