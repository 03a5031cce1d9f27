"""Decode fast-forward: the steps of a decode-only batch advanced at once, exactly.

Between two *events* -- an arrival (anything else on the simpy clock), an admission (a prefill chunk)
-- an iteration of :class:`sim.serving.engine.Engine` is a decode of every running request, one token each.
:meth:`FastForward.advance` finds the steps up to the next event and applies them in one go, with every
state change the stepped iterations would have made; the step that admits waiting requests (or runs the newest
request's next prompt chunk) may be its first, and the step the next event falls in its last. It processes *block
events and batch changes*, not tokens:

* **Eligible.** Every running request decodes (``pending == 1``, past its prompt and its high-water
  mark) but the newest, which may be mid-prompt (its next chunk is the first step's), is a branch's generation
  without token-eviction cache (:func:`sim.serving.ff_admission.plain_branch`: one branch of a plain request, or one
  of a trace problem's several), and all are scheduled (``len(running) <= max_num_batched_tokens``, within the
  fitted batch). A branch held for a verification that reads its KV (``v_reuse``) and done with its generation
  idles in the running list, scheduling nothing (``FastForward.idle``: counted in ``max_num_seqs`` and the running
  counters, not in the token budget; a step that would preempt while one idles is stepped, since the scheduler's
  victim may be it).

* **Blocks.** Request ``i`` with ``c_i`` computed tokens over ``nb_i`` blocks opens a block at steps
  ``f_i + m bs`` (``f_i = nb_i bs - c_i + 1``) and fills one at ``g_i + m bs``; those calls -- a take
  (clean first, else the block policy's victim) and a key registration -- are made in (step, running
  order), the only ``allocate_one`` calls of the stepped path that change anything. Under a release-ordered
  policy (LRU) a filled block's key is registered where its request leaves the window instead (finish,
  preemption, the chain's end: ``Window.lazy``), all of its filled blocks in one call: nothing reads when it was
  keyed, nor a running request's own decode keys, before it frees them. The step where the
  takes exceed the free pool preempts as ``Scheduler._run_running`` does: the scheduler's own
  ``_victim`` / ``_preempt`` (newest first) until the take fits or the taker itself goes.

* **Finishes.** Requests sampling their last token at a step finish after it as ``Scheduler.update``
  and ``Engine._complete`` finish them (blocks freed in running order, then each branch's
  ``ProblemLifecycle._gen_finished`` at the step's end: its score, and once its problem's branches are all done
  the answer or the verification), unless a waiting client's slot (``max_concurrency``) waits on the answer: that
  step is stepped. A held branch stays in the running list (idle, above). A verification that extends the held
  branches ends the window after that step (they compute it next); one queued as its own requests goes behind
  the events that fell in the step, so a step the next event falls in that may queue one is stepped
  (``ff_admission.queues_at``).

* **Problems of several branches** (``FastForward.multi``: one has arrived, or a verified one). A problem's
  decode phase gets every member's share of every step in the stepped order -- step by step, its members in
  running order -- and a step counts once in its iterations (:func:`sim.serving.ff_sums.problem_figures`, written
  at the window's close). A window's mixed first step takes only items whose problem has no member and no other
  item there (a problem's eight branches admitted together are stepped; their decodes then run in windows), and
  the branches a first token starts queue after the step's decode finishes (``Engine._complete``'s item order).

* **The mixed step first** (vLLM V1, :func:`sim.serving.ff_admission.plan`). Where the waiting head is
  admissible now, or the newest running request is mid-prompt (a chunked prefill past the knee, where every step
  has one), the window's first step is the stepped path's mixed step: the decodes allocate, the running tail takes
  its next chunk (its own allocation), then the scheduler's own ``_admit`` takes the waiting requests in order,
  each a one-branch request -- fresh, or resumed after a preemption -- whose whole rest fits the step's budget (it
  samples a token there and decodes from step 2, as a member whose ``c0`` is ``num_tokens - 1``), the last possibly
  a chunk that ends the budget; a tail whose chunk ends its prompt joins the members the same way. The step is
  priced from its items' cost tuples as the stepped path prices it and each item gets its share as
  ``Engine._attribute`` gives it. Its outcome is planned before anything changes: no preemption; each request's hit
  as its turn will find it, its cached chain cut at the first block the takes before it evict from the pool's LRU
  queue (:class:`sim.serving.ff_admission._Victims`); no hit another request of the step could change; the batch
  within the fitted range. Otherwise the step is stepped. A step that leaves a request mid-prompt (it is no member:
  ``Scheduler.update`` advances it there) ends its window; the next window takes its next chunk, from the same
  members. An idle engine's admission is such a window. On a hybrid KV cache (sliding-window layers) the plan follows
  the decodes' takes and releases member by member, and past the mixed step the window reads its members'
  releases from the pool (``ff_blocks.regroup``); where the head is admissible but the decodes preempt, the
  scheduler admits nobody: the window starts with that preemption. Where the head fits before the step's decodes
  take their blocks but not after, the scheduler tries it and admits nobody: the window starts with a decode step,
  the head's lookup counted (``FastForward.head_short``).

* **No admission after the first step.** A waiting head is admitted (vLLM V1 with ``scheduler_reserve_full_isl``, and
  prefill-first) iff ``ceil(num_tokens / bs) - (its cached chain blocks that a running request holds)
  <= free``. While no block is freed the left side never falls (new blocks are the running requests'
  own generated blocks, whose contents are unique, and an eviction only shortens the head's chain) and
  free blocks only fall, so a head that cannot be admitted cannot become admissible; after a step that
  frees blocks (a preemption, a finish) the window checks again and ends where the head fits. Where
  that argument fails, takes must not evict (else the window ends): ``vllm-v1-chunk-admit`` (a shorter
  hit can shrink the first chunk) and a head whose chain keys have duplicate copies. The head's prefix
  lookups of the skipped steps are counted as the scheduler makes them (``queried_blocks`` /
  ``hit_blocks``; V1 after the decodes allocate, prefill-first before, and in a preempting step too).

* **Time.** A uniform decode batch's cost depends on its size ``B``, total context ``S`` and longest
  ``cmax`` only: :meth:`sim.cost.terms.ScalarCost.decode_batch_seconds` (integer-valued closed-form terms, so
  bit for bit :meth:`~sim.cost.terms.ScalarCost.terms`; one numpy pass of :func:`sim.cost.roofline.seconds` per
  stretch of constant ``B``) through ``Engine._window_seconds``, where a per-step host term (affine in
  running requests and scheduled tokens, both ``B``) joins as one more vector function. The steps end
  before the next event on the clock, but the last may be the step the event falls in (it must end strictly
  after it: a tie is stepped): the event's callbacks (an arrival, a client's slot, the API server) only queue
  work that the next step's schedule reads, so they see nothing the window changed; a preempting step is priced
  for every batch size its preemptions can leave before it is applied (none may end on the event; the one past it
  is the window's last). End times ``t_j = t_{j-1} + dt_j`` are ``numpy.cumsum``
  of ``[now, dt_1..dt_k]``, which adds left to right as simpy's clock does (equal floats); so are
  ``busy``, ``run_time`` and each problem's decode phase (``dt_j / B_j`` a step); the clock lands on the
  window's end exactly (:func:`exact_delays`).

* **Tokens.** Window step end times are stored once (:class:`sim.serving.ff_members.StepTimes`) and each
  request refers to the part it was in (:class:`TokenTimes`), so memory grows with events, not tokens, until a
  caller asks for per-token times (``numpy.asarray``).

* **Members carried.** Where the next window starts where the last ended, with nothing run in between, it starts
  from the last one's members as arrays (:mod:`sim.serving.ff_members`): their objects and records are written
  where a member leaves (a finish, a preemption) or the chain ends (:meth:`FastForward.flush`: before the engine
  steps, or a result is read), so a window under arrivals costs O(batch) in numpy, not in Python.

* **Replicas.** Replicas behind a router share one clock (:class:`sim.serving.fleet_clock.FleetClock`), and each
  one's step ends are events on it: they touch nothing another replica reads, so a replica's window runs to the next
  event no engine made (``Engine.peek_next``: an arrival's). The router reads each replica's requests in flight
  (and running): without client slots an answer only lowers that count, so a fleet's window answers requests
  (``user_done`` succeeds in the window: the count drops before the next event, as stepped), except in the step
  the next event falls in (that step is stepped: its answer comes after the event). With client slots an answer can
  send a request to another replica: those fleets step. Where the next arrival leaves fewer than ``FLEET_MIN_STEPS``
  steps, the replica steps (the same figures, cheaper).

Every record, every metric and the scheduler's and block manager's state after a window are those of
the stepped path (``tests/test_fastforward.py`` compares them over random workloads); the one count
that differs is ``EngineResult.events`` (simpy events processed, fewer here).
"""
from __future__ import annotations

