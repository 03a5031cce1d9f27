"""Isolated mode and the token policies (VASE, H2O, ...) on a tensor-parallel target: one TP group.

What a user asks of Llama-3-70B or DeepSeek-R1 on several GPUs: each problem alone (isolated mode's closed form,
``sim.replay.fastpath``) and each long decode (``sim.replay.mode_token``) priced by the replica's own cost (each
rank's shard and its all-reduces, ``sim.cost.parallel.ParallelCost``), checked against the engine and that cost's
stepped ``seconds``; the eviction's scoring runs on one rank's heads; pipeline stages and replicas are refused by
name.
"""
from __future__ import annotations

import pytest

from policies import get_policy
from sim import api
from sim.cost.parallel import ParallelConfig, ParallelCost, load_node
from sim.cost.profiles import load_hardware, load_model
from sim.cost.terms import eviction_scoring_terms
from sim.replay.mode_token import _long_latency, eviction_schedule
from sim.replay.session import Session
from sim.replay.target import Target
from sim.base.errors import ConfigError

from trace_files import BUNDLED, HAS_BUNDLED  # noqa: E402

pytestmark = pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace not present")


def _target(model: str, hardware: str, tp: int) -> Target:
    return Target.resolve(Session(str(BUNDLED)), model, hardware, None, tensor_parallel_size=tp)


@pytest.mark.parametrize("budget,P,T", [(48, 300, 900), (4096, 300, 900), (8000, 12000, 12100)])
def test_a_tp_decode_is_its_replica_cost_step_by_step(budget, P, T):
    """llama-3-8b over TP 2 of a dgx-h100: prefill + every decode step + every eviction's scoring, each priced alone
    by the replica's ParallelCost (stepped ``seconds``, not the closed form) and by one rank's scoring."""
    t = _target("llama-3-8b", "h100-sxm", 2)
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    cost = ParallelCost(m, hw, load_node("dgx-h100"), ParallelConfig(2))
    pol = get_policy("vase-dkv", budget=budget)
    sizes, events, cands = eviction_schedule(pol, P, T)
    got = _long_latency(t, P, sizes, cands, pol.buffer)
    want_dec = sum(cost.seconds([(1.0, float(c - 1), None, 0.0, 1.0, 0.0)]) for c in sizes.tolist())
    assert got["decode_s"] == pytest.approx(want_dec, rel=1e-12)
    assert got["prefill_s"] == pytest.approx(cost.seconds([(float(P), 0.0, None, 0.0, 1.0, 0.0)]), rel=1e-12)
    rank = t.rank_model
    assert rank.n_kv_heads == m.n_kv_heads // 2
    want_ev = sum(float(hw.time(eviction_scoring_terms(rank, c, pol.buffer))) for c in cands)
    assert got["evict_s"] == pytest.approx(want_ev, rel=1e-12)
    if budget == 8000:   # a long cache: one rank scores half the heads (small ones cost the launch floor alike)
        assert want_ev < sum(float(hw.time(eviction_scoring_terms(m, c, pol.buffer))) for c in cands)
    assert (len(events) > 0) == (budget < T)
    # two GPUs share each step's weights and KV reads: a step is faster than on one (all-reduces included)
    one = _long_latency(_target("llama-3-8b", "h100-sxm", 1), P, sizes, cands, pol.buffer)
    assert got["decode_s"] < one["decode_s"]


def test_window_layers_read_their_window_on_a_tp_target():
    """gpt-oss-20b over TP 2: a budget under its 128-token window leaves the window layers reading their last 128
    keys (``window_s``: seconds over pricing every layer at the evicted cache); a budget past it, none."""
    t = _target("gpt-oss-20b", "h100-sxm", 2)
    P, T = 400, 700
    small = get_policy("vase-dkv", budget=48)
    sizes, _, cands = eviction_schedule(small, P, T)
    got = _long_latency(t, P, sizes, cands, small.buffer)
    assert got["window_s"] and all(v > 0 for v in got["window_s"].values())
    big = get_policy("vase-dkv", budget=4096)
    sizes, _, cands = eviction_schedule(big, P, T)
    assert _long_latency(t, P, sizes, cands, big.buffer)["window_s"] == {}


