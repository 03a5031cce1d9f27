"""What the real module executes, in the simulator: static padded batches and the unconstrained peak
(verification included). No torch."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sim.api import simulate
from sim.workload.decisions import ConfigError
from sim.workload.job import pad_static, build_job


@pytest.fixture(scope="module")
def syn(syn_factory):
    return syn_factory(n_problems=4, seed=5)


def _feat(prompt_len, gen, vlen):
    B = len(gen)
    gen = np.asarray(gen, np.int64)
    return SimpleNamespace(B=B, prompt_len=np.asarray(prompt_len, np.int64), verify_len=np.full(B, vlen, np.int64),
                           eff=lambda share, what: gen)


def _plan(reused, computed, gate, source, share):
    return SimpleNamespace(reused=np.asarray(reused), computed=np.asarray(computed), gate_tokens=np.asarray(gate),
                           source=np.asarray(source), share_root=np.asarray(share))


def test_pad_static_by_hand():
    # branch 0 is the root (computes 66 prompt tokens); 1 and 2 share its KV; 3 computes its own 71
    gate, reused, computed, gen = pad_static(
        np.array([7, 11, 0, 12]), np.array([-1, 0, 0, -1]),
        np.array([0, 66, 66, 0]), np.array([66, 0, 0, 71]), np.array([16, 24, 17, 20]))
    assert gate.tolist() == [12, 12, 0, 12]          # gated rows padded to the longest span
    assert computed.tolist() == [71, 0, 0, 71]       # the first wave's computing rows at its longest
    assert reused.tolist() == [0, 66, 66, 0]
    assert gen.tolist() == [24, 24, 24, 24]          # a finished row stays in the decode batch


def test_static_job_verifies_one_padded_batch_of_each_branchs_own_sequence():
    f = _feat([66, 70, 70, 71], [16, 16, 24, 24], 9)
    plan = _plan([0, 0, 0, 0], [66, 70, 70, 71], [0, 0, 0, 0], [-1, -1, -1, -1], [False] * 4)
    kw = dict(L=30, bs=16, verify_reuses_kv=False, no_kv=True, l_min=None, score=np.zeros(4))
    cont = build_job(f, plan, None, False, **kw)
    stat = build_job(f, plan, None, False, static=True, **kw)
    assert cont.v_new.tolist() == [91, 95, 103, 104]                  # own length each
    assert stat.v_new.tolist() == [104] * 4                           # the longest row, every row
    assert stat.computed.tolist() == [71] * 4 and stat.gen.tolist() == [24] * 4
    # a branch that decoded on the root's KV verifies its own prompt (the runner recomputes it)
    plan2 = _plan([0, 66, 66, 66], [66, 0, 0, 0], [7, 11, 11, 12], [-1, 0, 0, 0], [False, True, True, True])
    s2 = build_job(f, plan2, None, False, static=True, **dict(kw, no_kv=False))
    assert s2.v_new.tolist() == [104] * 4 and s2.gate.tolist() == [12, 12, 12, 12]
    assert s2.computed.tolist() == [66, 0, 0, 0] and s2.ctx.tolist() == [66] * 4


def test_static_batching_costs_at_least_continuous_and_is_isolated_only(syn):
    for pol in ("no-kv", "asks", "rksc"):
        wl = {"verify_reuses_kv": False, "kv_budget_frac": 1.0}
        c = simulate(syn, pol, hardware="h100-sxm", model_preset="qwen2.5-7b", workload=wl, baselines=False)
        s = simulate(syn, pol, hardware="h100-sxm", model_preset="qwen2.5-7b",
                     workload={**wl, "batching": "static"}, baselines=False)
        assert (s.problems["latency_s"].to_numpy() >= c.problems["latency_s"].to_numpy() - 1e-12).all()
        assert s.summary["latency_mean_s"] > c.summary["latency_mean_s"]
    with pytest.raises(ConfigError, match="batching"):
        simulate(syn, "no-kv", workload={"batching": "padded"})
    with pytest.raises(ConfigError, match="'batching': static .* isolated mode"):
        simulate(syn, "no-kv", mode="serving", workload={"batching": "static"})


def test_peak_blocks_includes_the_verification_batch():
    f = _feat([66, 70, 70, 71], [16, 16, 24, 24], 9)
    plan = _plan([0, 0, 0, 0], [66, 70, 70, 71], [0, 0, 0, 0], [-1, -1, -1, -1], [False] * 4)
    kw = dict(L=30, bs=16, no_kv=False, l_min=None, score=np.zeros(4))
    job = build_job(f, plan, None, False, verify_reuses_kv=False, **kw)
    gen = int(np.sum(-(-(job.own + job.decode_steps) // 16)))
    ver = int(np.sum(-(-job.v_new // 16)))
    assert (gen, ver) == (24, 26) and job.peak_blocks() == 26
    skipped = build_job(f, plan, None, True, verify_reuses_kv=False, **kw)
    assert skipped.peak_blocks() == 24
    reuse = build_job(f, plan, None, False, verify_reuses_kv=True, **kw)
    assert reuse.peak_blocks() == int(np.sum(-(-(reuse.own + reuse.decode_steps + reuse.v_new) // 16)))


def test_unconstrained_budget_does_not_throttle_the_verification(syn):
    # kv_budget_frac = 1 is the problem's unconstrained peak: nothing may wait for blocks, so the
    # result equals a budget far above it (before: the verification passes ran one at a time)
    for pol in ("rksc", "lru"):
        wl = {"verify_reuses_kv": False}
        a = simulate(syn, pol, hardware="h100-sxm", model_preset="qwen2.5-7b",
                     workload={**wl, "kv_budget_frac": 1.0}, baselines=False)
        b = simulate(syn, pol, hardware="h100-sxm", model_preset="qwen2.5-7b",
                     workload={**wl, "kv_budget_blocks": 1 << 20}, baselines=False)
        assert np.allclose(a.problems["latency_s"], b.problems["latency_s"], rtol=1e-12)
        assert int(a.problems["recompute_tokens"].sum()) == 0   # only finished blocks were reused
