"""The demo's HTML report figures (issue 11 item 10): shared sigma bins, every policy in every legend."""
from __future__ import annotations

import numpy as np
import pandas as pd

from app import report


def test_sigma_histogram_series_share_bin_edges():
    rng = np.random.default_rng(0)
    # two series with very different spreads: plotly's automatic bins would differ per series
    br = pd.DataFrame({"branch": np.arange(1, 41), "sigma": np.r_[rng.uniform(0.96, 0.99, 30), rng.uniform(0.2, 0.9, 10)],
                       "cf_same_answer": [True] * 30 + [False] * 10})
    fig = report.fig_sigma(br, 0.9)
    hists = [t for t in fig.data if t.type == "histogram"]
    assert len(hists) == 2
    edges = [(h.xbins.start, h.xbins.end, h.xbins.size) for h in hists]
    assert edges[0] == edges[1] and None not in edges[0]
    lo, hi, size = edges[0]
    assert lo <= br["sigma"].min() and hi > br["sigma"].max() and size > 0


def test_every_policy_appears_in_the_kv_and_vase_legends():
    from sim.api import compare_policies, simulate

    policies = compare_policies(None)["policies"]
    details = {n: simulate(None, n, baselines=False) for n in ("no-kv", "exact-prefix", "h2o")}
    names = {t.name for t in report.fig_kv(details, 0).data}
    for n in details:
        assert any(x == n or x.startswith(n + " ") for x in names), (n, names)
    vase = {t.name.split(" ")[0] for t in report.fig_vase(policies).data}
    tokens = {n for n, m in policies.items() if m.get("kind") == "token"}
    assert tokens <= vase, tokens - vase
