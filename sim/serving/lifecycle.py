"""A problem's lifecycle in the engine: arrival, ASKS gates, branch start, generation done, scores,
verification, answer.

:class:`ProblemLifecycle` is the part of :class:`sim.serving.engine.Engine` that turns a problem
(:class:`sim.workload.job.Job`) into scheduler requests and reacts to their progress (module docstring of
:mod:`sim.serving.engine`): a branch enters the scheduler once its gate pass finished and its KV source
produced its first token; verification starts when every branch is done; RSBCM's block scores are set when
they become known (``score_at``). The engine supplies ``env``, ``sched``, ``kv``, ``bs``, ``caching``,
``prompt_ids``, ``score_at``, ``record_tokens``, ``jobs``, ``probs``, ``_add``, ``_wake`` and ``_ff`` (its
fast-forward, or None).
"""
from __future__ import annotations

import numpy as np

from sim.serving.kvblock import token_blocks
from sim.serving.scheduler import Request
from sim.workload.job import KIND_NAMES, Job


class _Prob:
    __slots__ = ("pseq", "pos", "job", "ids", "arrival", "admitted", "end", "first", "gate_left", "src_ready",
                 "started", "gen_done", "n_gen_done", "verify_left", "phase", "times", "mem", "peak", "iterations",
                 "recompute", "hit_tokens", "prompt_tokens", "user_done", "reqs", "vstart", "ext", "qsum", "qn",
                 "tok")

    def __init__(self, pseq, pos, job, ids):
        self.pseq, self.pos, self.job, self.ids = pseq, pos, job, ids
        t = job.prob_init
        if t is None:   # the job's starting arrays, made once per job (a problem copies them: a day has 10^5)
            B = job.B
            vstart = np.where(job.gen > 0, job.ctx + job.gen - 1, job.ctx)
            vstart.flags.writeable = False   # shared by every problem of the job (read only)
            t = job.prob_init = (np.full(B, np.nan), job.gate > 0, np.zeros(B, bool), vstart)
        first, gate, no = t[0], t[1], t[2]
        self.arrival = self.admitted = 0.0
        self.end = float("nan")
        self.first = first.copy()
        self.gate_left = gate.copy()
        self.src_ready = no.copy()
        self.started = no.copy()
        self.gen_done = no.copy()
        self.n_gen_done = 0
        self.verify_left = 0
        self.phase = {k: 0.0 for k in KIND_NAMES}
        self.times, self.mem = [], []
        self.peak = 0.0
        self.iterations = 0
        self.recompute = 0
        self.hit_tokens = 0
        self.prompt_tokens = 0
        self.user_done = None
        self.reqs = {}
        self.vstart = t[3]
        self.ext = no.copy()             # the branch's request was extended by its verification prompt
        self.qsum, self.qn = 0.0, 0      # waiting of its branch requests: first scheduled - ready
        self.admitted = None
        self.tok = None                  # per branch, the times its tokens were sampled (record_token_times)


def _plan_ids(pos: int, job: Job) -> list:
    """Stand-in token ids that realise a job's sharing plan when the trace's are not given: branch ``b``'s
    first ``reused_b`` tokens are its source's (all of them when it shares the root's KV), the rest its own
    (negative ids, unique per problem position, branch and token)."""
    if job.plan_ids is not None:
        return job.plan_ids
    out = []
    for b in range(job.B):
        ids = -(1 + pos * 10 ** 9 + b * 10 ** 6 + np.arange(int(job.ctx[b]), dtype=np.int64))
        s = int(job.source[b])
        if s >= 0:
            r = int(job.ctx[b]) if job.share[b] else int(job.reused[b])
            r = min(r, len(out[s]))
            ids[:r] = out[s][:r]
        out.append(ids)
    job.plan_ids = out
    return out


class _Content:
    """Block ``k``'s content (``content(k)``): inside the prompt its token ids
    (:func:`sim.serving.kvblock.token_blocks`), else the branch's generated block ``k``; :meth:`range` gives blocks
    ``m..n-1`` at once (a prompt's keys are made in one pass)."""

    __slots__ = ("pos", "tag", "ids", "bs", "n_full")

    def __init__(self, pos, b, ids, bs, tag):
        self.pos, self.tag, self.bs = pos, tag, bs
        self.ids = np.ascontiguousarray(ids, np.int64)
        self.n_full = len(ids) // bs

    def __call__(self, k):
        if k < self.n_full:
            bs = self.bs
            return token_blocks(self.ids[k * bs:(k + 1) * bs], bs)[0]
        return ("gen", self.pos, self.tag, k)

    def range(self, m: int, n: int) -> list:
        bs, hi = self.bs, min(n, self.n_full)
        out = token_blocks(self.ids[m * bs:hi * bs], bs) if hi > m else []
        pos, tag = self.pos, self.tag
        out += [("gen", pos, tag, k) for k in range(max(m, hi), n)]
        return out


