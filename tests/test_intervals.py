"""95% intervals on rates and ratios (sim.replay.intervals): Wilson edge cases, the paired bootstrap, the
vectorised AUC bootstrap against the per-resample one, and *_ci95 on real simulations."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.tables import fmt_ci
from sim.replay.intervals import (auc_of_groups, bootstrap_auc, bootstrap_ratio, bootstrap_stat, summary_intervals,
                           wilson, wilson_of_rate, wilson_upper)


def test_wilson_known_values():
    # 0 of 12 (the bundled trace's CGEE error) and 1 of 12, to the Wilson formula by hand
    assert wilson(0, 12) == pytest.approx((0.0, 0.24250), abs=1e-5)
    lo, hi = wilson(1, 12)
    assert lo == pytest.approx(0.014865, abs=1e-5) and hi == pytest.approx(0.353886, abs=1e-5)
    assert wilson(0, 4)[1] == pytest.approx(0.4899, abs=1e-4)
    assert all(math.isnan(x) for x in wilson(0, 0))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), data=st.data())
def test_wilson_contains_the_rate_and_stays_in_unit_interval(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson(k, n)
    p = k / n
    assert 0.0 <= lo <= p <= hi <= 1.0
    assert hi - lo > 0  # never collapses to a point, even at 0 of n and n of n
    if k == 0:
        assert lo == 0.0
    if k == n:
        assert hi == 1.0
    # symmetric: k of n mirrors n - k of n
    lo2, hi2 = wilson(n - k, n)
    assert lo == pytest.approx(1 - hi2, abs=1e-12) and hi == pytest.approx(1 - lo2, abs=1e-12)
    assert wilson_of_rate(p, n) == pytest.approx([lo, hi])
    assert wilson_upper(p, n) == pytest.approx(hi)


def test_wilson_n1_and_missing():
    assert wilson(0, 1) == pytest.approx((0.0, 0.7934), abs=1e-4)
    assert wilson(1, 1) == pytest.approx((0.2066, 1.0), abs=1e-4)
    assert wilson_of_rate(None, 12) is None and wilson_of_rate(0.5, None) is None
    assert wilson_of_rate(float("nan"), 12) is None and wilson_of_rate(0.5, 0) is None


def test_paired_bootstrap_ratio_pairs_problems():
    rng = np.random.default_rng(0)
    base = rng.uniform(1, 10, 20)
    pol = base / 2 * rng.uniform(0.95, 1.05, 20)   # about 2x on every problem, problems very unequal
    v, lo, hi = bootstrap_ratio(base, pol, seed=1)
    assert v == pytest.approx(base.sum() / pol.sum())
    assert lo <= v <= hi and hi - lo < 0.1          # paired: the problems' spread cancels
    unpaired = base.sum() / rng.permutation(pol).sum()
    assert unpaired == pytest.approx(v)              # the point does not depend on pairing ...
    _, lo_u, hi_u = bootstrap_ratio(base, rng.permutation(pol), seed=1)
    assert hi_u - lo_u > 3 * (hi - lo)               # ... the interval does
    assert bootstrap_ratio(base, pol, seed=1) == (v, lo, hi)   # seeded


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 9), b=st.integers(1, 6))
def test_vectorised_auc_bootstrap_equals_the_per_resample_one(seed, n, b):
    rng = np.random.default_rng(seed)
    groups = [(rng.integers(0, 4, b).astype(np.float64) / 3, rng.random(b) < 0.5) for _ in range(n)]
    want = bootstrap_stat(auc_of_groups, groups, seed=seed % 1000, n_boot=200)
    got = bootstrap_auc(groups, seed=seed % 1000, n_boot=200)
    for w, g in zip(want, got):
        assert (math.isnan(w) and math.isnan(g)) or w == pytest.approx(g, abs=1e-12)


def test_fmt_ci():
    assert fmt_ci(0.25, [0.1, 0.47]) == "0.25 [0.1, 0.47]"
    assert fmt_ci(0.25, None) == "0.25"
    assert fmt_ci(None, [0, 1]) == "—"


def _rows(flags):
    return [{"pos": i, "latency_s": 1.0, "skipped": f, "cgee_differs": False, "cgee_branch_differs": False,
             "correct": f, "vote_correct": f, "reused_tokens": 1, "prompt_tokens": 2, "answer_changes": 0,
             "shared_branches": 0} for i, f in enumerate(flags)]


def test_summary_intervals_count_the_rows():
    rows = _rows([True, False, False, False])
    s = {"skip_rate": 0.25, "accuracy": 0.25, "cgee_error_rate": 0.0, "kv_reuse": 0.5, "answer_change_rate": None,
         "speedup_vs_no_kv": 2.0, "asks_gate_auc": None}
    base = {"no-kv": ((0, 1, 2, 3), (2.0, 2.0, 2.0, 2.0))}
    ci = summary_intervals(s, rows, [], base, seed=0)
    assert ci["skip_rate_ci95"] == pytest.approx(list(wilson(1, 4)))
    assert ci["cgee_error_rate_ci95"] == pytest.approx(list(wilson(0, 4)))
    assert ci["kv_reuse_ci95"] == pytest.approx([0.5, 0.5])
    assert ci["answer_change_rate_ci95"] is None and ci["asks_gate_auc_ci95"] is None
    assert ci["speedup_vs_no_kv_ci95"] == pytest.approx([2.0, 2.0])
    # a baseline on other problems is not paired: no interval rather than a wrong one
    ci = summary_intervals(s, rows, [], {"no-kv": ((0, 1, 2, 5), (2.0,) * 4)}, seed=0)
    assert ci["speedup_vs_no_kv_ci95"] is None


@pytest.mark.parametrize("policy", ["cgee", "asks"])
def test_simulation_intervals_contain_their_figures(policy):
    from sim.api import simulate
    r = simulate(None, policy=policy, hardware="local-cpu")
    ci = r.intervals()
    n = r.summary["n_problems"]
    checked = 0
    for key, v in ci.items():
        fig = r.summary[key.removesuffix("_ci95")]
        if v is None:
            continue
        checked += 1
        assert v[0] - 1e-12 <= fig <= v[1] + 1e-12, (key, fig, v)
    assert checked >= 5
    assert ci["accuracy_ci95"] == pytest.approx(list(wilson(round(r.summary["accuracy"] * n), n)))
    lo, hi = ci["speedup_vs_no_kv_ci95"]
    assert lo < hi   # problems differ: a real spread
    if policy == "asks":
        assert ci["asks_gate_auc_ci95"] is not None
    else:
        assert ci["skip_rate_ci95"] is not None and ci["asks_gate_auc_ci95"] is None
    # in the JSON beside the figures, and the same on a second call (seeded)
    js = r.to_json_dict()
    assert js["speedup_vs_no_kv_ci95"] == ci["speedup_vs_no_kv_ci95"]
    assert simulate(None, policy=policy, hardware="local-cpu").intervals() == ci


def test_serving_intervals_prefix_hits_and_slo_attainment():
    from sim.api import simulate
    r = simulate(None, policy="exact-prefix", hardware="h100-sxm", mode="serving",
                 workload={"n_requests": 8, "concurrency": 4}, slo="e2e=1000")
    s, ci = r.summary, r.intervals()
    n = len(r.problems)
    assert ci["slo_attainment_ci95"] == pytest.approx(list(wilson(round(s["slo_attainment"] * n), n)))
    lo, hi = ci["prefix_hit_rate_ci95"]
    assert lo <= s["prefix_hit_rate"] <= hi and 0 < s["prefix_hit_rate"]
    p = r.problems
    assert p["prefix_hit_tokens"].sum() / p["prompt_tokens_admitted"].sum() == pytest.approx(s["prefix_hit_rate"])


def test_the_docs_quote_the_intervals_this_code_gives():
    """docs/design.md and docs/sweeps.md quote Wilson intervals of small samples: each is what wilson() gives."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    design = (root / "docs" / "design.md").read_text()
    sweeps = (root / "docs" / "sweeps.md").read_text()
    for k, n, text in ((3, 12, "3 of 12 problems reads `0.25 [{lo}, {hi}]`"),
                       (0, 12, "no CGEE error on 12 problems reads `0 [0, {hi}]`"),
                       (0, 4, "4 problems `0 [0, {hi}]`")):
        lo, hi = wilson(k, n)
        want = text.format(lo=f"{lo:.2g}", hi=f"{hi:.2g}")
        assert want in " ".join(design.split()), want
    assert f"problems has an upper bound of {wilson(0, 4)[1]:.2g}" in " ".join(sweeps.split())
