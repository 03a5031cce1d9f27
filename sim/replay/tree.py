"""Tree search (RSBCM) replayed from a trace's tree on the serving block manager (``sim.serving.kvcache``).

DESIGN §2/§4: depth ``D``; each level the best ``expand_k`` open nodes (by
verification score, ties to the lower id) expand into ``branching`` children of
up to ``step_tokens`` tokens; every node is scored by a verification pass over
``prompt + path + verify prompt``. KV lives in blocks of ``block_size`` tokens
held by :class:`sim.serving.kvcache.BlockManager` -- the one block manager of rksim,
the one serving uses -- under a budget of ``num_blocks``: keys chain over the
tree block ids ``(node, j)`` (a node's KV = its parent's chain + its own
blocks), blocks of nodes still to be expanded or verified are referenced and
never evicted, finished / pruned nodes' blocks are freed into the evictable
cache that the block policy ranks (``rsbcm``: lowest ``omega = score / (depth +
1)`` first; ``lru``: vLLM's free-queue order; ``fifo``). When no block is free,
the newest waiting node is preempted (its blocks freed into the cache); resumed,
it takes its cached chain up to the first miss and recomputes every block after
it (chain rule), charged as ``recompute``.

There is one walk: the real runner (``calibrate/real_tree.py``) drives the same
:class:`TreeBlocks`, :func:`select_frontier` and :func:`unconstrained_budget`,
so the manager makes the same decisions for the same tree and budget:

1. root verification (``prompt + verify``, from scratch);
2. prompt prefill of ``len(prompt) - 1`` tokens, its blocks admitted; the root's
   score is known (RSBCM scores are 0 until a node on the block's path is verified);
3. per level, per frontier node ``p`` (frontier order): ``p``'s path is held
   (:meth:`TreeBlocks.path`: hits if ``p`` is live, else the cached chain and
   recompute); the context (``n_ctx`` tokens) is assembled (a KV copy, as the
   runner does); ``p``'s last token is prefilled over it and its tail block
   holds it (:meth:`TreeBlocks.tail`); the ``branching`` children decode
   ``max(gen) - 1`` lock-step steps and fork ``p``'s blocks, allocating their own
   (:meth:`TreeBlocks.admit`); ``p`` drops its reference (:meth:`TreeBlocks.done`);
4. the level is verified in one left-padded batch (from scratch); the scores
   become known (:meth:`TreeBlocks.scored`: every block of the node's path, a
   shared block keeping the highest); nodes not expanded next are freed
   (:meth:`TreeBlocks.finish`).

The clock is logical: one tick per block touched. :class:`TreeBlocks` holds the
block bookkeeping alone (pure Python, no torch); the real runner drives it with
hooks that do the torch work, :func:`walk_tree` drives it from a trace and
records the operations, :func:`simulate_tree` prices them with ``sim.cost.terms``
(:mod:`sim.replay.tree_result`, on the :class:`sim.replay.target.Target` of ``Target.resolve``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from policies import PolicyError, get_policy, list_policies

from sim.serving.kvcache import BlockManager
from sim.serving.capacity import MAX_BLOCK_SIZE, MAX_BLOCKS, MAX_FRAC
from sim.replay.tree_result import PHASES, tree_result, tree_target

BLOCK_POLICIES = ("rsbcm", "lru", "fifo")


class TreeError(ValueError):
    """A bad tree, policy or budget (one line naming the field or flag)."""


# --------------------------------------------------------------------------- the shared block walk
@dataclass
class Touch:
    """One block of a node's path looked up or computed: tree block id, its score then, depth, logical time, hit."""

    block: tuple
    score: float
    depth: int
    now: float
    hit: bool


class _NodeReq:
    """A tree node's sequence as a :class:`sim.serving.kvcache.BlockManager` request: the blocks of its path.

    Block ``k`` of the request is tree block ``blocks[k] = (node, j)`` (the ``j``-th block of that
    node's tokens); in the manager every tree block is one whole block (``block_size`` tokens of
    memory, partial or not), keyed by the hash chain over the tree block ids.
    """

    __slots__ = ("req_id", "blocks", "depths", "num_tokens", "num_computed_tokens", "__dict__")
    cacheable = True
    allow_full_hit = True     # a fork / resume uses every cached block (no logits needed from the cache)
    kv_cap = None

    def __init__(self, node: int, blocks: list, depths: list, bs: int):
        self.req_id = node
        self.blocks, self.depths = blocks, depths
        self.num_tokens = len(blocks) * bs
        self.num_computed_tokens = 0

    def block_content(self, k: int):
        return self.blocks[k]

    def block_depth(self, k: int) -> int:
        return self.depths[k]


