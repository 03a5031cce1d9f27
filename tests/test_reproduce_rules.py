"""The verdict rules of ``rksim reproduce`` (app.verdicts): for every rule a case that holds, one that
does not and one that is not measurable, built from small synthetic claims inputs; how conditions
combine (primary vs also, kinds never pooled); intervals; the generated legend and docs table."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import verdicts as V
from app.claims.rksc import real_speedup_conds
from app.reproduce import Context, ReproduceConfig, acted, reused_timings
from app.reproduce_report import to_markdown
from app.verdicts import Cond, combine

ROOT = Path(__file__).resolve().parent.parent
SIM = "simulated: costs qwen2.5-7b on h100-sxm (profile fitted on public per-operator measurements)"
REAL = "real: smollm2-135m on this CPU (1 thread), 2 problems, one timing each"


def verdict(conds):
    return combine(conds)[0]


# ---------------------------------------------------------------------------- intervals
def test_wilson_known_values():
    lo, hi = V.wilson(0, 12)
    assert lo == 0.0 and hi == pytest.approx(0.2425, abs=1e-4)
    lo, hi = V.wilson(6, 1616)
    assert lo < 6 / 1616 < hi and hi == pytest.approx(0.00809, abs=2e-4)
    assert all(x != x for x in V.wilson(0, 0))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.data())
def test_wilson_brackets_the_proportion(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = V.wilson(k, n)
    assert 0.0 <= lo <= k / n + 1e-12 and k / n - 1e-12 <= hi <= 1.0


def test_bootstrap_is_seeded_paired_and_brackets_the_estimate():
    rng = np.random.default_rng(7)
    base = rng.uniform(1, 3, 40)
    pol = base / rng.uniform(1.2, 1.6, 40)
    a = V.bootstrap_ratio(base, pol, seed=3)
    assert a == V.bootstrap_ratio(base, pol, seed=3)                 # same seed: bit-identical
    assert a != V.bootstrap_ratio(base, pol, seed=4)                 # the seed is used
    v, lo, hi = a
    assert v == pytest.approx(base.sum() / pol.sum()) and lo < v < hi
    # a constant ratio has no spread: resampling problems in pairs keeps it exact
    v, lo, hi = V.bootstrap_ratio(2 * pol, pol, seed=0)
    assert v == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    v, lo, hi = V.bootstrap_mean(np.r_[np.zeros(20), -np.ones(20)], seed=0)
    assert v == -0.5 and lo < -0.3 and hi > -0.7
    with pytest.raises(ValueError, match="paired"):
        V.bootstrap_ratio([1.0, 2.0], [1.0])


# ---------------------------------------------------------------------------- at_least (ratios, gains, AUC)
def test_at_least_holds_fails_ties_and_is_not_measurable():
    bar, scale = 0.8 * 3.008, 3.008 - 1
    ok = V.judge_at_least(Cond("a", 2.9, 2.6, 3.1, n=24, kind=SIM), bar, scale)
    assert ok.outcome == "pass" and verdict([ok]) == "holds"
    bad = V.judge_at_least(Cond("b", 1.158, 1.11, 1.182, n=24, kind=SIM), bar, scale)
    assert bad.outcome == "fail" and verdict([bad]) == "does not hold"
    assert "1.158" in combine([bad])[1] and "2.4064" in combine([bad])[1]      # reason from the numbers
    tie = V.judge_at_least(Cond("c", 2.41, 2.3, 2.5, n=24), bar, scale)
    assert tie.outcome == "tie" and verdict([tie]) == "does not hold" and "tie" in tie.text
    wide = V.judge_at_least(Cond("d", 1.55, 1.15, 3.2, n=24), bar, scale)
    assert wide.outcome == "untestable" and verdict([wide]) == "not measurable here"
    assert "2.05 wide" in combine([wide])[1]
    small = V.judge_at_least(Cond("e", 5.77, n=2, kind=REAL), bar, scale)
    assert small.outcome == "untestable" and "2 problems" in small.text
    never = V.judge_at_least(Cond("f", 1.0, 1.0, 1.0, n=24, untestable="CGEE never acted"), 1.01, 1.0)
    assert never.outcome == "untestable" and "never acted" in combine([never])[1]
    nan = V.judge_at_least(Cond("g", float("nan"), n=24), bar, scale)
    assert nan.outcome == "untestable"


def test_at_least_judges_raw_figures_not_rounded_ones():
    # 1.32796 rounds to 1.328 = 0.8 x 1.66 at 4 digits; raw, it is below the bar
    c = V.judge_at_least(Cond("x", 1.32796, 1.32796, 1.32796, n=24), 0.8 * 1.66, 0.66)
    assert c.outcome == "fail"


def test_acted_names_the_policy_that_never_acted():
    p = pd.DataFrame({"shared_branches": [0, 0], "skipped": [False, False], "exit_layer_sum": [224.0, 224.0],
                      "verified_branches": [8, 8]})
    assert "CGEE skipped 0 and exited early on 0 of 2" in acted("cgee", p, 28)
    assert "ASKS shared no branch" in acted("rksc", p, 28)
    p2 = p.assign(exit_layer_sum=[224.0, 200.0])                      # one early exit: CGEE acted
    assert acted("cgee", p2, 28) is None
    assert acted("rksc", p2, 28) is None                   # one of its two parts acted
    assert acted("asks", p2.assign(shared_branches=[7, 0]), 28) is None


# ---------------------------------------------------------------------------- rate_low (CGEE error)
def test_rate_low_holds_fails_and_is_not_measurable():
    p0 = 0.0037
    ok = V.judge_rate(Cond("paper-sized"), 6, 1616, p0, "below")         # the paper's own sample
    assert ok.outcome == "pass" and verdict([ok]) == "holds"
    bad = V.judge_rate(Cond("mmlu"), 1, 24, p0, "below")
    assert bad.outcome == "fail" and verdict([bad]) == "does not hold" and "1 of 24" in bad.text
    zero = V.judge_rate(Cond("gsm8k"), 0, 24, p0, "below")               # 0 errors at n = 24 prove nothing
    assert zero.outcome == "untestable" and verdict([zero]) == "not measurable here"
    assert "0.137981" in zero.text
    idle = V.judge_rate(Cond("idle", None, untestable="CGEE skipped 0 and exited early on 0 of 24 problems"),
                        0, 24, p0, "below")
    assert idle.outcome == "untestable" and "0 of 24" in combine([idle])[1]
    none = V.judge_rate(Cond("none"), 0, 0, p0, "below")
    assert none.outcome == "untestable"


# ---------------------------------------------------------------------------- rate_reach (skip rate)
def test_rate_reach_holds_fails_and_is_not_measurable():
    p0 = 0.92
    assert V.judge_rate(Cond("a"), 95, 100, p0, "above").outcome == "pass"     # contains 0.92, 0.09 wide
    assert V.judge_rate(Cond("b"), 200, 200, p0, "above").outcome == "pass"    # lies above
    bad = V.judge_rate(Cond("c"), 6, 24, p0, "above")
    assert bad.outcome == "fail" and verdict([bad]) == "does not hold"
    wide = V.judge_rate(Cond("d"), 22, 24, p0, "above")                        # contains 0.92, too wide
    assert wide.outcome == "untestable" and verdict([wide]) == "not measurable here"
    nofig = V.judge_rate(Cond("e", None, untestable="the paper gives no GSM8K skip rate"), 1, 24, 0.42, "above")
    assert verdict([nofig]) == "not measurable here" and "no GSM8K" in combine([nofig])[1]


# ---------------------------------------------------------------------------- no_loss (accuracy under sharing)
def _loss_cond(d, seed=0):
    v, lo, hi = V.bootstrap_mean(np.asarray(d, float), seed=seed)
    return Cond("t", v, lo, hi, n=len(d))


def test_no_loss_holds_fails_and_is_not_measurable():
    keep = np.r_[np.zeros(96), [1, -1, 1, -1]]
    ok = V.judge_no_loss(_loss_cond(keep), base_correct=50, n=100, changed=30)
    assert ok.outcome == "pass" and verdict([ok]) == "holds"
    lose = np.r_[np.zeros(80), -np.ones(20)]
    bad = V.judge_no_loss(_loss_cond(lose), base_correct=50, n=100, changed=30)
    assert bad.outcome == "fail" and verdict([bad]) == "does not hold"
    floor = V.judge_no_loss(_loss_cond(np.r_[np.zeros(23), -1.0]), base_correct=1, n=24, changed=20)
    assert floor.outcome == "untestable" and "solves 1 of 24" in floor.text
    same = V.judge_no_loss(_loss_cond(np.zeros(24)), base_correct=8, n=24, changed=0)
    assert same.outcome == "untestable" and "changed no answer" in same.text
    wide = V.judge_no_loss(_loss_cond(np.r_[np.zeros(20), [1, -1, -1, 1]]), base_correct=4, n=24, changed=6)
    assert wide.outcome == "untestable" and "too wide" in wide.text


# ---------------------------------------------------------------------------- better (directions)
def test_better_holds_fails_ties_and_is_not_measurable():
    ref = 0.25
    d = -np.array([0.02, 0.03, 0.025, 0.028, 0.022])
    ok = V.judge_better(Cond("kl", *V.bootstrap_mean(d), n=5), ref, lower_is_better=True)
    assert ok.outcome == "pass" and verdict([ok]) == "holds"
    bad = V.judge_better(Cond("kl", *V.bootstrap_mean(-d), n=5), ref, lower_is_better=True)
    assert bad.outcome == "fail" and verdict([bad]) == "does not hold"
    tiny = V.judge_better(Cond("kl", *V.bootstrap_mean(d / 100), n=5), ref, lower_is_better=True)
    assert tiny.outcome == "tie" and "tie margin" in tiny.text                 # 0.4055 vs 0.4059 is a tie
    mixed = V.judge_better(Cond("kl", *V.bootstrap_mean(np.array([-0.1, 0.08, -0.09, 0.07])), n=4), ref)
    assert mixed.outcome == "tie" and "contains 0" in mixed.text
    few = V.judge_better(Cond("kl", *V.bootstrap_mean(d[:3]), n=3), ref)
    assert few.outcome == "untestable" and verdict([few]) == "not measurable here"
    higher = V.judge_better(Cond("agree", *V.bootstrap_mean(-d), n=5), 0.5, lower_is_better=False)
    assert higher.outcome == "pass"


# ---------------------------------------------------------------------------- unchanged (compatibility)
def test_unchanged_holds_fails_and_is_not_measurable():
    assert verdict([V.judge_unchanged(Cond("r"), 0.7887, 0.7887, False)]) == "holds"
    assert verdict([V.judge_unchanged(Cond("e"), 0.2349, 0.1828, False)]) == "does not hold"
    assert verdict([V.judge_unchanged(Cond("s"), 0.25, 0.255, True)]) == "holds"       # 0.01 on rates
    assert verdict([V.judge_unchanged(Cond("s"), 0.25, 0.265, True)]) == "does not hold"
    assert verdict([V.judge_unchanged(Cond("l"), 1.0, 1.015, False)]) == "holds"       # 2% relative
    assert verdict([V.judge_unchanged(Cond("l"), 1.0, 1.03, False)]) == "does not hold"
    nm = V.judge_unchanged(Cond("t", None, untestable="RSBCM, LRU and FIFO make the same choices"), 31, 31, False)
    assert verdict([nm]) == "not measurable here" and "same choices" in combine([nm])[1]


# ---------------------------------------------------------------------------- premise (entropy)
def test_premise_holds_fails_and_is_not_measurable():
    assert V.judge_premise(5.52, 11, 1.18, 17, 18)[0] == "holds"
    assert V.judge_premise(5.52, 11, 1.18, 18, 18)[0] == "does not hold"          # only at the last layer
    assert V.judge_premise(3.70, 29, 2.24, None, 30)[0] == "does not hold"
    v = V.judge_premise(3.70, 30, 3.70, None, 30)
    assert v[0] == "not measurable here" and "30 of 30" in v[1]


# ---------------------------------------------------------------------------- combining conditions
def test_kinds_are_never_pooled_and_also_conditions_need_a_failed_primary():
    bar, scale = 2.4064, 2.008
    prim_fail = V.judge_at_least(Cond("paper shape", 1.16, 1.11, 1.18, n=24, kind=SIM), bar, scale)
    real_pass = V.judge_at_least(Cond("real CPU", 5.77, 5.0, 6.0, n=24, kind=REAL, primary=False), bar, scale)
    v, why, also = combine([prim_fail, real_pass])
    assert v == "does not hold" and also and REAL in also[0]          # another kind: a note, never a verdict
    other_shape = V.judge_at_least(Cond("prefix 2048, B 16", 3.47, 3.42, 3.50, n=24, kind=SIM, primary=False,
                                        same_kind=True), bar, scale)
    v, why, _ = combine([prim_fail, other_shape])
    assert v == "holds only when" and why.startswith("prefix 2048, B 16") and "1.16" in why
    prim_nm = V.judge_at_least(Cond("paper shape", 1.0, n=2, kind=SIM), bar, scale)
    assert combine([prim_nm, other_shape])[0] == "not measurable here"   # the paper's own condition must be measurable
    prim_pass = V.judge_at_least(Cond("mmlu", 3.0, 2.9, 3.1, n=24, kind=SIM), bar, scale)
    v, why, _ = combine([prim_pass, prim_fail])
    assert v == "holds only when" and why.startswith("mmlu —") and "not: paper shape" in why
    assert combine([])[0] == "not measurable here"
    # the primary's shared kind is named once, another kind per condition
    assert combine([prim_pass])[1].startswith(f"[{SIM}] ")


def test_reused_timings_are_named_and_counted_once():
    old = {"latency_s": {"no-kv": 132.3, "cgee": 117.4, "asks": 103.4},
           "verify_reuses_kv": {"latency_s": {"no-kv": 132.3, "cgee": 117.4, "asks": 23.8}}}
    assert reused_timings(old) == {"no-kv", "cgee"}                   # recognised by the copied float
    new = {**old, "verify_reuses_kv": {**old["verify_reuses_kv"], "reused_timings": ["no-kv"]}}
    assert reused_timings(new) == {"no-kv"}                           # the marker wins
    rp = Context(ReproduceConfig(traces=[]), progress=False)
    rp.measured["speedup"] = {"run": {
        "shape": {"problems": 24}, "threads": 1, "latency_s": old["latency_s"],
        "speedup_vs_no_kv": {"cgee": 132.3 / 117.4, "asks": 132.3 / 103.4},
        "verify_reuses_kv": {"latency_s": old["verify_reuses_kv"]["latency_s"],
                             "speedup_vs_no_kv": {"cgee": 132.3 / 117.4, "asks": 132.3 / 23.8, "exact-prefix": 1.59}}}}
    cg = real_speedup_conds(rp, "speedup_vs_no_kv", "cgee", "no-kv", 1.01, 1.0)
    assert len(cg) == 1 and "timings reused" in cg[0].label           # both copied: one condition, not two
    ak = real_speedup_conds(rp, "speedup_vs_no_kv", "asks", "no-kv", 1.0744, 0.343)
    assert len(ak) == 2 and "reused, not measured again" in ak[1].note and "1.59" in ak[1].note
    assert all(not c.primary for c in cg + ak)


# ---------------------------------------------------------------------------- legend and docs, generated
def test_legend_and_docs_table_come_from_the_rules():
    leg = V.legend()
    for r in V.RULES.values():
        assert r.passes in leg and r.testable in leg
    doc = (ROOT / "docs" / "reproduce.md").read_text()
    assert V.rule_table() in doc, "docs/reproduce.md: paste app.verdicts.rule_table() between the rule markers"


def test_report_renders_a_synthetic_claims_file(tmp_path):
    c = V.judge_rate(Cond("mmlu", kind=SIM), 1, 24, 0.0037, "below")
    r = V.judge_rate(Cond("real", kind=REAL, primary=False), 0, 2, 0.0037, "below")
    v = combine([c, r])
    res = {"rows": [{"id": "cgee-1", "group": "CGEE", "claim": "induced error", "paper": "0.37%", "simulated": "1 of 24",
                     "measured": "0 of 2", "source": "synthetic", "verdict": v[0], "why": v[1], "also": v[2],
                     "data": {"conditions": [c.as_dict(), r.as_dict()]}}],
           "tables": {}, "figures": {},
           "inputs": {"traces": [], "missing_traces": {}, "measured": {}, "seed": 0,
                      "rksc_target": ["qwen2.5-7b", "h100-sxm"], "vase_targets": [], "paper_shape": "x",
                      "profiles": {"h100-sxm": "datasheet"}}}
    json.dumps(res)                                                    # a claims.json is plain JSON
    md = to_markdown(res)
    assert "**does not hold**" in md and "also: real" in md and REAL in md
    assert "`h100-sxm` (datasheet profile: peak rates" in md and V.legend() in md


def test_calibrate_speedup_names_the_timings_it_reuses():
    from calibrate.speedup import reuse_section
    sec = reuse_section({"no-kv": 132.3, "cgee": 117.4, "asks": 103.4, "exact-prefix": 139.1},
                        {"asks": 23.8, "exact-prefix": 83.3})
    assert sec["reused_timings"] == ["cgee", "no-kv"]
    assert sec["latency_s"] == {"no-kv": 132.3, "cgee": 117.4, "asks": 23.8, "exact-prefix": 83.3}
    assert sec["speedup_vs_no_kv"]["asks"] == pytest.approx(132.3 / 23.8)
    assert reused_timings({"latency_s": {}, "verify_reuses_kv": sec}) == {"cgee", "no-kv"}
    # the stored run predates the marker: the same section, recognised by its copied floats
    stored = json.loads((ROOT / "docs/reproduction/measured/speedup-smollm2/speedup.json").read_text())
    again = reuse_section(stored["latency_s"], {k: v for k, v in stored["verify_reuses_kv"]["latency_s"].items()
                                               if k not in ("no-kv", "cgee")})
    assert again["latency_s"] == stored["verify_reuses_kv"]["latency_s"]
    assert reused_timings(stored) == set(again["reused_timings"])
