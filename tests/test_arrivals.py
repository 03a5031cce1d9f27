"""The one arrival process and driving loop (sim/serving/arrivals.py) of the engine, replicas and bench."""
from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from sim.serving import arrivals


def _drive(arr, n, service):
    """Run ``arr`` against a fake server answering problem ``i`` after ``service[i]`` s; returns
    (submit time per problem, answer time per problem, the most outstanding at once, sent times)."""
    env = simpy.Environment()
    sub, ans, live, most = {}, {}, [0], [0]
    sent: dict = {}

    def submit(i, hold):
        sub[i] = env.now
        live[0] += 1
        most[0] = max(most[0], live[0])
        done = env.timeout(service[i])

        def answered(_e, i=i):
            live[0] -= 1
            ans[i] = env.now
        done.callbacks.append(answered)
        return done if hold else None

    arrivals.start(env, arr, n, submit, sent)
    arrivals.run_until_empty(env, [])
    return sub, ans, most[0], sent


def test_poisson_is_seeded_and_draws_exponential_gaps():
    """Gaps are ``default_rng(seed).exponential(1 / rate)``, the first problem at 0; same seed, same times."""
    n, rate = 50, 4.0
    a, _, _, _ = _drive(arrivals.Poisson(rate, seed=7), n, [0.1] * n)
    b, _, _, _ = _drive(arrivals.Poisson(rate, seed=7), n, [0.1] * n)
    c, _, _, _ = _drive(arrivals.Poisson(rate, seed=8), n, [0.1] * n)
    assert a == b and a != c
    rng = np.random.default_rng(7)
    want = np.concatenate(([0.0], np.cumsum([rng.exponential(1.0 / rate) for _ in range(n - 1)])))
    np.testing.assert_array_equal([a[i] for i in range(n)], want)


def test_closed_loop_user_u_submits_u_plus_kc_each_when_answered():
    """Two users over five problems of 1 s each: user 0 sends 0, 2, 4 at 0, 1, 2 s; user 1 sends 1, 3 at 0, 1 s."""
    sub, ans, most, _ = _drive(arrivals.ClosedLoop(2), 5, [1.0] * 5)
    assert sub == {0: 0.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 2.0}
    assert most == 2 and max(ans.values()) == 3.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0.01, 5)), min_size=1, max_size=25),
       st.one_of(st.none(), st.integers(1, 6)))
def test_timed_never_early_never_over_the_cap_fifo(rows, cap):
    """A timed problem is sent no earlier than due, at most ``max_concurrency`` outstanding, slots handed out
    in arrival order (FIFO), and without a cap each is sent exactly when due."""
    times = sorted(t for t, _ in rows)
    service = [s for _, s in rows]
    n = len(rows)
    sub, ans, most, _ = _drive(arrivals.Timed(tuple(times), cap), n, service)
    assert len(sub) == n and len(ans) == n
    for i in range(n):
        assert sub[i] >= times[i]
    if cap is None:
        assert all(sub[i] == times[i] for i in range(n))
    else:
        assert most <= cap
        # FIFO: a later-due problem never gets a slot before an earlier-due one
        assert all(sub[i] <= sub[i + 1] for i in range(n - 1))


def test_timed_api_server_delays_in_turn_and_holds_the_slot_after():
    """One API server, 0.5 s each before the engine, 2 s after the answer: the second is sent at 0 and reaches
    the engine at 1.0 (behind the first); the slot (cap 1) is held through the after-delay."""
    arr = arrivals.Timed((0.0, 0.0), None, [(0.5, 2.0), (0.5, 2.0)], 1)
    sub, _, _, sent = _drive(arr, 2, [1.0, 1.0])
    assert sent == {0: 0.0, 1: 0.0} and sub == {0: 0.5, 1: 1.0}
    arr = arrivals.Timed((0.0, 0.0), 1, [(0.5, 2.0), (0.5, 2.0)], 1)
    sub, _, _, sent = _drive(arr, 2, [1.0, 1.0])
    # problem 0: engine at 0.5, answered 1.5, slot freed at 3.5; problem 1 sent then, engine at 4.0
    assert sent == {0: 0.0, 1: 3.5} and sub == {0: 0.5, 1: 4.0}


def _api_by_processes(times, delays, servers):
    """The reference: one simpy process per problem through a FIFO ``simpy.Resource`` of ``servers`` (as the
    per-problem processes with client slots pass the API server); (handed-over order, times, sent)."""
    env = simpy.Environment()
    api = simpy.Resource(env, capacity=servers)
    got, sent = [], {}

    def user(i):
        if times[i] > env.now:
            yield env.timeout(times[i] - env.now)
        sent[i] = env.now
        with api.request() as q:
            yield q
            yield env.timeout(delays[i][0])
        got.append((i, env.now))

    for i in range(len(times)):
        env.process(user(i))
    env.run()
    return [i for i, _ in got], [t for _, t in got], sent


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.25, 1.0]) | st.floats(0, 3),
                          st.sampled_from([0.0, 0.05, 0.1]) | st.floats(0, 0.5)), min_size=1, max_size=30),
       st.integers(1, 3), st.booleans())
