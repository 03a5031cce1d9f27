"""How problems reach the engines: one arrival process and one driving loop for every caller.

The single engine (:class:`sim.serving.engine.Engine`), the replica fleet (:mod:`sim.serving.replicas`)
and the bench's replicated run (:func:`sim.bench.plain._replicated`) all start their users here and step
their clock with :func:`run_until_empty`; each passes a ``submit(pseq, hold)`` callback that hands
problem ``pseq`` to its engine(s) now and returns the event succeeded when it is answered (or None).
``hold`` says whether the caller's user waits on the answer (closed loop, or a client slot).

* :class:`ClosedLoop` -- ``concurrency`` users, user ``u`` submitting problems ``u, u + c, u + 2c, ...``
  each when the previous one is answered (``concurrency = 1``: isolated mode).
* :class:`Poisson` -- a seeded Poisson process: inter-arrival gaps ``Exp(1 / rate)`` drawn from
  ``numpy.random.default_rng(seed)``, the first problem at ``t = 0``.
* :class:`Timed` -- problem ``i`` due at ``times[i]``; with ``max_concurrency`` it is sent when it holds one
  of that many client slots (FIFO; ``vllm bench serve``'s semaphore) and holds it until answered; with
  ``client_delays`` (per problem ``(before_s, after_s)``) it first passes the API server (``api_servers``
  at a time, FIFO, ``before_s`` each) and keeps its slot ``after_s`` past the answer (the last chunk's
  delivery). Without ``max_concurrency`` nothing waits on an answer: each problem is one event, scheduled at the
  start at the time it reaches the engine (:func:`submit_times`), not a process (a day of traffic holds no
  process per request, and the clock carries one event per arrival).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import simpy


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` closed-loop users (module docstring)."""
    concurrency: int = 1


@dataclass(frozen=True)
class Poisson:
    """Poisson arrivals of ``rate`` problems/s, gaps from ``default_rng(seed)`` (module docstring)."""
    rate: float
    seed: int = 0


@dataclass(frozen=True)
class Timed:
    """Arrivals at given times, at most ``max_concurrency`` outstanding, an optional API server in front."""
    times: tuple
    max_concurrency: int | None = None
    client_delays: object = None
    api_servers: int = 1


def of(n: int, *, concurrency: int = 1, arrival_rate: float | None = None, seed: int = 0, arrival_times=None,
       max_concurrency: int | None = None, client_delays=None, api_servers: int = 1):
    """The arrival process the engine's keywords name (``arrival_times`` first, then ``arrival_rate``)."""
    if arrival_times is not None:
        times = tuple(float(t) for t in arrival_times)
        if len(times) != n:
            raise ValueError(f"engine: {len(times)} arrival times for {n} jobs")
        return Timed(times, max_concurrency, client_delays, int(api_servers))
    if arrival_rate is not None:
        return Poisson(arrival_rate, seed)
    return ClosedLoop(int(concurrency))


def start(env: simpy.Environment, arrivals, n: int, submit, sent: dict | None = None) -> None:
    """Start the user processes of ``arrivals`` for problems ``0 .. n-1`` on ``env``.

    ``submit(pseq, hold)`` hands problem ``pseq`` over now and returns its answered event (None allowed
    when ``hold`` is False); ``sent[pseq]`` records when a :class:`Timed` client sent it (with delays).
    """
    if isinstance(arrivals, Timed) and not arrivals.max_concurrency:
        _timed_open(env, arrivals, n, submit, sent)
    elif isinstance(arrivals, Timed):
        slots = simpy.Resource(env, capacity=int(arrivals.max_concurrency))
        api = simpy.Resource(env, capacity=arrivals.api_servers) if arrivals.client_delays is not None else None
        for pseq in range(n):
            env.process(_timed(env, arrivals, pseq, slots, api, submit, sent))
    elif isinstance(arrivals, Poisson):
        env.process(_poisson(env, arrivals, n, submit))
    elif isinstance(arrivals, ClosedLoop):
        c = arrivals.concurrency
        for u in range(min(c, n)):
            env.process(_closed_loop(list(range(u, n, c)), submit))
    else:
        raise TypeError(f"arrivals: expected ClosedLoop, Poisson or Timed, got {type(arrivals).__name__}")