class ProblemLifecycle:
    """The problem lifecycle of :class:`sim.serving.engine.Engine` (module docstring; a mixin: the engine
    holds the state)."""

    # called with no argument once per answered problem, whichever path answered it (a progress bar's update, set
    # by the caller on the engine); it decides nothing
    on_answered = None

    def _branch_ids(self, p: _Prob, b: int):
        j = p.job
        if self.prompt_ids is None:
            return _plan_ids(p.pos, j)[b]
        ids = self.prompt_ids[p.pseq][b]
        return ids[: int(j.ctx[b])]

    def _start_branch(self, p: _Prob, b: int, now: float | None = None) -> None:
        j = p.job
        p.started[b] = True
        share = bool(j.share[b])
        ids = self._branch_ids(p, b)
        tag = ("s" if share else "o", b)
        hold = bool(j.verify_on and j.v_reuse)
        req = Request((p.pseq, "b", b), int(j.ctx[b]), int(j.gen[b]),
                      content=_Content(p.pos, b, ids, self.bs, tag), cacheable=self.caching,
                      allow_full_hit=share, hold=hold, depth=0, gen_depth=1, data=(p, 1, b))
        long = j.long
        if long is not None:
            req.kv_cap = long.cap
        req.arrival = self.env.now if now is None else now   # ready to run (gate done, source's first token out)
        p.reqs[b] = req
        self._add(req)

    def _ready(self, p: _Prob, b: int) -> bool:
        s = int(p.job.source[b])
        return (not p.started[b]) and (not p.gate_left[b]) and (s < 0 or p.src_ready[s])

    def _try_start(self, p: _Prob, now: float | None = None) -> None:
        """Start every branch of ``p`` now ready (``now``: a fast-forward window's step end; None: the clock's)."""
        for b in range(p.job.B):
            if self._ready(p, b):
                self._start_branch(p, b, now)

    def _arrive(self, p: _Prob, user_done=None) -> None:
        p.arrival = self.env.now
        p.user_done = user_done
        self.probs.append(p)
        j = p.job
        if j.B == 0:
            self._finish_problem(p)
            return
        if (j.B > 1 or j.verify_on) and self._ff is not None:
            # windows add a problem's figures over its several members (Window.close), and keep the order of the
            # requests a finish queues (verification passes) behind the events that fell in its step
            self._ff.multi = True
        for b in range(j.B):
            if j.gate[b] > 0:
                self._add(Request((p.pseq, "g", b), int(j.gate[b]), 0, cacheable=False, data=(p, 0, b)))
        self._try_start(p)

    def _gen_finished(self, p: _Prob, b: int, now: float | None = None) -> None:
        """Branch ``b`` of ``p`` sampled its last token (``now``: a fast-forward window's step end; None: the
        clock's): its score, and once every branch is done the verification or the answer."""
        if p.gen_done[b]:
            return
        p.gen_done[b] = True
        p.n_gen_done += 1
        j = p.job
        if self.score_at == "generation":
            self._score(p, b)
        if p.n_gen_done < j.B:
            return
        if self.score_at == "branches":
            for bb in range(j.B):
                self._score(p, bb)
        if not j.verify_on:
            self._finish_problem(p, now)
            return
        p.verify_left = j.B
        for bb in range(j.B):
            if j.v_reuse:
                tail = 1 if j.gen[bb] > 0 else 0
                p.ext[bb] = True
                req = self.sched.extend((p.pseq, "b", bb), int(j.v_new[bb]) - tail)
                if req.status == "finished":  # nothing to compute (no verification tokens)
                    self._verify_done(p, bb, now)
                if self._wake is not None and not self._wake.triggered:
                    self._wake.succeed()
            else:
                self._add(Request((p.pseq, "v", bb), int(j.v_new[bb]), 0, cacheable=False, data=(p, 3, bb)))

    def _score(self, p: _Prob, b: int) -> None:
        if self.kv.num_blocks == 0 or not self.caching:
            return
        req = p.reqs.get(b)
        if req is None:
            return
        s = float(p.job.score[b]) if p.job.score is not None else 0.0
        self.kv.set_scores(self.kv.chain_keys(req), s)

    def _verify_done(self, p: _Prob, b: int, now: float | None = None) -> None:
        if self.score_at == "verification":
            self._score(p, b)
        p.verify_left -= 1
        if p.verify_left == 0:
            self._finish_problem(p, now)

    def _finish_problem(self, p: _Prob, now: float | None = None) -> None:
        p.end = self.env.now if now is None else now
        if p.admitted is None:
            p.admitted = p.arrival
        self._release(p)
        if p.user_done is not None:
            p.user_done.succeed()

    def _release(self, p: _Prob) -> None:
        """An answered problem lets its requests go (their token ids, chain keys): what stays is its record's
        figures and token times."""
        ff = self._ff
        for req in p.reqs.values():
            self.kv.forget(req)
            if ff is not None:
                ff.forget(req)
        p.reqs = {}
        if self.on_answered is not None:
            self.on_answered()

    def _prob(self, pseq: int, pos=None, job=None) -> _Prob:
        """The problem ``pseq`` (of ``self.jobs`` unless ``pos``/``job`` are given), with its token-time lists."""
        if job is None:
            pos, job = self.jobs[pseq]
        p = _Prob(pseq, pos, job, None)
        if self.record_tokens:
            p.tok = [[] for _ in range(job.B)]
        return p

    def _admitted(self, items, start) -> None:
        """Bookkeeping of a batch formed at ``start``: admissions, prefix hits, queueing, zero-copy forks."""
        for it in items:
            p = it.req.data[0]
            if p.admitted is None:
                p.admitted = start
            if it.new_admission:
                req = it.req
                if req.data[1] == 1 and req.num_preemptions == 0:
                    b = req.data[2]
                    j = p.job
                    planned = int(j.reused[b]) - (int(j.copy[b]) if j.share[b] else 0)
                    if it.cache_hit < planned:
                        p.recompute += planned - it.cache_hit
                    p.hit_tokens += it.cache_hit
                    p.prompt_tokens += int(j.ctx[b])
                    p.qsum += start - req.arrival
                    p.qn += 1
                if it.num_new == 0 and req.data[1] == 1:
                    b = req.data[2]
                    if np.isnan(p.first[b]):
                        p.first[b] = start - p.arrival
                        p.src_ready[b] = True
