"""RSBCM in tree mode on a real model: a real KV block pool with a budget, real recompute.

Tree search as DESIGN §2 / ``traces.capture.capture_tree`` (same sampling
streams): depth ``D``; each level the best ``expand_k`` open nodes (by their
verification score, ties to the lower id) expand into ``branching`` children,
each generating ``step_tokens`` tokens; every node is scored by a
verification pass over ``prompt + path + verify prompt``.

KV memory: every node's tokens are cut into blocks of ``block_size`` tokens
(block id ``(node, k)``) held by the serving block manager
(``sim.serving.kvcache.BlockManager(budget, block_size, policy)``: hash-chained keys,
referenced blocks never evicted, freed blocks ranked by the block policy --
``rsbcm``: omega = score / (depth + 1); ``lru``; ``fifo``). The K/V tensors of
a block live here in a dict keyed by the manager's physical block id (its
slot), as a paged engine's KV pool; a slot is overwritten when the manager
hands it out again. To expand a node, its path is held; a node preempted
since (its blocks freed into the cache) takes its cached chain up to the
first miss and **recomputes** every block after it -- a forward of its tokens
over the KV of the blocks before it, timed as ``recompute``. The path's KV
(all tokens but the last) is the concatenation of its blocks; the last token
is prefilled to get the first logits; the children decode on that KV
``expand``-ed to ``branching`` rows (no copy). A block's score is 0 until a
node whose path holds it is verified (the highest such score), its depth its
node's depth; the prompt's blocks have depth 0.

The walk itself -- which blocks are touched, with which (score, depth), hit
or (re)compute, what is evicted, the frontier and the unconstrained budget --
is ``sim.replay.tree``'s (``TreeBlocks``, ``select_frontier``,
``unconstrained_budget``), the very code the simulator replays a trace with.
This module does the torch work in its hooks: it keeps each held block's K/V
tensors in step with the manager's block tables, computes the blocks the walk asks
for, decodes, verifies and times every phase.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TreeResult:
    policy: str
    budget_blocks: int
    seconds: float
    recompute_tokens: int
    recompute_seconds: float
    evictions: int
    refetches: int
    n_nodes: int
    best_score: float
    best_answer: str
    correct: bool
    peak_blocks: int
    preemptions: int = 0
    floor_blocks: int = 0
    touches: list = field(default_factory=list)
    eviction_order: list = field(default_factory=list)
    phases: list = field(default_factory=list)


def run_tree(lm, prompt: list[int], problem, block_policy, budget_blocks: int | None, *, depth: int = 3,
             expand_k: int = 2, branching: int = 3, step_tokens: int = 32, seed: int = 0, tree_index: int = 0,
             block_size: int = 16, temperature: float = 0.7, top_p: float = 0.95, timer=None,
             stop=(), yes=(), no=(), suffix=(), pad_id: int = 0) -> TreeResult:
    """One tree search on ``lm`` under a KV block budget (the module docstring); ``None``: the unconstrained one.

    Each level expands the frontier's nodes (:meth:`_TreeWalk.expand`), verifies the new ones
    (:meth:`_TreeWalk.verify`) and keeps the best ``expand_k`` open ones (``select_frontier``); the
    others' blocks go to the evictable cache.
    """
    import torch

    from sim.replay.tree import TreeBlocks, select_frontier, unconstrained_budget

    if timer is None:
        from calibrate.timing import PhaseTimer
        timer = PhaseTimer(sync=lm.sync)
    unconstrained = unconstrained_budget(len(prompt), depth, expand_k, branching, step_tokens, block_size)
    budget = unconstrained if budget_blocks is None else int(budget_blocks)
    # the walk (block tables, hits, recompute decisions, preemptions, evictions) is sim.replay.tree's; the real
    # KV of every block lives in the _TreeWalk, by slot (the manager's physical block id), kept in step by its hooks
    tb = TreeBlocks(block_policy, budget, block_size)
    walk = _TreeWalk(lm, tb, timer, prompt, problem, seed=seed, tree_index=tree_index, branching=branching,
                     step_tokens=step_tokens, temperature=temperature, top_p=top_p, stop=stop, yes=yes, no=no,
                     suffix=suffix, pad_id=pad_id)
    t0 = time.perf_counter()
    with torch.inference_mode():
        walk.root()
        frontier = [0]
        for d in range(1, depth + 1):
            if not frontier:
                break
            level = []
            for p in frontier:
                level += walk.expand(p, d, len(walk.nodes) + len(level))
                tb.done(p)
            walk.verify(level)
            frontier = select_frontier([n["node"] for n in level], {n["node"]: n["score"] for n in level},
                                       {n["node"]: n["done"] for n in level}, expand_k) if d < depth else []
            for n in level:         # pruned, finished or leaves: their blocks go to the evictable cache
                if n["node"] not in frontier:
                    tb.finish(n["node"])
    return _tree_result(lm, problem, block_policy, budget, walk, t0)


class _TreeWalk:
    """The torch side of one tree walk: the nodes, each held block's K/V by slot, the recompute clock.

    ``store`` maps a slot to its block's K/V, a list of ``(k, v)`` per layer, each ``[1, H, n, D]``;
    the :class:`~sim.replay.tree.TreeBlocks` hooks fill it when the manager hands a slot out.
    """

    def __init__(self, lm, tb, timer, prompt, problem, *, seed, tree_index, branching, step_tokens, temperature,
                 top_p, stop, yes, no, suffix, pad_id):
        self.lm, self.tb, self.timer, self.prompt, self.problem = lm, tb, timer, prompt, problem
        self.seed, self.tree_index, self.branching, self.step_tokens = seed, tree_index, branching, step_tokens
        self.temperature, self.top_p = temperature, top_p
        self.stop, self.yes, self.no, self.suffix, self.pad_id = stop, yes, no, suffix, pad_id
        self.store: dict = {}
        self.nodes = [{"node": 0, "parent": -1, "depth": 0, "tokens": list(prompt), "path": [], "score": 0.0,
                       "done": False}]
        self.rec_s = 0.0      # seconds spent recomputing evicted blocks

    def root(self) -> None:
        """Score the prompt; its KV (all but its last token): one prefill, cut into blocks and admitted to the pool."""
        import torch
        from traces import capture_ops as CO
        from traces.workload import verification_ids

        from calibrate import real_phases as E

        lm, timer, prompt = self.lm, self.timer, self.prompt
        v0 = verification_ids(prompt, [], self.suffix, sorted(self.stop))[0]
        self.nodes[0]["score"] = float(E.verify_batch(lm, [v0], self.yes, self.no, self.pad_id, None, timer).scores[0])
        n0 = len(prompt) - 1
        with timer.phase("prefill") as row:
            _, c0, _ = CO.prefill(lm, torch.tensor([prompt[:-1]], device=lm.device))
            row.items([n0], [0])
        self.tb.admit(0, -1, n0, 0, on_block=lambda bid, lo, hi, slot: self.store.__setitem__(
            slot, [(lay.keys[:, :, lo:hi], lay.values[:, :, lo:hi]) for lay in c0.layers]))
        self.tb.scored(0, self.nodes[0]["score"])

    def path_kv(self, p: int):
        """KV (list of blocks, each a list per layer) of node p's sequence but its last token, and its length."""
        parts: list[list] = []

        def block(bid, lo, hi, pos, phase, slot):
            if phase is None:       # cached (or held) and long enough
                parts.append([(kk[:, :, : hi - lo], vv[:, :, : hi - lo]) for kk, vv in self.store[slot]])
                return
            new = self._compute_block(parts, bid, lo, hi, pos, phase)
            self.store[slot] = new
            parts.append(new)

        _, n_ctx = self.tb.path(p, on_block=block)
        return parts, n_ctx

    def _compute_block(self, parts, bid, lo, hi, pos, phase):
        """Tokens ``[lo, hi)`` of node ``bid[0]`` over the KV of ``parts`` (the blocks before it): a first
        compute, or a recompute of a block evicted since (timed into ``rec_s``). Returns the block's K/V."""
        import torch
        from traces import capture_ops as CO

        from calibrate import kv as KV

        lm, L, dev = self.lm, self.lm.n_layers, self.lm.device
        toks = self.nodes[bid[0]]["tokens"]
        past = KV.cache_from([(torch.cat([q[l][0] for q in parts], 2), torch.cat([q[l][1] for q in parts], 2))
                              for l in range(L)]) if parts else None
        ids = torch.tensor([toks[lo:hi]], dtype=torch.long, device=dev)
        posi = torch.arange(pos, pos + hi - lo, device=dev).unsqueeze(0)
        ts = time.perf_counter()
        with self.timer.phase(phase) as row:
            _, cache, _ = CO.prefill(lm, ids, position_ids=posi, cache=past) if past is not None else \
                CO.prefill(lm, ids, position_ids=posi)
            row.items([hi - lo], [pos])
        if phase == "recompute":
            self.rec_s += time.perf_counter() - ts
        return [(lay.keys[:, :, -(hi - lo):], lay.values[:, :, -(hi - lo):]) for lay in cache.layers]

    def expand(self, p: int, d: int, first_id: int) -> list[dict]:
        """Node p's ``branching`` children at depth d, ids from ``first_id``: its path's KV assembled from its
        blocks, its last token prefilled, the children decoded on that KV expanded (no copy) and admitted."""
        import torch
        from traces import capture_ops as CO
        from traces.capture import STREAM_TREE

        from calibrate import kv as KV
        from calibrate.runner import StepClock

        lm, timer, tb, branching, dev = self.lm, self.timer, self.tb, self.branching, self.lm.device
        parts, n_ctx = self.path_kv(p)
        with timer.phase("assemble", kind="copy") as row:
            ctx_kv = [(torch.cat([q[l][0] for q in parts], 2), torch.cat([q[l][1] for q in parts], 2))
                      for l in range(lm.n_layers)]
            row.cand = n_ctx
        seq = list(self.prompt) + self.nodes[p]["path"]
        with timer.phase("prefill") as row:
            logits, cache, _ = CO.prefill(lm, torch.tensor([[seq[-1]]], device=dev),
                                          position_ids=torch.tensor([[n_ctx]], device=dev), cache=KV.cache_from(ctx_kv))
            row.items([1], [n_ctx])
        # the parent's last token now has KV: its tail block holds tokens [lo, hi) of p, the cache's last hi - lo
        tb.tail(p, on_block=lambda bid, lo, hi, slot: self.store.__setitem__(
                    slot, [(lay.keys[:, :, n_ctx + 1 - (hi - lo):], lay.values[:, :, n_ctx + 1 - (hi - lo):])
                          for lay in cache.layers]))
        new_ids = list(range(first_id, first_id + branching))
        gens = [CO.make_generator(lm, CO.seed_for(self.seed, self.problem.index, 1000 * self.tree_index + i,
                                                  STREAM_TREE)) for i in new_ids]
        batch = KV.expand_view(cache, branching)
        mask = torch.ones(branching, n_ctx + 1, dtype=torch.long, device=dev)
        sc = StepClock(timer, branching, [n_ctx + 1] * branching)
        res = CO.sample_decode(lm, logits.expand(branching, -1), batch, mask,
                               torch.full((branching,), n_ctx + 1, device=dev), self.step_tokens, gens,
                               self.temperature, self.top_p, sorted(self.stop), step_hook=sc.hook)
        sc.close()
        base = n_ctx + 1
        children = []
        for i, (nid, g) in enumerate(zip(new_ids, res.gen_ids)):
            node = {"node": nid, "parent": p, "depth": d, "tokens": list(g), "path": self.nodes[p]["path"] + list(g),
                    "score": 0.0, "done": bool(g and g[-1] in self.stop)}
            children.append(node)
            # the generated tokens' KV (all but the last, which was never fed), row i of the batch
            tb.admit(nid, p, len(g) - 1, d, on_block=lambda bid, lo, hi, slot, i=i: self.store.__setitem__(
                slot, [(lay.keys[i:i + 1, :, base + lo: base + hi], lay.values[i:i + 1, :, base + lo: base + hi])
                      for lay in res.cache.layers]))
        return children

    def verify(self, level: list[dict]) -> None:
        """Verification of a level (recomputed sequences); then its scores are known, to the nodes and the pool."""
        from traces.workload import verification_ids

        from calibrate import real_phases as E

        vseqs = [verification_ids(self.prompt, n["path"], self.suffix, sorted(self.stop))[0] for n in level]
        vr = E.verify_batch(self.lm, vseqs, self.yes, self.no, self.pad_id, None, self.timer)
        for n, s in zip(level, vr.scores):
            n["score"] = float(s)
            self.nodes.append(n)
            self.tb.scored(n["node"], n["score"])


