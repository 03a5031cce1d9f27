"""Replicas behind a router: one replica is the engine; routing decides which shares survive."""
from __future__ import annotations

import numpy as np
import pytest

from sim import api
from sim.serving.engine import Engine
from sim.serving.goodput import SLO
from sim.serving.replicas import Replicas, split_job, summary
from sim.serving.router import make_router
from sim.workload.job import Job

BUNDLED = api.default_trace_path()
HAS_BUNDLED = (BUNDLED / "manifest.json").is_file()


def _capture(monkeypatch, **kw):
    """The engine arguments and records of one api serving run."""
    import sim.serving.engine as eng
    got = {}

    class Capture(Engine):
        def __init__(self, *a, **k):
            got["args"], got["kwargs"] = a, dict(k)
            super().__init__(*a, **k)

        def run(self):
            res = super().run()
            got["records"] = res.records()
            got["events"] = res.events
            return res

    monkeypatch.setattr(eng, "Engine", Capture)
    api.simulate(None, baselines=False, mode="serving", hardware="h100-sxm", **kw)
    monkeypatch.undo()
    return got


def _same_records(a, b):
    from sim.serving.token_times import TokenTimes
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            if k == "token_times":   # per branch (a window's are TokenTimes views): the same floats
                assert len(x[k]) == len(y[k])
                for u, v in zip(x[k], y[k]):
                    np.testing.assert_array_equal(np.asarray(u, np.float64), np.asarray(v, np.float64), err_msg=k)
            elif isinstance(x[k], np.ndarray):
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
            else:
                assert x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]), k


@pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace not present")
@pytest.mark.parametrize("workload,rate", [({"concurrency": 4, "n_requests": 12}, None),
                                           ({"n_requests": 12}, 2.0)])
def test_one_replica_is_the_engine_bit_for_bit(monkeypatch, workload, rate):
    got = _capture(monkeypatch, policy="rksc", params={"tau": 0.8}, workload=workload, arrival_rate=rate)
    (model, hw, jobs), kw = got["args"], got["kwargs"]
    pol = kw.pop("block_policy")
    kw.pop("per_problem_timeline", None)
    cost = kw.pop("cost", None)   # the target's replica cost (None: one GPU, the engine's ScalarCost)
    r = Replicas(model, hw, jobs, make_router("round-robin", 1), 1, block_policy=lambda: pol,
                 costs=None if cost is None else [cost], **kw).run()
    _same_records(got["records"], r.records[0])
    _same_records(got["records"], r.problems)
    if rate is None:
        assert r.events == got["events"]   # (Poisson: the driver's done events, one per problem, add steps)
    assert r.lost == {"asks_shares": 0, "prefix_reuse": 0, "reused_tokens": 0}


def _shared_jobs(n, B=4, ctx=64, reuse=48, gen=32):
    """Problems of B branches: branch 0 computes its prompt, branches 1.. reuse its first ``reuse`` tokens."""
    z = np.zeros(B, np.int64)
    src = np.r_[-1, np.zeros(B - 1, np.int64)]
    reused = np.r_[0, np.full(B - 1, reuse)]
    c = np.full(B, ctx)
    return [(i, Job(B=B, L=32, bs=16, reused=reused, computed=c - reused, copy=z, gate=z, source=src,
                    share=np.zeros(B, bool), ctx=c, gen=np.full(B, gen), own=c - reused, verify_on=False, v_new=z,
                    v_cached=z, v_layers=np.full(B, 32), v_probes=z, v_head=np.ones(B, np.int64), v_kv_tokens=z,
                    v_reuse=False, score=np.zeros(B))) for i in range(n)]


def test_split_job_drops_reuse_of_branches_whose_source_went_elsewhere():
    (_, j), = _shared_jobs(1)
    s = split_job(j, [False, True, True, False])
    assert s.B == 2 and s.source.tolist() == [-1, -1] and s.reused.tolist() == [0, 0]
    assert s.computed.tolist() == [64, 64] and s.own.tolist() == [64, 64]
    t = split_job(j, [True, False, True, False])
    assert t.source.tolist() == [-1, 0] and t.reused.tolist() == [0, 48] and t.computed.tolist() == [64, 16]


def test_a_sub_job_starts_its_memos_afresh():
    """The memos a job keeps of derived values (Job.MEMOS) are the sub-job's own: a problem of the sub-job has
    arrays of its branches, not the whole job's."""
    from sim.serving.lifecycle import _Prob
    (_, j), = _shared_jobs(1)
    _Prob(0, 0, j, None)                       # fills j's memo of a problem's starting arrays (4 branches)
    j.plan_ids, j.query_range = ["x"], (1, 2)
    s = split_job(j, [False, True, True, False])
    assert all(getattr(s, f) is None for f in Job.MEMOS) and j.prob_init is not None
    p = _Prob(0, 0, s, None)
    assert len(p.first) == len(p.gate_left) == len(p.started) == len(p.vstart) == 2


def test_routing_decides_the_reuse():
    from sim.cost.profiles import load_hardware, load_model
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    jobs = _shared_jobs(16)
    out = {}
    for name in ("round-robin", "least-outstanding", "prefix-affinity", "branch-spread"):
        run = Replicas(m, hw, jobs, make_router(name, 4), 4, concurrency=8).run()
        out[name] = s = summary(run, jobs, SLO(ttft_s=10.0))
        assert s["replicas"] == 4 and len(s["per_replica"]) == 4
        assert s["total"]["problems"] == 16 and sum(p["problems"] for p in s["per_replica"]) >= 16
    # prefix affinity keeps every problem on one replica: nothing lost; round-robin and branch-spread split
    # each problem over 4 replicas: all 3 reusing branches of every problem lose their source
    assert out["prefix-affinity"]["lost_prefix_reuse"] == 0 and out["prefix-affinity"]["split_problems"] == 0
    assert out["round-robin"]["lost_prefix_reuse"] == 16 * 3
    assert out["branch-spread"]["lost_prefix_reuse"] == 16 * 3
    assert out["round-robin"]["lost_reused_tokens"] == 16 * 3 * 48
    assert out["prefix-affinity"]["total"]["prefix_hit_rate"] > out["round-robin"]["total"]["prefix_hit_rate"]
    assert out["round-robin"]["total"]["prefix_hit_rate"] == 0.0
    # one stream, one clock: every replica worked
    assert all(p["gpu_utilisation"] > 0 for p in out["round-robin"]["per_replica"])
