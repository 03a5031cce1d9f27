"""CGEE: level-1 skip and level-2 layer exit (DESIGN §4 'CGEE')."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from policies import PolicyError, get_policy, yes_score

entropies = st.integers(1, 6).flatmap(lambda B: st.integers(1, 12).flatmap(
    lambda L: arrays(np.float64, (B, L), elements=st.floats(0, 3))))


def _probs(B, L, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (B, L)), rng.uniform(0, 1, (B, L))


@settings(max_examples=200, deadline=None)
@given(entropies, st.integers(1, 14), st.floats(0, 3), st.floats(0, 1))
def test_never_exits_below_l_min_and_should_exit_agrees(H, l_min, theta, eps):
    pol = get_policy("cgee", l_min=l_min, theta=theta, eps=eps, tau_conf=2.0)
    B, L = H.shape
    py, pn = _probs(B, L)
    d = pol.decide(np.full(B, 0.5), H, py, pn)
    for b in range(B):
        e = int(d.exit_layer[b])
        assert 1 <= e <= L
        assert e == L or e >= max(l_min, 2)
        assert e == pol.exit_layer(H[b])
        # layer by layer, as the real runner does
        stop = next((l for l in range(1, L + 1)
                     if pol.should_exit(l, H[b, l - 1], H[b, l - 2] if l > 1 else None)), L)
        assert stop == e
        assert d.scores[b] == pytest.approx(yes_score(py[b, e - 1], pn[b, e - 1]))


def test_exit_rule_by_hand():
    pol = get_policy("cgee", l_min=3, theta=1.0, eps=0.1)
    # layer:           1    2    3    4    5    6
    row = np.array([0.0, 0.0, 0.5, 0.45, 0.44, 0.4])
    assert pol.exit_layer(row) == 4      # layer 3: |0.5 - 0| >= eps; layer 4 passes
    assert pol.exit_layer(np.array([0.0, 0.0, 2.0, 2.0, 2.0, 2.0])) == 6  # never below theta -> L
    assert get_policy("cgee", l_min=1, theta=1, eps=1).exit_layer(np.array([0.1, 0.1])) == 2  # layer 1 never exits
    assert pol.should_exit(3, 0.5, None) is False


@settings(max_examples=100, deadline=None)
@given(entropies, st.integers(1, 12))
def test_theta_zero_nothing_exits_early_and_decision_equals_full_depth(H, l_min):
    pol = get_policy("cgee", theta=0.0, l_min=l_min, tau_conf=2.0)
    B, L = H.shape
    py, pn = _probs(B, L, seed=B * 100 + L)
    d = pol.decide(np.linspace(0.1, 0.9, B), H, py, pn)
    assert not d.skipped
    assert (d.exit_layer == L).all()
    assert d.selected == d.full_selected == int(np.argmax(yes_score(py[:, -1], pn[:, -1])))
    assert not d.differs
    assert d.layers_run == B * L


@pytest.mark.parametrize("conf,skip", [
    ([0.9, 0.1, 0.1], True),    # p(w)=0.9 >= 0.6, margin (0.9-0.1)/0.9 >= 0.5
    ([0.55, 0.1, 0.1], False),  # margin ok, confidence too low
    ([0.9, 0.8, 0.1], False),   # confident, margin (0.9-0.8)/0.9 too small
    ([0.5, 0.4, 0.1], False),   # neither
])
def test_skip_needs_both_conditions(conf, skip):
    pol = get_policy("cgee", confidence="mean_prob", tau_conf=0.6, delta_rel=0.5)
    assert pol.skip(np.array(conf)) == (skip, 0)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(1, 8), elements=st.floats(0, 1)), st.floats(0, 1), st.floats(0, 1))
def test_skip_iff_both_conditions(conf, tau_conf, delta_rel):
    pol = get_policy("cgee", confidence="mean_prob", tau_conf=tau_conf, delta_rel=delta_rel)
    skipped, w = pol.skip(conf)
    pw = conf[w]
    p2 = np.sort(conf)[-2] if conf.size > 1 else 0.0
    assert w == int(np.argmax(conf))
    assert skipped == (pw > 0 and pw >= tau_conf and (pw - p2) / pw >= delta_rel)


def test_vote_share_infers_the_runner_up_answer():
    pol = get_policy("cgee", confidence="vote", tau_conf=0.4, delta_rel=0.5)
    # answers A A B B C: two answers tie at 0.4 -> p(second) = 0.4, no skip
    assert pol.skip(np.array([0.4, 0.4, 0.4, 0.4, 0.2])) == (False, 0)
    assert pol.skip(np.array([0.4, 0.4, 0.4, 0.4, 0.2]), answers=list("AABBC")) == (False, 0)
    # answers A A A B C: p(w) = 0.6, p(second) = 0.2 -> skip
    assert pol.skip(np.array([0.6, 0.6, 0.6, 0.2, 0.2])) == (True, 0)
    assert pol.skip(np.array([0.6, 0.6, 0.6, 0.2, 0.2]), answers=list("AAABC")) == (True, 0)
    # unanimous
    assert pol.skip(np.array([1.0, 1.0, 1.0])) == (True, 0)
    with pytest.raises(PolicyError, match="answers"):
        pol.skip(np.array([0.5, 0.5]), answers=["A"])


def test_notebook_rule_adds_its_second_branch():
    conf = np.array([0.65, 0.55])  # absolute margin 0.10, relative 0.15
    paper = get_policy("cgee", confidence="mean_prob", tau_conf=0.8, delta_rel=0.3)
    nb = get_policy("cgee", confidence="mean_prob", tau_conf=0.8, delta_rel=0.3, level1_rule="notebook")
    assert paper.skip(conf) == (False, 0)
    assert nb.skip(conf) == (True, 0)
    assert nb.skip(np.array([0.65, 0.6])) == (False, 0)  # margin 0.05 < 0.08
    assert get_policy("cgee", level1_rule="notebook", nb_conf=0.7, tau_conf=0.8).skip(np.array([0.65, 0.3]))[0] is False


def test_skipped_decision_selects_the_winner_and_flags_a_difference():
    pol = get_policy("cgee", confidence="mean_prob")
    H = np.full((3, 4), 2.0)
    py = np.array([[0.1] * 4, [0.9] * 4, [0.5] * 4])
    pn = 1 - py
    d = pol.decide(np.array([0.95, 0.2, 0.1]), H, py, pn)
    assert d.skipped and d.winner == 0 and d.selected == 0
    assert (d.exit_layer == 0).all() and np.isnan(d.scores).all()
    assert d.full_selected == 1 and d.differs
    assert d.layers_run == 0


def test_early_exit_can_change_the_selection():
    pol = get_policy("cgee", tau_conf=2.0, l_min=2, theta=0.5, eps=0.1)
    H = np.array([[1.0, 0.2, 0.2, 0.2], [2.0, 2.0, 2.0, 2.0]])
    py = np.array([[0.1, 0.9, 0.9, 0.2], [0.5, 0.5, 0.5, 0.6]])
    pn = 1 - py
    d = pol.decide(np.array([0.5, 0.5]), H, py, pn)
    assert d.exit_layer.tolist() == [3, 4]
    assert d.selected == 0 and d.full_selected == 1 and d.differs


def test_nonorm_lens_uses_given_full_scores():
    pol = get_policy("cgee", lens="nonorm", tau_conf=2.0, theta=0.0)
    assert pol.trace_columns["entropy"] == "entropy_nonorm"
    H = np.ones((2, 3))
    py, pn = np.full((2, 3), 0.5), np.full((2, 3), 0.5)
    d = pol.decide(np.array([0.3, 0.3]), H, py, pn, full_scores=np.array([0.2, 0.7]))
    assert d.full_selected == 1 and d.selected == 1 and d.scores.tolist() == [0.2, 0.7]


def test_zero_and_one_branch():
    pol = get_policy("cgee")
    d = pol.decide(np.zeros(0), np.zeros((0, 5)), np.zeros((0, 5)), np.zeros((0, 5)))
    assert d.winner == -1 and d.selected == -1 and not d.skipped and not d.differs
    d = pol.decide(np.array([0.9]), np.ones((1, 5)), np.full((1, 5), 0.7), np.full((1, 5), 0.3))
    assert d.skipped and d.selected == 0 and not d.differs   # one branch: runner-up is 0
    d = get_policy("cgee", tau_conf=2.0).decide(np.array([0.9]), np.ones((1, 5)), np.full((1, 5), 0.7),
                                                np.full((1, 5), 0.3))
    assert not d.skipped and d.selected == 0 and d.exit_layer.tolist() == [5]


def test_all_equal_scores_break_ties_to_lowest_branch():
    pol = get_policy("cgee", tau_conf=2.0, theta=0.0)
    d = pol.decide(np.full(4, 0.5), np.ones((4, 3)), np.full((4, 3), 0.5), np.full((4, 3), 0.5))
    assert d.winner == 0 and d.selected == 0 and d.full_selected == 0


def test_nan_inputs_raise_clear_errors():
    pol = get_policy("cgee")
    H = np.ones((2, 3))
    with pytest.raises(PolicyError, match="'cgee': entropy: contains NaN"):
        pol.decide(np.array([0.5, 0.5]), np.array([[1, np.nan, 1], [1, 1, 1]]), H, H)
    with pytest.raises(PolicyError, match="conf: contains NaN"):
        pol.skip(np.array([np.nan, 0.5]))
    with pytest.raises(PolicyError, match="p_yes: axis 1"):
        pol.decide(np.array([0.5, 0.5]), H, np.ones((2, 4)), H)
    with pytest.raises(PolicyError, match="entropy"):
        pol.should_exit(20, float("nan"), 0.1)
