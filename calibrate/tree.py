"""RSBCM in tree mode on a real model: a real KV block pool with a budget, real recompute.

Tree search as DESIGN §2 / ``traces.capture.capture_tree`` (same sampling
streams): depth ``D``; each level the best ``expand_k`` open nodes (by their
verification score, ties to the lower id) expand into ``branching`` children,
each generating ``step_tokens`` tokens; every node is scored by a
verification pass over ``prompt + path + verify prompt``.

KV memory: every node's tokens are cut into blocks of ``block_size`` tokens
(block id ``(node, k)``) whose K/V tensors live in a dict, and whose
residency is decided by ``policies.BlockPool(budget, policy)`` with the block
policy object (``rsbcm``: omega = score / (depth + 1); ``lru``; ``fifo``).
To expand a node, the blocks of its path are touched in order; a block the
pool evicted is **recomputed** — a forward of its tokens over the KV of the
blocks before it, timed as ``recompute`` — and re-admitted. The path's KV
(all tokens but the last) is the concatenation of its blocks; the last token
is prefilled to get the first logits; the children decode on that KV
``expand``-ed to ``branching`` rows (no copy). A generated block's score is
its node's verification score, its depth the node's depth; the prompt's
blocks have depth 0 and the root's score.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np


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
    phases: list = field(default_factory=list)


def run_tree(lm, prompt: list[int], problem, block_policy, budget_blocks: int | None, *, depth: int = 3,
             expand_k: int = 2, branching: int = 3, step_tokens: int = 32, seed: int = 0, tree_index: int = 0,
             block_size: int = 16, temperature: float = 0.7, top_p: float = 0.95, timer=None,
             stop=(), yes=(), no=(), suffix=(), pad_id: int = 0) -> TreeResult:
    import torch
    from policies import BlockPool
    from traces import capture_ops as CO
    from traces.answers import extract_answer, is_correct
    from traces.capture import STREAM_TREE
    from traces.workload import verification_ids

    from calibrate import engine as E
    from calibrate import kv as KV

    if timer is None:
        from calibrate.timing import PhaseTimer
        timer = PhaseTimer(sync=lm.sync)
    L = lm.n_layers
    dev = lm.device
    n_nodes_max = 1 + branching * (1 + expand_k * max(depth - 1, 0))
    unconstrained = n_nodes_max * (math.ceil((len(prompt) + step_tokens) / block_size) + 1)
    pool = BlockPool(unconstrained if budget_blocks is None else int(budget_blocks), block_policy)
    store: dict = {}          # block id -> list of (k, v) per layer, each [1, H, n, D]
    ever: set = set()         # blocks computed at least once: computing one again is recompute
    nodes = [{"node": 0, "parent": -1, "depth": 0, "tokens": list(prompt), "path": [], "score": 0.0, "done": False}]
    clock = [0.0]
    rec_tok, rec_s = 0, 0.0
    t0 = time.perf_counter()

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    def segs(n: int) -> list[int]:
        out = []
        while n >= 0:
            out.append(n)
            n = nodes[n]["parent"]
        return out[::-1]

    def drop_evicted():
        for bid in [b for b in store if b not in pool]:
            del store[bid]

    def path_kv(n: int, upto_last: bool):
        """KV (list per layer) of node n's full sequence, all tokens but the last if upto_last."""
        nonlocal rec_tok, rec_s
        parts: list[list] = []
        pos = 0
        seq_nodes = segs(n)
        for si, sn in enumerate(seq_nodes):
            toks = nodes[sn]["tokens"]
            n_use = len(toks) - 1 if (upto_last and si == len(seq_nodes) - 1) else len(toks)
            for k in range(math.ceil(n_use / block_size)):
                lo, hi = k * block_size, min((k + 1) * block_size, n_use)
                bid = (sn, k)
                have = store.get(bid)
                hit = pool.access(bid, score=float(nodes[sn]["score"]), depth=int(nodes[sn]["depth"]), now=tick())
                if hit and have is not None and have[0][0].shape[2] >= hi - lo:
                    parts.append([(kk[:, :, : hi - lo], vv[:, :, : hi - lo]) for kk, vv in have])
                else:
                    # evicted (or never computed this far): recompute over the KV before it
                    past = KV.cache_from([(torch.cat([p[l][0] for p in parts], 2), torch.cat([p[l][1] for p in parts], 2))
                                          for l in range(L)]) if parts else None
                    ids = torch.tensor([toks[lo:hi]], dtype=torch.long, device=dev)
                    posi = torch.arange(pos, pos + hi - lo, device=dev).unsqueeze(0)
                    ts = time.perf_counter()
                    again = bid in ever
                    ctx_ = timer.phase("recompute" if again else "prefill") if timer is not None else None
                    with (ctx_ if ctx_ is not None else _Null()) as row:
                        _, cache, _ = CO.prefill(lm, ids, position_ids=posi, cache=past) if past is not None else \
                            CO.prefill(lm, ids, position_ids=posi)
                        if row is not None:
                            row.items([hi - lo], [pos])
                    if again:
                        rec_s += time.perf_counter() - ts
                        rec_tok += hi - lo
                    ever.add(bid)
                    new = [(lay.keys[:, :, -(hi - lo):], lay.values[:, :, -(hi - lo):]) for lay in cache.layers]
                    store[bid] = new
                    parts.append(new)
                drop_evicted()
                pos += hi - lo
        return parts, pos

    with torch.inference_mode():
        v0 = verification_ids(prompt, [], suffix, sorted(stop))[0]
        nodes[0]["score"] = float(E.verify_batch(lm, [v0], yes, no, pad_id, None, timer).scores[0])
        # the prompt's KV (all but its last token): one prefill, cut into blocks and admitted to the pool
        n0 = len(prompt) - 1
        with timer.phase("prefill") as row:
            _, c0, _ = CO.prefill(lm, torch.tensor([prompt[:-1]], device=dev))
            row.items([n0], [0])
        for k in range(math.ceil(n0 / block_size)):
            lo, hi = k * block_size, min((k + 1) * block_size, n0)
            pool.access((0, k), score=float(nodes[0]["score"]), depth=0, now=tick())
            store[(0, k)] = [(lay.keys[:, :, lo:hi], lay.values[:, :, lo:hi]) for lay in c0.layers]
            ever.add((0, k))
            drop_evicted()
        frontier = [0]
        for d in range(1, depth + 1):
            if not frontier:
                break
            level = []
            for p in frontier:
                parts, n_ctx = path_kv(p, upto_last=True)
                with timer.phase("assemble", kind="copy") as row:
                    ctx_kv = [(torch.cat([q[l][0] for q in parts], 2), torch.cat([q[l][1] for q in parts], 2))
                              for l in range(L)]
                    row.cand = n_ctx
                seq = list(prompt) + nodes[p]["path"]
                with timer.phase("prefill") as row:
                    logits, cache, _ = CO.prefill(lm, torch.tensor([[seq[-1]]], device=dev),
                                                  position_ids=torch.tensor([[n_ctx]], device=dev), cache=KV.cache_from(ctx_kv))
                    row.items([1], [n_ctx])
                # the parent's last token now has KV: complete its tail block
                tail = nodes[p]["tokens"]
                k_last = (len(tail) - 1) // block_size
                lo = k_last * block_size
                bid = (p, k_last)
                pool.access(bid, score=float(nodes[p]["score"]), depth=int(nodes[p]["depth"]), now=tick())
                ever.add(bid)
                if True:  # the block now holds the parent's last token too
                    store[bid] = [(lay.keys[:, :, n_ctx - (len(tail) - 1 - lo):], lay.values[:, :, n_ctx - (len(tail) - 1 - lo):])
                                  for lay in cache.layers]
                drop_evicted()
                new_ids = list(range(len(nodes) + len(level), len(nodes) + len(level) + branching))
                gens = [CO.make_generator(lm, CO.seed_for(seed, problem.index, 1000 * tree_index + i, STREAM_TREE))
                        for i in new_ids]
                batch = KV.expand_view(cache, branching)
                mask = torch.ones(branching, n_ctx + 1, dtype=torch.long, device=dev)
                sc = _Clock(timer, branching, n_ctx + 1)
                res = CO.sample_decode(lm, logits.expand(branching, -1), batch, mask,
                                       torch.full((branching,), n_ctx + 1, device=dev), step_tokens, gens, temperature, top_p,
                                       sorted(stop), step_hook=sc.hook)
                sc.close()
                for i, (nid, g) in enumerate(zip(new_ids, res.gen_ids)):
                    node = {"node": nid, "parent": p, "depth": d, "tokens": list(g), "path": nodes[p]["path"] + list(g),
                            "score": 0.0, "done": bool(g and g[-1] in stop)}
                    level.append(node)
                    # store the generated tokens' KV (all but the last, which was never fed)
                    fed = len(g) - 1
                    base = n_ctx + 1
                    for k in range(math.ceil(fed / block_size)):
                        lo, hi = k * block_size, min((k + 1) * block_size, fed)
                        pool.access((nid, k), score=0.0, depth=d, now=tick())
                        ever.add((nid, k))
                        store[(nid, k)] = [(lay.keys[i:i + 1, :, base + lo: base + hi], lay.values[i:i + 1, :, base + lo: base + hi])
                                           for lay in res.cache.layers]
                        drop_evicted()
            # verification of the level (recomputed sequences), then the scores tag the blocks
            vseqs = [verification_ids(prompt, n["path"], suffix, sorted(stop))[0] for n in level]
            vr = E.verify_batch(lm, vseqs, yes, no, pad_id, None, timer)
            for n, s in zip(level, vr.scores):
                n["score"] = float(s)
                nodes.append(n)
                for k in range(math.ceil(max(len(n["tokens"]) - 1, 0) / block_size)):
                    pool.update((n["node"], k), score=float(s))
            open_ = [n["node"] for n in level if not n["done"]]
            frontier = sorted(open_, key=lambda i: (-nodes[i]["score"], i))[:expand_k]
    tok = lm.tokenizer
    leaves = [n for n in nodes[1:]]
    best = max(leaves, key=lambda n: (n["score"], -n["node"])) if leaves else nodes[0]
    ans = extract_answer(tok.decode(best["path"], skip_special_tokens=True), problem.answer_kind)
    return TreeResult(policy=block_policy.name, budget_blocks=int(pool.budget), seconds=time.perf_counter() - t0,
                      recompute_tokens=int(rec_tok), recompute_seconds=float(rec_s), evictions=int(pool.evictions),
                      refetches=int(pool.refetches), n_nodes=len(nodes), best_score=float(best["score"]),
                      best_answer=ans, correct=bool(is_correct(ans, problem.truth, problem.answer_kind)),
                      peak_blocks=int(pool.peak))


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


class _Clock:
    def __init__(self, timer, B, ctx):
        from calibrate.runner import _StepClock
        self.c = _StepClock(timer, B, [ctx] * B) if timer is not None else None

    def hook(self, t, feed):
        if self.c is not None:
            self.c.hook(t, feed)

    def close(self):
        if self.c is not None:
            self.c.close()