class TreeBlocks:
    """Block bookkeeping of the tree walk on the serving block manager (:class:`sim.serving.kvcache.BlockManager`).

    Pure Python (no torch). This is the one walk: the simulator drives it from a
    trace (:func:`walk_tree`), the real runner (``calibrate/real_tree.py``) drives it
    with live results and does the torch work in the hooks.

    Each node is a request of the manager holding the blocks of its path (its
    parent's chain + its own blocks, block id ``(node, j)``, keyed by the hash
    chain). A node is **live** (its blocks referenced, never evicted) from its
    admission until it is expanded (:meth:`done`) or pruned / finished
    (:meth:`finish`); freed blocks form the evictable cache the block policy
    ranks (``evict_key``). Children fork their parent's block table (zero copy).
    When an allocation finds no free block, the newest live node not in use
    (not the node being expanded or its children) is preempted (vLLM's
    recompute preemption): its blocks are freed into the cache. A node resumed
    later takes its cached chain up to the first miss and recomputes every
    block after it (chain rule), each block over the KV before it.

    RSBCM scores: a block's score is 0 until :meth:`scored` (a node verified)
    raises the scores of every block of its path; a shared block keeps the
    highest of its branches (``BlockManager.set_score``, as ``sim.serving.engine`` does).

    Hooks (the runner keeps its K/V store, keyed by the manager's physical
    block id ``slot``, in step through them):

    - ``admit(..., on_block=f)``: ``f(block, lo, hi, slot)`` for each freshly computed block,
      tokens ``[lo, hi)`` of its node;
    - ``path(..., on_block=f)``: ``f(block, lo, hi, pos, phase, slot)`` for each block of the
      path, ``pos`` its first position in the sequence, ``phase`` None on a hit (use the KV in
      ``slot``), else ``"prefill"`` / ``"recompute"`` (compute it over the blocks before it into ``slot``);
    - ``tail(..., on_block=f)``: ``f(block, lo, hi, slot)``, the tail block now holding tokens
      ``[lo, hi)`` of the node.
    """

    def __init__(self, policy, budget: int, block_size: int):
        self.bm = BlockManager(int(budget), int(block_size), policy=policy, caching=True)
        self.bs = int(block_size)
        self.clock = 0.0
        self.parent: dict[int, int] = {}
        self.length: dict[int, int] = {}     # node -> its tokens
        self.depth: dict[int, int] = {}
        self.reqs: dict[int, _NodeReq] = {}
        self.live: dict[int, None] = {}      # live nodes, in admission order (preempted newest first)
        self.busy: set = set()               # the node being expanded and its children
        self.fill: dict[int, int] = {}       # slot -> tokens of KV it holds
        self.ever: set = set()               # tree blocks computed at least once
        self._bid_of_key: dict = {}
        self.known: dict = {}                # tree block -> highest verification score known on it
        self.touches: list[Touch] = []
        self.path_log: list = []             # (node, [hit per block of its path]) per expansion
        self.recompute_tokens = 0
        self.refetches = 0                   # blocks recomputed
        self.preemptions = 0
        self.peak = 0                        # most blocks resident (referenced + cached)
        self.floor = 0                       # most blocks one expansion references (the least budget)

    # ------------------------------------------------------------------ helpers
    def _plan(self, node: int, own: int) -> list[tuple]:
        """``[(block, lo, hi, depth), ...]`` of ``node``'s path: ancestors whole, then ``own`` of its tokens."""
        chain = []
        n = node
        while n >= 0:
            chain.append(n)
            n = self.parent[n]
        out = []
        for s in reversed(chain):
            m = own if s == node else self.length[s]
            out += [((s, j), j * self.bs, min((j + 1) * self.bs, m), self.depth[s]) for j in range(-(-m // self.bs))]
        return out

    def _touch(self, bid, blk, hit: bool) -> None:
        self.clock += 1.0
        self.touches.append(Touch(bid, float(blk.score), int(self.depth[bid[0]]), self.clock, bool(hit)))

    def _resident(self) -> None:
        r = self.bm.num_blocks - self.bm.n_clean
        if r > self.peak:
            self.peak = r

    def _allocate(self, node: int, n_new: int, computed=(), hit_tokens=None) -> None:
        req = self.reqs[node]
        while not self.bm.allocate(req, n_new * self.bs, computed, hit_tokens):
            victims = [v for v in self.live if v not in self.busy]
            if not victims:
                need = len({b.block_id for v in self.busy if v in self.live for b in self.bm.req_blocks.get(v, ())}) \
                    + self.bm.blocks_needed(req, n_new * self.bs, computed, hit_tokens)
                raise TreeError(f"--budget-blocks: {self.bm.num_blocks} blocks cannot hold the expansion of node "
                                f"{min(self.busy)} (its path and children need {need} blocks at once)")
            self._free(victims[-1])
            self.preemptions += 1
        self._resident()

    def _free(self, node: int) -> None:
        if node in self.live:
            del self.live[node]
            self.bm.free(self.reqs[node])
            self.reqs[node].num_computed_tokens = 0

    def _new_req(self, node: int, plan) -> _NodeReq:
        req = _NodeReq(node, [b for b, *_ in plan], [d for *_, d in plan], self.bs)
        self.reqs[node] = req
        for k, (bid, *_) in enumerate(plan):
            self._bid_of_key[self.bm.key(req, k)] = bid
        return req

    # ------------------------------------------------------------------ the walk's operations
    def admit(self, node: int, parent: int, n_tokens: int, depth: int, on_block=None) -> None:
        """Freshly computed KV of ``n_tokens`` tokens of ``node`` (the prompt's prefill, a child's decode).

        A child (``parent >= 0``) forks its parent's block table and allocates its own blocks.
        """
        self.parent[node], self.length[node], self.depth[node] = int(parent), int(n_tokens) + 1, int(depth)
        plan = self._plan(node, int(n_tokens))
        req = self._new_req(node, plan)
        fork = list(self.bm.req_blocks[parent]) if parent >= 0 else []
        self.busy.add(node)
        self.live[node] = None
        n_own = len(plan) - len(fork)
        self._allocate(node, n_own, fork, len(fork) * self.bs)
        req.num_computed_tokens = req.num_tokens
        blks = self.bm.req_blocks[node]
        for k in range(len(fork), len(plan)):
            bid, lo, hi, _ = plan[k]
            b = blks[k]
            self._touch(bid, b, False)
            self.fill[b.block_id] = hi - lo
            self.ever.add(bid)
            if on_block is not None:
                on_block(bid, lo, hi, b.block_id)
        if parent < 0:
            self.busy.discard(node)

    def path(self, node: int, on_block=None) -> tuple[list[tuple[str, int, int]], int]:
        """Hold the path of ``node`` (all its tokens but the last) to expand it; touch its blocks in order.

        Returns ``(computes, n_ctx)``: each compute is ``(phase, n_new, n_cached)``, phase
        ``"recompute"`` (computed before, evicted since) or ``"prefill"``, in order.
        """
        self.busy = {node}
        plan = self._plan(node, self.length[node] - 1)
        req = self.reqs[node]
        n_hit = len(plan)
        if node not in self.live:
            # resumed: the cached chain up to the first miss (or a block holding too few tokens)
            req.num_tokens, req.num_computed_tokens = len(plan) * self.bs, 0
            got, _ = self.bm.find_cached(req)
            n_hit = 0
            for b, (_, lo, hi, _) in zip(got, plan):
                if self.fill.get(b.block_id, 0) < hi - lo:
                    break
                n_hit += 1
            self.live[node] = None
            self._allocate(node, len(plan) - n_hit, got[:n_hit], n_hit * self.bs)
            req.num_computed_tokens = req.num_tokens
        blks = self.bm.req_blocks[node]
        self.path_log.append((node, [k < n_hit for k in range(len(plan))]))
        out = []
        pos = 0
        for k, (bid, lo, hi, _) in enumerate(plan):
            b = blks[k]
            hit = k < n_hit
            self._touch(bid, b, hit)
            phase = None
            if not hit:
                again = bid in self.ever
                if again:
                    self.recompute_tokens += hi - lo
                    self.refetches += 1
                phase = "recompute" if again else "prefill"
                out.append((phase, hi - lo, pos))
                self.ever.add(bid)
                self.fill[b.block_id] = hi - lo
                if bid in self.known:        # a recomputed block keeps the score known for it
                    self.bm.set_score(self.bm.key(req, k), self.known[bid])
            if on_block is not None:
                on_block(bid, lo, hi, pos, phase, b.block_id)
            pos += hi - lo
        return out, pos

    def tail(self, node: int, on_block=None) -> None:
        """The node's last token now has KV (prefilled to expand it): its tail block holds it."""
        n = self.length[node]
        k = (n - 1) // self.bs
        bid = (node, k)
        req = self.reqs[node]
        if (n - 1) % self.bs == 0:          # the last token opens a new block
            req.blocks.append(bid)
            req.depths.append(self.depth[node])
            req.num_tokens += self.bs
            self._bid_of_key[self.bm.key(req, len(req.blocks) - 1)] = bid
            self._allocate(node, 1)
            req.num_computed_tokens = req.num_tokens
        b = self.bm.req_blocks[node][-1]
        if bid in self.known:
            self.bm.set_score(self.bm.key(req, len(req.blocks) - 1), self.known[bid])
        self._touch(bid, b, False)
        self.ever.add(bid)
        self.fill[b.block_id] = n - k * self.bs
        if on_block is not None:
            on_block(bid, k * self.bs, n, b.block_id)

    def done(self, node: int) -> None:
        """``node`` is expanded: its children hold the shared path; its own reference is dropped."""
        used = {b.block_id for v in self.busy if v in self.live for b in self.bm.req_blocks.get(v, ())}
        self.floor = max(self.floor, len(used))
        self._free(node)
        self.busy = set()

    def scored(self, node: int, score: float) -> None:
        """``node`` is verified: every block of its path takes its score (a shared block keeps the highest)."""
        req = self.reqs[node]
        for k, bid in enumerate(req.blocks):
            if not float(score) <= self.known.get(bid, 0.0):
                self.known[bid] = float(score)
            self.bm.set_score(self.bm.key(req, k), float(score))

    def finish(self, node: int) -> None:
        """``node`` will not be expanded (pruned, finished or a leaf): its blocks go to the evictable cache."""
        self._free(node)

    @property
    def evicted_log(self) -> list:
        """Tree block ids evicted, in order."""
        return [self._bid_of_key[k] for k in self.bm.evicted_log]


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
    """A :class:`TreeSpec` from a trace path, a loaded ``Trace`` or a ``TreeSpec`` (None: the bundled trace)."""
    if isinstance(trace, TreeSpec):
        return trace
    if trace is None:
        from sim.replay.session import default_trace_path
        trace = default_trace_path()
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


def tree_structure(spec: TreeSpec):
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
    """Replay the tree search of ``spec`` on a ``BlockManager``; record every operation (no costs)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise TreeError(f"--block-size: must be an integer in 1..{MAX_BLOCK_SIZE}, got {block_size!r}")
    pol = _policy(policy, params)
    parent, depth, ntok, score, toks, children, levels = tree_structure(spec)
    meta = spec.meta
    D = max(depth)
    unc = unconstrained_budget(ntok[0], int(meta.get("depth", D)), int(meta.get("expand_k", max(map(len, levels), default=1))),
                               int(meta.get("branching", max((len(c) for c in children.values()), default=1))),
                               int(meta.get("step_tokens", max(ntok[1:], default=1))), block_size)
    n_blocks_total = sum(math.ceil(t / block_size) for t in ntok)
    unc = max(unc, n_blocks_total)
    free = None
    if budget_blocks is None and budget_frac is not None:
        free = _run(spec, get_policy("rsbcm"), unc, block_size, parent, depth, ntok, score, toks, children, levels)[1]
    budget = _budget(budget_blocks, budget_frac, free.peak if free is not None else unc, unc)
    if free is not None and budget < free.floor:
        # a fraction of the peak below one expansion's working set cannot run (referenced blocks are never
        # evicted): the budget is raised to that floor, and the result says so (floor_blocks)
        budget = free.floor
    ops, tb = _run(spec, pol, budget, block_size, parent, depth, ntok, score, toks, children, levels)
    best = max(range(1, len(ntok)), key=lambda i: (score[i], -i)) if len(ntok) > 1 else 0
    return TreeWalk(ops, tb, budget, unc, len(ntok), best)


def _run(spec, pol, budget, bs, parent, depth, ntok, score, toks, children, levels):
    from traces.workload import verification_ids

    tb = TreeBlocks(pol, budget, bs)
    ops = {p: [] for p in PHASES}
    suffix, stop = spec.verify_suffix_ids, sorted(spec.stop_ids)
    prompt = toks[0]
    paths: dict[int, list[int]] = {0: []}

    # 1. the root is scored; 2. the prompt (all but its last token) is prefilled and admitted
    ops["verify"].append(([len(verification_ids(prompt, [], suffix, stop)[0])], [0]))
    ops["prefill"].append(([ntok[0] - 1], [0]))
    tb.admit(0, -1, ntok[0] - 1, 0)
    tb.scored(0, score[0])
    for d, frontier in enumerate(levels, start=1):
        level = []
        for p in frontier:
            computes, n_ctx = tb.path(p)
            for phase, n_new, n_cached in computes:
                ops[phase].append(([n_new], [n_cached]))
            ops["assemble"].append(([n_ctx], []))
            ops["prefill"].append(([1], [n_ctx]))
            tb.tail(p)
            kids = children[p]
            steps = max(ntok[c] for c in kids) - 1
            for j in range(steps):
                ops["decode"].append(([1] * len(kids), [n_ctx + 1 + j] * len(kids)))
            for c in kids:
                paths[c] = paths[p] + toks[c]
                level.append(c)
                tb.admit(c, p, ntok[c] - 1, d)
            tb.done(p)
        # verification of the level, from scratch, one left-padded batch; then the scores are known
        T = max(len(verification_ids(prompt, paths[c], suffix, stop)[0]) for c in level)
        ops["verify"].append(([T] * len(level), [0] * len(level)))
        for c in level:
            tb.scored(c, score[c])
        nxt = set(levels[d]) if d < len(levels) else set()
        for c in level:
            if c not in nxt:
                tb.finish(c)
    return ops, tb


# --------------------------------------------------------------------------- costs
def simulate_tree(trace=None, policy: str = "rsbcm", params: dict | None = None, budget_blocks: int | None = None,
                  budget_frac: float | None = 0.5, model_preset=None, hardware="local-cpu", tree: int = 0,
                  block_size: int = 16) -> dict:
    """Latency, evictions, refetches, recompute and peak KV of one tree search under a block policy.

    Parameters
    ----------
    trace : path, ``traces.store.Trace`` or :class:`TreeSpec` (default: the bundled trace)
    policy, params : a block policy (``rsbcm``, ``lru``, ``fifo``) and its parameters
    budget_blocks : int, optional
        Block budget (refused below one expansion's working set, ``floor_blocks``); else
        ``max(floor_blocks, round(budget_frac * peak))`` with ``peak`` the unconstrained walk's
        peak resident blocks; both None = unconstrained.
    model_preset, hardware : cost target (default: the trace's model on ``local-cpu``)

    Latency is the sum of the walk's operations, each priced by ``sim.cost.terms``
    (``t = max(flops / (peak eff_c), bytes / (bw eff_m)) + overheads``, :mod:`sim.replay.tree_result`): ``verify``
    (root + one batch per level, from scratch), ``prefill`` (prompt, first-time
    blocks, each expansion's last token over its context), ``assemble`` (the
    context's KV copy), ``decode`` (lock-step steps of the children) and
    ``recompute`` (evicted blocks needed again, each over the KV before it).
    """
    spec = tree_spec(trace, tree)
    target = tree_target(spec, model_preset, hardware, error=TreeError)
    w = walk_tree(spec, policy, params, budget_blocks, budget_frac, block_size)
    return tree_result(spec, w, target, policy, params, budget_blocks, budget_frac, block_size, error=TreeError)


def compare_tree(trace=None, budget_blocks: int | None = None, budget_frac: float | None = 0.5, model_preset=None,
                 hardware="local-cpu", tree: int = 0, block_size: int = 16,
                 policies=BLOCK_POLICIES) -> pd.DataFrame:
    """RSBCM vs LRU vs FIFO on one tree and budget: one row per policy (index), plus latency vs RSBCM."""
    spec = tree_spec(trace, tree)
    rows = {p: simulate_tree(spec, p, None, budget_blocks, budget_frac, model_preset, hardware, tree, block_size)
            for p in policies}
    df = pd.DataFrame.from_dict(rows, orient="index")
    if "rsbcm" in rows:
        df["latency_vs_rsbcm"] = df["latency_s"] / rows["rsbcm"]["latency_s"]
    return df
