"""Pipeline parallelism in the serving engine: vLLM's up to PP batches in flight against the serial bound."""
from __future__ import annotations

import numpy as np
import pytest

from sim.serving.engine import Engine
from sim.base.errors import ConfigError
from sim.serving.kvcache import BlockManager
from sim.base.options import declared
from sim.cost.parallel import ParallelConfig, ParallelCost, ParallelError, load_node, pipeline_schedule
from sim.cost.profiles import load_hardware, load_model
from sim.serving.scheduler import Request, Scheduler, SchedulerConfig
from sim.replay.target import TargetSpec
from sim.workload.job import Job


def _job(B=8, ctx=256, gen=16, L=80):
    """``B`` independent branches (no shared prefix, no gate, no verification)."""
    z = np.zeros(B, np.int64)
    c, g = np.full(B, ctx), np.full(B, gen)
    return Job(B=B, L=L, bs=16, reused=z, computed=c, copy=z, gate=z, source=np.full(B, -1),
               share=np.zeros(B, bool), ctx=c, gen=g, own=c, verify_on=False, v_new=z, v_cached=z,
               v_layers=np.full(B, L), v_probes=z, v_head=np.ones(B, np.int64), v_kv_tokens=z, v_reuse=False,
               score=np.full(B, 0.5))


def _serve(schedule, pp=2, n=4):
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    cost = ParallelCost(m, hw, node, ParallelConfig(1, pp), schedule=schedule)
    # a 1,024-token budget splits the 32 prompts of 256 tokens over several batches, so there is work
    # outside the batch in flight whenever stage 0 frees
    eng = Engine(m, hw, [(i, _job()) for i in range(n)], concurrency=n, cost=cost, record_pipeline=True,
                 scheduler=SchedulerConfig(policy="vllm-v1", max_num_seqs=256, max_num_batched_tokens=1024))
    return eng.run()


def _in_flight_at_once(batches):
    ev = sorted([(b["formed_s"], 1) for b in batches] + [(b["end_s"][-1], -1) for b in batches])
    n = top = 0
    for _, d in ev:     # an end sorts before a formation at the same instant
        n += d
        top = max(top, n)
    return top


@pytest.mark.parametrize("pp", [2, 4])
def test_overlapped_pipeline_beats_serial_and_is_the_schedule_it_ran(pp):
    ov, se = _serve("overlapped", pp), _serve("serial", pp)
    # the same work either way
    assert ov.gen_tokens == se.gen_tokens and ov.tokens == pytest.approx(se.tokens)
    assert ov.makespan < 0.9 * se.makespan
    bo, bs = ov.pipeline["batches"], se.pipeline["batches"]
    # the engine's batches follow vLLM's schedule of those batches (formed no earlier than the engine formed them)
    st = [b["stage_s"] for b in bo]
    sched = pipeline_schedule(st, release=[b["formed_s"] for b in bo])
    np.testing.assert_allclose([b["end_s"] for b in bo], sched["end"], rtol=1e-12, atol=1e-12)
    assert ov.makespan == pytest.approx(sched["makespan"], rel=1e-12)
    # enough independent requests: the pipeline never waited for work, so it is pipeline_schedule as such
    assert ov.makespan == pytest.approx(pipeline_schedule(st)["makespan"], rel=1e-12)
    assert _in_flight_at_once(bo) == pp
    # serial: one batch in flight, each through every stage
    ser = pipeline_schedule([b["stage_s"] for b in bs], in_flight=1, release=[b["formed_s"] for b in bs])
    np.testing.assert_allclose([b["end_s"] for b in bs], ser["end"], rtol=1e-12, atol=1e-12)
    assert _in_flight_at_once(bs) == 1
    # bubbles: each stage's idle share of the makespan, smaller when batches overlap
    for r, b in ((ov, bo), (se, bs)):
        busy = [sum(x["stage_s"][k] for x in b) for k in range(pp)]
        assert r.pipeline["stage_busy_s"] == pytest.approx(busy, rel=1e-12)
        assert r.pipeline["bubble_fraction"] == pytest.approx([1 - x / r.makespan for x in busy], rel=1e-9)
    assert max(ov.pipeline["bubble_fraction"]) < min(se.pipeline["bubble_fraction"])
    assert min(se.pipeline["bubble_fraction"]) > 1 - 1 / pp - 0.05


def test_a_request_is_never_in_two_in_flight_batches():
    res = _serve("overlapped", 4)
    spans: dict = {}
    for b in res.pipeline["batches"]:
        for r in b["requests"]:
            spans.setdefault(r, []).append((b["formed_s"], b["end_s"][-1]))
    assert len(spans) == 32
    for r, sp in spans.items():
        sp.sort()
        for (_, e0), (s1, _) in zip(sp, sp[1:]):
            assert s1 >= e0, r     # formed again only once its previous batch left the last stage


def test_scheduler_skips_and_never_preempts_requests_in_flight():
    kv = BlockManager(4, 4)
    s = Scheduler(SchedulerConfig(policy="vllm-v1", max_num_seqs=8, max_num_batched_tokens=64), kv)
    a, b = Request("a", 8, 4), Request("b", 7, 4)
    s.add(a)
    s.add(b)
    s.update(s.schedule())          # both prompts in: a holds 2 blocks + its sampled token, b 2 blocks
    out = s.schedule(busy={"b"})    # b in flight: only a runs; a's next block needs room
    assert [it.req.req_id for it in out.items] == [] and [r.req_id for r in out.preempted] == ["a"]
    assert b.status == "running" and b.num_computed_tokens == 7   # the newest, but in flight: untouched
    out = s.schedule()
    assert [it.req.req_id for it in out.items] == ["b"]


def test_pipeline_schedule_option_is_declared_once_and_checked():
    flags = {f.name: o.flag for f, o in declared(TargetSpec)}
    assert flags["pipeline_schedule"] == "--pipeline-schedule"
    assert TargetSpec().pipeline_schedule == "overlapped"
    with pytest.raises(ConfigError, match="pipeline_schedule"):
        TargetSpec(pipeline_schedule="eager")
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    with pytest.raises(ParallelError, match="--pipeline-schedule"):
        ParallelCost(m, hw, node, ParallelConfig(1, 2), schedule="eager")
