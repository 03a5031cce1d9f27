"""Fast-forward windows over problems of several branches (``rksim serve``, ``simulate --mode serving``, ``plan``):
every figure equal to the stepped engine's.

Random problems -- 1-4 branches, gate passes, branches that read a source's KV (copied or as a zero-copy fork),
verification passes of their own or reading the branch's KV (held: those run stepped), scores -- served under
Poisson or closed-loop arrivals, small KV capacities that preempt, and several schedulers; run once with windows
and once step by step (``fast_forward=False``), then compared bit for bit: every problem record, the engine's
counters and timelines, the scheduler's and block manager's statistics and state.
"""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cost.profiles import load_hardware, load_model
from sim.serving.engine import Engine
from sim.serving.replicas import Replicas
from sim.serving.router import ROUTERS, make_router
from sim.serving.scheduler import SchedulerConfig
from sim.workload.job import Job

from test_fastforward import _same

MODEL, HW = load_model("llama-3-8b"), load_hardware("h100-sxm")
L = MODEL.n_layers


def _job(rng, B: int, verify: bool, v_reuse: bool, gates: bool, sources: bool, bs: int) -> Job:
    ctx = rng.integers(8, 120, B)
    gen = rng.integers(1, 60, B)
    src = np.full(B, -1, np.int64)
    reused = np.zeros(B, np.int64)
    share = np.zeros(B, bool)
    if sources:
        for b in range(1, B):
            if rng.random() < 0.6:    # the root's KV, as ASKS plans it (trace_workload's jobs)
                s = 0
                src[b] = s
                if rng.random() < 0.3:    # a zero-copy fork of its source's whole prompt
                    share[b] = True
                    ctx[b] = ctx[s]
                    reused[b] = ctx[b]
                else:
                    reused[b] = int(rng.integers(0, min(ctx[b], ctx[s]) + 1))
    computed = ctx - reused
    z = np.zeros(B, np.int64)
    # none: a held branch's verification with nothing to compute (answered at once; a pass of its own has >= 1)
    v_new = (np.where(rng.random(B) < 0.3, rng.integers(0 if v_reuse else 1, 2, B), rng.integers(1, 30, B)) if verify
             else z)
    return Job(B=B, L=L, bs=bs, reused=reused, computed=computed, copy=z, gate=rng.integers(0, 3, B) * 8 if gates
               else z, source=src, share=share, ctx=ctx, gen=gen, own=computed, verify_on=verify, v_new=v_new,
               v_cached=z, v_layers=np.full(B, L), v_probes=z, v_head=np.ones(B, np.int64), v_kv_tokens=v_new,
               v_reuse=v_reuse and verify, score=rng.random(B))


def _run(jobs, fast: bool, **kw):
    eng = Engine(MODEL, HW, jobs, fast_forward=fast, record_token_times=True, **kw)
    res = eng.run()
    return eng, res, res.records()


def _check(jobs, **kw):
    (ea, ra, reca), (eb, rb, recb) = (_run(jobs, f, **kw) for f in (True, False))
    assert len(reca) == len(jobs)
    _same(reca, recb, "records")
    for f in ("timeline_t", "timeline_b", "timeline_running", "iterations", "makespan", "busy", "mean_running",
              "tokens", "stats", "gen_tokens"):
        _same(getattr(ra, f), getattr(rb, f), f)
    assert ea.items_scheduled == eb.items_scheduled and ea.run_time == eb.run_time
    ka, kb = ea.kv, eb.kv
    for f in ("n_clean", "evictions", "hits", "queries", "peak_used", "tick", "_next_id"):
        _same(getattr(ka, f), getattr(kb, f), f"kv.{f}")
    assert sorted(ka.cached) == sorted(kb.cached) and sorted(ka._evictable) == sorted(kb._evictable)
    ka.check()
    return ea


