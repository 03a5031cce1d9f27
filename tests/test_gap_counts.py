"""The ITL multiset (sim.bench.gap_counts.GapCounts): numpy's statistics over the gaps written out, and a serve
result's ITLs held as counts, not per token, unless a detailed result writes them."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.bench import plain
from sim.bench.gap_counts import GapCounts, expanded
from sim.bench.plain_workload import PlainError
from sim.cost.profiles import load_hardware, load_model

_gap = st.sampled_from([0.0, 1e-3, 0.00625, 0.0125, 0.0125000001, 0.02, 0.1, 1.0 / 3.0])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_gap, st.floats(0.0, 10.0)), min_size=1, max_size=60), st.integers(1, 6),
       st.integers(1, 8), st.lists(st.floats(0.0, 100.0), min_size=1, max_size=6))
def test_statistics_are_numpys_over_the_gaps_written_out(x, parts, pending, qs):
    """Merged in any number of batches (and with merges forced early), the multiset is the sorted gaps; its median
    and percentiles are numpy's to the bit, its mean and standard deviation to 1e-12 relative."""
    a = np.asarray(x, np.float64)
    g = GapCounts()
    g.PENDING = pending
    for p in np.array_split(a, parts):
        g.add(p)
    np.testing.assert_array_equal(expanded(g), np.sort(a))
    assert g.n == a.size
    assert g.median() == float(np.median(a))
    for q in [*qs, 0.0, 50.0, 99.0, 100.0]:
        assert g.percentile(q) == float(np.percentile(a, q)), q
    assert g.mean() == pytest.approx(float(np.mean(a)), rel=1e-12, abs=1e-300)
    assert g.std() == pytest.approx(float(np.std(a)), rel=1e-12, abs=1e-15)


def _run(**kw):
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    wl = plain.random_workload(60, 256, 48, 0.5, 0, 3)
    return plain.run(m, hw, wl, request_rate=30.0, seed=3, **kw)


def test_a_run_without_its_gaps_gives_the_same_result_from_their_counts():
    """``keep_gaps=False`` keeps no per-request gaps, only their counts (a few per engine step, not one per token)
    and the tokens per second; its result is the kept run's, number for number; a detailed result needs the gaps."""
    kept, lean = _run(), _run(keep_gaps=False)
    assert lean.itls is None and isinstance(kept.itls, plain.Gaps)
    tokens = int(sum(len(x) for x in kept.itls))
    assert lean.tally.gaps.n == tokens
    assert lean.tally.gaps.values.size < tokens / 4            # gaps repeat: one per step the requests share
    np.testing.assert_array_equal(lean.tally.gaps.counts, kept.tally.gaps.counts)
    np.testing.assert_array_equal(lean.tally.tok, kept.tally.tok)
    a, b = plain.serve_result(kept, detailed=False), plain.serve_result(lean, detailed=False)
    assert json.dumps(a) == json.dumps(b)
    flat = np.concatenate([np.asarray(x) for x in kept.itls])
    assert a["p99_itl_ms"] == float(np.percentile(flat, 99)) * 1000
    assert a["median_itl_ms"] == float(np.median(flat)) * 1000
    with pytest.raises(PlainError, match="keep_gaps"):
        plain.serve_result(lean, detailed=True)


def test_without_a_front_end_the_counts_are_made_from_the_token_times(monkeypatch):
    """An in-process run's (no front end) ITLs are counted from its token times a chunk of requests at a time: any
    chunk gives the one-pass statistics and peak tokens per second."""
    import sim.bench.plain_results as pr
    r = _run(frontend=False)
    assert r.tally is None
    whole = plain.serve_result(r)
    flat = np.concatenate([np.asarray(x) for x in whole["itls"]])
    assert whole["p99_itl_ms"] == float(np.percentile(flat, 99)) * 1000
    monkeypatch.setattr(pr, "TOKEN_CHUNK", 7)
    assert json.dumps(plain.serve_result(r)) == json.dumps(whole)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 30.0), min_size=1, max_size=50), st.integers(1, 40))
def test_token_seconds_past_the_run_are_its_last_seconds(times, nsec):
    """Counted by second, then folded to ``nsec`` seconds, the tokens are ``calculate_metrics``'s buckets: every
    second past the last counts as the last (numpy's clip)."""
    from sim.bench.plain_results import fold_seconds
    t = np.asarray(times)
    idx = t.astype(np.int64)
    want = np.bincount(np.clip(idx, 0, nsec - 1), minlength=nsec)
    np.testing.assert_array_equal(fold_seconds(np.bincount(idx), nsec), want)