import math

import numpy as np

from sim.serving.ff_admission import HEAD_SHORT, Admission, continues, decode_takes, may_admit, plain_branch, plan
from sim.serving.ff_members import Members, StepTimes, answers_user
from sim.serving.ff_blocks import NEVER, group_events
from sim.serving.ff_window import Window
from sim.serving.token_times import TokenTimes, token_times  # noqa: F401  (read here by the engine and tests)
from sim.serving.scheduler import RUNNING, chunk

MAX_STEPS = 4096      # longest window (bounds the per-window arrays)
MIN_STEPS = 2         # shorter windows are stepped (nothing to gain)
# a replica of a fleet (Engine.fleet) steps where the next arrival leaves fewer steps than this at the last window
# step's seconds: every replica's windows end at every arrival, and a short one over a small batch costs more than
# its steps stepped (3 replicas of llama-3-8b / h100-sxm, serve defaults, 3,000 x 1,024/128, CPU s at 6 / 20 / 60
# req/s: every window 5.4 / 5.3 / 4.0, from 2 steps 4.9 / 4.5 / 3.5, from 8 steps 4.7 / 4.4 / 3.3, stepped 7.8 / 4.6
# / 3.2); either way the figures are the same
FLEET_MIN_STEPS = 8
GUARDED = 16          # windows whose first step is also priced item by item, as stepped (a check, O(batch))


