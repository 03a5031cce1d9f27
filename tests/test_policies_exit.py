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


def test_skip_boundaries_are_inclusive_and_the_margin_is_relative():
    pol = get_policy("cgee", confidence="mean_prob", tau_conf=0.8, delta_rel=0.5)
    assert pol.skip(np.array([0.8, 0.4])) == (True, 0)      # p(w) = tau_conf, margin = delta_rel exactly
    assert pol.skip(np.array([0.4, 0.8])) == (True, 1)      # the winner is the argmax, wherever it is
    assert pol.skip(np.array([0.8, 0.41]))[0] is False      # margin just below
    assert pol.skip(np.array([0.79, 0.1]))[0] is False      # confidence just below
    # relative, not absolute: the same absolute gap 0.2 passes at 0.4 / 0.2 but not at 0.9 / 0.7
    rel = get_policy("cgee", confidence="mean_prob", tau_conf=0.0, delta_rel=0.5)
    assert rel.skip(np.array([0.4, 0.2]))[0] and not rel.skip(np.array([0.9, 0.7]))[0]


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(1, 8), elements=st.floats(0.01, 1)), st.floats(0, 1), st.floats(0, 1),
       st.floats(0.1, 10))
def test_skip_rule_properties(conf, tau_conf, delta_rel, scale):
    pol = lambda t, d: get_policy("cgee", confidence="mean_prob", tau_conf=t, delta_rel=d)  # noqa: E731
    skipped, w = pol(tau_conf, delta_rel).skip(conf)
    assert conf[w] == conf.max() and (conf[:w] < conf[w]).all()          # first argmax
    if skipped:  # lower thresholds never withdraw a skip
        assert pol(tau_conf / 2, delta_rel / 2).skip(conf)[0] and pol(0.0, 0.0).skip(conf)[0]
    # the margin test alone is scale-free (relative to p(w)); away from the exact boundary,
    # where scaling may move the last bit
    second = np.sort(conf)[-2] if conf.size > 1 else 0.0
    if abs((conf[w] - second) / conf[w] - delta_rel) > 1e-9:
        assert pol(0.0, delta_rel).skip(conf)[0] == pol(0.0, delta_rel).skip(conf * scale)[0]
    # only the best runner-up counts: a new branch below the runner-up changes nothing ...
    low = np.append(conf, conf.min() / 2)
    if conf.size > 1:
        assert pol(tau_conf, delta_rel).skip(low) == (skipped, w)
    # ... a branch as confident as the winner (another answer, mean_prob) blocks any positive margin
    if delta_rel > 0:
        assert not pol(tau_conf, delta_rel).skip(np.append(conf, conf[w]))[0]


def test_mean_prob_with_answers_takes_the_runner_up_answer_not_the_runner_up_branch():
    pol = get_policy("cgee", confidence="mean_prob", tau_conf=0.6, delta_rel=0.5)
    conf = np.array([0.9, 0.85, 0.2])
    # without answers the runner-up is branch 1 (0.85): margin 0.06, no skip
    assert pol.skip(conf) == (False, 0)
    # branch 1 gives the winner's answer: the best *other* answer is branch 2's 0.2 -> skip
    assert pol.skip(conf, answers=["12", "12", "7"]) == (True, 0)
    # every branch agrees: no other answer (p(second) = 0) -> skip
    assert pol.skip(conf, answers=["12"] * 3) == (True, 0)
    # a different answer at 0.85 -> no skip
    assert pol.skip(conf, answers=["12", "7", "12"]) == (False, 0)
    d = pol.decide(conf, np.full((3, 4), 2.0), np.full((3, 4), 0.5), np.full((3, 4), 0.5), answers=["12", "12", "7"])
    assert d.skipped and d.selected == 0


def test_cgee_error_compares_answers_not_branches():
    # Skip selects branch 0; full verification prefers branch 2.
    pol = get_policy("cgee", confidence="mean_prob", tau_conf=0.6, delta_rel=0.5)
    H = np.full((3, 4), 2.0)
    py = np.array([[0.2] * 4, [0.1] * 4, [0.9] * 4])
    conf = np.array([0.9, 0.3, 0.2])
    same = pol.decide(conf, H, py, 1 - py, answers=["42", "5", "42"])      # same answer: no error
    assert same.skipped and same.selected == 0 and same.full_selected == 2
    assert same.branch_differs and not same.differs
    other = pol.decide(conf, H, py, 1 - py, answers=["42", "5", "41"])     # another answer: an error
    assert other.branch_differs and other.differs
    assert pol.decide(conf, H, py, 1 - py).differs                        # no answers: branches only
    # layer-exit level: an early exit that picks another branch with the same answer is no error
    ex = get_policy("cgee", tau_conf=2.0, l_min=2, theta=0.5, eps=0.1)
    H2 = np.array([[1.0, 0.2, 0.2, 0.2], [2.0, 2.0, 2.0, 2.0]])
    py2 = np.array([[0.1, 0.9, 0.9, 0.2], [0.5, 0.5, 0.5, 0.6]])
    d = ex.decide(np.array([0.5, 0.5]), H2, py2, 1 - py2, answers=["3", "3"])
    assert d.selected == 0 and d.full_selected == 1 and d.branch_differs and not d.differs


def test_theta_as_a_fraction_of_max_entropy():
    H = np.array([0.0, 0.0, 1.25, 1.195, 1.185, 1.17])
    nats = get_policy("cgee", l_min=3, theta=1.0, eps=0.05)
    frac = get_policy("cgee", l_min=3, theta=0.1, eps=0.05, theta_unit="ln_v", vocab_size=151936)
    assert frac.theta_nats == pytest.approx(0.1 * np.log(151936))               # 1.19 nats (Qwen2.5)
    assert nats.exit_layer(H) == 6 and frac.exit_layer(H) == 5                 # 1.185 < 1.193 at layer 5
    small = get_policy("cgee", l_min=3, theta=0.1, eps=0.05, theta_unit="ln_v", vocab_size=49152)
    assert small.theta_nats == pytest.approx(1.0803, abs=1e-4) and small.exit_layer(H) == 6
    assert frac.should_exit(5, 1.185, 1.195) and not small.should_exit(5, 1.185, 1.195)
    with pytest.raises(PolicyError, match="vocab_size"):
        get_policy("cgee", theta=0.1, theta_unit="ln_v").exit_layer(H)
    with pytest.raises(PolicyError, match="theta"):
        get_policy("cgee", theta=2.0, theta_unit="ln_v", vocab_size=100)


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