@settings(max_examples=int(os.environ.get("FF_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 12), Bmax=st.sampled_from([1, 2, 4, 4]), verify=st.booleans(), v_reuse=st.booleans(),
       gates=st.booleans(), sources=st.booleans(), seed=st.integers(0, 10 ** 6),
       blocks=st.sampled_from([None, None, 60, 120, 300]), bs=st.sampled_from([16, 16, 4]),
       rate=st.sampled_from([None, 2.0, 20.0, 200.0]), conc=st.sampled_from([1, 3]),
       policy=st.sampled_from(["vllm-v1", "vllm-v1", "prefill-first", "vllm-v1-chunk-admit"]),
       seqs=st.sampled_from([None, 4, 16]), tokens=st.sampled_from([None, 64, 512]), caching=st.booleans(),
       host=st.booleans())
def test_windows_over_branches_equal_the_stepped_engine(n, Bmax, verify, v_reuse, gates, sources, seed, blocks, bs,
                                                        rate, conc, policy, seqs, tokens, caching, host):
    rng = np.random.default_rng(seed)
    jobs = [(i, _job(rng, int(rng.integers(1, Bmax + 1)), verify, v_reuse, gates, sources, bs)) for i in range(n)]
    need = max(int(np.ceil((j.ctx + j.gen + j.v_new).max() / bs)) * j.B for _, j in jobs)
    sc = SchedulerConfig(policy=policy, **({} if seqs is None else {"max_num_seqs": seqs}),
                         **({} if tokens is None else {"max_num_batched_tokens": max(tokens, 128)}))
    kw = dict(scheduler=sc, kv_blocks=None if blocks is None else max(blocks, need + 2), caching=caching,
              block_size=bs, seed=seed, arrival_rate=rate, concurrency=conc)
    if host:
        kw.update(host_step=HW.host_step, async_scheduling=bool(seed % 2))
    _check(jobs, **kw)


def test_a_plan_of_branching_problems_takes_windows():
    """Eight branches per problem, each verified by its own pass (no KV read back: ``no-kv``'s shape), at a
    steady Poisson rate: most decode steps run in windows, spanning the branches' finishes; the figures equal the
    stepped engine's."""
    rng = np.random.default_rng(3)
    jobs = [(i, _job(rng, 8, True, False, False, False, 16)) for i in range(30)]
    eng = _check(jobs, scheduler=SchedulerConfig(policy="vllm-v1"), arrival_rate=8.0, seed=1)
    ff = eng._ff
    assert ff is not None and ff.multi and ff.windows > 30 and ff.steps > 0.8 * eng.iterations


def test_serve_simulate_and_plan_print_the_same_step_by_step(capsys, monkeypatch):
    """``rksim serve``, ``simulate --mode serving`` and ``plan`` on the bundled trace take windows by default and
    print the same JSON with ``--step-by-step``, which takes none (its plan records the flag), but for the count of
    simpy events processed."""
    import json

    import sim.serving.fastforward as ffm
    from app.cli import main

    windows = []
    orig = ffm.FastForward._apply

    def counted(self, w):
        windows.append(1)
        return orig(self, w)
    monkeypatch.setattr(ffm.FastForward, "_apply", counted)
    target = ["--model-preset", "llama-3-8b", "--hardware", "h100-sxm"]
    runs = {"serve": ["serve", "--policy", "no-kv", *target, "--problem-rate", "4", "--workload", "n_requests=40"],
            "simulate": ["simulate", "--policy", "no-kv", *target, "--mode", "serving", "--problem-rate", "4"],
            "plan": ["plan", *target, "--gpus", "1", "--policies", "no-kv", "--tensor-parallel-size", "1",
                     "--problem-rate", "4", "--num-problems", "40"]}
    for name, args in runs.items():
        outs = []
        for extra in ([], ["--step-by-step"]):
            windows.clear()
            assert main([*args, "--json", *extra]) == 0
            doc = json.loads(capsys.readouterr().out)
            outs.append((doc, len(windows)))
        (fast, n_fast), (step, n_step) = outs
        assert n_fast > 0 and n_step == 0, name
        if name == "plan":
            for d in (fast, step):
                d["meta"].pop("wall_s")
            assert step["meta"].pop("target_options") == {"step_by_step": True}
            assert fast["meta"].pop("target_options") == {}
        if name != "plan":   # the simpy events processed: the one count a window changes (fewer, as in bench)
            assert fast.pop("events") < step.pop("events"), name
        assert fast == step, name


@settings(max_examples=int(os.environ.get("FF_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 10), Bmax=st.sampled_from([1, 4, 4]), verify=st.booleans(), v_reuse=st.booleans(),
       sources=st.booleans(), seed=st.integers(0, 10 ** 6), dp=st.sampled_from([1, 1, 2, 3]),
       router=st.sampled_from(sorted(ROUTERS)), rate=st.sampled_from([2.0, 20.0, 200.0]),
       blocks=st.sampled_from([None, 120, 300]), host=st.booleans())
def test_replicas_of_branching_problems_take_windows_with_the_stepped_figures(n, Bmax, verify, v_reuse, sources, seed,
                                                                              dp, router, rate, blocks, host):
    """Poisson arrivals (``plan``'s and ``serve``'s replicas): the replicas take windows as a fleet; every problem
    record, routing decision and replica's figures equal the stepped run's."""
    rng = np.random.default_rng(seed)
    jobs = [(i, _job(rng, int(rng.integers(1, Bmax + 1)), verify, v_reuse, False, sources, 16)) for i in range(n)]
    need = max(int(np.ceil((j.ctx + j.gen + j.v_new).max() / 16)) * j.B for _, j in jobs)
    kw = dict(scheduler=SchedulerConfig(policy="vllm-v1"), kv_blocks=None if blocks is None else max(blocks, need + 2),
              arrival_rate=rate, seed=seed)
    if host:
        kw.update(host_step=HW.host_step, async_scheduling=True)
    runs = [Replicas(MODEL, HW, jobs, make_router(router, dp), dp, fast_forward=f, **kw).run() for f in (True, False)]
    (a, b) = runs
    _same(a.problems, b.problems, "problems")
    _same([list(x) for x in a.routing], [list(x) for x in b.routing], "routing")
    assert a.makespan == b.makespan and a.lost == b.lost
    for ra, rb in zip(a.results, b.results):
        for f in ("timeline_t", "timeline_b", "timeline_running", "iterations", "makespan", "busy", "mean_running",
                  "tokens", "stats", "gen_tokens"):
            _same(getattr(ra, f), getattr(rb, f), f)


def test_step_by_step_is_refused_outside_serving_mode(capsys):
    """Isolated mode has no windows to leave out: the flag is refused by name, nothing runs."""
    from app.cli import main

    rc = main(["simulate", "--policy", "no-kv", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm",
               "--step-by-step"])
    assert rc != 0 and "--step-by-step: only meaningful with mode='serving'" in capsys.readouterr().err


def test_a_held_branch_with_nothing_to_verify_answers_its_user_at_its_finish():
    """Closed loop, verification that reads the branch's KV with no token to compute (``v_new`` 0, as CGEE skips
    it): the last branch's finish answers the problem there and the user sends the next one, so no window may run
    past that finish (``ff_members.answers_user``)."""
    rng = np.random.default_rng(11)
    jobs = []
    for i in range(12):
        j = _job(rng, int(rng.integers(1, 4)), True, True, False, False, 16)
        z = np.zeros(j.B, np.int64)
        jobs.append((i, j.fresh(v_new=z, v_kv_tokens=z)))
    eng = _check(jobs, scheduler=SchedulerConfig(policy="vllm-v1"), concurrency=3, seed=2)
    assert eng._ff is not None and eng._ff.windows > 10
