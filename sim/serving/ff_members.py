"""The running requests a chain of fast-forward windows advances, carried from one window to the next.

Under arrivals a window is short (an arrival every step or two at a day's rates) and the batch is large, so what
a window costs is what it does per running request. A window's members and their figures are therefore kept as
arrays (:class:`Members`) from one window to the next while nothing else runs in between: the next window
starts where the last ended (``env.now``), no iteration was stepped since (``Scheduler.iterations``) and the
running list is the members, in order (then the request the last window's mixed step left mid-prompt, if any).
Their request objects and problem records are written only where a member leaves (it finishes or is preempted:
:meth:`sim.serving.ff_window.Window.close`) or the chain ends (:meth:`Members.flush`, before anything else reads
them: the engine steps, or a window starts afresh). What is written is what each window would have written:
lengths are a function of the steps taken, a decode phase is the same float sums in the same order, iteration
counts add, peaks are maxima, and token times are the window steps' end times (:class:`StepTimes`).
"""
from __future__ import annotations

from itertools import compress

import numpy as np

from sim.serving.token_times import TokenTimes

TOKEN_PARTS = 32   # a branch's token-time parts are joined into one array past this many (TokenTimes)


class StepTimes:
    """The end times of every window step, in fixed chunks that never move: a member's token times are views
    of them (memory grows with steps, not tokens)."""

    def __init__(self, chunk: int = 1 << 16):
        self.chunk = int(chunk)
        self.chunks: list = []
        self.n = 0

    def extend(self, ends) -> int:
        """Append ``ends``; the index of its first."""
        start = self.n
        ends = np.asarray(ends, np.float64)
        i = 0
        while i < len(ends):
            off = self.n % self.chunk
            if off == 0:
                self.chunks.append(np.empty(self.chunk, np.float64))
            m = min(self.chunk - off, len(ends) - i)
            self.chunks[-1][off:off + m] = ends[i:i + m]
            i += m
            self.n += m
        return start

    def views(self, a: int, b: int) -> list:
        """Steps ``a..b-1``, as views of the chunks (one per chunk crossed)."""
        out = []
        while a < b:
            c, off = divmod(a, self.chunk)
            m = min(self.chunk - off, b - a)
            out.append(self.chunks[c][off:off + m])
            a += m
        return out


def lazy_keys(kv) -> bool:
    """Whether a window keys the blocks its decodes fill where their request leaves it (a finish, a preemption, the
    carried chain's end), all in one call, instead of as each fills: under prefix caching with a release-ordered
    policy (LRU) no rank reads when a block was keyed, and nothing reads a running request's decode keys (its own
    output, unique) before it frees them; a scored policy ranks by insertion, so each is keyed as it fills."""
    return kv.caching and kv._ordered


def answers_user(p) -> bool:
    """Whether a finish of a branch of problem ``p`` may answer a user waiting on it (``p.user_done``): its problem
    is answered at the finish of its last branch unless a verification follows -- passes of their own (queued), or
    the held branches extended by their ``v_new`` tokens (``ProblemLifecycle._gen_finished``: ``v_new - 1`` more
    beside the last sampled one, never computed, so ``v_new`` left to compute), every one of them at least one."""
    if p.user_done is None:
        return False
    j = p.job
    if not j.verify_on:
        return True
    return bool(j.v_reuse) and not bool(np.all(np.asarray(j.v_new) > 0))


def write_record(p, req, phase: float, iters: int, peak: float, times: list, record: bool) -> None:
    """A member's deferred figures onto its problem: decode phase, iterations, peak KV, token times."""
    p.phase["decode"] = phase
    if iters:
        p.iterations += iters
    if peak > p.peak:
        p.peak = peak
    if record and times:
        parts = p.tok[req.data[2]]
        parts.extend(times)
        if len(parts) > TOKEN_PARTS:   # one array, not a view per chain (memory)
            parts[:] = [np.asarray(TokenTimes(parts))]


