"""From a run's decisions to the jobs the fast path and the engine price (shared by the modes).

``decided`` gives each selected problem's ``(ProblemDecision, Job, key)``, memoised in the
:class:`sim.replay.session.Session` per distinct decision (``sim.workload.decisions.decision_key``);
``check_range`` refuses jobs outside the hardware profile's fitted range; ``make_engine``
builds the simpy engine of a block/serving run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.workload.decisions import (bind_vocab, decide, decision_key, in_target_units, job_for, prefetch_exits, scale_layers,
                        static_key, workload_key)
from sim.base.errors import ConfigError
from sim.cost.ranges import job_extent
from sim.replay.summary import info_of
from sim.workload.job import probes_for


def select(session, problems) -> list:
    """The features of the problems at ``problems`` (``None``: all), each checked to be a position."""
    tf = session.tf
    if problems is None:
        return tf.problems
    out = []
    n = len(tf.problems)
    for p in problems:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= int(p) < n:
            raise ConfigError(f"problems: {p!r} is not a problem position in 0..{n - 1}", field="problems")
        out.append(tf.problems[int(p)])
    return out


def _scale_job(job, L_trace: int, L_target: int, l_min):
    """Map exit layers recorded on the trace's model onto the target's depth (same fraction of depth)."""
    if L_trace == L_target:
        job.L = L_target
        return job
    job.v_layers = scale_layers(job.v_layers, L_trace, L_target)
    job.v_head = (job.v_layers == L_target).astype(np.int64)
    if l_min is not None:
        job.v_probes = probes_for(job.v_layers, L_target, int(math.ceil(l_min * L_target / L_trace)))
    job.L = L_target
    return job


def decided(session, cfg, probs, L_target: int) -> list:
    """``(ProblemDecision, Job, key)`` per problem of ``probs`` for the built config ``cfg`` on an ``L_target``-deep model."""
    tf = session.tf
    bind_vocab(cfg, tf.vocab_size)  # CGEE theta as a fraction of ln V: the trace model's V
    sig_cache = session.signals
    wl = (workload_key(cfg), L_target)
    static = static_key(cfg)
    if cfg.exit is not None:
        prefetch_exits(probs, cfg, sig_cache, static)
    scaled = tf.n_layers != L_target
    out = []
    memo = session.decisions
    for f in probs:
        key = (decision_key(f, cfg, sig_cache, static, scaled),) + wl
        hit = memo.get(key)
        if hit is None:
            dec = decide(f, cfg)
            job = _scale_job(job_for(f, cfg, dec, tf.n_layers), tf.n_layers, L_target,
                             getattr(cfg.exit, "l_min", None))
            dec = in_target_units(dec, tf.n_layers, L_target)  # exit layers as the job runs them
            hit = memo[key] = (dec, job, key)
        out.append(hit)
    return out


def query_extent(jobs) -> tuple[int, int]:
    """``(longest context, most new tokens of one item)`` over ``jobs`` (``(pos, job)`` pairs): a branch's prompt
    and generation, its gate pass, its verification pass; each job's pair memoised on it (``query_range``)."""
    max_ctx = max_new = 0
    for _, j in jobs:
        if not j.B:
            continue
        if j.query_range is None:
            j.query_range = (
                max(int((j.ctx + j.gen).max()), int((j.v_cached + j.v_new).max()) if j.verify_on else 0),
                max(int(j.computed.max()), int(j.gate.max()), int(j.v_new.max()) if j.verify_on else 0))
        max_ctx, max_new = max(max_ctx, j.query_range[0]), max(max_new, j.query_range[1])
    return max_ctx, max_new


