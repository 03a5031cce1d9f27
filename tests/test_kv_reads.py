"""How attention reads KV: shared blocks (sim.serving.kvshare, sim.cost.terms "Shared KV reads") and padded decode rows."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost import terms as C
from sim.serving.engine import Engine
from sim.replay.fastpath import FastPath
from sim.serving.kvshare import block_names, shared_per_step, shared_tokens
from sim.cost.hardware import HardwareProfile
from sim.cost.profiles import load_hardware, load_model

from test_sim_core import _EQUAL_KEYS, _random_job

SMOL = load_model("smollm2-135m")


def test_only_full_blocks_read_before_count():
    # item 0 reads blocks 7, 8 (and a partial 9); item 1 re-reads 7 and 8; item 2 re-reads 7 only in full
    lists = [[7, 8, 9], [7, 8, 5], [7, 8]]
    assert shared_tokens(lists, [40, 33, 20], 16) == [0, 32, 16]
    # the partial block an item is writing is never shared, even if another item holds the same id
    assert shared_tokens([[1, 2], [1, 2]], [20, 20], 16) == [0, 16]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 7), st.integers(0, 130)), min_size=1, max_size=8),
       st.sampled_from([4, 16]))
def test_total_is_reads_minus_distinct_blocks(spec, bs):
    """sum_i h_i = bs (reads of full blocks - distinct full blocks read), whatever the order."""
    lists = [[(a + k) % 9 if k < b else 100 + i * 50 + k for k in range(12)] for i, (a, b, _) in enumerate(spec)]
    ctx = [c % (12 * bs) for _, _, c in spec]
    h = shared_tokens(lists, ctx, bs)
    full = [lst[: c // bs] for lst, c in zip(lists, ctx)]
    assert sum(h) == bs * (sum(map(len, full)) - len({x for f in full for x in f}))
    assert sum(shared_tokens(lists[::-1], ctx[::-1], bs)) == sum(h)
    assert all(0 <= x <= c for x, c in zip(h, ctx))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_closed_form_per_step_equals_the_rule(seed):
    """The fast path's per-step count (sim.serving.kvshare.shared_per_step) is the rule applied to every decode step."""
    rng = np.random.default_rng(seed)
    B, bs = int(rng.integers(1, 7)), 16
    nblk = rng.integers(0, 9, B)
    source = np.array([int(rng.integers(-1, b)) for b in range(B)])
    borrowed = np.array([int(rng.integers(0, min(nblk[b], nblk[source[b]]) + 1)) if source[b] >= 0 else 0
                         for b in range(B)])
    names = block_names(source, borrowed, nblk)
    active = rng.random((7, B)) < 0.6
    got = shared_per_step(names, nblk, active)
    for j in range(7):
        act = [b for b in range(B) if active[j, b]]
        want = sum(shared_tokens([names[b] + [("own", b, k) for k in range(5)] for b in act],
                                 [int(nblk[b]) * bs + int(rng.integers(0, 3 * bs)) for b in act], bs)) if act else 0
        # the blocks a branch fills while decoding are its own: only the named prompt blocks can be shared
        assert got[j] * bs == want


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_fast_path_equals_engine_with_shared_reads_priced(seed):
    """With eff_kv_shared set, the closed form and the engine's block manager price the same seconds, and the
    term acts on jobs whose branches share their prompt's blocks."""
    m = load_model("qwen3-4b")
    hw0 = load_hardware("l4")
    hw = dataclasses.replace(hw0, eff_kv_shared=3.0)
    rng = np.random.default_rng(seed)
    job = _random_job(rng, m.n_layers)
    a = FastPath(m, hw).run(job)
    r = Engine(m, hw, [(0, job)]).run().records()[0]
    for k in _EQUAL_KEYS:
        assert r[k] == pytest.approx(a[k], rel=1e-9, abs=1e-300), k
    names = FastPath._names(job)
    decoding = [set(names[b]) for b in range(job.B) if job.gen[b] >= 2]
    if sum(map(len, decoding)) > len(set().union(*decoding)):   # two decoding branches read one block
        assert a["decode_s"] < FastPath(m, hw0).run(job)["decode_s"]


def test_engine_prices_branches_over_one_prompt_cheaper():
    """Four branches of one 64-token prompt decode over the same blocks: with eff_kv_shared above eff_kv the
    decode costs less than over distinct prompts, and not at all less with the term off."""
    from sim.workload.job import Job

    def job(shared: bool):
        B, ctx = 4, np.full(4, 64)
        z = np.zeros(B, np.int64)
        src = np.array([-1, 0, 0, 0]) if shared else np.full(B, -1)
        reused = np.where(src >= 0, 48, 0)
        return Job(B=B, L=SMOL.n_layers, bs=16, reused=reused, computed=ctx - reused, copy=z.copy(), gate=z.copy(),
                   source=src, share=np.zeros(B, bool), ctx=ctx, gen=np.full(B, 30), own=ctx - reused,
                   verify_on=False, v_new=z.copy(), v_cached=z.copy(), v_layers=z.copy(), v_probes=z.copy(),
                   v_head=z.copy(), v_kv_tokens=z.copy())

    hw0 = load_hardware("l4")
    hw = dataclasses.replace(hw0, eff_kv_shared=8.0)
    t = {(s, h.eff_kv_shared): Engine(SMOL, h, [(0, job(s))]).run().records()[0]["decode_s"]
         for s in (True, False) for h in (hw0, hw)}
    assert t[(True, 8.0)] < t[(True, None)]
    assert t[(False, 8.0)] == t[(False, None)]


