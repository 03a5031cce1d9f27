"""No-KV, exact prefix and ASKS (DESIGN §4 'Sharing')."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicyError, get_policy, layer_weights, pooled_cosine


def _fields(plan):
    return (plan.reused, plan.computed, plan.share_root, plan.gate_tokens, plan.source)


@st.composite
def workloads(draw, max_branches=6):
    """A problem as DESIGN §2 builds it: shared and variant segments per branch."""
    n = draw(st.integers(1, max_branches))
    layout = draw(st.sampled_from(["hint-suffix", "persona-prefix", "paraphrase", "random"]))
    shared = draw(st.lists(st.integers(0, 5), min_size=0, max_size=40))
    bank = draw(st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=20), min_size=1, max_size=4))
    prompts, spans = [], []
    for _ in range(n):
        v = bank[draw(st.integers(0, len(bank) - 1))]
        if layout == "hint-suffix":
            p, s = shared + v, (len(shared), len(shared) + len(v))
        elif layout == "persona-prefix":
            p, s = v + shared, (0, len(v))
        elif layout == "paraphrase":
            p, s = v + shared + v[:3], (0, len(v))
        else:
            p = draw(st.lists(st.integers(0, 2), max_size=40))
            a = draw(st.integers(0, len(p)))
            s = (a, draw(st.integers(a, len(p))))
        prompts.append(np.array(p, dtype=np.int64))
        spans.append(s)
    L = draw(st.integers(1, 5))
    cos = np.array(draw(st.lists(st.lists(st.floats(-1, 1), min_size=L, max_size=L), min_size=n, max_size=n)))
    cos[0] = 1.0
    return prompts, cos, np.array(spans, dtype=np.int64).reshape(n, 2)


def test_no_kv_computes_everything():
    plan = get_policy("no-kv").plan([[1, 2, 3], [1, 2, 3, 4]])
    assert plan.reused.tolist() == [0, 0] and plan.computed.tolist() == [3, 4]
    assert plan.source.tolist() == [-1, -1] and not plan.share_root.any()


def test_exact_prefix_rounds_down_to_blocks_and_picks_earliest_best_source():
    base = list(range(100))
    prompts = [base[:50], base[:37] + [999] * 10, base[:45] + [7, 7], [5] * 20]
    plan = get_policy("exact-prefix", block_size=16).plan(prompts)
    # LCP with earlier branches: b1 -> 37 -> 32; b2 -> 45 with b0 -> 32 (b0 wins the tie over b1); b3 -> 0
    assert plan.reused.tolist() == [0, 32, 32, 0]
    assert plan.source.tolist() == [-1, 0, 0, -1]
    assert plan.computed.tolist() == [50, 15, 15, 20]
    plan1 = get_policy("exact-prefix", block_size=1).plan(prompts)
    assert plan1.reused.tolist() == [0, 37, 45, 0]


def test_exact_prefix_whole_prompt_match_recomputes_the_last_position_as_vllm():
    # vLLM caps a prefix-cache hit at n - 1 tokens (the last position's logits must exist),
    # then rounds down to whole blocks: a 32-token prompt fully cached recomputes its last block.
    p = list(range(32))
    plan = get_policy("exact-prefix", block_size=16).plan([p, p, p + [7]])
    assert plan.reused.tolist() == [0, 16, 32] and plan.computed.tolist() == [32, 16, 1]
    assert plan.source.tolist() == [-1, 0, 0]
    one = get_policy("exact-prefix", block_size=1).plan([p, p])   # SGLang's radix cache (page 1)
    assert one.reused.tolist() == [0, 31] and one.computed.tolist() == [32, 1]
    assert (get_policy("exact-prefix").plan([[5], [5]]).computed == 1).all()   # a 1-token prompt: no hit


def test_hand_computed_three_layer_sigma():
    cos = np.array([[1.0, 1.0, 1.0], [0.2, 0.5, 0.9]])
    pol = get_policy("asks", alpha=2.0)
    w = [math.exp(2 * 1 / 3), math.exp(2 * 2 / 3), math.exp(2 * 3 / 3)]
    want = (w[0] * 0.2 + w[1] * 0.5 + w[2] * 0.9) / sum(w)
    assert pol.sigma(cos)[1] == pytest.approx(want, rel=1e-12)
    assert pol.sigma(cos)[0] == 1.0
    # the public code's weights: exp(alpha * i / (L - 1)), i = 0..L-1
    wc = [1.0, math.exp(1.0), math.exp(2.0)]
    want_c = (wc[0] * 0.2 + wc[1] * 0.5 + wc[2] * 0.9) / sum(wc)
    assert get_policy("asks", alpha=2.0, layer_weights="code").sigma(cos)[1] == pytest.approx(want_c, rel=1e-12)
    assert layer_weights(3, 0.0).tolist() == [1.0, 1.0, 1.0]


def test_identical_variant_spans_give_sigma_one_and_share_at_tau_one():
    rng = np.random.default_rng(0)
    pooled = rng.standard_normal((3, 4, 8)).astype(np.float16)
    pooled[2] = pooled[0]  # branch 2's span is the root's
    ref = rng.standard_normal((4, 8)).astype(np.float32)
    for reference in (None, ref):
        cos = pooled_cosine(pooled, reference)
        assert (cos[0] == 1.0).all() and (cos[2] == 1.0).all()
        pol = get_policy("asks", tau=1.0)
        prompts = [[1] * 20, [2] * 20, [1] * 20]
        plan = pol.plan(prompts, cos, np.array([[0, 20]] * 3))
        assert plan.sigma[2] == 1.0
        assert plan.share_root.tolist() == [False, False, True]
        assert plan.reused[2] == 20 and plan.computed[2] == 0 and plan.source[2] == 0


def test_pooled_cosine_matches_manual_raw_and_centered():
    rng = np.random.default_rng(1)
    h = rng.standard_normal((2, 3, 5))
    mu = rng.standard_normal((3, 5))
    raw = pooled_cosine(h)
    cen = pooled_cosine(h, mu)
    for l in range(3):
        a, b = h[1, l], h[0, l]
        assert raw[1, l] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        a, b = a - mu[l], b - mu[l]
        assert cen[1, l] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    with pytest.raises(PolicyError, match="reference"):
        pooled_cosine(h, mu[:2])


def test_asks_falls_back_to_exact_prefix_below_tau_and_charges_the_gate():
    prompts = [list(range(40)), list(range(33)) + [99] * 7, [5] + list(range(1, 40))]
    cos = np.array([[1, 1], [0.1, 0.2], [0.95, 0.99]])
    spans = np.array([[33, 40], [33, 40], [0, 1]])
    plan = get_policy("asks", tau=0.9).plan(prompts, cos, spans)
    assert plan.share_root.tolist() == [False, False, True]
    assert plan.reused.tolist() == [0, 32, 40]
    assert plan.computed.tolist() == [40, 8, 0]
    assert plan.gate_tokens.tolist() == [7, 7, 1]  # the root's span is pooled by the gate too
    assert math.isnan(plan.sigma[0]) and plan.sigma[1] < 0.9 <= plan.sigma[2]


@settings(max_examples=150, deadline=None)
@given(workloads(), st.floats(1.0000001, 10))
def test_tau_above_one_equals_exact_prefix_exactly(w, tau):
    prompts, cos, spans = w
    a = get_policy("asks", tau=tau, block_size=4).plan(prompts, cos, spans)
    e = get_policy("exact-prefix", block_size=4).plan(prompts)
    for x, y in zip(_fields(a), _fields(e)):
        assert np.array_equal(x, y)
    assert not a.gate_tokens.any()


@settings(max_examples=200, deadline=None)
@given(workloads(), st.floats(-1, 1), st.floats(0, 3))
def test_tau_at_most_one_never_reuses_fewer_tokens_than_exact_prefix(w, tau, alpha):
    prompts, cos, spans = w
    a = get_policy("asks", tau=tau, alpha=alpha, block_size=4).plan(prompts, cos, spans)
    e = get_policy("exact-prefix", block_size=4).plan(prompts)
    lens = np.array([len(p) for p in prompts])
    assert np.array_equal(a.reused + a.computed, np.where(a.share_root, lens[0], lens))
    for b in range(len(prompts)):
        if a.reused[b] >= e.reused[b]:
            continue
        # Only exception: exact prefix's source shared the root, so it holds no KV of its own
        # prompt; ASKS then reuses the best prefix among branches that do.
        assert a.share_root[e.source[b]], (b, a.reused, e.reused)
    if len(prompts) > 1:
        assert (a.gate_tokens == spans[:, 1] - spans[:, 0]).all()


@settings(max_examples=100, deadline=None)
@given(workloads())
def test_variation_at_the_end_never_loses_reuse(w):
    """hint-suffix style: every branch's best prefix source is the root, so ASKS >= exact always."""
    prompts, cos, spans = w
    shared = list(range(100, 140))
    prompts = [np.array(shared + [b % 3] * 5) for b in range(len(prompts))]
    spans = np.array([[40, 45]] * len(prompts))
    for tau in (-1.0, 0.0, 0.5, 1.0):
        a = get_policy("asks", tau=tau).plan(prompts, cos, spans)
        e = get_policy("exact-prefix").plan(prompts)
        assert (a.reused >= e.reused).all()


