"""One fast-forward window's state and its steps (:mod:`sim.serving.fastforward`, module docstring).

:class:`Window` holds what the window's steps share -- the alive set, the block events generated so far, the
head's cached chain, the priced segments, KV in use -- so each step is a method: :meth:`Window.process` (block
events of steps that take within the pool) and :meth:`Window.preempt_step` (the step whose takes exceed it), both
from :class:`sim.serving.ff_walk.BlockWalk`, :meth:`Window.finish` (requests sampling their last token),
:meth:`Window.close` (counters, records, timelines). :class:`sim.serving.fastforward.FastForward` finds a window
and runs one of these.
"""
from __future__ import annotations

import numpy as np

from sim.cost.pricing import attribution, equal_shares
from sim.serving.ff_blocks import (block_events, first_short, head_fits, hybrid_takes, regroup,
                                   window_key_sums)
from sim.serving.ff_admission import queues_at
from sim.serving.ff_members import carried, lazy_keys, write_record
from sim.serving.ff_walk import BlockWalk
from sim.serving.scheduler import SchedulerOutput
from sim.serving.ff_sums import problem_figures, shared_problems
from sim.serving.ff_sums import add_in_turn, forward_fill, window_counters
from sim.workload.job import KIND_NAMES


class Window(BlockWalk):
    """The decode window starting now of ``ff``'s engine over the running requests (its members).

    Parameters
    ----------
    ff : the :class:`sim.serving.fastforward.FastForward` (the waiting head's admission, counters)
    m : the members (:class:`sim.serving.ff_members.Members`): requests ``R`` and problems in running order,
        computed tokens ``c0`` of each at the window's start, the window step ``fin`` at which each samples its
        last token, and the figures of the members carried from the last window
    f, g : first window step at which each opens / fills a block
    kcap : the longest window allowed
    hd : the waiting head's admission (``FastForward.head``): ``(keys, L, nblk, clean_only)``
    admit : the first step's plan, vLLM V1's mixed step (:func:`sim.serving.ff_admission.plan`; the requests that
        join in it are the last members of ``R``), or None
    groups : a hybrid KV cache's other block events (:func:`sim.serving.ff_blocks.group_events`), or None
    """

    def __init__(self, ff, m, f, g, kcap: int, hd, admit=None, groups=None):
        eng = self.eng = ff.eng
        self.ff = ff
        self.sched, self.kv = eng.sched, eng.kv
        kv = self.kv
        self.m = m
        R, c0 = m.R, m.c0
        self.R, self.probs, self.c0, self.f, self.g, self.fin, self.kcap = R, m.probs, c0, f, g, m.fin, kcap
        B0 = len(R)
        self.bs = kv.block_size
        self.now = eng.env.now
        self.t_next = eng.peek_next()
        self.keys, self.L, self.nblk, self.clean_only = hd
        self.alive = np.ones(B0, bool)
        self.last = np.zeros(B0, np.int64)     # last step each request was in the batch (0: none)
        self.segs = []                         # (dt, B, alive mask) of consecutive steps
        self.used = []                         # (step, num_used after its schedule)
        self.t_end = self.now
        self.s = 1
        self.n_alive = B0
        self.hits = 0
        self.evs, self.who, self.ep = [], [], 0   # block events generated so far, the next one to process
        self.gen_to = 0
        self.pf = self.sched.cfg.policy == "prefill-first"
        self.cl = c0.tolist()
        self.al = [True] * B0                  # alive, as a list (read per event)
        self.admit = admit                     # the first step's plan (ff_admission.plan), or None
        self.blist, self.reg, self.rids = m.blist, m.reg, m.rids   # an admitted head's table: once admitted
        self._index = None                     # id(request) -> member, made when a preemption asks
        self.blocked = False                   # it ended where its next step cannot end before the next event
        self.idle0, self.idle_at = ff.idle, []   # held requests idle at its start; the steps more went idle at
        self.extended = False                  # a finish extended its held branches by their verification: it ends
        self.lazy = lazy_keys(kv)              # blocks a decode fills keyed where its request leaves
        self.eager = kv.caching and not self.lazy
        self.carry = None                      # the members alive at its end (close), carried to the next window
        # a hybrid KV cache (kv.kv_groups): each event is the block manager's own allocate(req, 1), and a step that
        # might run short of blocks (an open taking one block of every group, releases not counted) is followed
        # member by member (preempt_prices: ff_blocks.hybrid_takes)
        self.groups = groups
        self.per_open = 1 if groups is None else kv.kv_groups[0] + kv.kv_groups[1]
        self.sync_step = 1                     # the step its syncs shed their extra blocks at (_regroup: 2)
        self.W = ff.window                     # a sliding-window shape's window (its closed form), or None

    # ------------------------------------------------------------------ helpers of the steps
    def ensure(self, upto: int) -> None:
        """Block events generated through step ``upto``: at least twice as many steps as so far (a window under
        arrivals is a step or two: generating more would be wasted), at most ``ff.chunk`` steps at a time."""
        chunk = self.ff.chunk
        while self.gen_to < upto:
            gen_to = self.gen_to
            a, b = gen_to + 1, min(max(upto, gen_to + max(2, gen_to)), gen_to + chunk, self.kcap)
            kinds = (self.f, self.g) if self.eager else (self.f,)
            if self.groups is not None:
                kinds += self.groups[:2]
            e, w = block_events(kinds, self.bs, a, b, unique=self.groups is not None)
            ep = self.ep
            self.evs, self.who, self.ep = self.evs[ep:] + e, self.who[ep:] + w, 0
            self.gen_to = b

    def settle(self, i: int, steps_done: int) -> None:
        """Set request i's lengths after ``steps_done`` window steps (each sampled one token)."""
        req = self.R[i]
        c = int(self.c0[i]) + steps_done
        req.num_computed_tokens = c
        req.num_tokens = c + 1
        req.num_output_tokens = req.max_output_tokens - int(self.fin[i]) + steps_done
        req.high_water = c

    def key_filled(self, i: int) -> None:   # member i's filled blocks keyed (lengths settled) before it frees them
        if self.lazy and self.reg[i]:
            self.kv._register(self.R[i], self.blist[i], self.R[i].num_computed_tokens // self.bs)

    def price(self, Bs: int, a: int, b: int, mask):
        """Per-step seconds of steps a..b with the alive set ``mask`` (a sliding-window shape's with their window key
        sums: :func:`sim.serving.ff_blocks.window_key_sums`)."""
        ctx = self.c0[mask]
        j = np.arange(a, b + 1, dtype=np.int64) - 1
        if Bs == 1 and self.W is None:
            # one decode alone (a quiet server's window): its steps' GPU seconds are its stand-alone decodes',
            # remembered by context (decode_batch_seconds(1, c, c): the same floats), then the host term
            return self.eng.pricer.with_host(self.ff.alone_decodes(int(ctx[0]) + j), 1)
        sw = None if self.W is None else window_key_sums(ctx, self.W, j + 1)
        return self.eng._window_seconds(Bs, int(ctx.sum()) + Bs * j, int(ctx.max()) + j, sw)

    def _new_head(self) -> bool:
        """The waiting head's admission after a step that freed blocks; False: it fits (the window ends)."""
        hd = self.ff.head()
        if hd is None:
            return False
        self.keys, self.L, self.nblk, self.clean_only = hd
        return True

    # ------------------------------------------------------------------ the steps
    def preempt_prices(self, s: int, free: int):
        """Step ``s`` preempts: ``(r1, dtc)``, the alive requests before the first take the pool cannot give and
        the step's seconds for every batch size ``r1..`` its preemptions can leave (None where nothing is on the
        clock: no outcome can pass an event), or None where none is planned or some outcome could end on the next
        event, or past it in a fleet (the window ends before ``s``)."""
        alive, evs, who, f = self.alive, self.evs, self.who, self.f
        bs = self.bs
        order = np.flatnonzero(alive)
        need, i1 = free, None
        if self.groups is not None:   # a hybrid cache's takes and releases, member by member (None: none fails)
            fo, hn = f[order], self.ff.head_need
            nb = np.array([len(self.blist[i]) for i in order])
            left, _, _, i1 = hybrid_takes(self.kv, self.c0[order] + (s - 1), nb, [self.rids[i] for i in order],
                                          (s >= fo) & ((s - fo) % bs == 0))
            if i1 is None and hn is not None and left >= hn:
                return None   # no decode preempts, and the waiting head may be admitted after them
            r1 = len(order) if i1 is None else i1
        else:
            for q in range(self.ep, len(evs)):
                if evs[q] != s:
                    if evs[q] > s:
                        break
                    continue
                i = who[q]
                if alive[i] and (s - f[i]) % bs == 0 and s >= f[i]:
                    if need == 0:
                        i1 = i
                        break
                    need -= 1
            r1 = 0 if i1 is None else int(alive[:i1].sum())   # alive requests before the first that cannot take
        if r1 == 0:
            return None
        if self.t_next == np.inf:   # nothing on the clock (offline): the outcome is priced once it is known
            return r1, None
        ctx = self.c0[order] + (s - 1)
        cand = np.arange(r1, max(len(order), r1 + 1), dtype=np.int64)   # the batch sizes the preemptions can leave
        sums, mx = np.cumsum(ctx), np.maximum.accumulate(ctx)
        sw = None if self.W is None else np.cumsum(np.minimum(ctx + 1, self.W))[cand - 1]
        dtc = self.eng._window_seconds(cand, sums[cand - 1], mx[cand - 1], sw)
        if dtc is None or not np.all(dtc > 0):
            return None
        ends = self.t_end + dtc
        # each outcome ends before the next event, or after it (then it is the window's last step, as a decode step
        # the event falls in); never on it (a tie is stepped). A fleet's answers in that step would come after the
        # event (Window._decode steps them): there every outcome ends before it
        if not (np.all(ends < self.t_next) if self.eng.fleet else np.all(ends != self.t_next)):
            return None
        return r1, dtc

    def finish(self, st: int) -> None:
        """Requests sampling their last token at step ``st`` finish as ``Scheduler.update`` and
        ``Engine._complete`` finish them: blocks freed in running order, then each problem answered at the
        window's time so far."""
        eng, R, alive = self.eng, self.R, self.alive
        done = [i for i in np.flatnonzero(alive & (self.fin == st)).tolist()]
        for i in done:
            self.settle(i, st)
            self.key_filled(i)
            alive[i] = False
            self.al[i] = False
            self.last[i] = st
            if R[i].hold:   # its verification reads its KV: it idles in the running list until its siblings are done
                self.ff.idle += 1
                self.idle_at.append(st)
            else:
                eng.sched._finish(R[i])
        for i in done:
            p = self.probs[i]
            b = R[i].data[2]
            eng.gen_tokens += int(p.job.gen[b])
            # its score; the problem answered once every branch is done (a fleet's router's count drops before the
            # next event), or its verification queued (the window ends where it may be admitted: _new_head)
            eng._gen_finished(p, b, self.t_end)
            self.extended |= bool(p.ext[b])   # the held branches compute their verification next: stepped

    # ------------------------------------------------------------------ the window
    def run(self):
        """Apply the window's steps; ``(t, dt)`` (step end times from now, per-step seconds), or None (no step)."""
        go = self._admit_step() if self.admit is not None else True
        while go and self.s <= self.kcap and self._next():
            pass
        k = self.s - 1
        if k < 1:
            if self.segs:   # pragma: no cover
                raise RuntimeError("fast-forward: a window of no steps changed state")
            return None
        t, dt = self.close(k)
        if float(t[-1]) != self.t_end:   # pragma: no cover - one sum, two ways
            raise RuntimeError("fast-forward: the window's end time disagrees with its steps")
        return t, dt

    def _admit_step(self) -> bool:
        """Step 1 is the mixed step, as ``Scheduler._schedule_v1`` and ``Engine._accelerator`` / ``_complete`` make it:
        the decodes' block events, the running tail's chunk (its own allocation), the scheduler's own admissions (and
        its one failed attempt, where planned), the planned price, each item's share of it by its stand-alone seconds
        (``Engine._attribute``), the prefill tokens, the decodes' finishes, then the first tokens (the branches they
        start); a request left mid-prompt advances as ``Scheduler.update`` does (it is no member). False: it ends."""
        plan, eng, sched, kv = self.admit, self.eng, self.sched, self.kv
        tail, open_req, firsts = plan.tail, plan.open_req, []   # firsts: problems whose first token came out
        m = len(plan.items)
        joined = m + (tail is not None) - (open_req is not None)
        i0 = len(self.R) - joined
        old = self.alive.copy()
        old[i0:] = False
        self.process(1, 1)               # the decodes' block events (the joining have none in step 1)
        items = []
        if tail is not None:             # after the decodes, in running order (Scheduler._run_running)
            nt = tail.num_new   # one token: the scheduler's allocate_one, as for a decode
            if not (kv.allocate_one(tail.req) if nt == 1 else kv.allocate(tail.req, nt)):   # pragma: no cover - planned
                raise RuntimeError("fast-forward: the tail's planned chunk did not fit")
            items.append(sched._item(tail.req, nt, False))
            if open_req is not tail.req:
                self.blist[i0] = kv.req_blocks[tail.req.req_id]
        j0 = i0 + (tail is not None and open_req is not tail.req)   # the admitted's first member
        for k, it in enumerate(plan.items):
            item = sched._admit(it.req, plan.budgets[k], whole=False, thr=plan.thr)
            if item is None or item.num_new != it.num_new:   # pragma: no cover - planned within the pool
                raise RuntimeError("fast-forward: a planned admission failed or differs from its plan")
            sched._take_waiting()
            if it.req is not open_req:
                self.blist[j0 + k] = kv.req_blocks[it.req.req_id]
            items.append(item)
        if plan.tries > m and sched._admit(sched.waiting[0], plan.budgets[m], whole=False,
                                           thr=plan.thr) is not None:   # pragma: no cover - planned not to fit
            raise RuntimeError("fast-forward: a request planned not to fit was admitted")
        if len(sched.running) > sched.max_running:   # a request mid-prompt runs and is no member
            sched.max_running = len(sched.running)
        used = kv.num_used
        self.used.append((1, used))
        eng._admitted(items, self.now)
        dt = plan.dt
        priced = plan.priced if tail is None else [plan.tail_priced] + plan.priced
        # each decode's stand-alone seconds in one pass (the closed form of its one tuple), then the other items':
        # Engine._attribute's shares
        c = self.c0[old]
        n = len(c) + len(items)
        if equal_shares(priced):   # with the decodes, every item of the decode kind (a resumed request's hit past
            shares = np.full(n, dt / n)   # its prompt): dt / n each, as Engine._attribute
        else:
            a_dec = self.ff.alone_decodes(c)
            shares = attribution(dt, np.concatenate([a_dec, [eng.pricer.alone(ts) for ts, _ in priced]]))
        dec_sh, own_sh = shares[:len(c)], shares[len(c):].tolist()
        self.t_end = float(self.now + dt)
        for it, (ts, kind), x in zip(items, priced, own_sh):
            req = it.req
            p, b = req.data[0], req.data[2]
            p.phase[KIND_NAMES[kind]] += x
            eng.tokens[kind] += ts[0][0] if len(ts) == 1 else sum(t[0] for t in ts)
            if req is open_req:   # mid-prompt: its lengths and figures now (Scheduler.update, Engine._complete)
                sched.update(SchedulerOutput([it], [], it.num_new, "mixed"))
                p.iterations += 1
                if used * eng.block_bytes > p.peak:
                    p.peak = used * eng.block_bytes
            else:
                sched._recomputed(it)              # a resumed request's tokens computed again (Scheduler.update)
            p.recompute += it.recompute
            if p.first[b] != p.first[b] and it.num_cached + it.num_new >= int(p.job.ctx[b]):
                p.first[b] = self.t_end - p.arrival   # fresh: its prompt is in, its first token is out
                p.src_ready[b] = True
                firsts.append(p)
        dec = np.zeros(len(self.R))
        dec[old] = dec_sh
        self.segs.append((np.array([dt]), int(old.sum()), old, dec))   # decode shares, not dt / B (close)
        self.s = 2
        if np.any(self.fin[old] == 1):
            self.finish(1)
        for p in firsts:   # Engine._complete's item order: the decodes (their finishes queue first), then these
            eng._try_start(p, self.t_end)   # the branches that read its KV queue (the window ends: _new_head)
        self.n_alive = int(self.alive.sum())
        return (open_req is None and self.n_alive != 0 and not self.extended and (self.groups is None or self._regroup())
                and self._new_head() and self.t_end < self.t_next)

    def _regroup(self) -> bool:
        """A hybrid cache's window past its mixed step takes its members' releases and syncs from the pool
        (:func:`sim.serving.ff_blocks.regroup`); False: the window ends."""
        got = regroup(self.kv, self.c0, self.R, self.alive)
        if got is not None:
            self.groups, self.sync_step = got, 2
            self.evs, self.who, self.ep, self.gen_to = [], [], 0, 1   # step 2 on, from these
        return got is not None

    def _next(self) -> bool:
        """Apply the next stretch: steps up to the soonest finish, preemption or the window's cap; False: the
        window ends."""
        if self.t_end > self.t_next:   # pragma: no cover - the step the next event fell in was the window's last
            raise RuntimeError("fast-forward: a window step would start after the next event")
        alive, kv, s = self.alive, self.kv, self.s
        mask = alive.copy()
        nf = int(self.fin[alive].min())
        free = kv.n_clean if self.clean_only else kv.num_free
        e = min(nf, self.kcap)
        pre = first_short(self.f[alive], self.bs, s, e, free // self.per_open)
        if pre is not None:
            e = pre - 1
        if self.groups is not None and self.ff.head_need is not None:
            fit = head_fits(self.kv, self.groups, self.ff.head_need, self.sync_step, alive, s, e)
            if fit is not None:   # the waiting head may fit there (releases freed blocks): the window ends before
                e, pre = fit - 1, fit
        if e >= s:
            return self._decode(s, e, nf, self.n_alive, mask)
        if pre is None or self.clean_only:
            self.blocked = pre is not None
            return False
        return self._preempting(pre, free)

    def _decode(self, s: int, e: int, nf: int, Bs: int, mask) -> bool:
        """Steps ``s..e`` take within the pool: priced, applied up to the next event on the clock."""
        dt, tt = self._priced(Bs, s, e, mask)
        if dt is None:
            return False
        m = len(dt)   # steps priced: through e, or fewer where the next event falls in them
        e = s + m - 1
        ok = int(np.searchsorted(tt[1:], self.t_next, side="left"))   # steps ending before the next event
        cross = ok < m and tt[ok + 1] > self.t_next
        if cross:
            ok += 1    # and the step the next event falls in, the window's last (crosses)
        if ok < m:
            self.blocked = not cross   # the next step would end exactly at the next event (a tie: stepped)
            if ok:
                self.process(s, s + ok - 1)
                self.segs.append((dt[:ok], Bs, mask))
                self.t_end = float(tt[ok])
                self.s += ok
            return False
        if cross and e == nf and ((self.eng.fleet and np.any(self.alive & (self.fin == e) & self.m.ud))
                                  or (self.ff.multi and queues_at(self, e))):
            # a fleet's answer after the next event (which may route a request by the counts), or verification
            # passes queued behind it: stepped
            self.blocked = True
            if m > 1:
                self.process(s, e - 1)
                self.segs.append((dt[:-1], Bs, mask))
                self.t_end = float(tt[-2])
                self.s = e
            return False
        self.process(s, e)
        self.segs.append((dt, Bs, mask))
        self.t_end = float(tt[-1])
        self.s = e + 1
        if e == nf:
            self.finish(e)
            self.n_alive = int(self.alive.sum())
            if self.n_alive == 0 or self.extended or not self._new_head():
                return False
        return not cross

    def _priced(self, Bs: int, s: int, e: int, mask):
        """Steps ``s..e``'s seconds and end times ``(dt, [t_end, t_s, ...])``, priced in pieces of as many steps as
        the time left to the next event holds at the last window step's price (2 without one; at least doubling),
        until the next event falls in them or through ``e``: a window under arrivals takes a step or two, and its
        longer stretch would be priced for nothing. The end times are one ``cumsum`` carried from piece to piece
        (the same floats as one pass). ``(None, None)`` where a priced step takes no time."""
        t_next, dts, tts = self.t_next, [], [np.array([self.t_end])]
        est = self.ff.step_s   # the last window step's seconds: how many steps the time left holds, a first guess
        a, k = s, (e - s + 1 if t_next == np.inf else 2 if est is None
                   else max(2, int((t_next - self.t_end) / est * 1.05) + 2))
        while a <= e:
            b = min(e, a + k - 1)
            dt = self.price(Bs, a, b, mask)
            if dt is None or not np.all(dt > 0):
                return None, None
            tt = np.cumsum(np.concatenate((tts[-1][-1:], dt)))
            dts.append(dt)
            tts.append(tt[1:])
            if tt[-1] >= t_next or b >= e:
                break
            # next: the steps the time left to the next event holds at the last step's price (a step's price grows
            # with its context: a little more), at least twice as many as so far
            a, k = b + 1, max(2 * k, int((t_next - tt[-1]) / dt[-1] * 1.05) + 2)
        return (dts[0] if len(dts) == 1 else np.concatenate(dts)), np.concatenate(tts)

    def _preempting(self, s: int, free: int) -> bool:
        """Step ``s`` preempts: its batch is the alive requests before some rank, priced for every outcome
        first, so that none can end on the next event; the one that ends past it ends the window."""
        alive = self.alive
        self.s = s
        self.ensure(s)
        plan = self.preempt_prices(s, free)
        if plan is None:
            self.blocked = True
            return False
        r1, dtc = plan
        if self.ff.multi and (queues_at(self, s) or self.ff.idle):
            # its finishes may queue requests (the event's order), or the scheduler's victim may be a held request
            self.blocked = True
            return False
        self.preempt_step(s)
        n_alive = int(alive.sum())
        mask = alive.copy()
        if n_alive < r1:   # pragma: no cover - victims are the newest, the first r1 stay
            raise RuntimeError("fast-forward: a preemption left fewer requests than planned")
        if dtc is None:
            ctx = self.c0[alive] + (s - 1)
            sw = None if self.W is None else np.array([int(np.minimum(ctx + 1, self.W).sum())])
            dt = self.eng._window_seconds(n_alive, np.array([int(ctx.sum())]), np.array([int(ctx.max())]), sw)
            if dt is None or not dt[0] > 0:   # pragma: no cover - a decode step takes time
                raise RuntimeError("fast-forward: a preempting step priced no time")
        else:
            dt = dtc[n_alive - r1: n_alive - r1 + 1]   # the alive requests are the first n_alive: priced above
        self.segs.append((dt, n_alive, mask))
        self.t_end = float(self.t_end + float(dt[0]))
        cross = self.t_end > self.t_next   # the next event falls in this step: the window's last
        done = n_alive > 0 and int(self.fin[alive].min()) == s
        self.s = s + 1
        if done:
            self.finish(s)
            n_alive = int(alive.sum())
        self.n_alive = n_alive
        return n_alive != 0 and not self.extended and self._new_head() and not cross

    def close(self, k: int):
        """Counters, records and timelines of the window's ``k`` steps (module docstring of
        :mod:`sim.serving.fastforward`); ``(t, dt)``."""
        eng, R, probs, segs, last = self.eng, self.R, self.probs, self.segs, self.last
        sched = eng.sched
        idx = np.flatnonzero(self.alive)
        last[idx] = k   # the requests alive at the end are carried on: their lengths are written later (Members)
        dt = np.concatenate([sg[0] for sg in segs]) if len(segs) > 1 else segs[0][0]
        if len(dt) != k:   # pragma: no cover
            raise RuntimeError(f"fast-forward: {len(dt)} priced steps for a window of {k}")
        t = np.cumsum(np.concatenate(([self.now], dt)))
        sched.iterations += k
        B0 = len(R)
        if B0 + self.idle0 > sched.max_running:
            sched.max_running = B0 + self.idle0
        eng.iterations += k
        # the held requests idle in the running list at each step (one more from the step after each went idle)
        idle = (None if not (self.idle0 or self.idle_at) else
                self.idle0 + np.searchsorted(np.sort(np.array(self.idle_at, np.int64)), np.arange(1, k + 1)))
        nB, run = window_counters(self.eng, self.admit, self.segs, k, dt, idle)
        eng.tokens[2] += float(nB)        # integer-valued: the stepped sum of 1.0s is exact
        m = self.m
        nc = m.nc
        ph = np.empty(B0)   # decode phases: the carried members', then the others' from their problems
        ph[:nc] = m.ph
        ph[nc:] = [p.phase["decode"] for p in probs[nc:]]
        groups = shared_problems(probs) if self.ff.multi else None
        ph0 = None if groups is None else ph.copy()
        for sg in segs:
            d, b, mask = sg[:3]
            if len(sg) > 3:   # the admitting step: each request's own share of it (Window._admit_step)
                np.add(ph, sg[3], out=ph, where=mask)
            else:             # a decode step adds dt / B to each request
                add_in_turn(ph, mask, d / b)
        ub = self._kv_used(k) * eng.block_bytes
        top = np.maximum.accumulate(ub)
        ends = t[1:]
        # the members' figures, added to the carried ones: written where a member left, else carried on (Members)
        iters = np.zeros(B0, np.int64)
        iters[:nc] = m.iters
        iters += last
        if groups:
            problem_figures(groups, probs, segs, ph0, ph, iters, last)
        peak = np.full(B0, -np.inf)
        peak[:nc] = m.peak
        np.maximum(peak, np.where(last > 0, top[np.maximum(last, 1) - 1], -np.inf), out=peak)
        rec, times = eng.record_tokens, self.ff.times
        ws = times.extend(ends) if rec else 0
        t0 = np.full(B0, ws, np.int64)
        t0[:nc] = m.t0
        for i in np.flatnonzero(~self.alive).tolist():
            write_record(probs[i], R[i], float(ph[i]), int(iters[i]), float(peak[i]),
                         times.views(int(t0[i]), ws + int(last[i])) if rec else (), rec)
        self.carry = carried(m, self.alive, k, self.bs, ph, iters, peak, t0) if len(idx) else None
        if self.carry is not None:
            self.carry.t_end, self.carry.iterations = self.t_end, sched.iterations
            self.carry.tail = None if self.admit is None else self.admit.open_req   # running after them, mid-prompt
        eng.timeline_t.extend(ends.tolist())
        eng.timeline_b.extend(ub.tolist())
        eng.timeline_run.extend(run if isinstance(run, list) else run.tolist())
        self.ff.windows += 1
        self.ff.steps += k
        self.ff.step_s = float(dt[-1])
        return t, dt

    def _kv_used(self, k: int):
        """KV blocks in use after each of steps 1..k's schedule (:func:`sim.serving.ff_sums.forward_fill` of the
        window's marks ``used``, the window's start before any)."""
        return forward_fill(self.used, k, self.kv.num_used)
