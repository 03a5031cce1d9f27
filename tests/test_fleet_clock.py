"""The fleet's clock (:mod:`sim.serving.fleet_clock`): the next event no engine made, as simpy runs them."""
from __future__ import annotations

import math

import simpy

from sim.serving.fleet_clock import FleetClock, StepTimeout


def test_peek_foreign_skips_the_engines_own_delays_and_processed_events():
    env = FleetClock()
    seen = []

    def engine(name, delays):
        for d in delays:
            yield StepTimeout(env, d)
            seen.append((name, env.now))

    def arrivals(times):
        for t in times:
            yield env.timeout(t - env.now)
            seen.append(("arrival", env.now))

    env.process(engine("a", [0.5, 0.5, 0.5]))
    env.process(engine("b", [0.3, 2.0]))
    env.process(arrivals([1.2, 2.5]))
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
    plain, seen2 = simpy.Environment(), []

    def engine2(name, delays):
        for d in delays:
            yield simpy.Timeout(plain, d)
            seen2.append((name, plain.now))

    def arrivals2(times):
        for t in times:
            yield plain.timeout(t - plain.now)
            seen2.append(("arrival", plain.now))
    plain.process(engine2("a", [0.5, 0.5, 0.5]))
    plain.process(engine2("b", [0.3, 2.0]))
    plain.process(arrivals2([1.2, 2.5]))
    plain.run()
    assert seen2 == seen