def test_zero_and_one_branch():
    for name in ("no-kv", "exact-prefix", "asks"):
        plan = get_policy(name).plan([], np.zeros((0, 3)), np.zeros((0, 2)))
        assert plan.n_branches == 0 and plan.reused.shape == (0,)
        plan = get_policy(name).plan([[1, 2, 3]], np.ones((1, 3)), np.array([[0, 3]]))
        assert plan.reused.tolist() == [0] and plan.computed.tolist() == [3]
        assert plan.gate_tokens.tolist() == [0] and plan.source.tolist() == [-1]


def test_asks_bad_inputs_raise_clear_errors():
    pol = get_policy("asks")
    prompts = [[1, 2], [1, 3]]
    with pytest.raises(PolicyError, match="'asks': cos: contains NaN"):
        pol.plan(prompts, np.array([[1.0, 1.0], [np.nan, 0.5]]), np.array([[1, 2], [1, 2]]))
    with pytest.raises(PolicyError, match="cos: is required"):
        pol.plan(prompts)
    with pytest.raises(PolicyError, match="variant_spans: is required"):
        pol.plan(prompts, np.ones((2, 2)))
    with pytest.raises(PolicyError, match="variant_spans"):
        pol.plan(prompts, np.ones((2, 2)), np.array([[0, 5], [0, 1]]))
    with pytest.raises(PolicyError, match="cos: axis 0"):
        pol.plan(prompts, np.ones((3, 2)), np.array([[1, 2], [1, 2]]))
    with pytest.raises(PolicyError, match="prompt_ids\\[1\\]"):
        pol.plan([[1, 2], [[1, 2]]], np.ones((2, 2)), np.array([[1, 2], [1, 2]]))


