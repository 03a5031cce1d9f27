"""Block arithmetic of a fast-forward window (:mod:`sim.serving.ff_window`): which window steps open or fill a block.

A member opening its first block at window step ``f`` opens another every ``bs`` steps after (one token per step);
it fills one at ``g``, ``g + bs``, ... Pure numpy over the members' ``f`` (and ``g``) arrays.
"""
from __future__ import annotations

import numpy as np

from sim.serving.kvcache import group_blocks

SMALL_BATCH = 8   # block events and takes of at most this many members in Python (numpy's per-call cost dominates)


def takes(fa, bs: int, a: int, b: int) -> int:
    """Blocks the requests with first opens ``fa`` open at steps ``a..b``.

    Request i opens at ``fa_i + j * bs`` (``j >= 0``), so it opens ``max((b - fa_i) // bs + 1, 0) -
    max((a - 1 - fa_i) // bs + 1, 0)`` blocks in ``a..b``.
    """
    if isinstance(fa, list):   # a few members (first_short's Python lane)
        return sum(max((b - f) // bs + 1, 0) - max((a - 1 - f) // bs + 1, 0) for f in fa)
    hi = np.maximum((b - fa) // bs + 1, 0)
    lo = np.maximum((a - 1 - fa) // bs + 1, 0)
    return int((hi - lo).sum())


def first_short(fa, bs: int, s: int, e: int, free: int):
    """The first step of ``s..e`` whose takes (by the requests with first opens ``fa``) exceed the ``free`` blocks
    (it preempts), or None."""
    if len(fa) <= SMALL_BATCH:   # a few members: in Python (the same integers)
        fa = fa.tolist()
        nt = [f + max(-(-(s - f) // bs), 0) * bs for f in fa]
    else:
        nt = fa + np.maximum(-(-(s - fa) // bs), 0) * bs      # each request's next take, >= s
    if free < len(nt):
        # every request takes at most once in bs steps: the (free + 1)-th take is the
        # (free + 1)-th smallest next take if that falls within them
        q = int(sorted(nt)[free] if isinstance(nt, list) else np.partition(nt, free)[free])
        if q < s + bs and q <= e:
            return q
    if takes(fa, bs, s, e) <= free:
        return None
    lo, hi = s - 1, e          # takes(s..lo) <= free < takes(s..hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if takes(fa, bs, s, mid) <= free:
            lo = mid
        else:
            hi = mid
    return hi                  # the step whose takes exceed the pool


NEVER = 1 << 40   # a first event step no window reaches (a member without that kind of event)


def group_events(kv, c0, R):
    """A hybrid KV cache's (``kv.kv_groups``) block events besides the opens, for members with ``c0`` computed tokens:
    ``(releases, syncs, excess)``: first window steps repeating every block, and the blocks the syncs shed. A sliding
    group's blocks wholly before the window fall out where ``c0 + j - W`` is a positive multiple of the block size
    (``skipped = floor(max(0, c - W + 1) / B)`` of ``c = c0 + j - 1`` computed tokens grows:
    ``sim.serving.kvcache.group_blocks``); a member holding more of its other groups' blocks than its last decode
    step left (its prefill's whole chunk) sheds them at step 1. None where a member holds fewer (its next allocation
    would take more than an open's blocks: the engine steps)."""
    _, sliding, window = kv.kv_groups
    bs = kv.block_size
    # what its last decode step's allocation left: c0 tokens, c0 - 1 of them computed before it
    want0 = group_blocks(kv.kv_groups, bs, -(-c0 // bs), c0 - 1, np.maximum, np.minimum)
    ext = np.array([len(kv._extra.get(r.req_id, ())) for r in R], np.int64)
    if np.any(ext < want0):
        return None
    never = np.full(len(c0), NEVER, np.int64)
    syncs = np.where(ext > want0, 1, never)
    excess = int((ext - want0).sum())
    if not sliding:
        return never, syncs, excess
    r0 = window - c0 + bs
    return np.where(r0 >= 1, r0, r0 + (-(-(1 - r0) // bs)) * bs), syncs, excess


def head_fits(kv, groups, head_need: int, sync_step: int, alive, s: int, e: int):
    """A hybrid cache's releases free blocks inside a window (``groups``: :func:`group_events`' arrays, their syncs
    shedding their excess at ``sync_step``): the first step of ``s..e`` at which the waiting head's ``head_need``
    blocks (``FastForward.head_need``, which only grows as its cached chain is evicted) might be free -- the free
    pool now plus every release up to it, the takes not counted -- or None."""
    _, sliding, _ = kv.kv_groups   # the blocks each release frees
    short = head_need - kv.num_free - (groups[2] if s <= sync_step else 0)
    if short <= 0:
        return s
    if not sliding:
        return None
    return first_short(groups[0][alive], kv.block_size, s, e, -(-short // sliding) - 1)


def regroup(kv, c0, R, alive):
    """A hybrid cache's window past its mixed step (members ``R`` with ``c0`` tokens computed before it, ``alive``):
    each alive member's releases and syncs read from the pool as step 1 left it (:func:`group_events` of its tokens
    then: a joiner sheds its prompt's extra blocks at its first decode), one window step later, the others NEVER;
    None where one would take more than an open's blocks."""
    live = np.flatnonzero(alive)
    ge = group_events(kv, c0[live] + 1, [R[i] for i in live])
    if ge is None:
        return None
    rel, syn = np.full(len(R), NEVER, np.int64), np.full(len(R), NEVER, np.int64)
    rel[live], syn[live] = ge[0] + 1, ge[1] + 1
    return rel, syn, ge[2]


def clean_first(n: int, clean: int) -> tuple:
    """``n`` blocks taken from a pool of ``clean`` clean ones, then the eviction queue's front (``BlockManager._take``'s
    order): ``(clean left, taken off the queue)``."""
    use = min(n, clean)
    return clean - use, n - use


def hybrid_takes(kv, c, nb, rids, opens):
    """A hybrid cache's (``kv.kv_groups``) decode step over requests in running order, ``c`` computed tokens each,
    ``nb`` blocks, ``opens`` where the token opens a block: each ``allocate_one`` takes its blocks of every group,
    then releases the sliding ones wholly before the window (``BlockManager._allocate_one_groups``). ``(free, clean,
    evict, fail)``: the free blocks after them, the clean ones left, those taken off the eviction queue's front, and
    the first request whose takes exceed the free pool at its turn (None where all fit; the figures stop there)."""
    want = group_blocks(kv.kv_groups, kv.block_size, nb + opens, c, np.maximum, np.minimum)
    ext = np.fromiter((len(kv._extra.get(r, ())) for r in rids), np.int64, len(rids))
    take, rel = opens + np.maximum(want - ext, 0), np.maximum(ext - want, 0)
    free, clean, evict = kv.num_free, kv.n_clean, 0
    for i in np.flatnonzero(take + rel).tolist():   # in running order: its takes, then its releases
        t, r = int(take[i]), int(rel[i])
        if t > free:
            return free, clean, evict, i
        clean, ev = clean_first(t, clean)
        clean, evict, free = clean + r, evict + ev, free - t + r
    return free, clean, evict, None


def block_events(kinds, bs: int, a: int, b: int, unique: bool = False):
    """Block events of steps ``a..b`` in (step, running order): ``(steps, request indices)``; each of ``kinds`` the
    members' first event steps, repeating every ``bs`` steps (the opens; the fills unless keyed where a member
    leaves, ``Window.lazy``; a hybrid cache's releases). ``unique``: kinds whose events may coincide (one call)."""
    B0 = len(kinds[0])
    if B0 <= SMALL_BATCH:   # a few members (a low rate's window): in Python, the same keys without numpy's call cost
        key = sorted({st * B0 + i for kind in kinds for i, f in enumerate(kind.tolist())
                      for st in range(f + max(-(-(a - f) // bs), 0) * bs, b + 1, bs)} if bs == 1 or unique else
                     [st * B0 + i for kind in kinds for i, f in enumerate(kind.tolist())
                      for st in range(f + max(-(-(a - f) // bs), 0) * bs, b + 1, bs)])
        return [k // B0 for k in key], [k % B0 for k in key]
    if b - a < bs:   # fewer steps than a block: each request opens (fills) at most one block in them
        keys = []
        for st in kinds:
            s0 = st + np.maximum(-(-(a - st) // bs), 0) * bs    # first event step >= a
            sel = s0 <= b
            keys.append(s0[sel] * B0 + np.flatnonzero(sel))
        key = np.concatenate(keys) if len(keys) > 1 else keys[0]
        key = np.unique(key) if bs == 1 or unique else np.sort(key)
        return (key // B0).tolist(), (key % B0).tolist()
    M = (b - a) // bs + 2
    m = np.arange(M, dtype=np.int64)[None, :] * bs
    idx = np.arange(B0, dtype=np.int64)[:, None]
    keys = []
    for st in kinds:
        s0 = st + np.maximum(-(-(a - st) // bs), 0) * bs    # first event step >= a
        e = s0[:, None] + m
        keys.append(np.where(e <= b, e * B0 + idx, -1).ravel())
    key = np.concatenate(keys)
    key = key[key >= 0]
    # distinct but for block size 1 (a step both opens and fills the request's block: one call)
    key = np.unique(key) if bs == 1 or unique else np.sort(key)
    return (key // B0).tolist(), (key % B0).tolist()


def window_key_sums(ctx, W: int, steps):
    """``Ssw(j) = sum_i min(c_i + j, W)`` for each window step ``j`` of ``steps``: the keys a sliding-window layer
    reads at step ``j`` over members of ``c_i`` tokens at the window's start (the ``n`` below ``W - j`` add ``c_i +
    j``, the others ``W``; one ``searchsorted`` over the sorted lengths)."""
    cs = np.sort(ctx)
    pre = np.concatenate(([0], np.cumsum(cs)))
    n = np.searchsorted(cs, W - steps, side="left")
    return pre[n] + n * steps + (len(cs) - n) * W


def cached_prefix(keys: dict, cached: dict, L: int) -> int:
    """The waiting head's cached chain after evictions: its first ``L`` blocks up to the first no longer in
    ``cached`` (``keys``: its chain keys by position, in position order)."""
    for key, pos in keys.items():
        if pos >= L:
            break
        if key not in cached:
            return pos
    return L
