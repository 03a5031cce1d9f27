"""When an arriving request can first be scheduled: at the next step (sync), or a step later (async scheduling).

With ``--async-scheduling`` vLLM's engine core runs a queue of two batches (``EngineCore.step_with_batch_queue``,
vLLM PR #19970): it schedules step ``n + 1`` and submits it as soon as step ``n`` is submitted, then blocks on step
``n - 1``'s output, applies it, reads its input queue (``_process_input_queue``: the requests that arrived) and
schedules again. So the schedule of the step that starts at ``T_n`` is made when the step before it starts, at
``T_{n-1}``, and a request that arrives while step ``n - 1`` runs is first scheduled into step ``n + 1``::

    sync:   a request arriving at a is scheduled at the first step start T_n >= a
    async:  ... at the first T_n with T_{n-1} >= a   (about one step later under load)

When the engine has nothing scheduled (it idled, or the step before had no request left to schedule), the engine
core reads its input and schedules at once: the request goes into the next step, as in sync. The rule applies to
requests that arrive from outside (:meth:`Engine.submit`, a problem's arrival); the requests a problem queues itself
later (a verification pass, a gated branch) are queued at once, as an orchestrator inside the engine's process
would. Pipeline-parallel engines keep the sync rule.
"""
from __future__ import annotations

from collections import deque


class AsyncIntake:
    """Arrivals held back until the schedule that vLLM's one-step-ahead engine core would make with them.

    The engine calls :meth:`hold` for an arriving request, :meth:`began` for every step it runs (its start and
    end), and :meth:`release` before each schedule: the held requests that arrived by the cutoff join the
    scheduler's waiting queue, in arrival order.
    """

    def __init__(self):
        self.held: deque = deque()     # (arrival time, request), in arrival order
        self.start = float("-inf")     # the last step's start and end
        self.end = float("-inf")

    def hold(self, req, now: float) -> None:
        self.held.append((now, req))

    def began(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def release(self, now: float, sched, force: bool = False) -> bool:
        """Queue the held requests the schedule at ``now`` sees; True if some stay held.

        The cutoff is the last step's start where that step ends now (the schedule was made then), else ``now``;
        ``now`` too where the scheduler has nothing else (the engine core schedules at once) or ``force``."""
        held = self.held
        if not held:
            return False
        cutoff = self.start if (self.end == now and not force and (sched.running or sched.waiting)) else now
        while held and held[0][0] <= cutoff:
            sched.add(held.popleft()[1])
        return bool(held)