def test_open_timed_arrivals_hand_over_as_the_processes_did(rows, servers, api):
    """Without client slots every problem is one event at the time it reaches the engine (``submit_times``):
    the same order, the same floats and the same send times as one simpy process per problem through a FIFO
    resource of ``api_servers`` (ties included: equal due times, zero delays); unsorted due times allowed."""
    times = [t for t, _ in rows]
    delays = [(d, 0.0) for _, d in rows] if api else None
    n = len(rows)
    arr = arrivals.Timed(tuple(times), None, delays, servers)
    env = simpy.Environment()
    got, sent = [], {}
    arrivals.start(env, arr, n, lambda i, hold: got.append((i, env.now, hold)), sent)
    arrivals.run_until_empty(env, [])
    assert all(h is False for _, _, h in got)
    if api:
        order, at, ref_sent = _api_by_processes(times, delays, servers)
        assert [i for i, _, _ in got] == order and [t for _, t, _ in got] == at
        assert sent == ref_sent
    else:
        assert [i for i, _, _ in got] == sorted(range(n), key=lambda i: (times[i], i))
        assert [t for _, t, _ in got] == sorted(times) and sent == {}   # no API server: sent is when it arrives


def test_of_picks_the_process_and_checks_the_times():
    assert arrivals.of(3) == arrivals.ClosedLoop(1)
    assert arrivals.of(3, arrival_rate=2.0, seed=5) == arrivals.Poisson(2.0, 5)
    assert arrivals.of(2, arrival_times=[0, 1], max_concurrency=1) == arrivals.Timed((0.0, 1.0), 1, None, 1)
    with pytest.raises(ValueError, match="2 arrival times for 3 jobs"):
        arrivals.of(3, arrival_times=[0, 1])
    with pytest.raises(TypeError, match="ClosedLoop, Poisson or Timed"):
        arrivals.start(simpy.Environment(), object(), 1, lambda i, h: None)


def test_run_until_empty_reraises_the_accelerators_failure():
    env = simpy.Environment()

    class TwoPart(RuntimeError):   # not rebuilt from its args (simpy's copy of it fails): the original is raised
        def __init__(self, what, where):
            super().__init__(f"{what} at {where}")

    err = TwoPart("boom", "step 3")

    def acc():
        yield env.timeout(1.0)
        raise err

    a = env.process(acc())
    with pytest.raises(TwoPart, match="boom at step 3") as got:
        arrivals.run_until_empty(env, [a])
    assert got.value is err
    env = simpy.Environment()
    env.timeout(2.0)
    assert arrivals.run_until_empty(env, []) == 1 and env.now == 2.0


def _job():
    from sim.workload.job import Job
    z = np.zeros(2, np.int64)
    ctx, gen = np.array([8, 8]), np.array([9, 9])
    return Job(B=2, L=24, bs=4, reused=z, computed=ctx, copy=z, gate=z, source=np.array([-1, -1]),
               share=np.zeros(2, bool), ctx=ctx, gen=gen, own=ctx, verify_on=False, v_new=z, v_cached=z,
               v_layers=np.array([24, 24]), v_probes=z, v_head=np.ones(2, np.int64), v_kv_tokens=z, v_reuse=False,
               score=np.array([0.5, 0.5]))


@pytest.mark.parametrize("kw", [{"arrival_rate": 3.0, "seed": 4}, {"concurrency": 2},
                                {"arrival_times": [0.0, 0.0, 0.1, 0.2, 5.0, 5.0], "max_concurrency": 2}])
def test_engine_arrivals_are_the_modules_and_seeded_runs_repeat(kw):
    """The engine's problems arrive when this module's process submits them (a fake server under the same
    process gives the same Poisson / timed-without-cap times), and a seeded run repeats bit for bit."""
    from sim.cost.profiles import load_hardware, load_model
    from sim.serving.engine import Engine
    m, hw = load_model("qwen3-4b"), load_hardware("h100-sxm")
    jobs = [(k, _job()) for k in range(6)]
    r1 = Engine(m, hw, jobs, **kw).run().records()
    r2 = Engine(m, hw, jobs, **kw).run().records()
    assert [r["arrival_s"] for r in r1] == [r["arrival_s"] for r in r2]
    assert [r["end_s"] for r in r1] == [r["end_s"] for r in r2]
    if "arrival_rate" in kw:
        sub, _, _, _ = _drive(arrivals.Poisson(3.0, 4), 6, [1.0] * 6)
        assert [r["arrival_s"] for r in r1] == [sub[i] for i in range(6)]
    elif "concurrency" in kw:
        # closed loop: user 0 sends problem 2 exactly when problem 0 is answered
        assert r1[2]["arrival_s"] == r1[0]["end_s"] and r1[3]["arrival_s"] == r1[1]["end_s"]
    else:
        # at most 2 outstanding: problem 2 is sent when one of 0, 1 is answered, and never before it is due
        assert r1[2]["arrival_s"] == max(0.1, min(r1[0]["end_s"], r1[1]["end_s"]))
        assert all(r["arrival_s"] >= t for r, t in zip(r1, kw["arrival_times"]))
