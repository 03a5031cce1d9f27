"""Decode fast-forward: the steps of a decode-only batch advanced at once, exactly.

Between two *events* -- an arrival (anything else on the simpy clock), an admission (a prefill chunk)
-- an iteration of :class:`sim.serving.engine.Engine` is a decode of every running request, one token each.
:meth:`FastForward.advance` finds the steps up to the next event and applies them in one go, with every
state change the stepped iterations would have made. It processes *block events and batch changes*,
not tokens:

* **Eligible.** Every running request decodes (``pending == 1``, past its prompt and its high-water
  mark), is a one-branch request without verification or token-eviction cache, and all are scheduled
  (``len(running) <= max_num_batched_tokens``, within the fitted batch).

* **Blocks.** Request ``i`` with ``c_i`` computed tokens over ``nb_i`` blocks opens a block at steps
  ``f_i + m bs`` (``f_i = nb_i bs - c_i + 1``) and fills one at ``g_i + m bs``; those calls -- a take
  (clean first, else the block policy's victim) and a key registration -- are made in (step, running
  order), the only ``allocate_one`` calls of the stepped path that change anything. The step where the
  takes exceed the free pool preempts as ``Scheduler._run_running`` does: the scheduler's own
  ``_victim`` / ``_preempt`` (newest first) until the take fits or the taker itself goes.

* **Finishes.** Requests sampling their last token at a step finish after it as ``Scheduler.update``
  and ``Engine._complete`` finish them (blocks freed in running order, then each problem answered at the
  step's end), unless a waiting client's slot (``max_concurrency``) waits on the answer: that step is
  stepped.

* **No admission inside.** A waiting head is admitted (vLLM V1 with ``scheduler_reserve_full_isl``, and
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
  running requests and scheduled tokens, both ``B``) joins as one more vector function. Steps must
  end strictly before the next event on the clock; a preempting step is priced for every batch size its
  preemptions can leave before it is applied. End times ``t_j = t_{j-1} + dt_j`` are ``numpy.cumsum``
  of ``[now, dt_1..dt_k]``, which adds left to right as simpy's clock does (equal floats); so are
  ``busy``, ``run_time`` and each problem's decode phase (``dt_j / B_j`` a step); the clock lands on the
  window's end exactly (:func:`exact_delays`).

* **Tokens.** The window's step end times are stored once and each request refers to the part it was
  in (:class:`TokenTimes`), so memory grows with events, not tokens, until a caller asks for per-token
  times (``numpy.asarray``).

Every record, every metric and the scheduler's and block manager's state after a window are those of
the stepped path (``tests/test_fastforward.py`` compares them over random workloads); the one count
that differs is ``EngineResult.events`` (simpy events processed, fewer here).
"""
from __future__ import annotations

import math

import numpy as np

from sim.serving.scheduler import RUNNING

MAX_STEPS = 4096      # longest window (bounds the per-window arrays)
MIN_STEPS = 2         # shorter windows are stepped (nothing to gain)
GUARDED = 16          # windows whose first step is also priced item by item, as stepped (a check, O(batch))


class TokenTimes:
    """One branch's token times: plain floats (stepped) and shared window arrays (fast-forwarded).

    Behaves as the stepped path's list where it is read: ``numpy.asarray``, ``len``, iteration,
    indexing, ``tolist``. Nothing is flattened until asked.
    """

    __slots__ = ("parts", "n")

    def __init__(self, parts):
        self.parts = parts
        self.n = sum(len(p) if isinstance(p, np.ndarray) else 1 for p in parts)

    def __array__(self, dtype=None, copy=None):
        out = np.empty(self.n, np.float64)
        i = 0
        for p in self.parts:
            if isinstance(p, np.ndarray):
                out[i:i + len(p)] = p
                i += len(p)
            else:
                out[i] = p
                i += 1
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.tolist())

    def __getitem__(self, i):
        return np.asarray(self)[i].tolist()


