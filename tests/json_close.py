"""Two JSON-like documents compared as figures: keys, strings, integers and booleans exactly, floats within a
relative tolerance.

The figures of fits and of attention errors go through BLAS matrix products and iterative optimisers whose
kernels differ between CPUs (an AMD EPYC and an Intel Xeon give different last bits, and an optimiser's
stopping point moves in the 9th digit), so a file written on one machine is compared to its recomputation
on another with :func:`moved` at a stated tolerance instead of byte for byte.
"""
from __future__ import annotations

import math


def moved(got, want, path: str = "", rel: float = 1e-12, abs_tol: float = 0.0) -> list[str]:
    """The figures of ``got`` that differ from ``want``, as ``path: got != want`` (empty: equal).

    Dicts must have the same keys and lists the same lengths; a float equals a float within ``rel`` relative
    (``math.isclose``, or within ``abs_tol``: a fitted constant the optimiser drives to its zero bound lands on
    noise there); everything else (strings, integers, booleans, None) exactly, type included.
    """
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path or '/'}: keys {sorted(set(got) ^ set(want))} in one only"]
        return [m for k in sorted(want) for m in moved(got[k], want[k], f"{path}/{k}", rel, abs_tol)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items != {len(want)}"]
        return [m for i, (a, b) in enumerate(zip(got, want)) for m in moved(a, b, f"{path}[{i}]", rel, abs_tol)]
    if isinstance(want, float) and isinstance(got, float):
        return [] if math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol) or (got != got and want != want) \
            else [f"{path}: {got!r} != {want!r}"]
    return [] if type(got) is type(want) and got == want else [f"{path}: {got!r} != {want!r}"]
