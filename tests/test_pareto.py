"""Pareto frontier: a hand-made table, ties, NaN, orientation, and the brute-force definition."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.frontier_plot import frontier_figure as figure
from sim.search.pareto import (collapse_ties, default_minimise, frontier, pareto_mask, pareto_mask_bruteforce)


def hand_table() -> pd.DataFrame:
    # x = error (minimise), y = speedup (maximise)
    rows = [
        ("a", 0.00, 1.0),   # frontier: lowest error
        ("b", 0.00, 0.9),   # dominated by a (same x, worse y)
        ("c", 0.01, 2.0),   # frontier
        ("d", 0.01, 2.0),   # frontier: identical to c, neither dominates
        ("e", 0.02, 2.0),   # dominated by c (same y, worse x)
        ("f", 0.02, 1.5),   # dominated by c
        ("g", 0.05, 3.0),   # frontier
        ("h", 0.04, 2.5),   # frontier
        ("i", np.nan, 9.0),  # NaN: never on the frontier
        ("j", 0.10, 2.9),   # dominated by g
        ("k", 0.10, 3.5),   # frontier (best y)
    ]
    return pd.DataFrame(rows, columns=["config_id", "cgee_error_rate", "speedup_vs_no_kv"])


def test_hand_made_table():
    df = hand_table()
    front = frontier(df, "cgee_error_rate", "speedup_vs_no_kv")
    assert list(front["config_id"]) == ["a", "c", "d", "h", "g", "k"]
    assert list(front.index) == [0, 2, 3, 7, 6, 10]  # original rows kept


def test_ties_collapse_to_one_row_per_point():
    front = frontier(hand_table(), "cgee_error_rate", "speedup_vs_no_kv")
    c = collapse_ties(front, "cgee_error_rate", "speedup_vs_no_kv")
    assert list(c["config_id"]) == ["a", "c", "h", "g", "k"]
    assert list(c["n_tied"]) == [1, 2, 1, 1, 1]
    assert c.loc[2, "tied_config_ids"] == ["c", "d"]
    assert collapse_ties(front.iloc[:0], "cgee_error_rate", "speedup_vs_no_kv").empty


def test_orientation_flags():
    df = hand_table()
    # maximise x, minimise y: larger error and smaller speedup "win"
    front = frontier(df, "cgee_error_rate", "speedup_vs_no_kv", minimize_x=False, maximize_y=False)
    assert set(front["config_id"]) == {"j", "h", "f", "b"}
    # both maximised
    front = frontier(df, "cgee_error_rate", "speedup_vs_no_kv", minimize_x=False, maximize_y=True)
    assert list(front["config_id"]) == ["k"]


def test_default_directions():
    assert default_minimise("cgee_error_rate") and default_minimise("latency_mean_s")
    assert default_minimise("peak_kv_bytes") and default_minimise("attn_output_rel_error")
    assert not default_minimise("speedup_vs_no_kv") and not default_minimise("accuracy")
    assert not default_minimise("attn_mass_recall") and not default_minimise("kv_reuse")
    assert not default_minimise("asks_gate_auc") and not default_minimise("skip_rate")


def test_empty_and_all_nan():
    assert pareto_mask([], []).tolist() == []
    assert pareto_mask([np.nan, 1.0], [1.0, np.nan]).tolist() == [False, False]
    assert pareto_mask([1.0], [1.0]).tolist() == [True]


def test_bad_columns_named():
    df = hand_table()
    with pytest.raises(ValueError, match=r"--x 'nope': no such column .*cgee_error_rate"):
        frontier(df, "nope", "speedup_vs_no_kv")
    with pytest.raises(ValueError, match=r"--y 'config_id': column is not numeric"):
        frontier(df, "cgee_error_rate", "config_id")


coords = st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0, np.nan]) | st.floats(-5, 5),
                            st.sampled_from([0.0, 0.5, 1.0, 2.0, np.nan]) | st.floats(-5, 5)),
                  max_size=40)


@settings(max_examples=300, deadline=None)
@given(pts=coords, mx=st.booleans(), my=st.booleans())
def test_matches_definition(pts, mx, my):
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    fast = pareto_mask(x, y, mx, my)
    assert fast.tolist() == pareto_mask_bruteforce(x, y, mx, my).tolist()
    if np.isfinite(x).any() and (np.isfinite(x) & np.isfinite(y)).any():
        assert fast.any()  # a non-empty finite set has a non-empty frontier


def test_figure_has_points_and_frontier():
    df = hand_table()
    df["param.tau"] = np.linspace(0, 1, len(df))
    front = frontier(df, "cgee_error_rate", "speedup_vs_no_kv")
    fig = figure(df, front, "cgee_error_rate", "speedup_vs_no_kv")
    assert [t.name for t in fig.data] == ["configurations", "Pareto frontier"]
    assert len(fig.data[0].x) == len(df) and len(fig.data[1].x) == len(front)
    assert "param.tau=" in fig.data[1].text[0]
