"""Tree search (RSBCM) replayed from a trace's tree, with a real ``policies.BlockPool``.

DESIGN §2/§4: depth ``D``; each level the best ``expand_k`` open nodes (by
verification score, ties to the lower id) expand into ``branching`` children of
up to ``step_tokens`` tokens; every node is scored by a verification pass over
``prompt + path + verify prompt``. KV lives in blocks of ``block_size`` tokens,
block id ``(node, k)``, under a block budget run by ``policies.BlockPool`` with
the block policy (``rsbcm``: evict the lowest ``omega = score / (depth + 1)``;
``lru``; ``fifo``). A block the pool evicted and that is needed again is
recomputed and charged.

There is one walk: the real runner (``calibrate/tree.py``) drives the same
:class:`TreeBlocks`, :func:`select_frontier` and :func:`unconstrained_budget`,
so the pool makes the same decisions for the same tree and budget:

1. root verification (``prompt + verify``, from scratch);
2. prompt prefill of ``len(prompt) - 1`` tokens; its blocks are admitted
   (score = root score, depth 0);
3. per level, per frontier node ``p`` (frontier order): the blocks of the path
   root..p are touched in order (``p``'s own blocks up to its last token
   excluded); a block not resident (or held shorter than needed) is computed
   over the blocks before it -- **recompute** if it was computed before;
   the context (``n_ctx`` tokens) is assembled (a KV copy, as the runner does);
   ``p``'s last token is prefilled over it and its tail block touched (it now
   holds that token); the ``branching`` children decode ``max(gen) - 1`` lock-step
   steps; each child's blocks (all its tokens but the last) are admitted with
   score 0 and depth ``d`` (the runner tags them before they are verified);
4. the level is verified in one left-padded batch (from scratch) and the
   scores are written onto the children's resident blocks (``BlockPool.update``).

The pool clock is logical: one tick per touch. :class:`TreeBlocks` holds the
block bookkeeping alone (pure Python, no torch); the real runner drives it with
hooks that do the torch work, :func:`walk_tree` drives it from a trace and
records the operations, :func:`simulate_tree` prices them with ``sim.cost``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Hashable

import numpy as np
import pandas as pd

from policies import BlockPool, PolicyError, get_policy, list_policies

from . import cost as C
from .capacity import MAX_BLOCK_SIZE, MAX_BLOCKS, MAX_FRAC
from .profiles import HardwareProfile, ModelShape, load_hardware, load_model, model_from_manifest

BLOCK_POLICIES = ("rsbcm", "lru", "fifo")
PHASES = ("verify", "prefill", "assemble", "decode", "recompute")


class TreeError(ValueError):
    """A bad tree, policy or budget (one line naming the field or flag)."""


# --------------------------------------------------------------------------- the shared block walk
@dataclass
class Touch:
    """One ``BlockPool.access``: block id, score, depth, logical time, and whether it hit."""

    block: tuple
    score: float
    depth: int
    now: float
    hit: bool


class TreeBlocks:
    """Block bookkeeping of the tree walk: a ``BlockPool``, the logical clock, what is held and how long.

    Pure Python (no torch). This is the one walk: the simulator drives it from a
    trace (:func:`walk_tree`), the real runner (``calibrate/tree.py``) drives it
    with live results and does the torch work in the hooks. Each method touches
    blocks in the walk's order and returns (or hands to its hook) what the
    caller must compute.

    Hooks (all optional; the runner keeps the real KV tensors in step with
    ``held`` through them):

    - ``on_drop(block)``: a held block's KV is gone (evicted, or never admitted
      under budget 0); called once per block leaving ``held``.
    - ``admit(..., on_block=f)``: ``f(block, lo, hi)`` for each admitted block,
      tokens ``[lo, hi)`` of the node, after its touch and before evictions are
      dropped;
    - ``path(..., on_block=f)``: ``f(block, lo, hi, pos, phase)`` for each block of
      the path, ``pos`` its first position in the sequence, ``phase`` None on a hit
      (use the held KV), else ``"prefill"`` / ``"recompute"`` (compute it over the
      blocks before it);
    - ``tail(..., on_block=f)``: ``f(block, lo, hi)``, the tail block now holding
      tokens ``[lo, hi)`` of the node.
    """

    def __init__(self, pool: BlockPool, block_size: int, on_drop=None):
        self.pool = pool
        self.bs = int(block_size)
        self.clock = 0.0
        self.held: dict[Hashable, int] = {}   # resident block -> tokens of KV it holds
        self.ever: set = set()                # blocks computed at least once
        self.touches: list[Touch] = []
        self.recompute_tokens = 0
        self.on_drop = on_drop
        self._n_log = 0

    def _access(self, bid, score: float, depth: int) -> bool:
        self.clock += 1.0
        hit = self.pool.access(bid, score=float(score), depth=int(depth), now=self.clock)
        self.touches.append(Touch(bid, float(score), int(depth), self.clock, bool(hit)))
        return hit

    def _forget(self, bid) -> None:
        if self.held.pop(bid, None) is not None and self.on_drop is not None:
            self.on_drop(bid)

    def _drop_evicted(self, bid) -> None:
        log = self.pool.evicted_log
        for victim, _ in log[self._n_log:]:
            self._forget(victim)
        self._n_log = len(log)
        if bid not in self.pool:          # budget 0: computed, used, dropped
            self._forget(bid)

    def admit(self, node: int, n_tokens: int, score: float, depth: int, on_block=None) -> None:
        """Freshly computed KV of ``n_tokens`` tokens of ``node`` (prompt prefill, a child's decode)."""
        for k in range(math.ceil(n_tokens / self.bs)):
            bid = (node, k)
            lo, hi = k * self.bs, min((k + 1) * self.bs, n_tokens)
            self._access(bid, score, depth)
            self.ever.add(bid)
            self.held[bid] = hi - lo
            if on_block is not None:
                on_block(bid, lo, hi)
            self._drop_evicted(bid)

    def path(self, segments, on_block=None) -> tuple[list[tuple[str, int, int]], int]:
        """Touch the blocks of a path; ``segments`` = ``[(node, n_use, score, depth), ...]`` root first.

        Returns ``(computes, n_ctx)``: each compute is ``(phase, n_new, n_cached)`` with phase
        ``"recompute"`` (computed before, evicted since) or ``"prefill"``, in order.
        """
        out = []
        pos = 0
        for node, n_use, score, depth in segments:
            for k in range(math.ceil(n_use / self.bs)):
                lo, hi = k * self.bs, min((k + 1) * self.bs, n_use)
                bid = (node, k)
                have = self.held.get(bid)
                hit = self._access(bid, score, depth)
                phase = None
                if not (hit and have is not None and have >= hi - lo):
                    again = bid in self.ever
                    if again:
                        self.recompute_tokens += hi - lo
                    phase = "recompute" if again else "prefill"
                    out.append((phase, hi - lo, pos))
                    self.ever.add(bid)
                    self.held[bid] = hi - lo
                if on_block is not None:
                    on_block(bid, lo, hi, pos, phase)
                self._drop_evicted(bid)
                pos += hi - lo
        return out, pos

    def tail(self, node: int, n_tokens: int, score: float, depth: int, on_block=None) -> None:
        """The node's last token now has KV (prefilled to expand it): its tail block holds all its tokens."""
        k = (n_tokens - 1) // self.bs
        bid = (node, k)
        self._access(bid, score, depth)
        self.ever.add(bid)
        self.held[bid] = n_tokens - k * self.bs
        if on_block is not None:
            on_block(bid, k * self.bs, n_tokens)
        self._drop_evicted(bid)

    def scored(self, node: int, n_tokens: int, score: float) -> None:
        """A verified node: its resident blocks take its score (no touch)."""
        for k in range(math.ceil(max(n_tokens - 1, 0) / self.bs)):
            self.pool.update((node, k), score=float(score))


def unconstrained_budget(prompt_len: int, depth: int, expand_k: int, branching: int, step_tokens: int,
                         block_size: int) -> int:
    """The runner's budget when none is set: room for every block of the largest such tree."""
    n_nodes_max = 1 + branching * (1 + expand_k * max(depth - 1, 0))
    return n_nodes_max * (math.ceil((prompt_len + step_tokens) / block_size) + 1)


def select_frontier(level: list[int], score: dict, done: dict, expand_k: int) -> list[int]:
    """The best ``expand_k`` open nodes of a level, by score, ties to the lower id."""
    return sorted([n for n in level if not done[n]], key=lambda i: (-score[i], i))[:expand_k]


# --------------------------------------------------------------------------- the tree of a trace
@dataclass
class TreeSpec:
    """What the walk needs from a trace's tree (``trees/tNNNNN``) and manifest."""

    nodes: pd.DataFrame
    meta: dict
    verify_suffix_ids: list = field(default_factory=list)
    stop_ids: list = field(default_factory=list)
    manifest: dict | None = None
    name: str = "tree"


def tree_spec(trace, tree: int = 0) -> TreeSpec:
    """A :class:`TreeSpec` from a trace path, a loaded ``Trace`` or a ``TreeSpec``."""
    if isinstance(trace, TreeSpec):
        return trace
    from traces.store import Trace, load_trace
    if isinstance(trace, (str, Path)):
        if not (Path(trace) / "manifest.json").is_file():
            raise TreeError(f"--trace {trace}: not a trace directory (no manifest.json)")
        trace = load_trace(trace, verify=False)
    if not isinstance(trace, Trace):
        raise TreeError(f"trace: expected a path, a traces.store.Trace or a TreeSpec, got {type(trace).__name__}")
    if not trace.trees:
        raise TreeError(f"{trace.path}: manifest.json: shards.trees: the trace has no tree (capture with --trees N)")
    if isinstance(tree, bool) or not isinstance(tree, (int, np.integer)) or not 0 <= tree < len(trace.trees):
        raise TreeError(f"--tree: {tree!r} is not a tree index of {trace.path} (0..{len(trace.trees) - 1})")
    tt = trace.trees[int(tree)]
    tok = (trace.manifest.get("capture") or {}).get("tokens") or {}
    for key in ("verify_suffix_ids", "stop_ids"):
        if key not in tok:
            raise TreeError(f"{trace.path}/manifest.json: capture.tokens.{key}: missing (needed for verification lengths)")
    return TreeSpec(nodes=tt.nodes, meta=dict(tt.meta), verify_suffix_ids=list(tok["verify_suffix_ids"]),
                    stop_ids=list(tok["stop_ids"]), manifest=trace.manifest, name=f"{trace.path.name}/{tt.rel}")


def _structure(spec: TreeSpec):
    """Check the tree and return per-node lists plus the frontiers, level by level, in expansion order."""
    df = spec.nodes
    where = f"{spec.name}/nodes.parquet"
    for col in ("node", "parent", "depth", "score", "n_tokens", "context_len", "token_ids", "expanded"):
        if col not in df.columns:
            raise TreeError(f"{where}: column {col}: missing")
    n = len(df)
    if n == 0:
        raise TreeError(f"{where}: no nodes")
    node = df["node"].to_numpy()
    if not np.array_equal(node, np.arange(n)):
        raise TreeError(f"{where}: column node: must be 0..{n - 1} in order")
    parent = [int(x) for x in df["parent"]]
    depth = [int(x) for x in df["depth"]]
    ntok = [int(x) for x in df["n_tokens"]]
    ctx = [int(x) for x in df["context_len"]]
    score = [float(x) for x in df["score"]]
    toks = [list(map(int, t)) for t in df["token_ids"]]
    expanded = [bool(x) for x in df["expanded"]]
    if parent[0] != -1 or depth[0] != 0 or ntok[0] < 1:
        raise TreeError(f"{where}: node 0: must be the root prompt (parent -1, depth 0, n_tokens >= 1)")
    children: dict[int, list[int]] = {i: [] for i in range(n)}
    for i in range(1, n):
        p = parent[i]
        if not 0 <= p < i:
            raise TreeError(f"{where}: column parent: node {i} has parent {p} (parents must precede children)")
        if depth[i] != depth[p] + 1:
            raise TreeError(f"{where}: column depth: node {i} has depth {depth[i]}, its parent {depth[p]}")
        if ctx[i] != ctx[p] + ntok[p]:
            raise TreeError(f"{where}: column context_len: node {i} has {ctx[i]}, expected {ctx[p] + ntok[p]}")
        if ntok[i] < 1:
            raise TreeError(f"{where}: column n_tokens: node {i} generated no token")
        if len(toks[i]) != ntok[i]:
            raise TreeError(f"{where}: column n_tokens: node {i} does not match len(token_ids)")
        children[p].append(i)
    for i in range(n):
        if bool(children[i]) != expanded[i]:
            raise TreeError(f"{where}: column expanded: node {i} is {'not ' if not expanded[i] else ''}expanded "
                            f"but has {len(children[i])} children")
    if any(not math.isfinite(s) for s in score):
        raise TreeError(f"{where}: column score: must be finite")
    levels = []
    D = max(depth)
    for d in range(0, D):
        # frontier order = the order the runner expanded them in, i.e. by their children's ids
        front = sorted((i for i in range(n) if depth[i] == d and children[i]), key=lambda i: children[i][0])
        levels.append(front)
    return parent, depth, ntok, score, toks, children, levels


# --------------------------------------------------------------------------- the walk
@dataclass
class TreeWalk:
    """Everything one walk produced (hardware-free)."""

    ops: dict                   # phase -> list of (n list, c list) forward items (assemble: [n_ctx], [])
    blocks: TreeBlocks
    budget_blocks: int
    unconstrained_blocks: int
    n_nodes: int
    best_node: int


def _policy(policy, params) -> object:
    if not isinstance(policy, str):
        raise TreeError(f"--policy: expected a block policy name ({', '.join(BLOCK_POLICIES)}), got {policy!r}")
    block_names = list_policies("block")
    if policy not in block_names:
        raise TreeError(f"--policy: {policy!r} is not a block policy; valid: {', '.join(block_names)}")
    try:
        return get_policy(policy, **(params or {}))
    except PolicyError as exc:
        raise TreeError(f"--set: {exc}") from None


def _budget(budget_blocks, budget_frac, peak: int, unconstrained: int) -> int:
    if budget_blocks is not None:
        if isinstance(budget_blocks, bool) or not isinstance(budget_blocks, (int, np.integer)) \
                or not 1 <= budget_blocks <= MAX_BLOCKS:
            raise TreeError(f"--budget-blocks: must be an integer in 1..{MAX_BLOCKS}, got {budget_blocks!r}")
        return int(budget_blocks)
    if budget_frac is None:
        return unconstrained
    if isinstance(budget_frac, bool) or not isinstance(budget_frac, (int, float, np.floating, np.integer)) \
            or not math.isfinite(budget_frac) or not 0 < budget_frac <= MAX_FRAC:
        raise TreeError(f"--budget-frac: must be a number in (0, {MAX_FRAC:g}], got {budget_frac!r}")
    # the runner's rule (calibrate/speedup.py): a fraction of the unconstrained run's peak blocks
    return max(1, int(round(float(budget_frac) * peak)))


def walk_tree(spec: TreeSpec, policy: str = "rsbcm", params: dict | None = None, budget_blocks: int | None = None,
              budget_frac: float | None = 0.5, block_size: int = 16) -> TreeWalk:
    """Replay the tree search of ``spec`` through a ``BlockPool``; record every operation (no costs)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise TreeError(f"--block-size: must be an integer in 1..{MAX_BLOCK_SIZE}, got {block_size!r}")
    pol = _policy(policy, params)
    parent, depth, ntok, score, toks, children, levels = _structure(spec)
    meta = spec.meta
    D = max(depth)
    unc = unconstrained_budget(ntok[0], int(meta.get("depth", D)), int(meta.get("expand_k", max(map(len, levels), default=1))),
                               int(meta.get("branching", max((len(c) for c in children.values()), default=1))),
                               int(meta.get("step_tokens", max(ntok[1:], default=1))), block_size)
    n_blocks_total = sum(math.ceil(t / block_size) for t in ntok)
    unc = max(unc, n_blocks_total)
    if budget_blocks is None and budget_frac is not None:
        peak = _run(spec, get_policy("rsbcm"), unc, block_size, parent, depth, ntok, score, toks, children,
                    levels)[1].pool.peak
    else:
        peak = unc
    budget = _budget(budget_blocks, budget_frac, peak, unc)
    ops, tb = _run(spec, pol, budget, block_size, parent, depth, ntok, score, toks, children, levels)
    best = max(range(1, len(ntok)), key=lambda i: (score[i], -i)) if len(ntok) > 1 else 0
    return TreeWalk(ops, tb, budget, unc, len(ntok), best)


def _run(spec, pol, budget, bs, parent, depth, ntok, score, toks, children, levels):
    from traces.workload import verification_ids

    tb = TreeBlocks(BlockPool(budget, pol), bs)
    ops = {p: [] for p in PHASES}
    suffix, stop = spec.verify_suffix_ids, sorted(spec.stop_ids)
    prompt = toks[0]
    paths: dict[int, list[int]] = {0: []}

    def seg(n: int) -> list[int]:
        out = []
        while n >= 0:
            out.append(n)
            n = parent[n]
        return out[::-1]

    # 1. the root is scored; 2. the prompt (all but its last token) is prefilled and admitted
    ops["verify"].append(([len(verification_ids(prompt, [], suffix, stop)[0])], [0]))
    ops["prefill"].append(([ntok[0] - 1], [0]))
    tb.admit(0, ntok[0] - 1, score[0], 0)
    for d, frontier in enumerate(levels, start=1):
        level = []
        for p in frontier:
            sp = seg(p)
            computes, n_ctx = tb.path([(s, ntok[s] - 1 if s == p else ntok[s], score[s], depth[s]) for s in sp])
            for phase, n_new, n_cached in computes:
                ops[phase].append(([n_new], [n_cached]))
            ops["assemble"].append(([n_ctx], []))
            ops["prefill"].append(([1], [n_ctx]))
            tb.tail(p, ntok[p], score[p], depth[p])
            kids = children[p]
            steps = max(ntok[c] for c in kids) - 1
            for j in range(steps):
                ops["decode"].append(([1] * len(kids), [n_ctx + 1 + j] * len(kids)))
            for c in kids:
                paths[c] = paths[p] + toks[c]
                level.append(c)
                tb.admit(c, ntok[c] - 1, 0.0, d)
        # verification of the level, from scratch, one left-padded batch; then the scores tag the blocks
        T = max(len(verification_ids(prompt, paths[c], suffix, stop)[0]) for c in level)
        ops["verify"].append(([T] * len(level), [0] * len(level)))
        for c in level:
            tb.scored(c, ntok[c], score[c])
    return ops, tb


# --------------------------------------------------------------------------- costs
def _targets(spec: TreeSpec, model_preset, hardware) -> tuple[ModelShape, HardwareProfile]:
    if isinstance(model_preset, ModelShape):
        model = model_preset
    elif model_preset is not None:
        model = load_model(model_preset)
    elif spec.manifest is not None:
        model = model_from_manifest(spec.manifest)
    else:
        raise TreeError("--model-preset: needed (the tree has no trace manifest to take the model from)")
    hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
    return model, hw


def _price(model: ModelShape, hw: HardwareProfile, phase: str, items: list) -> float:
    if not items:
        return 0.0
    if phase == "assemble":
        return float(np.sum(hw.time(C.kv_copy_terms(model, np.array([n[0] for n, _ in items], dtype=np.float64)))))
    k = max(len(n) for n, _ in items)
    N = np.zeros((len(items), k))
    Cc = np.zeros((len(items), k))
    M = np.zeros((len(items), k), dtype=bool)
    for r, (n, c) in enumerate(items):
        N[r, :len(n)], Cc[r, :len(c)], M[r, :len(n)] = n, c, True
    return float(np.sum(hw.time(C.batch_terms(model, N, Cc, mask=M))))


def simulate_tree(trace=None, policy: str = "rsbcm", params: dict | None = None, budget_blocks: int | None = None,
                  budget_frac: float | None = 0.5, model_preset=None, hardware="local-cpu", tree: int = 0,
                  block_size: int = 16) -> dict:
    """Latency, evictions, refetches, recompute and peak KV of one tree search under a block policy.

    Parameters
    ----------
    trace : path, ``traces.store.Trace`` or :class:`TreeSpec` (default: the bundled trace)
    policy, params : a block policy (``rsbcm``, ``lru``, ``fifo``) and its parameters
    budget_blocks : int, optional
        Block budget; else ``max(1, round(budget_frac * peak))`` with ``peak`` the
        unconstrained walk's peak blocks (the real runner's rule); both None = unconstrained.
    model_preset, hardware : cost target (default: the trace's model on ``local-cpu``)

    Latency is the sum of the walk's operations, each priced by ``sim.cost``
    (``t = max(flops / (peak eff_c), bytes / (bw eff_m)) + overheads``): ``verify``
    (root + one batch per level, from scratch), ``prefill`` (prompt, first-time
    blocks, each expansion's last token over its context), ``assemble`` (the
    context's KV copy), ``decode`` (lock-step steps of the children) and
    ``recompute`` (evicted blocks needed again, each over the KV before it).
    """
    if trace is None:
        from .api import default_trace_path
        trace = default_trace_path()
    spec = tree_spec(trace, tree)
    model, hw = _targets(spec, model_preset, hardware)
    w = walk_tree(spec, policy, params, budget_blocks, budget_frac, block_size)
    max_ctx = max((max(np.add(n, c)) if c else n[0]) for ops in w.ops.values() for n, c in ops)
    max_new = max(max(n) for p, ops in w.ops.items() if p != "assemble" for n, _ in ops)
    max_batch = max(len(n) for p, ops in w.ops.items() if p != "assemble" for n, _ in ops)
    hw.check_query(model, max_context=int(max_ctx), max_new=int(max_new), max_batch=int(max_batch))
    phases = {f"{p}_s": _price(model, hw, p, w.ops[p]) for p in PHASES}
    pool = w.blocks.pool
    nodes = spec.nodes
    best = w.best_node
    bytes_per_block = block_size * model.kv_bytes_per_token
    return {
        "policy": policy, "params": dict(params or {}), "tree": spec.name,
        "latency_s": float(sum(phases.values())), **phases,
        "evictions": int(pool.evictions), "refetches": int(pool.refetches),
        "recompute_tokens": int(w.blocks.recompute_tokens),
        "hits": int(pool.hits), "misses": int(pool.misses), "touches": len(w.blocks.touches),
        "peak_blocks": int(pool.peak), "peak_kv_bytes": int(pool.peak * bytes_per_block),
        "budget_blocks": int(w.budget_blocks), "budget_frac": None if budget_blocks is not None else budget_frac,
        "block_size": int(block_size), "n_nodes": int(w.n_nodes),
        "best_node": int(best), "best_score": float(nodes["score"].iloc[best]),
        "best_answer": str(nodes["answer"].iloc[best]) if "answer" in nodes else "",
        "correct": bool(nodes["correct"].iloc[best]) if "correct" in nodes else False,
        "eviction_order": [list(b) for b, _ in pool.evicted_log],
        "cost_model": model.name, "hardware": hw.name,
        "decisions_model": str(((spec.manifest or {}).get("model") or {}).get("name", "")),
    }


def compare_tree(trace=None, budget_blocks: int | None = None, budget_frac: float | None = 0.5, model_preset=None,
                 hardware="local-cpu", tree: int = 0, block_size: int = 16,
                 policies=BLOCK_POLICIES) -> pd.DataFrame:
    """RSBCM vs LRU vs FIFO on one tree and budget: one row per policy (index), plus latency vs RSBCM."""
    if trace is None:
        from .api import default_trace_path
        trace = default_trace_path()
    spec = tree_spec(trace, tree)
    rows = {p: simulate_tree(spec, p, None, budget_blocks, budget_frac, model_preset, hardware, tree, block_size)
            for p in policies}
    df = pd.DataFrame.from_dict(rows, orient="index")
    if "rsbcm" in rows:
        df["latency_vs_rsbcm"] = df["latency_s"] / rows["rsbcm"]["latency_s"]
    return df
