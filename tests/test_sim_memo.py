"""The fast path's memoisation never changes a number: a warm sweep equals cold evaluations.

``sim.api`` memoises (in the trace's caller-owned ``Session``) decisions per threshold *outcome* (ASKS's sign(sigma - tau), CGEE's
skip outcome and exit layers), rows per decision and summaries per row set. A configuration
evaluated after many others (caches warm, sweep order) must give exactly the metrics it gives
alone (caches cleared).
"""
from __future__ import annotations

import numpy as np
import pytest

from sim import api

from trace_files import BUNDLED  # noqa: E402
pytestmark = pytest.mark.skipif(not (BUNDLED / "manifest.json").is_file(), reason="bundled trace not present")


def _configs(seed: int, n: int) -> list[tuple[str, dict]]:
    """A seeded sample from small grids, so many configurations share threshold outcomes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pol = ("cgee", "rksc", "asks")[int(rng.integers(3))]
        if pol == "asks":
            p = {"tau": float(rng.choice([0.5, 0.7, 0.8, 0.9, 1.1]))}
        elif pol == "cgee":
            p = {"tau_conf": float(rng.choice([0.5, 0.6, 0.8, 1.1])), "delta_rel": float(rng.choice([0.3, 0.5])),
                 "theta": float(rng.choice([0.25, 1.0, 2.0])), "eps": float(rng.choice([0.02, 0.2])),
                 "l_min": int(rng.choice([2, 16, 24, 29]))}
        else:
            p = {"tau": float(rng.choice([0.6, 0.8, 0.95])), "theta": float(rng.choice([0.5, 2.0])),
                 "tau_conf": float(rng.choice([0.5, 0.6, 1.1])), "l_min": int(rng.choice([16, 26]))}
        out.append((pol, p))
    return out


@pytest.mark.parametrize("model_preset,hardware", [(None, "local-cpu"), ("qwen2.5-7b", "h100-sxm")])
def test_warm_sweep_equals_cold_evaluations(model_preset, hardware):
    trace = str(BUNDLED)
    configs, seen = [], set()
    for pol, p in _configs(7, 40):  # distinct configurations only: sharing must come from outcomes
        k = (pol, tuple(sorted(p.items())))
        if k not in seen:
            seen.add(k)
            configs.append((pol, p))
    session = api.Session(trace)
    warm = [api.evaluate(session, pol, p, model_preset=model_preset, hardware=hardware) for pol, p in configs]
    # The memo really was shared: fewer decisions than (configuration, problem) pairs.
    assert len(session.decisions) < len(configs) * warm[0]["n_problems"]
    for (pol, p), w in zip(configs, warm):
        session.clear()
        cold = api.evaluate(session, pol, p, model_preset=model_preset, hardware=hardware)
        assert cold == w, (pol, p)


def test_problem_subsets_share_exit_memo_correctly():
    """Exit layers prefetched for one problem subset serve another subset exactly."""
    trace = str(BUNDLED)
    p = {"theta": 1.5, "eps": 0.2, "l_min": 20, "tau_conf": 1.1}
    session = api.Session(trace)
    a = api.evaluate(session, "cgee", p, problems=[0, 1, 2])
    b = api.evaluate(session, "cgee", p, problems=[0, 3, 5])
    session.clear()
    assert api.evaluate(session, "cgee", p, problems=[0, 3, 5]) == b
    session.clear()
    assert api.evaluate(session, "cgee", p, problems=[0, 1, 2]) == a


def test_thresholds_that_decide_nothing_reuse_decisions():
    """tau_conf > 1 never skips (confidences are <= 1), so delta_rel decides nothing: no new decision."""
    trace = str(BUNDLED)
    session = api.Session(trace)
    a = api.evaluate(session, "cgee", {"tau_conf": 1.1, "delta_rel": 0.3})
    n = len(session.decisions)
    b = api.evaluate(session, "cgee", {"tau_conf": 1.1, "delta_rel": 0.5})
    assert len(session.decisions) == n
    assert a == b and a["skip_rate"] == 0.0


def test_targets_of_other_depths_and_theta_units_share_no_wrong_memo():
    """Exit layers are reported in each target's depth: interleaving a 28-layer and the 30-layer
    trace model, and theta in nats or as a fraction of ln V, gives exactly the cold numbers."""
    trace = str(BUNDLED)
    p = {"theta": 1.0, "eps": 0.05, "l_min": 16, "tau_conf": 0.5}
    frac = {**p, "theta": 1.0 / np.log(49152), "theta_unit": "ln_v"}
    runs = [("cgee", p, "qwen2.5-7b"), ("cgee", p, None), ("cgee", frac, "qwen2.5-7b"), ("rksc", p, None),
            ("rksc", p, "qwen2.5-7b"), ("cgee", frac, None)]
    session = api.Session(trace)
    warm = [api.evaluate(session, pol, q, model_preset=m, hardware="h100-sxm") for pol, q, m in runs]
    assert warm[0]["layers"] == 28 and warm[1]["layers"] == 30
    assert warm[0]["mean_exit_layer"] < warm[1]["mean_exit_layer"] <= 30
    assert warm[2]["mean_exit_layer"] == warm[0]["mean_exit_layer"]       # theta 1.0 nats either way
    for (pol, q, m), w in zip(runs, warm):
        session.clear()
        assert api.evaluate(session, pol, q, model_preset=m, hardware="h100-sxm") == w, (pol, q, m)


def test_the_host_fingerprint_is_read_once_per_session(monkeypatch):
    # every result says whether its profile is this host's; reading /proc/cpuinfo and torch's version per
    # evaluation cost 2-3x the fast path's own time (bench/bench_sim.py)
    import sim.cost.fingerprint
    from sim import api
    calls = []
    real = sim.cost.fingerprint.current_cpu_fingerprint
    monkeypatch.setattr(sim.cost.fingerprint, "current_cpu_fingerprint", lambda *a, **k: calls.append(1) or real(*a, **k))
    s = api.Session()
    for tau in (0.6, 0.7, 0.8):
        r = api.evaluate(s, "asks", {"tau": tau}, hardware="local-cpu")
        assert "speedup_vs_no_kv" in r
    assert len(calls) == 1