def test_vase_on_deepseek_v3_over_eight_h200s():
    """The question the tool exists for: VASE on DeepSeek-V3 (MLA, FP8 as released) over TP 8 of a dgx-h200, in
    isolated and serving mode, with the target's KV bytes per token stated; more GPUs per step, each rank scoring
    the whole latent (MLA's KV is not split over the TP ranks)."""
    kw = dict(model_preset="deepseek-v3", hardware="h200", tensor_parallel_size=8, baselines=False)
    iso = api.simulate(None, "vase-dkv", {}, **kw)
    assert iso.summary["tensor_parallel_size"] == 8 and iso.summary["evictions"] > 0
    assert iso.info["capacity"]["kv_bytes_per_token"] == 70272
    assert 0.9 < iso.summary["speedup_vs_full"] < 1.1
    srv = api.simulate(None, "vase-dkv", {}, mode="serving", **kw)
    assert srv.summary["throughput_vs_full"] > 0 and "host time per step priced" in srv.info["note"]
    t = _target("deepseek-v3", "h200", 8)
    assert t.rank_model.kv_lora_rank == load_model("deepseek-v3").kv_lora_rank


@pytest.mark.parametrize("flag,extra", [("--pipeline-parallel-size", {"pipeline_parallel_size": 2}),
                                        ("--data-parallel-size", {"data_parallel_size": 2})])
def test_stages_and_replicas_are_refused_by_name(flag, extra):
    with pytest.raises(ConfigError, match=f"{flag}: 2 is not supported in the token policy 'vase-dkv'"):
        api.simulate(None, "vase-dkv", {}, model_preset="llama-3-8b", hardware="h100-sxm", baselines=False,
                     mode="serving", **extra)


def test_compare_on_a_tp_target_includes_the_token_policies():
    out = api.compare_policies(None, model_preset="llama-3-8b", hardware="h100-sxm", tensor_parallel_size=2,
                      policies=["exact-prefix", "vase-dkv"], mode="serving")
    assert set(out["policies"]) == {"exact-prefix", "vase-dkv"}
    out = api.compare_policies(None, model_preset="llama-3-8b", hardware="h100-sxm", pipeline_parallel_size=2,
                      policies=["exact-prefix", "vase-dkv"], mode="serving")
    assert set(out["policies"]) == {"exact-prefix"}


# (policy, params, workload): sharing, exit and a composite, with and without the verification reusing the KV
ISOLATED = [("no-kv", {}, None), ("exact-prefix", {}, None), ("asks", {"tau": 0.8}, None),
            ("cgee", {}, {"verify_reuses_kv": False}), ("rksc", {"tau": 0.8, "theta": 2.5, "l_min": 3}, None)]


@pytest.mark.parametrize("model,hardware,tp", [("llama-3-70b", "h100-sxm", 4), ("gpt-oss-20b", "h100-sxm", 2),
                                               ("deepseek-v3", "h200", 8), ("gemma3-270m", "h100-sxm", 2)])
def test_isolated_closed_form_equals_the_engine_on_a_tp_replica(model, hardware, tp):
    """Dense, sliding-window + MoE (its window key sums), MLA + MoE, and a window share without a closed form (its
    steps one by one): every problem's latency and phases as the simpy engine prices them with the same
    ParallelCost; its KV peak too under exact prefix; and TP > 1 is not the one-GPU figure."""
    kw = dict(model_preset=model, hardware=hardware, baselines=False, tensor_parallel_size=tp)
    for pol, par, wl in ISOLATED:
        fast = api.simulate(None, pol, par, workload=wl, **kw)
        eng = api.simulate(None, pol, par, workload=wl, engine=True, **kw)
        for col in ("latency_s", "prefill_s", "decode_s", "verify_s", "ttft_s", "iterations"):
            a, b = fast.problems[col].to_numpy(float), eng.problems[col].to_numpy(float)
            assert a == pytest.approx(b, rel=1e-9, abs=1e-15), (pol, col)
        if pol == "exact-prefix":
            assert (fast.problems["peak_kv_bytes"].to_numpy() == eng.problems["peak_kv_bytes"].to_numpy()).all()
        assert fast.summary["tensor_parallel_size"] == tp
    if model == "llama-3-70b":   # 70B fits on no single H100: TP 8 is faster per problem than TP 4
        tp4, tp8 = (api.simulate(None, "asks", {"tau": 0.8}, **{**kw, "tensor_parallel_size": n}) for n in (4, 8))
        assert tp8.summary["latency_mean_s"] < tp4.summary["latency_mean_s"]
