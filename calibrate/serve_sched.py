"""Thin adapter from ``calibrate serve`` to the simulator's scheduler and block manager.

It decides nothing: every rule (what runs, how many tokens, whom to preempt,
which blocks hit, which block to evict) is ``sim.serving.scheduler.Scheduler`` over
``sim.serving.kvcache.BlockManager`` with a block policy of ``policies.blocks`` — the
objects the simulator's serving mode calls. The adapter only

* wraps a :class:`calibrate.serve.Request` as a ``sim.serving.scheduler.Request``
  whose block content is its token ids (prompt, then the tokens sampled so
  far — known by the time a block fills, since a token is fed the iteration
  after it is sampled), so prefix-cache keys chain over real tokens;
* turns a ``SchedulerOutput`` into ``(rid, cached, new)`` triples, the
  preempted rids and each scheduled request's block table
  (``BlockManager.blocks_of``: the block ids the paged KV pool is indexed by);
* passes the stop tokens the real model sampled to ``update`` (the scheduler
  finishes a request at ``max_output_tokens`` by itself).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Step:
    items: list          # (rid, num_cached, num_new, samples), in the scheduler's order
    preempted: list      # rids preempted (by recompute) while forming this iteration
    block_tables: dict   # rid -> block ids (sequence order) of every scheduled request
    cache_hits: dict     # rid -> tokens the prefix cache gave at its (re)admission this iteration
    recompute: int       # tokens of this iteration computed before (preemption by recompute)
    out: object = None   # the sim.serving.scheduler.SchedulerOutput


def block_policy(name: str):
    from policies import get_policy
    try:
        pol = get_policy(name)
    except (KeyError, ValueError):
        raise ValueError(f"--block-policy: {name!r} is not a block policy (lru, fifo, rsbcm)") from None
    if not hasattr(pol, "evict_key"):
        raise ValueError(f"--block-policy: {name!r} is not a block policy (lru, fifo, rsbcm)")
    return pol


class SchedulerAdapter:
    """One scheduler + block manager for one run (``cfg``: :class:`calibrate.serve.ServeConfig`)."""

    def __init__(self, cfg):
        from sim.serving.kvcache import BlockManager
        from sim.serving.scheduler import Scheduler, SchedulerConfig

        self.bs = int(cfg.block_size)
        self.kv = BlockManager(cfg.num_blocks, self.bs, policy=block_policy(cfg.block_policy),
                               caching=bool(cfg.prefix_caching))
        self.s = Scheduler(SchedulerConfig(max_num_seqs=int(cfg.max_num_seqs),
                                           max_num_batched_tokens=int(cfg.max_num_batched_tokens),
                                           policy=cfg.scheduler), self.kv)

    def add(self, r) -> None:
        from sim.serving.scheduler import Request as SReq
        bs = self.bs

        def content(k, r=r):
            toks = r.tokens
            if (k + 1) * bs > len(toks):   # the manager keys only full blocks of known tokens
                raise RuntimeError(f"request {r.rid}: block {k} keyed before its tokens are known")
            return tuple(toks[k * bs:(k + 1) * bs])

        self.s.add(SReq(req_id=r.rid, prompt_tokens=len(r.prompt), max_output_tokens=int(r.max_new),
                        content=content, data=r))

    def idle(self) -> bool:
        return not self.s.has_unfinished()

    def schedule(self) -> Step:
        out = self.s.schedule()
        items = [(it.req.req_id, int(it.num_cached), int(it.num_new), bool(it.samples)) for it in out.items]
        tables = {it.req.req_id: self.kv.blocks_of(it.req.req_id) for it in out.items}
        hits = {it.req.req_id: int(it.cache_hit) for it in out.items if it.new_admission}
        rec = sum(int(it.recompute) for it in out.items)
        return Step(items, [p.req_id for p in out.preempted], tables, hits, rec, out)

    def update(self, step: Step, stopped=()) -> list:
        """Rids finished by this iteration (a stop token in ``stopped``, or ``max_output_tokens`` out)."""
        return [r.req_id for r in self.s.update(step.out, finished=list(stopped))]

    def n_running(self) -> int:
        return len(self.s.running)

    def n_waiting(self) -> int:
        return len(self.s.waiting)

    def n_unfinished(self) -> int:
        return len(self.s.running) + len(self.s.waiting)

    def blocks_used(self) -> int:
        return int(self.kv.num_used)

    def stats(self) -> dict:
        return self.s.stats()