def check_range(session, target, jobs, batch_items: int, tokens: int = 0, mixed: bool = False,
                allow_extrapolation: bool = False, chunk=None) -> list:
    """Refuse jobs outside the fitted range (context, new tokens, batch, tokens per iteration, mixed
    iterations: :mod:`sim.cost.ranges`); a passed set is remembered. Returns the extrapolation notes.
    ``chunk``: ``(policy, max_num_batched_tokens)`` of a serving run, whose scheduler chunks a prompt's new tokens
    (:func:`sim.cost.ranges.chunk_tokens`); None: an item carries its whole prompt (isolated mode)."""
    from sim.cost.ranges import chunk_tokens
    # Jobs are memoised objects (held by session.decisions): the same jobs on the same target pass again.
    okey = (tuple(id(j) for _, j in jobs), id(target.hardware), id(target.model), batch_items, tokens, mixed,
            allow_extrapolation, chunk)
    if okey in session.range_ok:
        return session.range_ok[okey][3]
    max_ctx, max_new = query_extent(jobs)
    if chunk is not None:
        max_new = chunk_tokens(max_new, *chunk)
    marks = target.check_query(max_context=max_ctx, max_new=max_new, max_batch=batch_items, tokens=tokens,
                               mixed=mixed, allow_extrapolation=allow_extrapolation)
    # kept alive so the ids in the key stay theirs
    session.range_ok[okey] = (target.hardware, target.model, [j for _, j in jobs], marks)
    return marks


def kv_ids(f, dec) -> list:
    """Token ids each branch's KV holds: its own prompt, or its root's when ASKS shares the root's KV."""
    out = []
    for b in range(f.B):
        src = b
        plan = dec.plan
        while bool(np.asarray(plan.share_root)[src]) and int(np.asarray(plan.source)[src]) >= 0 \
                and int(np.asarray(plan.source)[src]) != src:
            src = int(np.asarray(plan.source)[src])
        out.append(np.asarray(f.prompt_ids[src], np.int64))
    return out


def make_engine(target, cfg, jobs, feats, decs, sched_cfg, budget, *, concurrency, arrival_rate, seed,
                per_problem=False, caching=True, record_tokens=False, costs=None, fast_forward=False):
    """The simpy engine of ``jobs`` under the built config ``cfg`` (block policy, prefix caching, score);
    ``record_tokens``: keep every sampled token's time (serving mode's per-request TPOT and ITL); ``costs``: a served
    run's cost, host time and async scheduling (:meth:`sim.replay.target.Target.serving_costs`; None: the target's
    eager kernels alone, as isolated mode prices them); ``fast_forward``: quiet decode stretches advanced at once where
    the engine can (:mod:`sim.serving.fastforward`; the same figures as stepping every iteration)."""
    from sim.serving.engine import SCORE_AT, Engine
    return Engine(target.model, target.hardware, jobs, concurrency=concurrency, arrival_rate=arrival_rate, seed=seed,
                  scheduler=sched_cfg, kv_blocks=budget, block_policy=cfg.block,
                  caching=caching and not cfg.no_kv, prompt_ids=[kv_ids(f, d) for f, d in zip(feats, decs)],
                  score_at=SCORE_AT[cfg.workload.score], max_batch=target.max_batch,
                  hw_name=target.hardware.name, per_problem_timeline=per_problem,
                  record_token_times=record_tokens, fast_forward=fast_forward, **(costs or {"cost": target.cost()}))


@dataclass
class Prepared:
    """What a problem-mode run starts from: its scheduler, capacity, ``info``, problems, depth and decisions."""

    sched: object
    cap: dict
    info: dict
    probs: list
    L: int
    triples: list

    @property
    def jobs(self) -> list:
        return [(f.pos, job) for f, (_, job, _) in zip(self.probs, self.triples)]


def prepare(session, target, config) -> Prepared:
    """Scheduler, capacity and ``info`` of ``config.mode``, the selected problems' decisions and jobs, the
    fitted-range check (serving: the batch an iteration reaches is only known while it runs; the engine checks it)."""
    cfg = config.sim
    sched = target.scheduler(config.mode)
    cap = target.capacity(config.mode, int(cfg.workload.block_size))
    probs = select(session, config.problems)
    L = target.model.n_layers
    out = Prepared(sched, cap, info_of(session, target, config, cap, sched), probs, L, decided(session, cfg, probs, L))
    jobs = out.jobs
    out.info["extrapolated"] = check_range(
        session, target, jobs, max((j.B for _, j in jobs), default=0),
        *job_extent([j for _, j in jobs], config.mode, sched.max_num_batched_tokens),
        allow_extrapolation=config.allow_extrapolation,
        chunk=(sched.policy, sched.max_num_batched_tokens) if config.mode == "serving" else None)
    return out


__all__ = ["select", "decided", "query_extent", "check_range", "kv_ids", "make_engine", "prepare", "Prepared"]
