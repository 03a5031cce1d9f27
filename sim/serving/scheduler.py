"""The serving scheduler: vLLM V1's default rule (and the older prefill-first rule), pure Python.

One object decides, iteration by iteration, which requests run and how many
tokens each computes; the simpy engine (:mod:`sim.serving.engine`) and a real torch
runner (``calibrate``) both drive it, so their scheduling can be compared one
for one. KV memory is a :class:`sim.serving.kvcache.BlockManager`.

``policy="vllm-v1"`` (vLLM V1 ``Scheduler.schedule`` with vLLM 0.33's defaults; V1 is the default
engine since vLLM 0.8):

1. *Running first*, in admission order: each running request gets
   ``min(num_tokens - num_computed_tokens, token_budget)`` tokens (1 for a
   decode; the rest of a partly computed prompt = chunked prefill). If its
   blocks cannot be allocated, the newest running request is **preempted by
   recompute** (blocks freed into the cache, ``num_computed_tokens = 0``, put
   at the front of the waiting queue) until they can, or the request itself
   was the newest (then it is preempted and skipped).
2. *Then waiting* (FCFS), only if nothing was preempted this step, while
   ``len(running) < max_num_seqs`` and tokens are left: the longest cached
   prefix is reused (:meth:`BlockManager.find_cached`), the rest is scheduled
   up to the remaining ``token_budget`` (a chunk). A request is admitted only
   if the free blocks hold its *whole* known sequence after the hit, not just
   the first chunk (vLLM 0.33's ``scheduler_reserve_full_isl=True``: blocks
   are still allocated chunk by chunk, the check only gates admission); one
   that does not fit stays waiting and stops admission (FCFS: no overtaking).
   A cached block allocated earlier in the same step is a hit (blocks are
   keyed when allocated).

``policy="vllm-v1-chunk-admit"``: the same, but a waiting request is admitted
when its first chunk fits (vLLM's ``scheduler_reserve_full_isl=False``). Under
KV pressure it admits a request with the last few free blocks and preempts it
(or another) a step later, so it preempts more than the default.

``long_prefill_token_threshold`` (0 = off, vLLM's default) caps one request's
chunk only while more than one request is running or waiting, as vLLM 0.33
does (a lone request has nobody to starve).

``policy="prefill-first"`` (vLLM V0's default without chunked prefill; Vidur's
vLLM scheduler): if a waiting request can be admitted, the iteration
batches whole prompts FCFS while their tokens fit in
``max_num_batched_tokens`` (a prompt longer than the budget runs alone, which
V0 would refuse) together with running requests' pending prompt-like tokens
(an extension such as a verification prompt); else it is a decode iteration
of every running request, with the same preemption.

A request is a token stream: ``prompt_tokens`` known at :meth:`add`; the
iteration that computes the last known token *samples* one output token
(``num_tokens += 1``) until ``max_output_tokens`` are out; then it finishes
(blocks freed into the cache), or with ``hold=True`` stays running with
nothing to compute until :meth:`extend` appends tokens (e.g. a verification
prompt reusing the branch's KV). A large batch waits; nothing fails.

API::

    sched = Scheduler(SchedulerConfig(max_num_seqs=..., max_num_batched_tokens=...), BlockManager(...))
    sched.add(Request("r0", prompt_tokens=1024, max_output_tokens=256))
    while sched.has_unfinished():
        out = sched.schedule()           # SchedulerOutput: items (request, tokens, cached), preempted
        ...run the forward of out.items...
        done = sched.update(out)         # sample tokens, finish requests; returns the finished ones
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable

from sim.serving.kvcache import BlockManager, KVCacheError, check_size

POLICIES = ("vllm-v1", "vllm-v1-chunk-admit", "prefill-first")
WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
MAX_TOKENS_LIMIT = 1 << 24  # bound on max_num_batched_tokens (16M tokens per iteration)
MAX_SEQS_LIMIT = 1 << 20


class SchedulerError(KVCacheError):
    """A bad scheduler parameter (message names it)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler limits (vLLM ``SchedulerConfig`` names).

    Parameters
    ----------
    max_num_seqs : int
        Requests running at once (vLLM default 256 on GPUs, ``max_num_seqs``).
    max_num_batched_tokens : int
        Tokens computed per iteration (vLLM V1 default 8192 for online serving on
        data-centre GPUs with chunked prefill; 2048 in older releases).
    policy : {"vllm-v1", "vllm-v1-chunk-admit", "prefill-first"}
        ``vllm-v1``: vLLM 0.33's default (admission needs room for the whole prompt);
        ``vllm-v1-chunk-admit``: admission needs room for the first chunk only
        (``scheduler_reserve_full_isl=False``); ``prefill-first``: vLLM V0 without chunking.
    long_prefill_token_threshold : int
        vLLM's cap on one request's prefill chunk per iteration when more than one request
        is running or waiting; 0 = none (vLLM default).
    kv_groups : tuple
        ``(full_groups, sliding_groups, sliding_window)`` of a hybrid model's KV cache
        (:attr:`sim.cost.model_shape.ModelShape.kv_cache_groups`); the block manager charges each request the
        blocks of every group (:meth:`sim.serving.kvcache.BlockManager.set_kv_groups`). Empty: one group.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "vllm-v1"
    long_prefill_token_threshold: int = 0
    kv_groups: tuple = ()

    def __post_init__(self) -> None:
        try:
            check_size("max_num_seqs", self.max_num_seqs, 1, MAX_SEQS_LIMIT)
            check_size("max_num_batched_tokens", self.max_num_batched_tokens, 1, MAX_TOKENS_LIMIT)
            check_size("long_prefill_token_threshold", self.long_prefill_token_threshold, 0, MAX_TOKENS_LIMIT)
        except KVCacheError as exc:
            raise SchedulerError(str(exc)) from None
        if self.policy not in POLICIES:
            raise SchedulerError(f"scheduler: {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.kv_groups and (len(self.kv_groups) != 3 or
                               any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in self.kv_groups)
                               or self.kv_groups[0] < 1 or bool(self.kv_groups[1]) != bool(self.kv_groups[2])):
            raise SchedulerError(f"scheduler: kv_groups must be (full_groups >= 1, sliding_groups >= 0, "
                                 f"sliding_window >= 0, both 0 or both > 0), got {self.kv_groups!r}")

    @property
    def reserve_full_prompt(self) -> bool:
        """Admission needs free blocks for the whole known sequence (vLLM ``scheduler_reserve_full_isl``)."""
        return self.policy != "vllm-v1-chunk-admit"

    def to_dict(self) -> dict:
        out = {"scheduler": self.policy, "max_num_seqs": int(self.max_num_seqs),
               "max_num_batched_tokens": int(self.max_num_batched_tokens),
               "long_prefill_token_threshold": int(self.long_prefill_token_threshold)}
        if self.kv_groups and tuple(self.kv_groups) != (1, 0, 0):   # stated only for a hybrid KV cache
            out["kv_groups"] = list(self.kv_groups)
        return out


