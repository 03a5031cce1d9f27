"""The range a fitted profile answers: every dimension that bends the cost, checked per query.

A fitted profile's coefficients hold on the shapes the fit measured. The
dimensions along which a CPU's or GPU's time per iteration changes regime
(BLAS blocking in the number of token rows, cache sizes in the context, the
mix of a prefill chunk with decodes) are recorded at fit time in the profile's
``fitted_range`` (:func:`calibrate.fit.fitted_range`):

==========================  ===============================  =========================
key                         dimension                        range
==========================  ===============================  =========================
``max_batch``               sequences per iteration          1 .. max
``max_tokens_per_iteration`` tokens per iteration (sum n_i)   1 .. max
``max_context_tokens``      context length (c_i + n_i)       0 .. max
``max_new_tokens``          new tokens of one item (n_i)     1 .. max
``mixed_iterations``        prefill chunks beside decodes    seen (true) or not (false)
==========================  ===============================  =========================

A query outside is refused (:class:`sim.cost.profiles.OutOfCalibrationError`)
with a message naming the dimension, its value and the fitted range; with
``allow_extrapolation`` it goes through and the caller marks its result with
the returned notes. A key a profile does not record (older fits) is not checked.
Pure functions: the profile's range and the query's dimensions in, a decision out.
"""
from __future__ import annotations

from dataclasses import dataclass

# (query field, fitted_range key, words)
DIMENSIONS = (("seqs", "max_batch", "sequences per iteration"),
              ("tokens", "max_tokens_per_iteration", "tokens per iteration"),
              ("context", "max_context_tokens", "context length"),
              ("item_tokens", "max_new_tokens", "new tokens of one forward item"))
EXTRAPOLATION_FLAG = "--allow-extrapolation"


@dataclass(frozen=True)
class RangeQuery:
    """The largest shape a query prices: sequences and tokens of one iteration, one context, one item.

    ``mixed``: some iteration runs a prefill chunk (n > 1) beside decode steps.
    0 / False: the dimension is not exercised (not checked).
    """

    seqs: int = 0
    tokens: int = 0
    context: int = 0
    item_tokens: int = 0
    mixed: bool = False


@dataclass(frozen=True)
class Violation:
    dimension: str      # words
    key: str            # fitted_range key
    value: object
    fitted: str         # the fitted range, in words

    def message(self, profile: str) -> str:
        return (f"hardware {profile}: {self.dimension} {self.value} is outside the fitted range {self.fitted} "
                f"(fitted_range.{self.key})")


def violations(fitted_range: dict | None, q: RangeQuery) -> list[Violation]:
    """Every dimension of ``q`` outside ``fitted_range`` (empty: inside, or no range recorded)."""
    fr = fitted_range or {}
    out = []
    for field, key, words in DIMENSIONS:
        lim, v = fr.get(key), int(getattr(q, field) or 0)
        if lim is not None and v > int(lim):
            lo = 0 if field == "context" else 1
            out.append(Violation(words, key, v, f"[{lo}, {int(lim)}]"))
    if q.mixed and fr.get("mixed_iterations") is False:
        out.append(Violation("mixed prefill + decode iterations", "mixed_iterations", "present",
                             "without any (the fit measured none)"))
    return out


def check(profile: str, fitted_range: dict | None, q: RangeQuery, allow_extrapolation: bool = False) -> list[str]:
    """Refuse ``q`` outside the fitted range, or (``allow_extrapolation``) return the notes that mark it.

    Raises :class:`sim.cost.profiles.OutOfCalibrationError` naming the first dimension outside.
    """
    from sim.base.errors import OutOfCalibrationError

    vs = violations(fitted_range, q)
    if not vs:
        return []
    if not allow_extrapolation:
        raise OutOfCalibrationError(f"{vs[0].message(profile)}; refusing to extrapolate "
                                    f"({EXTRAPOLATION_FLAG} prices it anyway and marks the result)")
    return [f"extrapolated: {v.message(profile)}" for v in vs]


def iteration_query(items) -> RangeQuery:
    """The query of a list of iterations, each a list of ``(n, c)`` items (new, cached tokens)."""
    seqs = tokens = ctx = item = 0
    mixed = False
    for it in items:
        ns = [int(n) for n, _ in it]
        if not ns:
            continue
        seqs, tokens = max(seqs, len(ns)), max(tokens, sum(ns))
        ctx = max(ctx, max(int(n) + int(c) for n, c in it))
        item = max(item, max(ns))
        mixed = mixed or (any(n > 1 for n in ns) and any(n == 1 for n in ns))
    return RangeQuery(seqs=seqs, tokens=tokens, context=ctx, item_tokens=item, mixed=mixed)


def chunk_tokens(new_tokens: int, policy: str, max_num_batched_tokens: int) -> int:
    """The most new tokens one item of a serving iteration can carry, for a prompt of ``new_tokens``: vLLM V1's
    rules (``vllm-v1``, ``vllm-v1-chunk-admit``) chunk a prompt to at most ``max_num_batched_tokens`` a step;
    ``prefill-first`` (V0 without chunking) runs it whole, alone where it is longer than the budget
    (:mod:`sim.serving.scheduler`). What a fitted range's ``max_new_tokens`` is checked against."""
    if policy == "prefill-first":
        return int(new_tokens)
    return min(int(new_tokens), int(max_num_batched_tokens))


def job_extent(jobs, mode: str, max_num_batched_tokens: int) -> tuple[int, bool]:
    """(tokens per iteration, mixed iterations) a run of ``jobs`` (``sim.workload.job.Job``) can reach.

    Isolated mode prefills a problem's computed prompt tokens together and never mixes a
    prefill chunk with decodes; serving mode chunks prefills to ``max_num_batched_tokens``
    per iteration beside running decodes (vLLM V1), so it reaches the smaller of that and
    the tokens the jobs have to prefill, in mixed iterations.
    """
    import numpy as np

    need = max((int(np.sum(j.computed)) for j in jobs if j.B), default=0)
    if mode == "serving":
        total = sum(int(np.sum(j.computed)) for j in jobs if j.B)
        return min(int(max_num_batched_tokens), total), total > 0
    return need, False