def test_trace_column_follows_pooling_and_similarity():
    assert get_policy("asks").trace_column == "cos_mean_raw"
    assert get_policy("asks", pooling="last", similarity="centered").trace_column == "cos_last_centered"


@settings(max_examples=150, deadline=None)
@given(workloads(), st.integers(1, 8))
def test_exact_prefix_matches_a_naive_scan(w, bs):
    prompts = w[0]

    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    plan = get_policy("exact-prefix", block_size=bs).plan(prompts)
    for b in range(len(prompts)):
        best, src = 0, -1
        for s in range(b):
            r = min(lcp(prompts[b], prompts[s]), len(prompts[b]) - 1) // bs * bs  # vLLM: hit <= n - 1
            if r > best:
                best, src = r, s
        assert (plan.reused[b], plan.source[b]) == (best, src)


def test_one_cosine_gives_exactly_one_for_identical_float32_vectors():
    # a.b / (|a||b|) in float64 gives 0.9999999999999994 for ~1 in 6 identical float32 vectors
    from policies import cosine
    a = np.random.default_rng(0).standard_normal((2000, 576)).astype(np.float32)
    assert (cosine(a, a.copy()) == 1.0).all()
    b = np.random.default_rng(1).standard_normal((2000, 576))
    c = cosine(a, b)
    want = (a * b).sum(1) / np.linalg.norm(a.astype(np.float64), axis=1) / np.linalg.norm(b, axis=1)
    assert np.allclose(c, want, rtol=0, atol=1e-12) and (np.abs(c) <= 1).all()
    assert cosine(np.zeros(4), np.ones(4)) == 0.0 and cosine(np.zeros(4), np.zeros(4)) == 1.0
    opp = cosine(-a, a)
    assert (opp >= -1.0).all() and np.allclose(opp, -1.0, rtol=0, atol=1e-12)


def test_capture_and_live_gate_use_the_one_cosine():
    CO = pytest.importorskip("traces.capture_ops")   # imports torch
    a = np.random.default_rng(0).standard_normal((2000, 8, 64)).astype(np.float32)
    assert (CO.cosine(a, a.copy()) == 1.0).all()    # capture's and calibrate/runner.py's gate cosine
    b = np.random.default_rng(2).standard_normal((2000, 8, 64)).astype(np.float32)
    from policies import cosine
    assert np.array_equal(CO.cosine(a, b[:1]), cosine(a, b[:1]))


def test_replay_gives_identical_spans_sigma_one(tmp_path):
    # The synthetic trace's last branch has the root's variant tokens, but its stored
    # cos_last_* columns are 0.95 / below 1 (as an old capture's 1 - 6e-16): replay restores 1.
    from sim.workload import features
    from sim.workload.decisions import decide, make_config
    from tests.synthetic import write_synthetic_trace
    tf = features.load(str(write_synthetic_trace(tmp_path / "t", n_problems=2, seed=3)))
    for f in tf.problems:
        last = f.B - 1
        for col in ("cos_mean_raw", "cos_mean_centered", "cos_last_raw", "cos_last_centered"):
            assert (f.cos[col][last] == 1.0).all() and (f.cos[col][0] == 1.0).all(), col
        d = decide(f, make_config("asks", {"tau": 1.0, "pooling": "last"}, None))
        assert d.sigma[last] == 1.0 and d.share[last]
        assert not d.share[1:last].any()