def token_times(parts: list):
    """The stepped path's list when ``parts`` holds no window arrays, else a :class:`TokenTimes`."""
    if any(isinstance(p, np.ndarray) for p in parts):
        return TokenTimes(parts)
    return parts


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
        self.chunk = int(chunk)   # block events are generated this many steps at a time
        self.windows = 0          # windows applied
        self.steps = 0            # steps they covered
        self.off = False          # set when the closed-form cost disagreed with the stepped one (never expected)
        self._keys: dict = {}     # id(waiting head) -> (head, {chain key: position})
        self._static: dict = {}   # id(request) -> (request, problem, prompt tokens) of requests found eligible
        self.guarded = 0          # windows whose first step was also priced the stepped way

    @staticmethod
    def supports(eng) -> bool:
        """Engines whose iterations a window can replace: one stage, one accelerator on its own clock, a cost
        with a per-step vector form and exact integer terms, no per-problem KV timeline, no shared-KV pricing,
        block scores at generation (the plain workload)."""
        c = eng.cost
        # a per-step host term (Engine.host_step) must enter Engine._window_seconds (and its host-seconds
        # counter) before windows can replace its steps: until then such an engine steps
        if getattr(eng, "host_step", None) is not None and not getattr(eng, "windows_price_host", False):
            return False
        return (eng.pp_stages == 1 and eng.settle is None and not eng.per_problem and not eng.prices_shared
                and eng.score_at == "generation" and hasattr(c, "decode_batch_seconds") and c.exact_integers())

    # ------------------------------------------------------------------ admissions
    def _head(self):
        """The waiting head's admission now. ``None``: it could be admitted (or the rule is not covered): stop.
        Else ``(keys, L, nblk, clean_only)``: ``keys`` its chain keys by position (None: no lookup is counted),
        ``L`` the length of its cached chain, ``clean_only``: takes must not evict (module docstring)."""
        sched, kv = self.eng.sched, self.eng.kv
        cfg = sched.cfg
        B = len(sched.running)
        if not sched.waiting or B >= cfg.max_num_seqs or (cfg.policy != "prefill-first"
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
        chunk = cfg.policy == "vllm-v1-chunk-admit"
        if chunk:
            m = min(m, int(cfg.max_num_batched_tokens) - B)
            thr = cfg.long_prefill_token_threshold if B + len(sched.waiting) > 1 else 0
            if thr and m > 1:
                m = min(m, thr)
        if kv.blocks_needed(head, m, blocks, hit) <= kv.num_free:
            return None
        return (keys, len(out), nblk, chunk or dups)

    # ------------------------------------------------------------------ the window
    def advance(self):
        """Apply the decode window that starts now; the delays to its end (:func:`exact_delays`), or None (the
        engine steps)."""
        if self.off:
            return None
        eng = self.eng
        sched, kv, env = eng.sched, eng.kv, eng.env
        R = list(sched.running)
        B0 = len(R)
        cfg = sched.cfg
        if B0 == 0 or sched.parked or B0 > cfg.max_num_batched_tokens or (
                eng.max_batch is not None and B0 > eng.max_batch):
            return None
        last = R[-1]   # the newest request is the likeliest not to decode (a prefill chunk): look at it first
        if last.num_tokens - last.num_computed_tokens != 1 or last.num_computed_tokens < last.high_water:
            return None
        kcap = self.max_steps
        probs, cl, nbl, finl = [], [], [], []
        static = self._static
        rb = kv.req_blocks
        for req in R:
            e = static.get(id(req))
            if e is None or e[0] is not req:
                # what does not change while the request lives: a one-branch plain request past its prompt's
                # first token, no verification, no token-eviction cache (else: step)
                p, kind, b = req.data
                j = p.job
                if (kind != 1 or j.B != 1 or j.verify_on or j.long is not None or req.hold or req.kv_cap is not None
                        or p.ext[b] or p.first[b] != p.first[b]):
                    return None
                if len(static) > 1 << 16:
                    static.clear()
                e = static[id(req)] = (req, p, int(j.ctx[b]))
            c = req.num_computed_tokens
            if (req.status != RUNNING or req.num_tokens - c != 1 or req.num_output_tokens >= req.max_output_tokens
                    or c < req.high_water or c < e[2]):
                return None
            p = e[1]
            probs.append(p)
            cl.append(c)
            nbl.append(len(rb.get(req.req_id, ())))
            r = req.max_output_tokens - req.num_output_tokens
            finl.append(r)
            if p.user_done is not None and r - 1 < kcap:   # its answer wakes a waiting user: stepped
                kcap = r - 1
        c0 = np.array(cl, np.int64)
        nb = np.array(nbl, np.int64)
        fin = np.array(finl, np.int64)      # the window step at which each request samples its last token
        if kcap < self.min_steps:
            return None
        hd = self._head()
        if hd is None:
            return None
        bs = kv.block_size
        f = nb * bs - c0 + 1                 # first step at which request i opens a block
        if np.any(f < 1):                    # pragma: no cover - a request's blocks hold its computed tokens
            return None
        g = (-c0) % bs
        g = np.where(g == 0, bs, g)          # first step at which it fills one
        # the stepped pricing of the first step (the guard of the closed form)
        if self.guarded < GUARDED:
            S0, m0 = int(c0.sum()), int(c0.max())
            first = eng._window_seconds(np.array([B0]), np.array([S0]), np.array([m0]))
            ref = eng.cost.seconds([(1.0, float(x), None, 0.0, 1.0, 0.0) for x in cl]) + 0.0
            if eng.host_step is not None:   # the stepped price with its host time (Engine._stepped)
                from sim.cost.overheads import step_seconds
                h, sr = eng.window_host(np.array([B0]))
                ref = float(step_seconds(ref, float(h[0]), eng.async_scheduling, float(sr[0])))
            if first is None or float(first[0]) != ref:   # never expected (tests/test_fastforward.py): step
                self.off = True
                return None
            self.guarded += 1
        return self._run(R, probs, c0, f, g, fin, kcap, hd)

    def _takes(self, f, alive, a: int, b: int) -> int:
        """Blocks the alive requests open at steps ``a..b``."""
        fa = f[alive]
        bs = self.eng.kv.block_size
        hi = np.maximum((b - fa) // bs + 1, 0)
        lo = np.maximum((a - 1 - fa) // bs + 1, 0)
        return int((hi - lo).sum())

    def _short(self, f, alive, s: int, e: int, free: int):
        """The first step of ``s..e`` whose takes exceed the ``free`` blocks (it preempts), or None."""
        bs = self.eng.kv.block_size
        fa = f[alive]
        nt = fa + np.maximum(-(-(s - fa) // bs), 0) * bs      # each alive request's next take, >= s
        if free < len(nt):
            # every request takes at most once in bs steps: the (free + 1)-th take is the
            # (free + 1)-th smallest next take if that falls within them
            q = int(np.partition(nt, free)[free])
            if q < s + bs and q <= e:
                return q
        if self._takes(f, alive, s, e) <= free:
            return None
        lo, hi = s - 1, e          # takes(s..lo) <= free < takes(s..hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._takes(f, alive, s, mid) <= free:
                lo = mid
            else:
                hi = mid
        return hi                  # the step whose takes exceed the pool

    def _events(self, f, g, a: int, b: int, caching: bool):
        """Block events of steps ``a..b`` in (step, running order): ``(steps, request indices)``."""
        B0 = len(f)
        bs = self.eng.kv.block_size
        M = (b - a) // bs + 2
        m = np.arange(M, dtype=np.int64)[None, :] * bs
        idx = np.arange(B0, dtype=np.int64)[:, None]
        keys = []
        for st in ((f, g) if caching else (f,)):
            s0 = st + np.maximum(-(-(a - st) // bs), 0) * bs    # first event step >= a
            e = s0[:, None] + m
            keys.append(np.where(e <= b, e * B0 + idx, -1).ravel())
        key = np.concatenate(keys)
        key = key[key >= 0]
        # distinct but for block size 1 (a step both opens and fills the request's block: one call)
        key = np.unique(key) if bs == 1 else np.sort(key)
        return (key // B0).tolist(), (key % B0).tolist()

    def _run(self, R, probs, c0, f, g, fin, kcap, hd):
        eng = self.eng
        sched, kv, env = eng.sched, eng.kv, eng.env
        B0 = len(R)
        bs = kv.block_size
        now = env.now
        t_next = env.peek()
        keys, L, nblk, clean_only = hd
        alive = np.ones(B0, bool)
        last = np.zeros(B0, np.int64)          # last step each request was in the batch (0: none)
        out_at = np.zeros(B0, np.int64)        # the step its lengths were settled at (0: at the window's end)
        segs = []                              # (dt, B, alive mask) of consecutive steps
        used = []                              # (step, num_used after its schedule)
        t_end = now
        s = 1
        n_alive = B0
        hits = 0
        evs, who, ep = [], [], 0               # block events generated so far, the next one to process
        gen_to = 0

        def ensure(upto):
            nonlocal evs, who, ep, gen_to
            while gen_to < upto:
                a, b = gen_to + 1, min(gen_to + max(32, min(gen_to, self.chunk)), kcap)   # 32 steps, then doubling
                e, w = self._events(f, g, a, b, kv.caching)
                evs, who, ep = evs[ep:] + e, who[ep:] + w, 0
                gen_to = b

        def settle(i, steps_done):
            """Set request i's lengths after ``steps_done`` window steps (each sampled one token)."""
            req = R[i]
            c = int(c0[i]) + steps_done
            req.num_computed_tokens = c
            req.num_tokens = c + 1
            req.num_output_tokens = req.max_output_tokens - int(fin[i]) + steps_done
            req.high_water = c
            out_at[i] = steps_done

        def price(Bs, a, b, mask):
            """Per-step seconds of steps a..b with the alive set ``mask``."""
            ctx = c0[mask]
            j = np.arange(a, b + 1, dtype=np.int64) - 1
            return eng._window_seconds(np.full(len(j), Bs), int(ctx.sum()) + Bs * j, int(ctx.max()) + j)

        pf = sched.cfg.policy == "prefill-first"
        cl = c0.tolist()
        al = [True] * B0                       # alive, as a list (read per event)
        blist = [kv.req_blocks[r.req_id] for r in R]
        reg = [kv.caching and r.cacheable for r in R]
        rids = [r.req_id for r in R]
        nkeyed = kv._n_keyed

        def process(a, b):
            """Block events of steps a..b (no take fails), as ``allocate_one`` makes them; the head's lookups."""
            nonlocal ep, L, hits
            ensure(b)
            cur = a
            ev0 = kv.evictions
            n = len(evs)
            if pf and keys is not None:
                hits += L            # prefill-first looks the head up before the step's decodes allocate
            take, register = kv._take, kv._register
            while ep < n and evs[ep] <= b:
                st, i = evs[ep], who[ep]
                ep += 1
                if not al[i]:
                    continue
                if st != cur:
                    if keys is not None:
                        hits += L * (st - cur)
                    used.append((cur, kv.num_used))
                    cur = st
                blks = blist[i]
                tokens = cl[i] + st                 # the token this step computes, 1-based
                if tokens > len(blks) * bs:         # it opens a block (allocate_one's second lane)
                    if kv.n_clean + len(kv._evictable) < 1:   # pragma: no cover - planned within the pool
                        raise RuntimeError("fast-forward: a planned block allocation failed")
                    blks.append(take())
                    u = kv.num_used
                    if u > kv.peak_used:
                        kv.peak_used = u
                    if reg[i] and nkeyed.get(rids[i], 0) < tokens // bs:   # else _register is a no-op
                        register(R[i], blks, tokens // bs)
                    if keys is not None and kv.evictions != ev0:
                        for x in kv.evicted_log[len(kv.evicted_log) - (kv.evictions - ev0):]:
                            pos = keys.get(x)
                            if pos is not None and pos < L:
                                L = pos
                        ev0 = kv.evictions
                elif reg[i] and tokens % bs == 0:   # it fills one: its key (the first lane)
                    register(R[i], blks, tokens // bs)
            if keys is not None:
                hits += L * (b - cur if pf else b + 1 - cur)
                kv.queries += nblk * (b + 1 - a)
                kv.hits += hits
                hits = 0
            used.append((cur, kv.num_used))
            if cur < b:
                used.append((b, kv.num_used))

        def preempt_step(st):
            """Step ``st``, whose takes exceed the pool: the scheduler's own preemptions (newest first) as
            ``_run_running`` makes them; no admission in this step."""
            nonlocal ep
            ensure(st)
            pre_l = []
            if pf and keys is not None:   # prefill-first tried the head before the decodes preempted
                kv.queries += nblk
                kv.hits += L
            while ep < len(evs) and evs[ep] <= st:
                i = who[ep]
                ep += 1
                if not al[i]:
                    continue
                req = R[i]
                req.num_computed_tokens = cl[i] + st - 1
                while not kv.allocate_one(req):
                    victim = sched._victim()
                    vi = index[id(victim)]
                    settle(vi, st - 1)
                    alive[vi] = False
                    al[vi] = False
                    last[vi] = st - 1
                    sched._preempt(victim, pre_l)
                    if victim is req:
                        break
            used.append((st, kv.num_used))

        index = {id(r): i for i, r in enumerate(R)}
        while s <= kcap:
            mask = alive.copy()
            Bs = n_alive
            nf = int(fin[alive].min())
            free = kv.n_clean if clean_only else kv.num_free
            e = min(nf, kcap)
            pre = self._short(f, alive, s, e, free)
            if pre is not None:
                e = pre - 1
            if e >= s:
                dt = price(Bs, s, e, mask)
                if dt is None or not np.all(dt > 0):
                    break
                tt = np.cumsum(np.concatenate(([t_end], dt)))
                ok = int(np.searchsorted(tt[1:], t_next, side="left"))   # steps ending before the next event
                if ok < e - s + 1:
                    if ok:
                        process(s, s + ok - 1)
                        segs.append((dt[:ok], Bs, mask))
                        t_end = float(tt[ok])
                        s += ok
                    break
                process(s, e)
                segs.append((dt, Bs, mask))
                t_end = float(tt[-1])
                s = e + 1
                if e == nf:
                    self._finish(R, probs, alive, al, last, fin, e, t_end, settle)
                    n_alive = int(alive.sum())
                    if n_alive == 0:
                        break
                    hd = self._head()
                    if hd is None:
                        break
                    keys, L, nblk, clean_only = hd
                continue
            if pre is None or clean_only:
                break
            # step `pre` preempts: its batch is the alive requests before some rank; priced after, so first make
            # sure no outcome can end past the next event
            s = pre
            ensure(s)
            plan = self._preempt_prices(s, alive, evs, who, ep, free, f, c0, t_end, t_next)
            if plan is None:
                break
            r1, dtc = plan
            preempt_step(s)
            n_alive = int(alive.sum())
            mask = alive.copy()
            if n_alive < r1:   # pragma: no cover - victims are the newest, the first r1 stay
                raise RuntimeError("fast-forward: a preemption left fewer requests than planned")
            dt = dtc[n_alive - r1: n_alive - r1 + 1]   # the alive requests are the first n_alive: priced above
            segs.append((dt, n_alive, mask))
            t_end = float(t_end + float(dt[0]))
            done = n_alive > 0 and int(fin[alive].min()) == s
            s += 1
            if done:
                self._finish(R, probs, alive, al, last, fin, s - 1, t_end, settle)
                n_alive = int(alive.sum())
            if n_alive == 0:
                break
            hd = self._head()
            if hd is None:
                break
            keys, L, nblk, clean_only = hd
        k = s - 1
        if k < 1:
            if segs:   # pragma: no cover
                raise RuntimeError("fast-forward: a window of no steps changed state")
            return None
        t, dt = self._close(R, probs, c0, alive, last, out_at, segs, used, k, hits, nblk, settle, now, keys)
        if float(t[-1]) != t_end:   # pragma: no cover - one sum, two ways
            raise RuntimeError("fast-forward: the window's end time disagrees with its steps")
        return exact_delays(now, t, dt)

    def _preempt_prices(self, s, alive, evs, who, ep, free, f, c0, t_end, t_next):
        """Step ``s`` preempts: ``(r1, dtc)``, the alive requests before the first take the pool cannot give and
        the step's seconds for every batch size ``r1..`` its preemptions can leave, or None where none is
        planned or some outcome could end at or past the next event (the window ends before ``s``)."""
        eng = self.eng
        bs = eng.kv.block_size
        order = np.flatnonzero(alive)
        need, i1 = free, None
        for q in range(ep, len(evs)):
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
        ctx = c0[order] + (s - 1)
        cand = np.arange(r1, len(order), dtype=np.int64)   # the batch sizes the preemptions can leave
        sums, mx = np.cumsum(ctx), np.maximum.accumulate(ctx)
        dtc = eng._window_seconds(cand, sums[cand - 1], mx[cand - 1])
        if dtc is None or not np.all(t_end + dtc < t_next) or not np.all(dtc > 0):
            return None
        return r1, dtc

    def _finish(self, R, probs, alive, al, last, fin, st, t_end, settle) -> None:
        """Requests sampling their last token at step ``st`` finish as ``Scheduler.update`` and
        ``Engine._complete`` finish them: blocks freed in running order, then each problem answered at ``t_end``."""
        eng = self.eng
        done = [i for i in np.flatnonzero(alive & (fin == st)).tolist()]
        for i in done:
            settle(i, st)
            alive[i] = False
            al[i] = False
            last[i] = st
            eng.sched._finish(R[i])
        for i in done:
            p = probs[i]
            b = R[i].data[2]
            eng.gen_tokens += int(p.job.gen[b])
            p.gen_done[b] = True
            p.n_gen_done += 1
            eng._score(p, b)
            p.end = t_end
            if p.admitted is None:   # pragma: no cover - a decoding request was admitted
                p.admitted = p.arrival

    def _close(self, R, probs, c0, alive, last, out_at, segs, used, k, hits, nblk, settle, now, keys) -> None:
        """Counters, records and timelines of the window's ``k`` steps (module docstring)."""
        eng = self.eng
        sched = eng.sched
        for i in np.flatnonzero(alive).tolist():
            settle(i, k)
            last[i] = k
        dt = np.concatenate([d for d, _, _ in segs])
        Bj = np.concatenate([np.full(len(d), b, np.int64) for d, b, _ in segs])
        if len(dt) != k:   # pragma: no cover
            raise RuntimeError(f"fast-forward: {len(dt)} priced steps for a window of {k}")
        t = np.cumsum(np.concatenate(([now], dt)))
        sched.iterations += k
        B0 = len(R)
        if B0 > sched.max_running:
            sched.max_running = B0
        eng.iterations += k
        nB = int(Bj.sum())
        eng.items_scheduled += nB
        eng.busy = float(np.cumsum(np.concatenate(([eng.busy], dt)))[-1])
        if eng.host_step is not None:
            # the host seconds the stepped path adds one step at a time (Engine._stepped), left to right
            h, _ = eng.window_host(Bj)
            eng.host_seconds = float(np.cumsum(np.concatenate(([eng.host_seconds], h)))[-1])
            hs = eng.host_step
            eng.host_extrapolated += int(np.sum(((hs.max_running is not None) & (Bj > (hs.max_running or 0)))
                                                | ((hs.max_tokens is not None) & (Bj > (hs.max_tokens or 0)))))
        eng.run_time = float(np.cumsum(np.concatenate(([eng.run_time], dt * Bj)))[-1])
        eng.tokens[2] += float(nB)        # integer-valued: the stepped sum of 1.0s is exact
        ph = np.array([p.phase["decode"] for p in probs])
        for d, b, mask in segs:
            for x in (d / b).tolist():
                np.add(ph, x, out=ph, where=mask)
        # KV in use after each step's schedule (forward-filled from the steps that changed it)
        u = np.empty(k + 1, np.int64)
        u[0] = used[0][1] if used else eng.kv.num_used
        marks = np.zeros(k + 1, np.int64) - 1
        for st, v in used:
            if 1 <= st <= k:
                marks[st] = v
        cur = int(u[0]) if marks[1] < 0 else int(marks[1])
        for st in range(1, k + 1):
            if marks[st] >= 0:
                cur = int(marks[st])
            u[st] = cur
        ub = u[1:] * eng.block_bytes
        top = np.maximum.accumulate(ub)
        ends = t[1:]
        rec = eng.record_tokens
        for i, p in enumerate(probs):
            p.phase["decode"] = float(ph[i])
            n = int(last[i])
            if n:
                p.iterations += n
                pk = float(top[n - 1])
                if pk > p.peak:
                    p.peak = pk
                if rec:
                    p.tok[R[i].data[2]].append(ends if n == k else ends[:n])
        eng.timeline_t.extend(ends.tolist())
        eng.timeline_b.extend(ub.tolist())
        eng.timeline_run.extend(Bj.tolist())
        self.windows += 1
        self.steps += k
        return t, dt
