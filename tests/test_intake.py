"""Async scheduling's one-step-ahead schedule (:mod:`sim.serving.intake`): an arrival while a step runs is first
scheduled a step later than under sync scheduling, and an idle engine takes it at once."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.bench import plain
from sim.bench.plain_workload import PlainWorkload
from sim.cost.profiles import load_hardware, load_model
from sim.cost.overheads import HostStepCost
from sim.serving.intake import AsyncIntake

MODEL = load_model("llama-3-8b")
# the engine core's host work is modelled (a host_step), at no cost: sync and async steps then take the same
# seconds (max(g + 0, 0) = g + 0), so only when a request is first scheduled differs
HW = dataclasses.replace(load_hardware("h100-sxm"), host_step=HostStepCost(base_s=0.0))


class _Sched:
    def __init__(self, running=(), waiting=()):
        self.running, self.waiting = list(running), list(waiting)

    def add(self, req):
        self.waiting.append(req)


def test_release_cutoff_is_the_last_steps_start_when_that_step_ends_now():
    it = AsyncIntake()
    for t, r in ((1.0, "a"), (2.5, "b"), (3.2, "c")):
        it.hold(r, t)
    it.began(2.5, 4.0)                       # the step [2.5, 4.0) was scheduled at 2.5 with "a" and "b" visible
    s = _Sched(running=["x"])
    assert it.release(4.0, s) is True and s.waiting == ["a", "b"]   # b arrived at the cutoff: visible
    it.began(4.0, 5.0)
    assert it.release(5.0, s) is False and s.waiting == ["a", "b", "c"]


def test_release_takes_everything_when_the_engine_idled_or_has_nothing_else():
    it = AsyncIntake()
    it.hold("a", 3.0)
    it.began(1.0, 2.0)                       # the last step ended before now: the engine idled
    s = _Sched(running=["x"])
    assert it.release(3.0, s) is False and s.waiting == ["a"]
    it = AsyncIntake()
    it.hold("a", 3.5)
    it.began(3.0, 4.0)                       # back to back, but nothing else to schedule: the core takes it now
    s = _Sched()
    assert it.release(4.0, s) is False and s.waiting == ["a"]
    it = AsyncIntake()
    it.hold("a", 3.5)
    it.began(3.0, 4.0)
    s = _Sched(running=["x"])
    assert it.release(4.0, s) is True and it.release(4.0, s, force=True) is False and s.waiting == ["a"]


def _two(async_on: bool, second_at: float, step_by_step=False):
    """A long request alone from t = 0, a short one at ``second_at``, no front end."""
    wl = PlainWorkload(np.array([128, 128]), np.array([600, 8]))
    return plain.run(MODEL, HW, wl, arrivals=np.array([0.0, second_at]), async_scheduling=async_on,
                     frontend=False, step_by_step=step_by_step)


@pytest.mark.parametrize("second_at", [0.3001, 1.23456])
def test_an_arrival_mid_step_waits_one_more_step_under_async_scheduling(second_at):
    sync, asy = _two(False, second_at), _two(True, second_at)
    step = float(np.median(sync.itls[0][:20]))           # the long request's decode step, alone
    lag = float(asy.ttft[1] - sync.ttft[1])
    assert lag == pytest.approx(step, rel=0.02)          # one decode step of the long request, alone
    assert asy.ttft[0] == sync.ttft[0]                    # the first request found the engine idle
    for sbs in (True,):                                   # the stepped path agrees bit for bit
        assert np.array_equal(_two(True, second_at, step_by_step=sbs).ttft, asy.ttft)


def test_an_idle_engine_schedules_an_arrival_at_once():
    wl = PlainWorkload(np.array([128, 128]), np.array([4, 4]))
    runs = [plain.run(MODEL, HW, wl, arrivals=np.array([0.0, 5.0]), async_scheduling=a, frontend=False)
            for a in (False, True)]
    assert np.array_equal(runs[0].ttft, runs[1].ttft)


def test_no_intake_where_the_engine_cores_host_work_is_not_modelled():
    """Kernels only (--no-host-time), or a target with no host_step (local-cpu: its fit holds the host): arrivals
    join the next step, as before."""
    sync = _two(False, 0.3001)
    wl = PlainWorkload(np.array([128, 128]), np.array([600, 8]))
    kernels = plain.run(MODEL, HW, wl, arrivals=np.array([0.0, 0.3001]), async_scheduling=True, frontend=False,
                        host_time=False)
    assert np.array_equal(kernels.ttft, sync.ttft)