def _closed_loop(mine, submit):
    for pseq in mine:
        yield submit(pseq, True)


def _poisson(env, arr: Poisson, n: int, submit):
    rng = np.random.default_rng(arr.seed)
    for pseq in range(n):
        if pseq:
            yield env.timeout(float(rng.exponential(1.0 / arr.rate)))
        submit(pseq, False)


def submit_times(arr: Timed, n: int, now: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Without client slots, when each of problems ``0 .. n-1`` reaches the engine: ``(order, at)``, the problems in
    the order they are handed over and their times.

    A problem is sent at ``max(times[i], now)``; with ``client_delays`` it waits for the first of ``api_servers``
    servers to be free (FIFO in the order sent, ties by problem number, as simpy's resource serves them) and is
    handed over ``before_s`` later: ``start_i = max(sent_i, free)``, ``at_i = start_i + before_i`` (Lindley's
    recursion; the same float additions as the processes' clock makes). Nothing waits on an answer, so these are
    known before the run."""
    sent = np.maximum(np.asarray(arr.times[:n], np.float64), now)
    order = np.argsort(sent, kind="stable")
    if arr.client_delays is None:
        return order, sent[order]
    free = [now] * max(1, int(arr.api_servers))   # each server's next free time (a heap)
    at = np.empty(n, np.float64)
    delays = arr.client_delays
    for k, i in enumerate(order.tolist()):
        at[k] = max(float(sent[i]), heapq.heappop(free)) + float(delays[i][0])
        heapq.heappush(free, float(at[k]))
    by = np.argsort(at, kind="stable")   # by time, then by service start: FIFO starts never decrease
    return order[by], at[by]


def _timed_open(env, arr: Timed, n: int, submit, sent) -> None:
    """Problems of a :class:`Timed` process without client slots: one event each, scheduled now at the time it reaches
    the engine (:func:`submit_times`: a delay from now, as the per-problem processes' first timeout, so the clock
    lands on the same float), whose callback hands it over. No process per problem: nothing waits on an answer."""
    order, at = submit_times(arr, n, env.now)
    now = env.now
    if sent is not None and arr.client_delays is not None:   # when each was sent (the client's clock, in front of
        sent.update(enumerate(np.maximum(np.asarray(arr.times[:n], np.float64), now).tolist()))   # the API server)

    def fire(ev):
        submit(ev.value, False)

    for i, t in zip(order.tolist(), at.tolist()):
        ev = env.timeout(t - now if t > now else 0.0, value=i)
        ev.callbacks.append(fire)


def _timed(env, arr: Timed, pseq: int, slots, api, submit, sent):
    t = arr.times[pseq]
    if t > env.now:
        yield env.timeout(t - env.now)
    slot = None
    if slots is not None:
        slot = slots.request()
        yield slot
    after = 0.0
    if api is not None:
        if sent is not None:
            sent[pseq] = env.now
        before, after = arr.client_delays[pseq]
        with api.request() as q:   # the API server takes requests in turn
            yield q
            yield env.timeout(before)
    done = submit(pseq, slot is not None)
    if done is not None:
        yield done
    if slot is not None:
        if after > 0:
            yield env.timeout(after)   # the client holds its slot until the last chunk arrives
        slots.release(slot)


def run_until_empty(env: simpy.Environment, accelerators) -> int:
    """Step ``env`` until no event is left; re-raise an accelerator process's failure at once (simpy's ``step``
    raises a copy of a failed process's exception where nothing waits on it: the original is raised instead).
    Returns the number of simpy events processed."""
    step = env.step
    n_ev = 0
    try:
        while True:
            step()
            n_ev += 1
    except simpy.core.EmptySchedule:
        pass
    except BaseException:
        for a in accelerators:
            if a.triggered and not a.ok:
                raise a.value from None
        raise
    for a in accelerators:
        if a.triggered and not a.ok:  # pragma: no cover - a failure nothing waited on raised above
            raise a.value
    return n_ev