def _reach(now: float, end: float):
    """A delay ``d > 0`` with ``now + d == end`` in floats, or None (a tie of the rounding can skip ``end``)."""
    d = end - now
    for _ in range(4):
        if now + d < end:
            d = math.nextafter(d, math.inf)
        elif now + d > end:
            d = math.nextafter(d, -math.inf)
        else:
            break
    return d if d > 0 and now + d == end else None


def exact_delays(now: float, t, dt) -> list:
    """Delays that take simpy's clock (which adds each delay to ``now``) from ``now`` through the window's end
    times ``t[1..k]`` (``t[j] = t[j-1] + dt[j-1]``) to ``t[k]`` exactly: one delay to ``t[k]`` where a float
    reaches it, else one to the latest ``t[j]`` that one reaches, then the steps' own ``dt`` after it (each
    lands exactly: that is how ``t`` was summed)."""
    k = len(dt)
    for j in range(k, 0, -1):
        d = _reach(now, float(t[j]))
        if d is not None:
            return [d] + [float(x) for x in dt[j:]]
    return [float(x) for x in dt]   # pragma: no cover - t[1] = now + dt[0] is always reached


class FastForward:
    """The window of one :class:`sim.serving.engine.Engine` (module docstring): :meth:`advance` applies it."""

    def __init__(self, eng, min_steps: int = MIN_STEPS, max_steps: int = MAX_STEPS, chunk: int = 256):
        self.eng = eng
        self.min_steps = int(min_steps)
        self.max_steps = int(max_steps)
        self.cap = None           # at most this many steps in the next window (one: an arrival held back a step)
        self.chunk = int(chunk)   # block events are generated this many steps at a time
        self.windows = 0          # windows applied
        self.steps = 0            # steps they covered
        self.off = False          # set when the closed-form cost disagreed with the stepped one (never expected)
        self._keys: dict = {}     # id(waiting head) -> (head, {chain key: position})
        self._static: dict = {}   # id(request) -> (request, problem, prompt tokens) of requests found eligible
        self.guarded = 0          # windows whose first step was also priced the stepped way
        self.head_need = None     # the blocks the waiting head needs where only they keep it waiting (head)
        sw = getattr(eng.cost, "sliding_window", None)
        self.window = sw() if sw is not None else None   # a sliding-window shape's W (its closed form), or None
        # (end, next event, scheduler iterations) of a window that ended blocked (Window.blocked): a window
        # starting there, nothing changed, would stop before its first step, so the engine steps at once
        self._blocked = None
        self.admissions = 0       # windows whose first step admitted waiting requests
        self.times = StepTimes()  # every window step's end time (the members' token times are views of it)
        self._carry = None        # the members at the last window's end, carried to the next (ff_members)
        self.step_s = None        # the last window step's seconds (Window._priced's first guess)
        self.carried = 0          # windows that started from the last one's members
        self.resumed = 0          # preempted requests admitted again in a window's first step
        self.tails = 0            # windows whose first step took the running tail's next prompt chunk
        self.open_ends = 0        # windows of one mixed step that left a request mid-prompt (a chunk)
        self.preempt_first = 0    # windows whose first step preempts, the waiting head admissible (it admits none)
        self.head_short = 0       # windows whose first step leaves the admissible waiting head short (it admits none)
        self._alone = np.zeros(0)  # a decode's stand-alone seconds by its context (alone_decodes; NaN: not yet)
        self.idle = 0             # held requests idle in the running list (their branch done, waiting for siblings)
        self.multi = False        # a problem of several branches, or verified, arrived (ProblemLifecycle._arrive): a
        # window's problem may have several members (Window.close adds its figures once per step) or items, and a
        # finish may queue requests (ff_admission._branches_fit, Window._decode)

    def alone_decodes(self, c):
        """Each decode's stand-alone seconds (``decode_batch_seconds(1, c, c)``, a sliding-window shape's with ``Ssw =
        min(c + 1, W)``: the price of a step of that decode alone, ``Engine._attribute``'s weight), remembered by
        context (a function of it alone) in an array that grows to the longest context seen."""
        c = np.asarray(c, np.int64)
        if not len(c):
            return np.zeros(0)
        memo = self._alone
        hi = int(c.max()) + 1
        if hi > len(memo):
            memo = np.concatenate([memo, np.full(max(hi, 2 * len(memo)) - len(memo), np.nan)])
            self._alone = memo
        v = memo[c]
        miss = np.isnan(v)
        if miss.any():
            u = np.unique(c[miss])
            memo[u] = self.eng.cost.decode_batch_seconds(1, u, u, None if self.window is None else np.minimum(u + 1,
                                                                                                           self.window))
            v = memo[c]
        return v

    def forget(self, req) -> None:
        """An answered request leaves the memos (they hold what is read while a request runs or waits)."""
        self._static.pop(id(req), None)
        self._keys.pop(id(req), None)

    @staticmethod
    def supports(eng) -> bool:
        """Engines whose iterations a window can replace: one stage, one accelerator on its own clock, a cost
        with a per-step vector form and exact integer terms on a dense, MoE, MLA or sliding-window shape (one GPU, or
        one pipeline stage over several: ``ParallelCost.decode_batch_seconds``), no per-problem KV timeline, no
        shared-KV pricing, block scores at generation (the plain workload)."""
        c = eng.cost
        # a per-step host term (Engine.host_step) must enter Engine._window_seconds (and its host-seconds
        # counter) before windows can replace its steps: until then such an engine steps
        if getattr(eng, "host_step", None) is not None and not getattr(eng, "windows_price_host", False):
            return False
        # the closed form prices dense, MoE and MLA layers (ScalarCost.closed_form), and a sliding-window shape's
        # decodes given each step's window key sum (ScalarCost.sliding_window; its admitting steps too: may_admit);
        # a replica shares its clock with others: only as a fleet's (Engine.fleet: the next event none made)
        sliding = getattr(c, "sliding_window", None)
        return (eng.pp_stages == 1 and (eng.settle is None or eng.fleet) and not eng.per_problem
                and not eng.prices_shared and eng.score_at == "generation" and hasattr(c, "decode_batch_seconds")
                and c.exact_integers() and (c.closed_form() or (sliding is not None and sliding() is not None)))

    # ------------------------------------------------------------------ admissions
    def head(self, lookup: bool = False):
        """The waiting head's admission now. ``None``: it could be admitted (or the rule is not covered): stop.
        Else ``(keys, L, nblk, clean_only)``: ``keys`` its chain keys by position (None: no lookup is counted),
        ``L`` the length of its cached chain, ``clean_only``: takes must not evict (module docstring). ``lookup``:
        that tuple and its blocks (``head_need``) even where it fits (a step whose decodes preempt admits none)."""
        sched, kv = self.eng.sched, self.eng.kv
        cfg = sched.cfg
        n_run = len(sched.running)
        B = n_run - self.idle   # the decodes: a held request done with its branch schedules nothing
        self.head_need = None
        if not sched.waiting or n_run >= cfg.max_num_seqs or (cfg.policy != "prefill-first"
                                                              and cfg.max_num_batched_tokens - B <= 0):
            return (None, 0, 0, False)
        head = sched.waiting[0]
        bs = kv.block_size
        n = int(head.num_tokens)
        nblk = n // bs
        cacheable = kv.caching and head.cacheable
        out, dups = [], False
        keys = None
        if cacheable:
            memo = self._keys
            if memo.get(id(head), (None,))[0] is not head or len(memo[id(head)][1]) != nblk:
                # the head's chain keys by position (its content never changes): kept while it waits
                if len(memo) > 4096:
                    memo.clear()
                memo[id(head)] = (head, {key: k for k, key in enumerate(kv.keys_upto(head, nblk)[:nblk])})
            keys = memo[id(head)][1]
            cached, kd = kv.cached, kv._dups
            for key in keys:            # in position order (dicts keep insertion order)
                b = cached.get(key)
                if b is None:
                    break
                out.append(b)
                if key in kd:
                    dups = True
        limit = n if getattr(head, "allow_full_hit", False) else n - 1
        keep = max(0, min(len(out) * bs, limit)) // bs
        blocks, hit = out[:keep], keep * bs
        m = n - hit
        chunked = cfg.policy == "vllm-v1-chunk-admit"
        if chunked:
            m = chunk(m, int(cfg.max_num_batched_tokens) - B, sched._threshold())
        need = kv.blocks_needed(head, m, blocks, hit)
        if need <= kv.num_free and not lookup:
            return None
        self.head_need = need   # what only blocks keep from it (a hybrid cache's releases: ff_blocks.head_fits)
        return (keys, len(out), nblk, chunked or dups)

    # ------------------------------------------------------------------ an admission in the first step
    def _admitting(self, m: Members, f, g, kcap: int, plan: Admission, groups=None):
        """The window whose first step admits ``plan``'s requests: each joins as a newer member, decoding from step
        2 as if it had ``num_tokens - 1`` tokens before step 1 (its blocks and their keys come from the admission
        itself, so its first block events are after step 1). A hybrid cache's (``groups``: the members' releases and
        syncs) reads every member's from the pool after that step (``Window._regroup``)."""
        bs = self.eng.kv.block_size
        # the members joining: the tail where its chunk ends its prompt, the admitted but a last chunk (in running
        # order); a request left mid-prompt is none (the window ends after step 1)
        reqs = [it.req for it in ([plan.tail] if plan.tail is not None else []) + plan.items
                if it.req is not plan.open_req]
        n = np.array([r.num_tokens for r in reqs], np.int64)
        c = n - 1
        nb = -(-n // bs)                                # its blocks once the whole prompt is in
        # it samples at steps 1..r (r: the tokens it has left to sample), its last at r
        fin = np.array([r.max_output_tokens - r.num_output_tokens for r in reqs], np.int64)
        m = m.join(self.eng.kv, reqs, c, nb, fin)
        ud = m.ud[len(m.R) - len(reqs):]
        if ud.any() and not self.eng.fleet:             # its answer wakes a waiting user: stepped
            kcap = min(kcap, int(fin[ud].min()) - 1)
        if kcap < self._min():
            return None
        gh = (-c) % bs
        gh = np.where(gh == 0, bs, gh)
        f = np.concatenate([f, nb * bs - c + 1])        # >= 2
        g = np.concatenate([g, np.where(gh == 1, gh + bs, gh)])   # the admission keyed the block its prompt fills
        if groups is not None:   # the joiners' releases and syncs: none in step 1 (Window._regroup reads them after it)
            never = np.full(len(reqs), NEVER, np.int64)
            groups = (np.concatenate([groups[0], never]), np.concatenate([groups[1], never]), groups[2])
        resumed = sum(1 for it in plan.items if it.req.num_preemptions)   # counted now: it may be preempted again
        out = self._apply(Window(self, m, f, g, kcap, (None, 0, 0, False), plan, groups))
        if out is None:   # pragma: no cover - the admission step is always applied
            raise RuntimeError("fast-forward: an admitting window took no step")
        self.admissions += 1
        self.resumed += resumed
        self.tails += plan.tail is not None
        self.open_ends += plan.open_req is not None
        return out

    # ------------------------------------------------------------------ the window
    def advance(self):
        """Apply the decode window that starts now; the delays to its end (:func:`exact_delays`), or None (the
        engine steps). The last window's members are carried into it where nothing ran in between; where no window
        runs, their objects are written first (:meth:`flush`)."""
        carry, self._carry = self._carry, None
        if carry is not None and not carry.valid(self.eng):
            carry.flush(self.eng, self.times)
            carry = None
        out = None if self.off else self._advance(carry)
        if out is None and carry is not None:
            carry.flush(self.eng, self.times)
        return out

    def _min(self) -> int:
        """The shortest window taken: ``min_steps``, or one step where the window is capped (``cap``)."""
        return self.min_steps if self.cap is None else min(self.min_steps, self.cap)

    def flush(self) -> None:
        """Write the carried members' lengths and figures onto their objects (before anything else reads them)."""
        carry, self._carry = self._carry, None
        if carry is not None:
            carry.flush(self.eng, self.times)

    def _advance(self, carry):
        eng, sched, kv = self.eng, self.eng.sched, self.eng.kv
        blocked, self._blocked = self._blocked, None
        if blocked is not None and blocked == (eng.env.now, eng.peek_next(), sched.iterations):
            return None
        running = sched.running
        self.idle = 0
        if self.multi and running and carry is None:
            # held requests done with their branch: in the list, scheduled nothing (carried members are the whole
            # list, and their objects are not written yet: none is idle)
            live = [r for r in running if not (r.hold and r.pending == 0)]
            self.idle = len(running) - len(live)
            running = live
        B0 = len(running)
        cfg = sched.cfg
        if sched.parked or B0 > cfg.max_num_batched_tokens or (eng.max_batch is not None and B0 > eng.max_batch):
            return None
        tail = None   # the newest request mid-prompt: its next chunk is the first step's, before any admission
        if carry is not None:
            tail = carry.tail
            if tail is not None and not continues(tail):
                return None
        elif B0:
            last = running[-1]   # the newest request is the likeliest not to decode (a prefill chunk): first
            if last.num_tokens - last.num_computed_tokens != 1 or last.num_computed_tokens < last.high_water:
                if not continues(last):
                    return None
                tail = last
        # an admissible head is admitted in the first step where its outcome is known (checked before the O(batch)
        # pass below: both read the state and only fill memos); an idle engine only admits
        if eng.fleet and self.step_s is not None and eng.peek_next() - eng.env.now < self.step_s * FLEET_MIN_STEPS:
            return None   # a short fleet window (FLEET_MIN_STEPS)
        hd = self.head()
        if tail is not None:
            if not may_admit(eng, hd is None):
                return None
        elif (hd is None and not may_admit(eng)) or (B0 == 0 and hd is not None):
            return None
        if carry is not None:
            self.carried += 1
        m = carry if carry is not None else self._members(list(running if tail is None else running[:-1]))
        if m is None:
            return None
        kcap = self.max_steps if self.cap is None else min(self.max_steps, self.cap)
        if m.ud.any() and not eng.fleet:      # an answer that wakes a waiting user: stepped (a fleet's: Window)
            kcap = min(kcap, int(m.fin[m.ud].min()) - 1)
        if kcap < self._min():
            return None
        c0, bs = m.c0, kv.block_size
        f = m.nb * bs - c0 + 1                # first step at which request i opens a block
        if np.any(f < 1):                     # pragma: no cover - a request's blocks hold its computed tokens
            return None
        g = (-c0) % bs
        g = np.where(g == 0, bs, g)           # first step at which it fills one
        if self.guarded < GUARDED and len(c0) and not self._guard(c0):
            return None
        groups = None
        if kv.kv_groups is not None:   # a hybrid cache: its releases and syncs (None: a member would take more)
            groups = group_events(kv, c0, m.R)
            if groups is None:
                return None
        if hd is None or tail is not None:   # the first step is the mixed step: the tail's chunk, admissions
            step1 = decode_takes(kv, m, f)
            adm = None if step1 is None else plan(eng, m, f, step1, tail)
            if adm is not None and adm is not HEAD_SHORT:
                return self._admitting(m, f, g, kcap, adm, groups)
            if tail is not None or (step1 is not None and adm is None):
                return None
            # its decodes preempt, or leave the head short: it admits nobody, a window whose first step decodes (and
            # preempts: Window._preempting) with the head's lookup counted
            hd = self.head(lookup=True)
            if hd is None or B0 == 0:
                return None
            if step1 is None:
                if self.idle:   # the scheduler's victim may be a held request: stepped
                    return None
                self.preempt_first += 1
            else:
                self.head_short += 1
        return self._apply(Window(self, m, f, g, kcap, hd, groups=groups))

    def _members(self, R):
        """The running requests ``R`` as a window's members, read from their objects, or None (one does not decode
        plainly: the engine steps)."""
        cfg, kv = self.eng.sched.cfg, self.eng.kv
        probs, cl, nbl, finl, udl = [], [], [], [], []
        static = self._static
        rb = kv.req_blocks
        for req in R:
            e = static.get(id(req))
            if e is None or e[0] is not req:
                # what does not change while the request lives: a branch's generation past its prompt's first
                # token, no token-eviction cache (else: step); whether its finish may answer a waiting user
                p, _, b = req.data
                if not plain_branch(req) or p.first[b] != p.first[b]:
                    return None
                if len(static) > 4 * cfg.max_num_seqs + 1024:   # only running requests are read: bound it
                    static.clear()
                e = static[id(req)] = (req, p, int(p.job.ctx[b]), answers_user(p))
            c = req.num_computed_tokens
            if (req.status != RUNNING or req.num_tokens - c != 1 or req.num_output_tokens >= req.max_output_tokens
                    or c < req.high_water or c < e[2]):
                return None
            p = e[1]
            probs.append(p)
            cl.append(c)
            nbl.append(len(rb.get(req.req_id, ())))
            finl.append(req.max_output_tokens - req.num_output_tokens)   # the step of its last sample
            udl.append(e[3])
        i64 = np.int64
        return Members.of(kv, R, probs, np.array(cl, i64), np.array(nbl, i64), np.array(finl, i64),
                          np.array(udl, bool))

    def _guard(self, c0) -> bool:
        """The first step priced the stepped way equals the closed form (never expected otherwise:
        ``tests/test_fastforward.py``); False turns windows off."""
        eng = self.eng
        B0 = len(c0)
        sw = None if self.window is None else np.array([int(np.minimum(c0 + 1, self.window).sum())])
        first = eng._window_seconds(np.array([B0]), np.array([int(c0.sum())]), np.array([int(c0.max())]), sw)
        ref = eng.cost.seconds([(1.0, float(x), None, 0.0, 1.0, 0.0) for x in c0.tolist()]) + 0.0
        if eng.host_step is not None:   # the stepped price with its host time (Engine._stepped)
            from sim.cost.overheads import step_seconds
            h, sr = eng.window_host(np.array([B0]))
            ref = float(step_seconds(ref, float(h[0]), eng.async_scheduling, float(sr[0])))
        if first is None or float(first[0]) != ref:
            self.off = True
            return False
        self.guarded += 1
        return True

    def _apply(self, w):
        """Run the window ``w``: the delays to its end (:func:`exact_delays`), or None (no step). One that ended
        blocked (``Window.blocked``) is remembered where it ends (``_blocked``); its members alive at the end are
        carried (``_carry``)."""
        res = w.run()
        if res is None:
            return None
        if w.blocked:
            self._blocked = (w.t_end, w.t_next, self.eng.sched.iterations)
        self._carry = w.carry
        self.last_start = float(res[0][-2])   # the window's last step's start (sim.serving.intake reads it)
        return exact_delays(w.now, *res)