def _tree_result(lm, problem, block_policy, budget: int, walk: _TreeWalk, t0: float) -> TreeResult:
    """The best node (by score, ties to the lower id; the root if none grew) and the walk's block counts."""
    from traces.answers import extract_answer, is_correct

    tok, tb, nodes = lm.tokenizer, walk.tb, walk.nodes
    leaves = [n for n in nodes[1:]]
    best = max(leaves, key=lambda n: (n["score"], -n["node"])) if leaves else nodes[0]
    ans = extract_answer(tok.decode(best["path"], skip_special_tokens=True), problem.answer_kind)
    return TreeResult(policy=block_policy.name, budget_blocks=int(budget), seconds=time.perf_counter() - t0,
                      recompute_tokens=int(tb.recompute_tokens), recompute_seconds=float(walk.rec_s),
                      evictions=int(tb.bm.evictions), refetches=int(tb.refetches), n_nodes=len(nodes),
                      best_score=float(best["score"]), best_answer=ans,
                      correct=bool(is_correct(ans, problem.truth, problem.answer_kind)), peak_blocks=int(tb.peak),
                      preemptions=int(tb.preemptions), floor_blocks=int(tb.floor),
                      touches=[(t.block, t.score, t.depth, t.now, t.hit) for t in tb.touches],
                      eviction_order=list(tb.evicted_log))
