"""Block arithmetic of a fast-forward window (:mod:`sim.serving.ff_window`): which window steps open or fill a block.

A member opening its first block at window step ``f`` opens another every ``bs`` steps after (one token per step);
it fills one at ``g``, ``g + bs``, ... Pure numpy over the members' ``f`` (and ``g``) arrays.
"""
from __future__ import annotations

import numpy as np


def takes(fa, bs: int, a: int, b: int) -> int:
    """Blocks the requests with first opens ``fa`` open at steps ``a..b``.

    Request i opens at ``fa_i + j * bs`` (``j >= 0``), so it opens ``max((b - fa_i) // bs + 1, 0) -
    max((a - 1 - fa_i) // bs + 1, 0)`` blocks in ``a..b``.
    """
    hi = np.maximum((b - fa) // bs + 1, 0)
    lo = np.maximum((a - 1 - fa) // bs + 1, 0)
    return int((hi - lo).sum())


def first_short(fa, bs: int, s: int, e: int, free: int):
    """The first step of ``s..e`` whose takes (by the requests with first opens ``fa``) exceed the ``free`` blocks
    (it preempts), or None."""
    nt = fa + np.maximum(-(-(s - fa) // bs), 0) * bs      # each request's next take, >= s
    if free < len(nt):
        # every request takes at most once in bs steps: the (free + 1)-th take is the
        # (free + 1)-th smallest next take if that falls within them
        q = int(np.partition(nt, free)[free])
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


def block_events(f, g, bs: int, a: int, b: int):
    """Block events of steps ``a..b`` in (step, running order): ``(steps, request indices)``; the opens of ``f``, and
    the fills of ``g`` unless it is None (fills keyed where a member leaves: ``Window.lazy``)."""
    B0 = len(f)
    kinds = (f,) if g is None else (f, g)
    if b - a < bs:   # fewer steps than a block: each request opens (fills) at most one block in them
        keys = []
        for st in kinds:
            s0 = st + np.maximum(-(-(a - st) // bs), 0) * bs    # first event step >= a
            sel = s0 <= b
            keys.append(s0[sel] * B0 + np.flatnonzero(sel))
        key = np.concatenate(keys) if len(keys) > 1 else keys[0]
        key = np.unique(key) if bs == 1 else np.sort(key)
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
    key = np.unique(key) if bs == 1 else np.sort(key)
    return (key // B0).tolist(), (key % B0).tolist()
