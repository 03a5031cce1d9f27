"""The fleet's clock (:mod:`sim.serving.fleet_clock`): the next event no engine made, as simpy runs them."""
from __future__ import annotations

import math

import simpy

from sim.serving.fleet_clock import FleetClock, StepTimeout


def _fleet(env, delay):
    """Two engines (``delay(env, d)``: their own step delays) and an arrival process on ``env``; the
    ``(who, time)`` of every event they see, filled as ``env`` runs."""
    seen = []

    def engine(name, delays):
        for d in delays:
            yield delay(env, d)
            seen.append((name, env.now))

    def arrivals(times):
        for t in times:
            yield env.timeout(t - env.now)
            seen.append(("arrival", env.now))

    env.process(engine("a", [0.5, 0.5, 0.5]))
    env.process(engine("b", [0.3, 2.0]))
    env.process(arrivals([1.2, 2.5]))
    return seen


def test_peek_foreign_skips_the_engines_own_delays_and_processed_events():
    env = FleetClock()
    seen = _fleet(env, StepTimeout)
    # the processes' start events are the first foreign events (time 0)
    assert env.peek_foreign() == 0.0
    for _ in range(3):
        env.step()      # the three processes start: the engines' first delays and the first arrival are pending
    assert env.peek() == 0.3 and env.peek_foreign() == 1.2
    while not seen or seen[-1][0] != "arrival":
        env.step()
    assert seen == [("b", 0.3), ("a", 0.5), ("a", 1.0), ("arrival", 1.2)]
    assert env.peek_foreign() == 2.5      # the next arrival, past a's step at 1.5 and b's at 2.3
    env.run()
    assert env.peek_foreign() == math.inf and not env._foreign
    # the queue's order is simpy's own: the same run on a plain clock sees the same events at the same times
    plain = simpy.Environment()
    seen2 = _fleet(plain, simpy.Timeout)
    plain.run()
    assert seen2 == seen


def test_a_fleet_engine_needs_the_fleet_clock():
    """An engine told it is a fleet's replica on a plain simpy clock is refused by name (its windows would read
    the other replicas' steps as events)."""
    import pytest

    from sim.cost.profiles import load_hardware, load_model
    from sim.serving.engine import Engine
    with pytest.raises(ValueError, match="fleet=True needs env to be a sim.serving.fleet_clock.FleetClock"):
        Engine(load_model("llama-3-8b"), load_hardware("h100-sxm"), [], env=simpy.Environment(), settle=1,
               fleet=True)
    eng = Engine(load_model("llama-3-8b"), load_hardware("h100-sxm"), [], env=FleetClock(), settle=1, fleet=True)
    assert eng.peek_next == eng.env.peek_foreign
