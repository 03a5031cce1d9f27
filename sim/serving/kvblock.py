"""A KV block and its key (:mod:`sim.serving.kvcache`'s units): the chain hash of a full block, the block record,
and the size check every serving parameter shares."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROOT_KEY = 0x9E3779B97F4A7C15  # parent key of a sequence's first block
UNLIMITED = 1 << 62            # "no capacity limit" in blocks (nothing is allocated per block)


class KVCacheError(ValueError):
    """A bad block-manager parameter (message names it)."""


def block_key(parent: int, content) -> int:
    """Key of a full block: ``hash((parent_key, content))``.

    Python's hash of an int (and of tuples of ints) does not depend on ``PYTHONHASHSEED``, so keys are the same
    in every run; like vLLM's builtin hash option it is 64-bit and not collision-proof (a collision merges two
    blocks; at 2^-64 per pair it is ignored, as vLLM's default does).
    """
    return hash((parent, content))


def token_blocks(ids, block_size: int) -> list:
    """The contents of the full blocks of token ids ``ids`` (an int64 array, or ints): each block's ids as int64,
    read as one ``8 block_size``-byte number (``int.from_bytes``: a fixed width, so equal blocks give equal numbers
    and different ones different numbers), made without a Python int per token."""
    ids = np.ascontiguousarray(ids, np.int64)
    n = len(ids) // block_size
    return list(map(int.from_bytes, ids[:n * block_size].view(f"V{8 * block_size}").tolist()))


def chain_keys(tokens, block_size: int, parent: int = ROOT_KEY) -> list[int]:
    """Keys of the full blocks of ``tokens`` (token ids), chained from ``parent``."""
    out = []
    for c in token_blocks(tokens, block_size):
        parent = block_key(parent, c)
        out.append(parent)
    return out


@dataclass(eq=False, slots=True)   # slots: a block is made per take, its fields read in every loop
class Block:
    """One KV block: id (0..num_blocks-1), key (None = not cached), refs and the policy's fields."""

    block_id: int
    key: int | None = None
    ref: int = 0
    score: float = 0.0
    depth: int = 0
    last_used: float = 0.0
    inserted: float = 0.0
    version: int = 0       # bumped whenever its heap entry goes stale


def check_size(name: str, value, lo: int = 1, hi: int | None = None, allow_none: bool = False) -> int | None:
    """An integer size parameter in ``[lo, hi]``, else :class:`KVCacheError` naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) and not (
            hasattr(value, "__index__") and not isinstance(value, float)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise KVCacheError(f"{name}: must be an integer >= {lo}, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise KVCacheError(f"{name}: must be an integer {rng}, got {value!r}")
    return value
