"""Tuning: the held-out split is disjoint and seeded; grid + refinement honour the constraints.

The search is tested with a test-only ``evaluate`` whose optimum is known in
closed form; tests/test_sweep_cli.py runs ``rksim tune`` on the real simulator.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.search.grid import parse_grids
from sim.search.tune import (DEFAULT_GRIDS, TuneSpec, default_grid, split_problems, tune,
                      violation)

N = 12
DIFFICULTY = [((7 * i) % N) / N for i in range(N)]  # problem i is "hard" above this tau


def fake_evaluate(trace, policy, params, problems=None, **kw):
    """Lower tau = faster but more errors: error = share of problems with difficulty > tau."""
    probs = list(range(N)) if problems is None else list(problems)
    if policy == "no-kv":
        return {"speedup_vs_no_kv": 1.0, "cgee_error_rate": None, "accuracy": 0.75,
                "n_problems": len(probs), "first_problem": probs[0]}
    tau = float(params["tau"])
    alpha = float(params.get("alpha", 0.0))
    err = sum(DIFFICULTY[i] > tau for i in probs) / len(probs)
    return {"speedup_vs_no_kv": 3.0 - 2.0 * tau - 0.01 * alpha,
            "cgee_error_rate": err,
            "accuracy": 0.75 - err / 2,
            "n_problems": len(probs), "first_problem": probs[0]}


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 500), frac=st.floats(0.05, 0.95), seed=st.integers(0, 2**32 - 1))
def test_split_disjoint_complete_seeded(n, frac, seed):
    a, b = split_problems(n, frac, seed)
    assert set(a).isdisjoint(b)
    assert sorted(a + b) == list(range(n))
    assert a and b and a == sorted(a) and b == sorted(b)
    assert abs(len(a) - frac * n) <= 1 or len(a) in (1, n - 1)
    assert split_problems(n, frac, seed) == (a, b)


def test_split_differs_across_seeds():
    splits = {tuple(split_problems(12, 0.5, s)[0]) for s in range(10)}
    assert len(splits) >= 8
    assert split_problems(12, 0.5, 0) != split_problems(12, 0.5, 1)


def test_split_errors():
    with pytest.raises(ValueError, match="--split"):
        split_problems(1, 0.5, 0)
    with pytest.raises(ValueError, match="--split 1.0"):
        split_problems(10, 1.0, 0)


def test_grid_then_refinement_finds_constrained_optimum():
    spec = TuneSpec(objective="speedup_vs_no_kv", max_cgee_error=0.2, seed=0)
    grid = parse_grids(["tau=0.3:1.0:0.1", "alpha=0,1"])
    res = tune("unused", "asks", spec, grid, evaluate=fake_evaluate, n_problems=N, n_layers=30,
               progress=False, validate=False)
    tune_p, held_p = res.tune_problems, res.held_problems
    assert set(tune_p).isdisjoint(held_p) and len(tune_p) == len(held_p) == 6
    # the metrics were computed on the right problems
    assert res.tune["n_problems"] == 6 and res.tune["first_problem"] == tune_p[0]
    assert res.held["n_problems"] == 6 and res.held["first_problem"] == held_p[0]
    assert res.baseline_held["first_problem"] == held_p[0]
    # closed form on the tune split: the smallest tau whose error <= 0.2, alpha = 0
    d = sorted(DIFFICULTY[i] for i in tune_p)
    k = math.floor(0.2 * len(d))  # problems allowed to be harder than tau
    tau_star = max(d[len(d) - 1 - k], 0.3)  # refinement stays inside the grid's box
    assert res.feasible and res.tune["cgee_error_rate"] <= 0.2
    assert res.params["alpha"] == 0
    grid_tau = min(t for t in grid.axes["tau"] if t >= tau_star - 1e-12)
    assert res.grid_best["params"]["tau"] == grid_tau
    # refinement moved tau from the grid point towards tau_star, never past it
    assert tau_star - 1e-9 <= res.params["tau"] <= grid_tau
    if grid_tau > tau_star + 1e-3:
        assert res.source == "refined" and res.params["tau"] < grid_tau
    assert res.tune["speedup_vs_no_kv"] >= 3.0 - 2.0 * grid_tau
    # same seed -> same result; held-out reported with the same params
    again = tune("unused", "asks", spec, grid, evaluate=fake_evaluate, n_problems=N, n_layers=30,
                 progress=False, validate=False)
    assert again.to_json() == res.to_json()
    js = res.to_json()
    assert js["chosen"]["params"] == res.params and js["split"]["held_out"] == held_p
    table = res.table()
    assert list(table.index) == ["tune", "held-out"]
    assert table.loc["tune", "speedup_vs_no_kv"] == res.tune["speedup_vs_no_kv"]
    assert table.loc["held-out", "accuracy_no_kv"] == 0.75


def test_no_refine_and_infeasible():
    spec = TuneSpec(objective="speedup_vs_no_kv", max_cgee_error=0.0, refine=False)
    grid = parse_grids(["tau=0.5,0.6,0.7"])
    for seed in range(6):
        spec.seed = seed
        res = tune("unused", "asks", spec, grid, evaluate=fake_evaluate, n_problems=N, n_layers=30,
                   progress=False, validate=False)
        d = [DIFFICULTY[i] for i in res.tune_problems]
        errs = {t: sum(x > t for x in d) / len(d) for t in (0.5, 0.6, 0.7)}
        assert res.source == "grid"
        assert res.feasible == (min(errs.values()) == 0)
        # feasible: the fastest (smallest) feasible tau; else the least violation, then the fastest
        best = min(errs.values())
        assert res.params["tau"] == min(t for t, e in errs.items() if e == best)


def test_accuracy_drop_constraint():
    spec = TuneSpec(max_accuracy_drop=0.0, refine=False)
    m = {"accuracy": 0.7, "cgee_error_rate": 0.3}
    assert violation(m, spec, 0.75) == pytest.approx(0.05)
    assert violation({"accuracy": 0.8}, spec, 0.75) == 0.0
    assert violation({"cgee_error_rate": None}, TuneSpec(max_cgee_error=0.01), 0.75) == 0.0
    grid = parse_grids(["tau=0.5:1.0:0.1"])
    res = tune("unused", "asks", spec, grid, evaluate=fake_evaluate, n_problems=N, n_layers=30,
               progress=False, validate=False)
    assert res.tune["accuracy"] >= res.baseline_tune["accuracy"]


def test_spec_errors_and_objective_direction():
    with pytest.raises(ValueError, match="--split"):
        TuneSpec(split=0)
    with pytest.raises(ValueError, match="--max-cgee-error"):
        TuneSpec(max_cgee_error=-1)
    assert TuneSpec(objective="speedup_vs_no_kv").maximize
    assert not TuneSpec(objective="latency_mean_s").maximize
    assert TuneSpec(objective="latency_mean_s", direction="max").maximize
    with pytest.raises(ValueError, match="--objective 'nope'"):
        tune("unused", "asks", TuneSpec(objective="nope"), parse_grids(["tau=0.5,0.6"]),
             evaluate=fake_evaluate, n_problems=N, n_layers=30, progress=False, validate=False)


def test_default_grids():
    g = default_grid("cgee", 30)
    assert g.axes["l_min"] == [8, 15, 22]
    assert g.axes["theta"] == [0.0, 0.25, 0.5, 1.0, 2.0]
    assert set(DEFAULT_GRIDS) >= {"asks", "cgee", "vase-attnv", "vase-dkv"}
    assert default_grid("asks", 30).axes["tau"][-1] == 1.0
    assert default_grid("cgee", 2).axes["l_min"] == [1, 2]
    with pytest.raises(ValueError, match="no default grid"):
        default_grid("lru", 30)
    assert np.all(np.diff(default_grid("asks", 30).axes["tau"]) > 0)


def test_token_policy_notes_and_no_default_refinement():
    calls = []

    def fake_token(trace, policy, params, problems=None, **kw):
        calls.append(params)
        if policy == "no-kv":
            return {"accuracy": 0.5, "attn_output_rel_error": None}
        return {"accuracy": None, "attn_output_rel_error": 1.0 / params["budget"] + 0.001 * params["n_value"]}

    grid = parse_grids(["budget=64,128,256", "n_value=0,8"])
    res = tune("unused", "vase-dkv", TuneSpec(objective="attn_output_rel_error"), grid, evaluate=fake_token,
               n_problems=N, n_layers=30, progress=False, validate=False)
    assert not res.refinement_ran and res.source == "grid"
    assert res.params == {"budget": 256, "n_value": 0}  # minimised (an error)
    assert len(calls) == 2 + 6 + 1  # baselines, grid, held-out: no refinement
    assert any("long decodes" in n for n in res.notes)
    forced = tune("unused", "vase-dkv", TuneSpec(objective="attn_output_rel_error", refine=True, refine_maxiter=2),
                  grid, evaluate=fake_token, n_problems=N, n_layers=30, progress=False, validate=False)
    assert forced.refinement_ran and forced.params["budget"] == 256


def test_conservative_reads_the_wilson_bound():
    from sim.replay.intervals import wilson
    cons = TuneSpec(max_cgee_error=0.01, conservative=True)
    # 0 errors of 4 problems: the point meets 0.01, the Wilson upper bound (0.49) does not
    assert violation({"cgee_error_rate": 0.0, "n_problems": 4}, TuneSpec(max_cgee_error=0.01), 0.75) == 0.0
    assert violation({"cgee_error_rate": 0.0, "n_problems": 4}, cons, 0.75) == pytest.approx(wilson(0, 4)[1] - 0.01)
    # accuracy at its Wilson lower bound against the no-kv point
    acc = TuneSpec(max_accuracy_drop=0.1, conservative=True)
    lo = wilson(6, 8)[0]
    assert violation({"accuracy": 0.75, "n_problems": 8}, acc, 0.75) == pytest.approx(0.75 - lo - 0.1)
    with pytest.raises(ValueError, match="--conservative"):
        violation({"cgee_error_rate": 0.0}, cons, 0.75)
    # on the search: the point estimate takes errors up to the bar, the bound takes none
    grid = parse_grids(["tau=0.3:1.0:0.05"])
    point = tune("unused", "asks", TuneSpec(max_cgee_error=0.4, refine=False), grid, evaluate=fake_evaluate,
                 n_problems=N, n_layers=30, progress=False, validate=False)
    safe = tune("unused", "asks", TuneSpec(max_cgee_error=0.4, refine=False, conservative=True), grid,
                evaluate=fake_evaluate, n_problems=N, n_layers=30, progress=False, validate=False)
    assert point.tune["cgee_error_rate"] > 0 and point.feasible
    assert safe.tune["cgee_error_rate"] == 0 and safe.feasible   # wilson(0, 6) upper = 0.39 <= 0.4
    assert safe.params["tau"] > point.params["tau"]
    assert safe.to_json()["constraints"]["conservative"] is True


def test_held_out_break_is_reported():
    grid = parse_grids(["tau=0.3:1.0:0.05"])
    seen_break = seen_clean = False
    for seed in range(8):
        res = tune("unused", "asks", TuneSpec(max_cgee_error=0.0, refine=False, seed=seed), grid,
                   evaluate=fake_evaluate, n_problems=N, n_layers=30, progress=False, validate=False)
        held_err = res.held["cgee_error_rate"]
        assert res.tune["cgee_error_rate"] == 0
        if held_err > 0:
            seen_break = True
            assert len(res.held_out_breaks) == 1
            line = res.held_out_breaks[0]
            assert f"held-out cgee_error_rate {held_err:.4g} on 6 problems breaks --max-cgee-error 0" in line
            assert "--conservative" in line
        else:
            seen_clean = True
            assert res.held_out_breaks == []
        assert res.to_json()["held_out_breaks"] == res.held_out_breaks
    assert seen_break and seen_clean


def test_tune_cli_warns_in_one_line(monkeypatch, capsys):
    """``rksim tune`` prints each held-out break as one warning line on stderr."""
    import sim.search.tune as T
    from app.cli import main
    real = T.tune

    def fake(trace, policy, spec, grid=None, options=None, **kw):
        kw.pop("evaluate", None)
        return real(trace, "asks", spec, parse_grids(["tau=0.3:1.0:0.05"]), options, evaluate=fake_evaluate,
                    n_problems=N, n_layers=30, progress=False, validate=False)

    monkeypatch.setattr(T, "tune", fake)
    spec_seed = next(s for s in range(8) if fake("x", "asks", TuneSpec(max_cgee_error=0.0, refine=False,
                                                                        seed=s)).held_out_breaks)
    assert main(["tune", "--policy", "asks", "--max-cgee-error", "0", "--no-refine", "--split-seed",
                 str(spec_seed), "--grid", "tau=0.5,0.6"]) == 0
    err = capsys.readouterr().err.splitlines()
    warn = [ln for ln in err if ln.startswith("rksim: warning: held-out")]
    assert len(warn) == 1 and "breaks --max-cgee-error 0" in warn[0]
