"""Routers on hand-built arrival sequences; lost shares; SLO goodput on hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest

from sim.serving.goodput import SLO, SLOError, goodput, max_goodput_rate, meets, tpot
from sim.serving.router import (Arrival, BranchSpread, LeastOutstanding, PrefixAffinity, RoundRobin, RouterError,
                        lost_shares, make_router, prefix_hash)


def _problems(n_problems, branches, prefixes):
    return [Arrival(p, b, branches, prefixes[p]) for p in range(n_problems) for b in range(branches)]


def test_round_robin_in_turn():
    r = RoundRobin(3)
    got = [r.route(a, [0, 0, 0]) for a in _problems(2, 4, [(1, 2), (3, 4)])]
    assert got == [0, 1, 2, 0, 1, 2, 0, 1]


def test_least_outstanding_follows_the_load_lowest_index_on_ties():
    r = LeastOutstanding(3)
    out = [2, 0, 1]
    got = []
    for a in _problems(1, 5, [(7,)]):
        i = r.route(a, out)
        got.append(i)
        out[i] += 1
    # [2,0,1] -> 1 -> [2,1,1] -> 1 (tie 1,2: lowest) -> [2,2,1] -> 2 -> [2,2,2] -> 0 -> [3,2,2] -> 1
    assert got == [1, 1, 2, 0, 1]


def test_prefix_affinity_same_prefix_same_replica_and_yields_to_imbalance():
    r = PrefixAffinity(4)
    pre = [tuple(range(10)), tuple(range(5, 20)), tuple(range(10))]   # problems 0 and 2 share their prefix
    got = [r.route(a, [0, 0, 0, 0]) for a in _problems(3, 3, pre)]
    h0, h1 = prefix_hash(pre[0]) % 4, prefix_hash(pre[1]) % 4
    assert got == [h0] * 3 + [h1] * 3 + [h0] * 3
    assert prefix_hash(np.array(pre[0])) == prefix_hash(list(pre[0]))   # ids, not the container
    # imbalanced: 40 - 0 > 32 and 40 > 0 * 1.0001 -> the least outstanding replica
    load = [0, 0, 0, 0]
    load[h0] = 40
    assert r.route(Arrival(0, 0, 1, pre[0]), load) == (1 if h0 == 0 else 0)
    # within the threshold: affinity holds
    load[h0] = 32
    assert r.route(Arrival(0, 0, 1, pre[0]), load) == h0
    assert PrefixAffinity(4, balance_abs_threshold=None).route(Arrival(0, 0, 1, pre[0]), [99, 99, 99, 99]) == h0


def test_branch_spread_puts_a_problems_branches_on_different_replicas():
    r = BranchSpread(4)
    load = [3, 1, 2, 5]
    got = [r.route(a, load) for a in _problems(1, 4, [(1,)])]
    assert got == [1, 2, 3, 0]          # r0 = argmin load = 1, then (1 + b) mod 4
    load = [0, 4, 4, 4]
    assert [r.route(a, load) for a in _problems(1, 2, [(2,)])] == [0, 1]
    assert r.first == {}                # fully routed problems are forgotten


def test_make_router_and_bad_names():
    assert isinstance(make_router("round-robin", 2), RoundRobin)
    assert make_router("prefix-affinity", 2, balance_abs_threshold=8).balance_abs_threshold == 8
    with pytest.raises(RouterError, match="--router: 'random' is not one of round-robin"):
        make_router("random", 2)
    with pytest.raises(RouterError, match="--data-parallel-size"):
        make_router("round-robin", 0)
    with pytest.raises(RouterError, match="--router prefix-affinity"):
        make_router("prefix-affinity", 2, bogus=1)


def test_lost_shares_counts_sources_on_other_replicas():
    # branches 1, 2, 3 share branch 0's KV; branch 4 has no source
    src = [-1, 0, 0, 0, -1]
    assert lost_shares([0, 0, 0, 0, 1], src) == 0
    assert lost_shares([0, 1, 2, 3, 0], src) == 3
    assert lost_shares([0, 0, 1, 0, 1], src) == 1
    # routing the branches of one problem: round-robin loses shares, prefix affinity keeps them
    arr = _problems(1, 4, [(5, 6)])
    rr, pa = RoundRobin(4), PrefixAffinity(4)
    assert lost_shares([rr.route(a, [0] * 4) for a in arr], src[:4]) == 3
    assert lost_shares([pa.route(a, [0] * 4) for a in arr], src[:4]) == 0


def test_slo_parse_and_errors():
    s = SLO.parse("ttft=0.5, tpot=0.05")
    assert (s.ttft_s, s.tpot_s, s.e2e_s) == (0.5, 0.05, None) and str(s) == "ttft=0.5,tpot=0.05"
    assert SLO.parse(None) == SLO() and SLO.parse("") == SLO()
    for bad, msg in (("ttft", "not KEY=SECONDS"), ("p99=1", "not KEY=SECONDS"), ("ttft=x", "not a number"),
                     ("ttft=-1", "positive"), ("ttft=1,ttft=2", "given twice"), ("e2e=inf", "positive")):
        with pytest.raises(SLOError, match=msg):
            SLO.parse(bad)


def test_goodput_hand_computed():
    # 5 requests over 10 s
    ttft = [0.1, 0.3, 0.2, 0.1, np.nan]
    e2e = [1.1, 1.3, 5.2, 0.6, np.nan]
    out = [11, 11, 11, 1, 5]
    tp = tpot(ttft, e2e, out)
    np.testing.assert_allclose(tp[:4], [0.1, 0.1, 0.5, 0.0])
    slo = SLO(ttft_s=0.25, tpot_s=0.2)
    # r0 meets both; r1 misses ttft; r2 misses tpot; r3 meets (one token: tpot 0); r4 never finished
    assert meets(slo, ttft, tp, e2e).tolist() == [True, False, False, True, False]
    g = goodput(slo, ttft, tp, e2e, 10.0)
    assert g["goodput_rps"] == pytest.approx(0.2) and g["throughput_rps"] == pytest.approx(0.5)
    assert g["slo_attainment"] == pytest.approx(0.4) and g["requests_meeting_slo"] == 2
    # e2e alone: r0, r1, r3 (<= 2 s)
    assert goodput(SLO(e2e_s=2.0), ttft, tp, e2e, 10.0)["goodput_rps"] == pytest.approx(0.3)
    # no SLO: every finished request counts
    assert goodput(SLO(), ttft, tp, e2e, 10.0)["requests_meeting_slo"] == 4


def test_max_goodput_rate_interpolates_the_crossing():
    assert max_goodput_rate([1, 2, 3, 4], [1.0, 0.95, 0.85, 0.5], 0.9) == pytest.approx(2.5)
    assert max_goodput_rate([1, 2], [1.0, 0.99], 0.9) == 2.0
    assert max_goodput_rate([1, 2], [0.5, 0.4], 0.9) is None
    with pytest.raises(ValueError):
        max_goodput_rate([2, 1], [1, 1])
