"""Replayed figures in the right units and words (DESIGN §4 'CGEE', §5): exit layers in the cost
target's depth, theta as a fraction of ln V, the CGEE error on answers, and the trace model's own
figures marked when the cost target is another model."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim import api
from sim.workload import features
from sim.workload.decisions import ConfigError

from trace_files import BUNDLED  # noqa: E402
pytestmark = pytest.mark.skipif(not (BUNDLED / "manifest.json").is_file(), reason="bundled trace not present")
TRACE = str(BUNDLED)
EXITING = {"l_min": 16, "theta": 1.0, "eps": 0.05}   # some passes exit before the last layer


def test_cross_model_replay_reports_exit_layers_in_the_target_depth():
    own = api.simulate(TRACE, policy="cgee", params=EXITING, hardware="h100-sxm", baselines=False)
    qwen = api.simulate(TRACE, policy="cgee", params=EXITING, model_preset="qwen2.5-7b", hardware="h100-sxm",
                        baselines=False)
    L_trace, L_target = own.summary["layers"], qwen.summary["layers"]
    assert (L_trace, L_target) == (30, 28)
    assert own.summary["mean_exit_layer"] < L_trace                    # the case exits early at all
    m = qwen.summary["mean_exit_layer"]
    assert m <= L_target
    # the same fraction of depth (rounded up to a whole layer)
    assert own.summary["mean_exit_layer"] * L_target / L_trace <= m <= own.summary["mean_exit_layer"] * L_target / L_trace + 1
    ex = qwen.branches["exit_layer"]
    assert ex.max() == L_target and ex[ex > 0].min() >= 1
    full = own.branches["exit_layer"] == L_trace
    assert (qwen.branches["exit_layer"][full] == L_target).all()       # a full-depth pass is the target's full depth
    # without an exit policy every verification is full depth, in the target's layers
    assert api.simulate(TRACE, policy="no-kv", model_preset="qwen2.5-7b", hardware="h100-sxm",
                        baselines=False).summary["mean_exit_layer"] == 28.0


def test_theta_as_a_fraction_of_ln_v_uses_the_trace_models_vocabulary():
    V = features.load(TRACE).vocab_size
    assert V == 49152
    frac = api.evaluate(TRACE, policy="cgee", params={**EXITING, "theta": 0.1, "theta_unit": "ln_v"},
                        hardware="h100-sxm")
    nats = api.evaluate(TRACE, policy="cgee", params={**EXITING, "theta": 0.1 * math.log(V)}, hardware="h100-sxm")
    assert frac == nats
    lower = api.evaluate(TRACE, policy="cgee", params={**EXITING, "theta": 0.01, "theta_unit": "ln_v"},
                         hardware="h100-sxm")
    assert lower["mean_exit_layer"] > frac["mean_exit_layer"]          # a lower threshold exits later
    with pytest.raises(ConfigError, match="vocab_size: 151936 differs"):
        api.evaluate(TRACE, policy="cgee", params={"theta": 0.1, "theta_unit": "ln_v", "vocab_size": 151936},
                     hardware="h100-sxm")


def test_cgee_error_rate_counts_changed_answers_not_changed_branches():
    # A skip selects the lowest-index majority branch; full verification often another branch
    # of the same majority answer. Only a changed *answer* is a CGEE-induced error.
    r = api.simulate(TRACE, policy="cgee", params={"tau_conf": 0.25, "delta_rel": 0.3}, hardware="h100-sxm",
                     baselines=False)
    tf = features.load(TRACE)
    p, b = r.problems, r.branches
    changed_answer = changed_branch = 0
    for _, row in p.iterrows():
        f = tf.problems[int(row["pos"])]
        share = b[b["pos"] == row["pos"]].sort_values("branch")["shared"].to_numpy()
        ans = f.eff(share, "answer")
        changed_branch += row["selected"] != row["full_selected"]
        changed_answer += ans[row["selected"]] != ans[row["full_selected"]]
    s = r.summary
    assert s["cgee_error_rate"] == pytest.approx(changed_answer / len(p))
    assert s["cgee_branch_disagreement_rate"] == pytest.approx(changed_branch / len(p))
    assert s["cgee_error_rate"] < s["cgee_branch_disagreement_rate"]   # 2 vs 5 of 12 on the bundled trace
    m = api.evaluate(TRACE, policy="rksc", hardware="h100-sxm")
    assert "cgee_error_rate" in m and "cgee_branch_disagreement_rate" in m
    assert api.evaluate(TRACE, policy="asks", hardware="h100-sxm")["cgee_branch_disagreement_rate"] is None


def test_trace_model_figures_are_marked_when_the_cost_target_is_another_model(capsys):
    other = api.evaluate(TRACE, policy="asks", model_preset="qwen2.5-7b", hardware="h100-sxm")
    assert other["decisions_model"] == "smollm2-135m" and other["cost_model"] == "qwen2.5-7b"
    assert {"accuracy", "asks_gate_auc", "gen_tokens_per_branch"} <= set(other["trace_model_figures"])
    assert "latency_mean_s" not in other["trace_model_figures"]
    assert "skip_rate" not in other["trace_model_figures"]              # None for asks: nothing to mark
    cg = api.evaluate(TRACE, policy="cgee", model_preset="qwen2.5-7b", hardware="h100-sxm")
    assert {"skip_rate", "cgee_error_rate", "accuracy"} <= set(cg["trace_model_figures"])
    assert api.evaluate(TRACE, policy="asks", hardware="h100-sxm")["trace_model_figures"] == []
    from app.cli import main
    assert main(["simulate", "--policy", "cgee", "--model-preset", "qwen2.5-7b", "--hardware", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "accuracy*" in text and "skip_rate*" in text and "latency_mean_s*" not in text
    assert "the trace model's own figures (smollm2-135m), not qwen2.5-7b's" in text
    assert main(["simulate", "--policy", "cgee", "--hardware", "h100-sxm"]) == 0
    assert "accuracy*" not in capsys.readouterr().out
    assert main(["simulate", "--policy", "cgee", "--model-preset", "qwen2.5-7b", "--hardware", "h100-sxm",
                 "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert "accuracy" in js["trace_model_figures"] and js["mean_exit_layer"] <= 28
    assert np.isfinite(js["cgee_error_rate"]) and np.isfinite(js["cgee_branch_disagreement_rate"])
