"""Shared KV reads: which cached tokens of an iteration's items sit in blocks another item reads too.

Branches of one prompt (a fork, ASKS sharing, a prefix-cache hit) attend over
the same physical KV blocks. When several items of one iteration read a block,
every read after the first finds it in cache (on a CPU: 2-9% less time for the
same decode, :mod:`sim.cost.terms`, "Shared KV reads"). The rule, in iteration order::

    h_i = bs * |{ k < floor(c_i / bs) : block_i[k] is read by an item j < i }|

Only full blocks count: a block being written (the last, partial one) belongs to
its sequence alone (vLLM shares full blocks only; a fork copies the partial one).
The engine applies it to the physical block ids of its block manager;
:func:`shared_per_step` is the same rule over many decode iterations of the fast
path, where a branch's blocks are named by :func:`block_names`.
"""
from __future__ import annotations

import numpy as np


def shared_tokens(block_lists, contexts, bs: int) -> list[int]:
    """``h_i`` of every item (rule above): ``block_lists[i]`` names item ``i``'s blocks in order, ``contexts[i]``
    is its cached tokens ``c_i``."""
    seen: set = set()
    out = []
    for blks, c in zip(block_lists, contexts):
        full = blks[: int(c) // bs]
        h = 0
        for b in full:
            if b in seen:
                h += 1
            else:
                seen.add(b)
        out.append(h * bs)
    return out


def block_names(source, borrowed_blocks, nblocks) -> list[list[int]]:
    """Names of every branch's first ``nblocks[b]`` blocks: its first ``borrowed_blocks[b]`` are its source's
    (a prefix hit on the blocks the source holds, recursively), the rest its own.

    A name is ``owner * K + k`` (``K`` = the longest list), so equal names are one physical block.
    """
    B = len(nblocks)
    K = int(max(nblocks, default=0)) + 1
    names: list[list[int]] = []
    for b in range(B):
        own = [b * K + k for k in range(int(nblocks[b]))]
        s = int(source[b])
        h = min(int(borrowed_blocks[b]), int(nblocks[b]))
        if s >= 0 and h > 0:
            own[:h] = names[s][:h]
        names.append(own)
    return names


def shared_per_step(names, full_blocks, active) -> np.ndarray:
    """``sum_i h_i / bs`` of each of ``J`` decode iterations: ``active (J, B)`` says which branches decode in it,
    each reading its first ``full_blocks[b]`` blocks (``names`` of :func:`block_names`; the blocks it fills
    while decoding are its own, read by nobody else). A block read by ``r`` active branches counts ``r - 1``."""
    active = np.asarray(active, dtype=bool)
    J = active.shape[0]
    reads: dict[int, list[int]] = {}
    for b, nm in enumerate(names):
        for x in nm[: int(full_blocks[b])]:
            reads.setdefault(x, []).append(b)
    multi = [readers for readers in reads.values() if len(readers) > 1]
    if not multi or J == 0:
        return np.zeros(J)
    M = np.zeros((active.shape[1], len(multi)))
    for u, readers in enumerate(multi):
        M[readers, u] = 1.0
    R = active.astype(np.float64) @ M
    return np.maximum(R - 1.0, 0.0).sum(axis=1)
