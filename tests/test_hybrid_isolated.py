"""Isolated and tree modes on hybrid (full + sliding-window) targets: every KV-cache group's blocks are charged.

The serving block manager's group rule (``sim.serving.kvcache.group_blocks``, vLLM's hybrid KV cache manager) is
checked in tests/test_moe.py; here the isolated mode's closed form (``sim.replay.fastpath``) must hold what the
engine running that rule holds, and the budgets, refusals and tree figures must count the same blocks.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from sim.api import simulate
from sim.cost.profiles import load_model
from sim.replay.tree import compare_tree
from sim.serving.capacity import CapacityError

from trace_files import BUNDLED, HAS_BUNDLED  # noqa: E402

pytestmark = pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace not present")

# (policy, params): the verification extends each branch (the default), so the fast path's count of every
# branch's blocks to the end is what the engine holds at its peak
REUSING = [("exact-prefix", {}), ("asks", {"tau": 0.8}), ("rksc", {"tau": 0.8, "theta": 2.5, "l_min": 3})]


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma3-270m"])
@pytest.mark.parametrize("policy,params", REUSING)
def test_isolated_fast_path_holds_every_group_as_the_engine_does(name, policy, params):
    a = simulate(str(BUNDLED), policy, params, model_preset=name, hardware="h100-sxm", baselines=False)
    b = simulate(str(BUNDLED), policy, params, model_preset=name, hardware="h100-sxm", baselines=False, engine=True)
    pa, pb = (r.problems["peak_kv_bytes"].to_numpy(float) for r in (a, b))
    np.testing.assert_allclose(pb, pa, rtol=1e-12)   # the engine runs the block manager with the model's groups
    np.testing.assert_allclose(b.problems["latency_s"].to_numpy(float), a.problems["latency_s"].to_numpy(float),
                               rtol=1e-9)
    slot = load_model(name).kv_bytes_per_token
    assert (pa > 0).all() and (pa % (16 * slot) == 0).all()


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma3-270m"])
def test_isolated_peak_against_the_group_rule_by_hand(name):
    """Exact prefix: a problem's peak, at the end of its decode or in its verification, is its prefix-shared
    full-attention blocks (``ceil((own + steps) / 16)`` per branch) plus, per branch and sliding group,
    ``ceil(t / 16) - floor(max(0, c - W + 1) / 16)`` blocks (``t`` tokens in, ``c`` computed before the step;
    vLLM's ``SlidingWindowManager`` frees the blocks wholly before the window). gpt-oss-20b: one sliding group,
    W = 128; gemma3-270m: five, W = 512."""
    m = load_model(name)
    _, n_sw, window = m.kv_cache_groups
    res = simulate(str(BUNDLED), "exact-prefix", {}, model_preset=name, hardware="h100-sxm", baselines=False)
    # every iteration's KV (prefill waves, decode steps, verification) is what the engine's block manager holds:
    # under exact prefix no branch lets its blocks go before the verification
    eng = simulate(str(BUNDLED), "exact-prefix", {}, model_preset=name, hardware="h100-sxm", baselines=False,
                   engine=True)
    np.testing.assert_array_equal(res.kv_timeline["kv_bytes"].to_numpy(), eng.kv_timeline["kv_bytes"].to_numpy())
    from sim.workload import features
    from sim.workload.decisions import decide, job_for, make_config
    cfg = make_config("exact-prefix", {}, None)
    by_pos = {f.pos: f for f in features.load(str(BUNDLED)).problems}
    assert len(res.problems) > 3
    for pos, peak in zip(res.problems["pos"], res.problems["peak_kv_bytes"].to_numpy(float)):
        f = by_pos[pos]
        job = job_for(f, cfg, decide(f, cfg), m.n_layers)
        t, held = job.ctx + job.decode_steps, job.own + job.decode_steps
        end = -(-t // 16) - np.maximum(t - window, 0) // 16        # the last decode step: t - 1 computed
        gen = int((-(-held // 16)).sum()) + n_sw * int(end.sum())
        # the verification prefills v_new more tokens of every layer (t computed): the window reaches back from t
        assert job.verify_on and job.v_reuse and (job.v_layers == m.n_layers).all()
        ver_sw = -(-(t + job.v_new) // 16) - np.maximum(t - window + 1, 0) // 16
        ver = int((-(-(held + job.v_new) // 16)).sum()) + n_sw * int(np.maximum(end, ver_sw).sum())
        assert peak == max(gen, ver) * 16 * m.kv_bytes_per_token, f.pos


def test_a_budget_of_the_whole_peak_evicts_nothing_on_a_hybrid_target():
    """``budget_frac`` 1.0 is the problem's unconstrained peak in every group's blocks: nothing is evicted
    (a peak of one group's blocks would leave the sliding ones no room)."""
    for name in ("gpt-oss-20b", "gemma3-270m"):
        r = simulate(str(BUNDLED), "lru", {"budget_frac": 1.0}, model_preset=name, hardware="h100-sxm",
                     baselines=False).problems
        assert int(r["evictions"].sum()) == 0 and int(r["recompute_tokens"].sum()) == 0, name
        tight = simulate(str(BUNDLED), "lru", {"budget_frac": 0.6}, model_preset=name, hardware="h100-sxm",
                         baselines=False).problems
        assert int(tight["evictions"].sum()) > 0, name


def test_a_request_that_never_fits_names_every_group_s_blocks():
    """gemma3-270m's six groups (one full, five sliding of W = 512) each hold a short prompt's every block."""
    with pytest.raises(CapacityError) as exc:
        simulate(str(BUNDLED), "lru", {"budget_blocks": 40}, model_preset="gemma3-270m", hardware="h100-sxm",
                 baselines=False)
    m = re.search(r"needs (\d+) KV blocks .* capacity is (\d+) blocks .*: (-?\d+) blocks", str(exc.value))
    need, cap, short = map(int, m.groups())
    assert need % 6 == 0 and need > cap == 40 and short == need - cap > 0


def test_tree_mode_prices_every_layer_on_a_hybrid_target_and_says_so():
    g = compare_tree(str(BUNDLED), model_preset="gemma3-270m", hardware="h100-sxm").iloc[0]
    d = compare_tree(str(BUNDLED), model_preset="llama-3-8b", hardware="h100-sxm").iloc[0]
    m = load_model("gemma3-270m")
    every_layer = 2 * m.n_layers * m.n_kv_heads * m.head_dim * m.kv_elem_bytes
    assert g["peak_kv_bytes"] == g["peak_blocks"] * 16 * every_layer and "upper bound" in g["kv_note"]
    assert d["peak_kv_bytes"] == d["peak_blocks"] * 16 * load_model("llama-3-8b").kv_bytes_per_token
    assert d["kv_note"] == ""
