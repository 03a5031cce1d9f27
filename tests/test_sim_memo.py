"""The fast path's memoisation never changes a number: a warm sweep equals cold evaluations.

``sim.api`` memoises (in the trace's caller-owned ``LoadedTrace``) decisions per threshold *outcome* (ASKS's sign(sigma - tau), CGEE's
skip outcome and exit layers), rows per decision and summaries per row set. A configuration
evaluated after many others (caches warm, sweep order) must give exactly the metrics it gives
alone (caches cleared).
"""
from __future__ import annotations

import numpy as np
import pytest

from sim import api

BUNDLED = api.default_trace_path()
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
    api.clear_caches()
    warm = [api.evaluate(trace, pol, p, model_preset=model_preset, hardware=hardware) for pol, p in configs]
    # The memo really was shared: fewer decisions than (configuration, problem) pairs.
    assert len(api.loaded(trace).decisions) < len(configs) * warm[0]["n_problems"]
    for (pol, p), w in zip(configs, warm):
        api.clear_caches()
        cold = api.evaluate(trace, pol, p, model_preset=model_preset, hardware=hardware)
        assert cold == w, (pol, p)


def test_problem_subsets_share_exit_memo_correctly():
    """Exit layers prefetched for one problem subset serve another subset exactly."""
    trace = str(BUNDLED)
    p = {"theta": 1.5, "eps": 0.2, "l_min": 20, "tau_conf": 1.1}
    api.clear_caches()
    a = api.evaluate(trace, "cgee", p, problems=[0, 1, 2])
    b = api.evaluate(trace, "cgee", p, problems=[0, 3, 5])
    api.clear_caches()
    assert api.evaluate(trace, "cgee", p, problems=[0, 3, 5]) == b
    api.clear_caches()
    assert api.evaluate(trace, "cgee", p, problems=[0, 1, 2]) == a


def test_thresholds_that_decide_nothing_reuse_decisions():
    """tau_conf > 1 never skips (confidences are <= 1), so delta_rel decides nothing: no new decision."""
    trace = str(BUNDLED)
    api.clear_caches()
    a = api.evaluate(trace, "cgee", {"tau_conf": 1.1, "delta_rel": 0.3})
    n = len(api.loaded(trace).decisions)
    b = api.evaluate(trace, "cgee", {"tau_conf": 1.1, "delta_rel": 0.5})
    assert len(api.loaded(trace).decisions) == n
    assert a == b and a["skip_rate"] == 0.0