class Members:
    """Per-member state of a window, in running order: requests, problems, block tables, whether their blocks are
    keyed, request ids, computed tokens ``c0``, blocks ``nb``, the window step of each one's last sample ``fin``,
    whether a user waits on its answer ``ud``; and for the first ``nc`` (carried from the last window) the
    figures not yet written: decode phase ``ph``, iterations ``iters``, peak KV ``peak``, the first step of their
    unwritten token times ``t0`` (:class:`StepTimes` index). The others' figures are on their problems."""

    __slots__ = ("R", "probs", "blist", "reg", "rids", "c0", "nb", "fin", "ud", "nc", "ph", "iters", "peak", "t0",
                 "t_end", "iterations", "tail")

    def __init__(self, R, probs, blist, reg, rids, c0, nb, fin, ud, nc=0, ph=None, iters=None, peak=None, t0=None):
        self.R, self.probs, self.blist, self.reg, self.rids = R, probs, blist, reg, rids
        self.c0, self.nb, self.fin, self.ud = c0, nb, fin, ud
        self.nc = nc
        z = np.zeros(0)
        self.ph = z if ph is None else ph
        self.iters = np.zeros(0, np.int64) if iters is None else iters
        self.peak = z if peak is None else peak
        self.t0 = np.zeros(0, np.int64) if t0 is None else t0
        self.t_end = None          # set when carried: the window's end and the scheduler's iterations there
        self.iterations = None
        self.tail = None           # set when carried: the request running after them, mid-prompt (no member)

    @classmethod
    def of(cls, kv, R, probs, c0, nb, fin, ud):
        """Members read from their objects (a window starting afresh)."""
        caching = kv.caching
        return cls(R, probs, [kv.req_blocks.get(r.req_id) for r in R], [caching and r.cacheable for r in R],
                   [r.req_id for r in R], c0, nb, fin, ud)

    def join(self, kv, reqs, c0, nb, fin) -> "Members":
        """These members and ``reqs`` (admitted in the window's first step: their block tables come then)."""
        probs = [r.data[0] for r in reqs]
        ud = np.array([answers_user(p) for p in probs], bool)
        cat = np.concatenate
        return Members(self.R + list(reqs), self.probs + probs, self.blist + [None] * len(reqs),
                       self.reg + [kv.caching and r.cacheable for r in reqs], self.rids + [r.req_id for r in reqs],
                       cat([self.c0, c0]), cat([self.nb, nb]), cat([self.fin, fin]), cat([self.ud, ud]),
                       self.nc, self.ph, self.iters, self.peak, self.t0)

    def valid(self, eng) -> bool:
        """Whether the next window may start from these members: nothing ran since the last one ended (the running
        list is the members, in order, then the request the last window left mid-prompt, ``tail``, if any)."""
        sched = eng.sched
        running, R, tail = sched.running, self.R, self.tail
        if not (eng.env.now == self.t_end and sched.iterations == self.iterations):
            return False
        if tail is None:
            return len(running) == len(R) and running == R
        return len(running) == len(R) + 1 and running[-1] is tail and running[:-1] == R

    def flush(self, eng, times: StepTimes) -> None:
        """Write every member's lengths and figures onto its objects, and key its full blocks not keyed yet (a
        window keys a decode's filled blocks where it leaves: ``Window.lazy``), as the chain ends."""
        rec, end = eng.record_tokens, times.n
        kv = eng.kv
        key = kv._register if lazy_keys(kv) else None
        bs = kv.block_size
        for req, p, c, fn, x, n, pk, a, blks, reg in zip(self.R, self.probs, self.c0.tolist(), self.fin.tolist(),
                                                         self.ph.tolist(), self.iters.tolist(), self.peak.tolist(),
                                                         self.t0.tolist(), self.blist, self.reg):
            req.num_computed_tokens = c
            req.num_tokens = c + 1
            req.num_output_tokens = req.max_output_tokens - fn
            req.high_water = c
            if key is not None and reg:
                key(req, blks, c // bs)
            write_record(p, req, x, n, pk, times.views(a, end) if rec else (), rec)
        self.R = []


def carried(m: Members, alive, k: int, bs: int, ph, iters, peak, t0) -> Members:
    """The members of ``m`` alive after a window of ``k`` steps, advanced by them, with their unwritten figures."""
    gone = np.flatnonzero(~alive).tolist()
    if len(gone) <= 8:     # a few left: copies with them deleted (no pass in Python over the members)
        lists = [x.copy() for x in (m.R, m.probs, m.blist, m.reg, m.rids)]
        for x in lists:
            for i in reversed(gone):
                del x[i]
    else:
        keep = alive.tolist()
        lists = [list(compress(x, keep)) for x in (m.R, m.probs, m.blist, m.reg, m.rids)]
    c0, nb = m.c0[alive], m.nb[alive]
    f = nb * bs - c0 + 1                               # the first step each opened a block in
    nb = nb + np.maximum((k - f) // bs + 1, 0)         # the blocks it opened in steps 1..k
    return Members(*lists, c0 + k, nb, m.fin[alive] - k, m.ud[alive], len(lists[0]), ph[alive], iters[alive],
                   peak[alive], t0[alive])
