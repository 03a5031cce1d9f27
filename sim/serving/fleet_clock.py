"""One simpy clock for several engines that tells each engine the next event none of the engines made.

A decode window (:mod:`sim.serving.fastforward`) advances its engine up to the next event on the clock that could
change what the engine's next step schedules: an arrival, or anything an arrival's path makes (a client's
process, the API server). On a single engine's clock that is simply ``env.peek()``: while the engine plans a
window, its own step has no pending event. Replicas behind a router (:func:`sim.bench.plain._replicated`) share
one clock, and each one's step ends are events too; they touch nothing another replica reads, so a window
must not stop at them (it would be a step or two long). :class:`FleetClock` keeps a second heap of every
event that is not an engine's own delay (:class:`StepTimeout`), and :meth:`FleetClock.peek_foreign` reads
its earliest unprocessed one (lazy deletion: simpy sets a processed event's ``callbacks`` to None).
"""
from __future__ import annotations

import heapq
import itertools
import math

import simpy


class StepTimeout(simpy.Timeout):
    """An engine's own delay (a step, a window's stretch, a settle step): a plain :class:`simpy.Timeout`, marked so
    that :class:`FleetClock` leaves it out of :meth:`FleetClock.peek_foreign`."""


class FleetClock(simpy.Environment):
    """A :class:`simpy.Environment` that also keeps the events no engine made (module docstring).

    :meth:`schedule` is simpy's (the event queue and its order are unchanged) plus one push onto that second heap.
    """

    def __init__(self, initial_time: float = 0):
        super().__init__(initial_time)
        self._foreign: list = []          # (time, order, event) of events not StepTimeout
        self._fid = itertools.count()

    def schedule(self, event, priority=simpy.events.NORMAL, delay=0) -> None:
        super().schedule(event, priority, delay)
        if type(event) is not StepTimeout:
            heapq.heappush(self._foreign, (self.now + delay, next(self._fid), event))

    def peek_foreign(self) -> float:
        """The time of the earliest unprocessed event that is not an engine's :class:`StepTimeout` (inf: none)."""
        f = self._foreign
        while f and f[0][2].callbacks is None:   # processed (simpy.Environment.step): drop it
            heapq.heappop(f)
        return f[0][0] if f else math.inf