@dataclass(eq=False)
class Request:
    """One sequence the scheduler runs (a branch, a verification pass, a gate pass, a user request).

    Parameters
    ----------
    req_id : hashable, unique among live requests
    prompt_tokens : int
        Tokens known at admission.
    max_output_tokens : int
        Tokens to sample; the iteration completing the prompt samples the first.
    content : callable ``k -> hashable``, optional
        Content of full block ``k`` (its token ids); default: unique to the request
        (no sharing). Keys chain over it (:func:`sim.serving.kvcache.block_key`).
    cacheable : bool
        Its blocks enter the prefix cache (False: a gate pass, a from-scratch verification).
    allow_full_hit : bool
        A whole-prompt cache hit is used in full (zero-copy fork) instead of vLLM's ``n - 1`` cap.
    hold : bool
        After its last output token, stay running (holding its KV) until :meth:`Scheduler.extend`.
    depth, gen_depth : int
        Tree depth of its prompt blocks and of the blocks it generates (RSBCM).
    data : any
        The caller's payload (untouched).
    """

    req_id: Hashable
    prompt_tokens: int
    max_output_tokens: int = 1
    content: Any = None
    cacheable: bool = True
    allow_full_hit: bool = False
    hold: bool = False
    depth: int = 0
    gen_depth: int = 1
    arrival: float = 0.0
    data: Any = None
    kv_cap: int | None = None      # token eviction: most tokens of KV the sequence ever holds
    # state
    num_tokens: int = field(default=0, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    num_output_tokens: int = field(default=0, init=False)
    prompt_like: int = field(default=0, init=False)     # tokens [0, prompt_like) were given, not sampled
    high_water: int = field(default=0, init=False)      # most tokens ever computed (recompute accounting)
    status: str = field(default=WAITING, init=False)
    num_preemptions: int = field(default=0, init=False)
    recompute_tokens: int = field(default=0, init=False)
    cached_tokens: int = field(default=0, init=False)   # tokens the prefix cache gave at the last admission
    block_size: int = field(default=16, init=False)     # the scheduler's (set when queued)

    def __post_init__(self) -> None:
        self.prompt_tokens = int(self.prompt_tokens)
        self.max_output_tokens = int(self.max_output_tokens)
        if self.prompt_tokens < 1 and not self.allow_full_hit:
            raise SchedulerError(f"request {self.req_id!r}: prompt_tokens: must be >= 1, got {self.prompt_tokens}")
        if self.max_output_tokens < 0:
            raise SchedulerError(f"request {self.req_id!r}: max_output_tokens: must be >= 0")
        self.num_tokens = self.prompt_tokens
        self.prompt_like = self.prompt_tokens

    def block_content(self, k: int):
        if self.content is None:
            return ("req", self.req_id, k)
        return self.content(k)

    def block_contents(self, m: int, n: int) -> list:
        """``block_content(k)`` for ``k`` in ``m..n-1`` (at once where the content callable has a ``range``)."""
        bulk = getattr(self.content, "range", None)
        if bulk is not None:
            return bulk(m, n)
        return [self.block_content(k) for k in range(m, n)]

    def block_depth(self, k: int) -> int:
        """Tree depth RSBCM reads for block ``k``: ``depth`` inside the prompt, else ``gen_depth``."""
        return self.depth if k < self.prompt_tokens // self.block_size else self.gen_depth

    @property
    def pending(self) -> int:
        """Tokens to compute now. Once every output is sampled, the last sampled token needs no KV
        (vLLM never computes it) unless an :meth:`Scheduler.extend` follows."""
        tail = 1 if (self.num_output_tokens >= self.max_output_tokens and self.num_tokens > self.prompt_like) else 0
        return self.num_tokens - self.num_computed_tokens - tail

    @property
    def done_sampling(self) -> bool:
        return self.num_output_tokens >= self.max_output_tokens


def chunk(n: int, budget: int, thr: int = 0) -> int:
    """The tokens a request computes in a step of ``n`` it has pending: within the step's token ``budget`` and,
    above one token, ``long_prefill_token_threshold`` (``thr``; 0: none) -- vLLM 0.33's rule for running and waiting
    requests alike."""
    n = min(n, budget)
    if thr and n > 1:
        n = min(n, thr)
    return n


class Scheduled:
    """One request's share of an iteration: ``num_new`` tokens over ``num_cached`` already computed.

    ``prompt_like``: of the new tokens, how many were given (prompt / extension) rather than sampled;
    ``recompute``: how many had been computed before (preemption); ``samples``: the chunk completes the
    known tokens and a token is sampled (logits needed); ``new_admission``: first chunk after
    (re)admission; ``cache_hit``: tokens the prefix cache gave at this admission.
    """

    __slots__ = ("req", "num_new", "num_cached", "prompt_like", "recompute", "samples", "new_admission", "cache_hit")

    def __init__(self, req, num_new, num_cached, prompt_like, recompute, samples, new_admission, cache_hit=0):
        self.req, self.num_new, self.num_cached, self.prompt_like = req, num_new, num_cached, prompt_like
        self.recompute, self.samples, self.new_admission, self.cache_hit = recompute, samples, new_admission, cache_hit

    def __repr__(self) -> str:
        return f"Scheduled({self.req.req_id!r}, new={self.num_new}, cached={self.num_cached})"


@dataclass
class SchedulerOutput:
    """What one iteration runs."""

    items: list
    preempted: list
    num_batched_tokens: int
    kind: str              # "mixed" (vllm-v1), "prefill" or "decode" (prefill-first), "idle"

    @property
    def num_seqs(self) -> int:
        return len(self.items)


class Scheduler:
    """vLLM-V1-style iteration scheduler over a :class:`BlockManager` (module docstring)."""

    def __init__(self, config: SchedulerConfig | None = None, kv: BlockManager | None = None):
        self.cfg = config or SchedulerConfig()
        self.kv = kv or BlockManager(1 << 62, 16)
        if self.cfg.kv_groups and tuple(self.cfg.kv_groups) != (1, 0, 0):
            self.kv.set_kv_groups(*self.cfg.kv_groups)   # a hybrid model: every group's blocks per request
        self.bs = self.kv.block_size
        self.waiting: deque = deque()
        self.running: list = []
        self.preemptions = 0
        self.recompute_tokens = 0
        self.iterations = 0
        self.max_running = 0
        self._live: dict = {}
        self.parked: dict = {}   # held requests preempted before their extension arrived
        self._busy = ()          # ids of requests in an in-flight batch (the current schedule() call's)

    # ------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        """Queue a request (FCFS)."""
        if req.req_id in self._live:
            raise SchedulerError(f"request {req.req_id!r}: already queued")
        req.block_size = self.bs
        req.status = WAITING
        self._live[req.req_id] = req
        self.waiting.append(req)

    def extend(self, req_id, n_tokens: int, max_output_tokens: int = 0, hold: bool = False) -> Request:
        """Append ``n_tokens`` given tokens to a held request (it computes them next); sample ``max_output_tokens`` more."""
        req = self._live[req_id]
        if req.req_id in self.parked:       # preempted while held: it resumes (recomputing) first
            del self.parked[req.req_id]
            self.waiting.appendleft(req)
        req.num_tokens += int(n_tokens)
        req.prompt_like = req.num_tokens
        req.max_output_tokens = req.num_output_tokens + int(max_output_tokens)
        req.hold = bool(hold)
        if req.pending == 0 and not req.hold and req.done_sampling:
            self._finish(req)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.parked)

    def get(self, req_id) -> Request:
        return self._live[req_id]

    # ------------------------------------------------------------------ schedule
    def schedule(self, busy=None) -> SchedulerOutput:
        """The next iteration (nothing changes until :meth:`update`, except admissions and preemptions).

        ``busy``: ids of requests in a batch still in flight (pipeline parallelism keeps up to PP batches
        in flight, :mod:`sim.serving.engine`): they are neither scheduled nor chosen as preemption victims.
        """
        self._busy = busy or ()
        out = self._schedule_once()
        preempted = list(out.preempted)
        while not out.items and self.waiting:
            # a step that only preempted changed the state: schedule again; else make room from held requests
            if not out.preempted and not self._preempt_held():
                break
            out = self._schedule_once()
            preempted += out.preempted
        out.preempted = preempted
        if out.items:
            self.iterations += 1
        return out

    def _schedule_once(self) -> SchedulerOutput:
        if self.cfg.policy == "prefill-first":
            return self._schedule_prefill_first()
        return self._schedule_v1()

    def _preempt_held(self) -> bool:
        """Nothing could run and requests wait: preempt the newest held request (its KV is recomputed
        when it resumes), so held requests never starve the ones they wait for. Not in vLLM (nothing
        is held there)."""
        for i in range(len(self.running) - 1, -1, -1):
            r = self.running[i]
            if r.pending == 0 and r.req_id not in self._busy:
                del self.running[i]
                self._preempt(r, [])
                return True
        return False

    def _item(self, req: Request, n: int, new: bool, hit: int = 0, c: int | None = None) -> Scheduled:
        """The item of ``n`` tokens of ``req`` over its ``c`` computed tokens (default: its own count; a caller
        planning an admission passes the cache hit it will start from)."""
        if c is None:
            c = req.num_computed_tokens
        if c >= req.prompt_like and c >= req.high_water:   # a decode (the common item): nothing given, nothing redone
            return Scheduled(req, n, c, 0, 0, c + n == req.num_tokens and not req.done_sampling, new, hit)
        pl = max(0, min(c + n, req.prompt_like) - c)
        rec = max(0, min(c + n, req.high_water) - c)
        return Scheduled(req, n, c, pl, rec, c + n == req.num_tokens and not req.done_sampling, new, hit)

    def _threshold(self) -> int:
        """``long_prefill_token_threshold``, or 0 when at most one request runs or waits (vLLM 0.33)."""
        thr = self.cfg.long_prefill_token_threshold
        if thr and len(self.running) + len(self.waiting) <= 1:
            return 0
        return thr

    def _preempt(self, victim: Request, preempted: list) -> None:
        idle = victim.hold and victim.pending == 0  # held, waiting for an extension: park it until then
        self.kv.free(victim)
        victim.num_computed_tokens = 0
        victim.status = WAITING
        victim.num_preemptions += 1
        self.preemptions += 1
        if idle:
            self.parked[victim.req_id] = victim
        else:
            self.waiting.appendleft(victim)
        preempted.append(victim)

    def _run_running(self, budget: int, items: list, preempted: list, only=None, thr: int = 0) -> int:
        """Schedule running requests in order (``only``: a filter on requests); returns the budget left."""
        i = 0
        busy = self._busy
        running, kv = self.running, self.kv
        one = kv.allocate_one
        while i < len(running) and budget > 0:
            req = running[i]
            pend = req.pending
            if pend == 0 or (only is not None and not only(req)) or (busy and req.req_id in busy):
                i += 1
                continue
            n = chunk(pend, budget, thr)
            ok = True
            while not (one(req) if n == 1 else kv.allocate(req, n)):
                victim = self._victim()   # newest first
                self._preempt(victim, preempted)
                if victim is req:
                    ok = False
                    break
            if not ok:
                break  # req was the newest: nothing after it remains
            items.append(self._item(req, n, False))
            budget -= n
            i += 1
        return budget

    def _victim(self) -> Request:
        """The newest running request not in flight (``req`` itself, not in flight, is the last resort)."""
        if not self._busy:
            return self.running.pop()
        for i in range(len(self.running) - 1, -1, -1):
            if self.running[i].req_id not in self._busy:
                return self.running.pop(i)
        raise SchedulerError("no running request outside the in-flight batches to preempt")  # pragma: no cover

    def _admit(self, req: Request, budget: int, whole: bool, thr: int = 0):
        """Try to admit the head of the waiting queue; returns the item or None.

        ``whole``: schedule the whole rest (prefill-first); else a chunk of at most ``budget``
        (``thr``: ``long_prefill_token_threshold``), admitted only if the whole rest fits in the
        free blocks unless the policy is ``vllm-v1-chunk-admit``.
        """
        blocks, hit = self.kv.find_cached(req)
        req.num_computed_tokens = 0
        n_total = req.num_tokens - hit
        if whole:
            n = n_total
        else:
            n = chunk(n_total, budget, thr)
            if (n < n_total and self.cfg.reserve_full_prompt
                    and not self.kv.can_allocate(req, n_total, blocks, hit)):
                return None
        if not self.kv.allocate(req, n, blocks, hit):
            return None
        req.num_computed_tokens = hit
        req.cached_tokens = hit
        return self._item(req, n, True, hit)

    def _room(self, budget: int, running: int) -> bool:
        """Whether a step with ``budget`` tokens left and ``running`` requests tries to admit another (vLLM V1)."""
        return budget > 0 and running < self.cfg.max_num_seqs

    def _take_waiting(self) -> Request:
        req = self.waiting.popleft()
        req.status = RUNNING
        self.running.append(req)
        return req

    def _schedule_v1(self) -> SchedulerOutput:
        budget = int(self.cfg.max_num_batched_tokens)
        items, preempted = [], []
        thr = self._threshold()   # fixed for the step, as vLLM counts requests once per step
        budget = self._run_running(budget, items, preempted, thr=thr)
        if not preempted:
            while self.waiting and self._room(budget, len(self.running)):
                item = self._admit(self.waiting[0], budget, whole=False, thr=thr)
                if item is None:
                    break
                self._take_waiting()
                items.append(item)
                budget -= item.num_new
        return self._out(items, preempted, "mixed")

    def _schedule_prefill_first(self) -> SchedulerOutput:
        budget = int(self.cfg.max_num_batched_tokens)
        items, preempted = [], []
        # Prefill iteration: running requests' given tokens (extensions), then whole prompts FCFS.
        thr = self.cfg.long_prefill_token_threshold
        budget = self._run_running(budget, items, preempted,
                                   only=lambda r: r.num_computed_tokens < r.prompt_like, thr=thr)
        if not preempted:
            while self.waiting and len(self.running) < self.cfg.max_num_seqs:
                head = self.waiting[0]
                _, hit = self.kv.find_cached(head, count=False)
                need = head.num_tokens - hit
                if need > budget and (items or budget < self.cfg.max_num_batched_tokens):
                    break
                item = self._admit(head, budget, whole=True)
                if item is None:
                    break
                self._take_waiting()
                items.append(item)
                budget -= item.num_new
        if items or preempted:
            return self._out(items, preempted, "prefill")
        budget = int(self.cfg.max_num_batched_tokens)
        budget = self._run_running(budget, items, preempted, thr=thr)
        return self._out(items, preempted, "decode")

    def _out(self, items, preempted, kind) -> SchedulerOutput:
        n = sum(it.num_new for it in items)
        if len(self.running) > self.max_running:
            self.max_running = len(self.running)
        return SchedulerOutput(items, preempted, n, kind if items else "idle")

    # ------------------------------------------------------------------ update
    def update(self, out: SchedulerOutput, finished=()) -> list:
        """Advance after the iteration ran: computed tokens, samples, finished requests (returned).

        ``finished``: request ids the caller stops early (a real runner's EOS); they finish now.
        """
        done = []
        stop = set(finished)
        for it in out.items:
            req = it.req
            if req.status != RUNNING:
                continue  # preempted later in the same step (cannot happen in one schedule) -- skip
            c = req.num_computed_tokens + it.num_new
            req.num_computed_tokens = c
            self._recomputed(it)
            if c > req.high_water:
                req.high_water = c
            if c == req.num_tokens and not req.done_sampling:
                req.num_tokens += 1
                req.num_output_tokens += 1
            if (stop and req.req_id in stop) or (req.done_sampling and req.pending == 0 and not req.hold):
                self._finish(req)
                done.append(req)
        return done

    def _recomputed(self, it: Scheduled) -> None:
        """Count an item's tokens computed again (after a preemption)."""
        if it.recompute:
            self.recompute_tokens += it.recompute
            it.req.recompute_tokens += it.recompute

    def _finish(self, req: Request) -> None:
        req.status = FINISHED
        self.kv.free(req)
        if req in self.running:
            self.running.remove(req)
        self._live.pop(req.req_id, None)

    def stats(self) -> dict:
        return {**self.cfg.to_dict(), "preemptions": self.preemptions, "recompute_tokens": self.recompute_tokens,
                "iterations": self.iterations, "max_running_seqs": self.max_running, **self.kv.stats()}
