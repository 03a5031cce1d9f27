"""One branch's token times as the engine records them: plain floats (stepped) and shared window arrays
(:mod:`sim.serving.fastforward`), joined only when read."""
from __future__ import annotations

import numpy as np


class TokenTimes:
    """One branch's token times: plain floats (stepped) and shared window arrays (fast-forwarded).

    Behaves as the stepped path's list where it is read: ``numpy.asarray``, ``len``, iteration,
    indexing, ``tolist``. Nothing is flattened until asked.
    """

    __slots__ = ("parts", "n")

    def __init__(self, parts):
        self.parts = parts
        self.n = sum(len(p) if isinstance(p, np.ndarray) else 1 for p in parts)

    def __array__(self, dtype=None, copy=None):
        out = np.empty(self.n, np.float64)
        i = 0
        for p in self.parts:
            if isinstance(p, np.ndarray):
                out[i:i + len(p)] = p
                i += len(p)
            else:
                out[i] = p
                i += 1
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.tolist())

    def __getitem__(self, i):
        return np.asarray(self)[i].tolist()


def token_times(parts: list):
    """The stepped path's list when ``parts`` holds no window arrays, else a :class:`TokenTimes`."""
    if any(isinstance(p, np.ndarray) for p in parts):
        return TokenTimes(parts)
    return parts