def test_scalar_and_vector_prices_agree_on_shared_reads():
    hw = dataclasses.replace(load_hardware("local-cpu"), eff_kv_shared=0.9)
    n, c, h = [1, 1, 1, 1], [300, 300, 300, 40], [0, 288, 288, 32]   # decodes: the KV reads bind
    vec = float(hw.time(C.batch_terms(SMOL, np.array(n), np.array(c), shared=np.array(h))))
    sc = C.ScalarCost(SMOL, hw).seconds([(a, b, None, 0.0, 1.0, 0.0, 1.0, x) for a, b, x in zip(n, c, h)])
    assert sc == pytest.approx(vec, rel=1e-12)
    off = float(hw.time(C.batch_terms(SMOL, np.array(n), np.array(c))))
    assert vec != pytest.approx(off, rel=1e-6)


def test_fit_recovers_the_shared_read_efficiency():
    """Synthetic host shapes (calibrate host's plan) timed under a profile with eff_kv_shared: the fit recovers
    it; the same timings fitted without the shared column miss the shared decodes."""
    from calibrate.fit import fit_profile, phase_terms, predict
    from calibrate.host import HostConfig, phases_from, plan_shapes

    true = HardwareProfile(name="t", peak_flops=7.6e10, mem_bw=1.9e11, mem_capacity=2.5e10, eff_c=0.9, eff_m=0.05,
                           eff_mv=0.08, eff_att=0.5, eff_kv=0.02, eff_kv_shared=0.06, per_kernel_s=7e-5,
                           per_layer_s=2e-5, sample_s_per_vocab=1.2e-7, roofline="operator")
    shapes = plan_shapes(HostConfig())
    assert sum(s.kind == "shared" for s in shapes) >= 8
    ph = phases_from([(s, 1.0, 1.0) for s in shapes], 16)
    terms = phase_terms(SMOL, ph)
    rng = np.random.default_rng(1)
    y = predict(true, terms) * np.exp(rng.normal(0, 0.005, terms.shape[1]))
    base = HardwareProfile(name="t", peak_flops=7.6e10, mem_bw=1.9e11, mem_capacity=2.5e10)
    res = fit_profile(base, terms, y, row_blocks=False)
    assert res.profile.eff_kv_shared == pytest.approx(true.eff_kv_shared, rel=0.05)
    assert res.profile.eff_kv == pytest.approx(true.eff_kv, rel=0.05)
    blind = fit_profile(base, phase_terms(SMOL, ph.drop(columns=["shared"])), y, row_blocks=False)
    shared_rows = (ph["phase"] == "host-shared").to_numpy()
    assert np.median(np.abs(blind.residuals[shared_rows])) > 4 * np.median(np.abs(res.residuals[shared_rows]))


# --------------------------------------------------------------------------- padded decode attention
def test_padded_decode_attention_charges_the_longest_context():
    """With decode_attention: padded, one-token rows cost as if every one attended over the longest context
    among them; prefill chunks and the paged default are unchanged. Scalar and vectorised prices agree."""
    paged = load_hardware("local-cpu")
    if paged.decode_attention != "paged":
        paged = dataclasses.replace(paged, decode_attention="paged")
    padded = dataclasses.replace(paged, decode_attention="padded")
    n, c = np.array([1, 1, 1, 64]), np.array([100, 300, 40, 20])
    t = C.batch_terms(SMOL, n, c)
    same = C.batch_terms(SMOL, np.array([1, 1, 1, 64]), np.array([300, 300, 300, 20]))
    assert float(padded.time(t)) == pytest.approx(float(paged.time(same)), rel=1e-12)
    assert float(padded.time(t)) > float(paged.time(t))
    for hw in (paged, padded):
        items = [(float(a), float(b), None, 0.0, 1.0, 0.0) for a, b in zip(n, c)]
        assert C.ScalarCost(SMOL, hw).seconds(items) == pytest.approx(float(hw.time(t)), rel=1e-12)
    # equal contexts: nothing to pad
    eq = C.batch_terms(SMOL, np.ones(4), np.full(4, 77.0))
    assert float(padded.time(eq)) == float(paged.time(eq))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_decode_steps_closed_form_matches_row_by_row_when_padded(seed):
    rng = np.random.default_rng(seed)
    J, B = int(rng.integers(1, 6)), int(rng.integers(1, 7))
    c = rng.integers(0, 500, (J, B)).astype(float)
    mask = rng.random((J, B)) < 0.7
    hw = dataclasses.replace(load_hardware("l4"), decode_attention="padded")
    got = np.asarray(hw.time(C.decode_steps_terms(SMOL, c, mask)))
    for j in range(J):
        want = float(hw.time(C.batch_terms(SMOL, np.ones(B), c[j], mask=mask[j]))) if mask[j].any() else 0.0
        assert got[j] == pytest.approx(want, rel=1e-12, abs=1e-15)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_fast_path_equals_engine_when_padded_and_shared(seed):
    m = load_model("qwen3-4b")
    hw = dataclasses.replace(load_hardware("l4"), decode_attention="padded", eff_kv_shared=3.0)
    job = _random_job(np.random.default_rng(seed), m.n_layers)
    a = FastPath(m, hw).run(job)
    r = Engine(m, hw, [(0, job)]).run().records()[0]
    for k in _EQUAL_KEYS:
        assert r[k] == pytest.approx(a[k], rel=1e-9, abs=1e-300), k
