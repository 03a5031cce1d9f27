"""Workload reshaping: a trace's problems at another prompt length, branch count and generation length.

``--reshape prefix_tokens=N,branches=B,gen_tokens=T[,seed=S]`` (docs/simulator.md, "Workload
reshaping", section 9) builds, from a loaded trace, problems of the requested shape whose decisions are
the trace's own, resampled with a seeded ``numpy.random.Generator``:

* **prompt layout** (``prefix_tokens``): every problem's root prompt becomes exactly ``N``
  tokens, as ``rksim capture --target-prefix-tokens N`` builds it: the *shared problem text*
  (the longer shared region of the root prompt, i.e. the problem block, where the capture
  pads) grows by repeating its own tokens, or shrinks, at its edge next to the variant span;
  the variant span keeps its tokens and length. So persona-prefix keeps its variant first
  (exact prefix reuses only the template head) and hint-suffix keeps its long shared
  prefix (exact prefix reuses nearly all of it);
* **branches** (``branches``): the root (branch 0) stays; ``B < B0`` keeps a seeded sample
  of the other branches without replacement (in their order), ``B > B0`` keeps every branch
  and appends ``B - B0`` whole-branch copies drawn with replacement from the same problem's
  non-root branches. A copy carries every decision input of its source row (cosines of all
  layers, own and counterfactual answers, correctness, confidences, per-layer entropies and
  p(Yes)/p(No), verification length): rows are never mixed across branches or layers, and
  answers stay correlated within the problem as CGEE's vote share needs. A copy's prompt is
  its source's with one token replaced by an id no other branch has at that position, at the
  position where the source diverged from its closest sibling, so exact prefix reuses for
  the copy exactly what the source reuses, as a distinct persona would;
* **generation lengths** (``gen_tokens``): ``T`` is the new ``max_new_tokens``: every length
  (own and counterfactual) is scaled by ``T / cap`` (``cap``: the capture's
  ``max_new_tokens``, else the longest recorded generation) with seeded stochastic rounding
  ``floor(len * T / cap + u)``, ``u ~ U[0, 1)`` (one ``u`` per branch row, so a branch whose
  own and counterfactual lengths were equal keeps them equal), capped at ``T``, at least 1 (0 stays 0).
  The shape of the distribution is kept and a branch that hit the cap hits the new cap.

An omitted key keeps the trace's own value; reshaping with every key at the trace's own value
(``branches = B0``, ``gen_tokens = cap``, ``prefix_tokens`` = the root's length) draws nothing
and reproduces the trace's features exactly. Long-decode sequences (token-eviction policies)
are not reshaped.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from sim.workload.decisions import ConfigError
from sim.workload.features import ProblemFeatures, TraceFeatures

# Upper bounds: a reshaped problem holds B prompts of ~N ids and B x L decision rows, and the
# exact-prefix plan compares every pair of prompts; these keep that within a workstation's memory.
MAX_PREFIX_TOKENS = 131072
MAX_BRANCHES = 64
MAX_GEN_TOKENS = 32768
MAX_SEED = 2 ** 63 - 1
_BOUNDS = {"prefix_tokens": (1, MAX_PREFIX_TOKENS), "branches": (1, MAX_BRANCHES),
           "gen_tokens": (1, MAX_GEN_TOKENS), "seed": (0, MAX_SEED)}
_KEYS = tuple(_BOUNDS)
_INT = re.compile(r"[+-]?[0-9]+")

# Generator streams per problem: default_rng([seed, problem position, stream]).
_STREAM_BRANCHES, _STREAM_GEN = 0, 1


def _short(text: str) -> str:
    """``repr`` of user text, cut to keep an error on one short line."""
    return repr(text) if len(text) <= 24 else repr(text[:24]) + "..."


@dataclass(frozen=True)
class ReshapeSpec:
    """The requested shape; ``None`` keeps the trace's own value.

    Parameters
    ----------
    prefix_tokens : int, optional
        Tokens of every problem's root prompt (1 .. 131072).
    branches : int, optional
        Branches per problem, the root included (1 .. 64).
    gen_tokens : int, optional
        The new generation cap ``T`` (1 .. 32768): lengths scale by ``T / max_new_tokens``.
    seed : int, default 0
        Seed of every draw (branch sample, rounding of generation lengths).
    """

    prefix_tokens: int | None = None
    branches: int | None = None
    gen_tokens: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for k in _KEYS:
            v = getattr(self, k)
            if v is None and k != "seed":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ConfigError(f"reshape: {k}: must be an integer, got {v!r}", field="reshape")
            lo, hi = _BOUNDS[k]
            if v < lo:
                raise ConfigError(f"reshape: {k}: must be >= {lo}, got {v}", field="reshape")
            if v > hi:
                raise ConfigError(f"reshape: {k}: at most {hi}, got {v}", field="reshape")
            object.__setattr__(self, k, int(v))

    @classmethod
    def parse(cls, text: str) -> "ReshapeSpec":
        """``"prefix_tokens=1024,branches=8,gen_tokens=256[,seed=0]"`` -> spec (errors name the key)."""
        if not isinstance(text, str):
            raise ConfigError(f"reshape: expected KEY=N[,KEY=N...] text, got {type(text).__name__}", field="reshape")
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise ConfigError(f"reshape: empty; expected KEY=N[,KEY=N...] with keys {', '.join(_KEYS)}", field="reshape")
        vals: dict = {}
        for it in items:
            if "=" not in it:
                raise ConfigError(f"reshape: {_short(it)}: expected KEY=N (keys {', '.join(_KEYS)})", field="reshape")
            k, v = (s.strip() for s in it.split("=", 1))
            if k not in _BOUNDS:
                raise ConfigError(f"reshape: unknown key {_short(k)}; valid: {', '.join(_KEYS)}", field="reshape")
            if k in vals:
                raise ConfigError(f"reshape: {k}: given twice", field="reshape")
            if not _INT.fullmatch(v):
                raise ConfigError(f"reshape: {k}: must be an integer, got {_short(v)}", field="reshape")
            if len(v.lstrip("+-").lstrip("0")) > 19:  # beyond every bound: do not build the integer
                lo, hi = _BOUNDS[k]
                raise ConfigError(f"reshape: {k}: " + (f"must be >= {lo}" if v.startswith("-") else f"at most {hi}")
                                  + f", got {_short(v)}", field="reshape")
            vals[k] = int(v)
        return cls(**vals)

    @classmethod
    def coerce(cls, spec) -> "ReshapeSpec":
        """A spec from a :class:`ReshapeSpec`, its text or a ``{key: int}`` mapping."""
        if isinstance(spec, cls):
            return spec
        if isinstance(spec, dict):
            bad = [k for k in spec if k not in _BOUNDS]
            if bad:
                raise ConfigError(f"reshape: unknown key {bad[0]!r}; valid: {', '.join(_KEYS)}", field="reshape")
            return cls(**spec)
        return cls.parse(spec)

    def text(self) -> str:
        """The canonical flag text (every key given, then ``seed``)."""
        parts = [f"{k}={getattr(self, k)}" for k in _KEYS[:-1] if getattr(self, k) is not None]
        return ",".join(parts + [f"seed={self.seed}"])


@dataclass
class ReshapedTrace:
    """A reshaped trace: what ``sim.workload.features.load`` returns for it is ``features`` (in memory).

    Pass it wherever the simulator takes a trace (``simulate(trace=...)``, ``evaluate``,
    ``compare_policies``). ``info`` says what it was built from.
    """

    features: TraceFeatures
    source: TraceFeatures
    spec: ReshapeSpec
    info: dict

    @property
    def reshaped_features(self) -> TraceFeatures:  # the hook sim.workload.features.load looks for
        return self.features


def _gen_cap(tf: TraceFeatures) -> int:
    cap = (tf.manifest.get("capture") or {}).get("max_new_tokens")
    if isinstance(cap, (int, np.integer)) and not isinstance(cap, bool) and cap > 0:
        return int(cap)
    longest = [int(max(f.gen["own"]["len"].max(), f.gen["cf"]["len"].max())) for f in tf.problems if f.B]
    return max(longest, default=1) or 1


def _branch_index(f: ProblemFeatures, B: int, rng: np.random.Generator) -> np.ndarray:
    """Source row of every reshaped branch (root first; see the module docstring)."""
    B0 = f.B
    if B == B0:
        return np.arange(B0, dtype=np.int64)
    rest = np.arange(1, B0, dtype=np.int64)
    if B < B0:
        return np.concatenate([[0], np.sort(rng.choice(rest, size=B - 1, replace=False))]).astype(np.int64)
    if rest.size == 0:
        raise ConfigError(f"reshape: branches: problem {f.index} has only its root branch; "
                          "there is no branch to resample beyond it", field="reshape")
    return np.concatenate([np.arange(B0), rng.choice(rest, size=B - B0, replace=True)]).astype(np.int64)


def _layout(f: ProblemFeatures, N: int | None) -> tuple[list, np.ndarray]:
    """Prompt ids and variant spans of ``f``'s branches with the root prompt at ``N`` tokens."""
    ids0 = f.prompt_ids
    spans = f.spans.copy()
    n0 = int(f.prompt_len[0])
    if N is None or N == n0:
        return list(ids0), spans
    s0, e0 = int(spans[0, 0]), int(spans[0, 1])
    pre, post = s0, n0 - e0
    grow_post = post >= pre  # the longer shared region holds the problem text
    region = ids0[0][e0:] if grow_post else ids0[0][:s0]
    d = int(N) - n0
    if d < 0 and -d >= region.shape[0]:
        raise ConfigError(f"reshape: prefix_tokens: {N} is too short for problem {f.index}: its prompt has "
                          f"{n0 - region.shape[0]} tokens outside the shared problem text (at least "
                          f"{n0 - region.shape[0] + 1} needed)", field="reshape")
    ext = np.resize(region, d) if d > 0 else None  # np.resize repeats the region's own ids
    out = []
    for b, ids in enumerate(ids0):
        s, e = int(spans[b, 0]), int(spans[b, 1])
        if grow_post:
            cut = e  # the edge next to the variant: its end
            new = (np.concatenate([ids[:cut], ext, ids[cut:]]) if d > 0 else
                   np.concatenate([ids[:cut], ids[cut - d:]]))
            if d < 0 and ids.shape[0] - e <= -d:
                raise ConfigError(f"reshape: prefix_tokens: {N} is too short for branch {b} of problem {f.index}", field="reshape")
        else:
            cut = s
            if d < 0 and s <= -d:
                raise ConfigError(f"reshape: prefix_tokens: {N} is too short for branch {b} of problem {f.index}", field="reshape")
            new = np.concatenate([ids[:cut], ext, ids[cut:]]) if d > 0 else np.concatenate([ids[:cut + d], ids[cut:]])
            spans[b] += d
        out.append(new.astype(np.int64, copy=False))
    return out, spans


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if neq.size else n


def _copy_prompts(ids: list, idx: np.ndarray, B0: int, vocab: int | None) -> list:
    """Prompts of the reshaped branches; copies (``b >= B0``) diverge where their source diverged."""
    out = [ids[int(j)] for j in idx]
    if idx.shape[0] <= B0:
        return out
    # Where each original diverges from its closest other original (its exact-prefix reach).
    reach = {}
    for j in set(int(j) for j in idx[B0:]):
        reach[j] = max((_lcp(ids[j], ids[k]) for k in range(B0) if k != j), default=0)
    top = int(vocab) if vocab else int(max(int(a.max()) for a in ids if a.size) + 1)
    for b in range(B0, idx.shape[0]):
        j = int(idx[b])
        k = reach[j]
        src = ids[j]
        if k >= src.shape[0]:
            continue  # the source equals a sibling: its copy does too (an identical variant)
        taken = {int(a[k]) for a in out if a.shape[0] > k}
        fresh = top - 1
        while fresh in taken and fresh > 0:  # the highest id no branch has at position k
            fresh -= 1
        if fresh in taken:
            fresh = top + b  # a vocabulary smaller than the branch count at k: out-of-range id
        c = src.copy()
        c[k] = fresh
        out[b] = c
    return out


def _vote(answers: np.ndarray) -> np.ndarray:
    """Share of the branches giving each branch's answer (0 for no answer), as the capture stores it."""
    a = np.asarray(answers)
    return np.array([(a == x).sum() / a.shape[0] if x != "" else 0.0 for x in a], dtype=np.float64)


def _scale_len(x: np.ndarray, T: int, cap: int, u: np.ndarray) -> np.ndarray:
    if T == cap:
        return x.astype(np.int64)
    y = np.floor(x.astype(np.float64) * (T / cap) + u).astype(np.int64)
    return np.where(x > 0, np.clip(y, 1, T), 0)  # an empty generation stays empty


def reshape_problem(f: ProblemFeatures, spec: ReshapeSpec, *, cap: int, vocab: int | None) -> ProblemFeatures:
    """``f`` at the shape of ``spec`` (one problem; draws from ``default_rng([seed, f.pos, stream])``)."""
    if f.B == 0:
        return f
    B = f.B if spec.branches is None else spec.branches
    idx = _branch_index(f, B, np.random.default_rng([spec.seed, f.pos, _STREAM_BRANCHES]))
    ids, spans = _layout(f, spec.prefix_tokens)
    ids = _copy_prompts(ids, idx, f.B, vocab)
    spans = spans[idx]
    identity = idx.shape[0] == f.B and bool((idx == np.arange(f.B)).all())
    T = cap if spec.gen_tokens is None else spec.gen_tokens
    u = np.random.default_rng([spec.seed, f.pos, _STREAM_GEN]).random(B) if T != cap else np.zeros(B)
    gen = {}
    for g in ("own", "cf"):
        src = f.gen[g]
        d = {k: v[idx] for k, v in src.items()}
        d["len"] = _scale_len(d["len"], T, cap, u)
        if not identity:
            d["vote_share"] = _vote(d["answer"])
        gen[g] = d
    cos = {k: v[idx] for k, v in f.cos.items()}
    lens = {key: {k: v[idx] for k, v in d.items()} for key, d in f.lens.items()}
    return ProblemFeatures(pos=f.pos, index=f.index, truth=f.truth, B=B, L=f.L, prompt_ids=ids,
                           prompt_len=np.array([a.shape[0] for a in ids], dtype=np.int64), spans=spans,
                           verify_len=f.verify_len[idx], gen=gen, cos=cos, lens=lens)


def build_reshaped(tf: TraceFeatures, spec) -> ReshapedTrace:
    """The reshaped trace of ``tf`` (a :class:`sim.workload.features.TraceFeatures`); not memoised."""
    spec = ReshapeSpec.coerce(spec)
    if (tf.manifest or {}).get("reshaped"):
        raise ConfigError("reshape: the trace is already reshaped; reshape its source trace")
    cap = _gen_cap(tf)
    probs = [reshape_problem(f, spec, cap=cap, vocab=getattr(tf, "vocab_size", None)) for f in tf.problems]
    B0 = sorted({f.B for f in tf.problems})
    info = {"reshaped": True, "source": tf.path, "spec": spec.text(), "seed": spec.seed,
            "source_shape": {"branches": B0[0] if len(B0) == 1 else B0, "max_new_tokens": cap,
                             "root_prompt_tokens_mean": float(np.mean([f.prompt_len[0] for f in tf.problems if f.B]))
                             if tf.problems else None},
            "long_decodes": "not reshaped (token-eviction results are the source's)",
            "rules": "docs/simulator.md, section 9 (Workload reshaping)"}
    manifest = dict(tf.manifest)
    manifest["reshaped"] = info
    if spec.branches is not None:
        manifest["n_branches"] = spec.branches
    if spec.gen_tokens is not None:
        manifest["capture"] = {**(manifest.get("capture") or {}), "max_new_tokens": spec.gen_tokens}
    # Timings measured at the source's shape describe no phase of the reshaped one.
    timings = [t.iloc[0:0] if hasattr(t, "iloc") else t for t in tf.timings]
    # Every other field (model, depth, vocabulary, long decodes) is the source's.
    out = dataclasses.replace(tf, manifest=manifest, problems=probs, timings=timings, trace=None)
    rt = ReshapedTrace(features=out, source=tf, spec=spec, info=info)
    out.trace = rt  # what sim.api passes on (baselines, compare) resolves to these features again
    return rt


def reshape_trace(trace, spec) -> ReshapedTrace:
    """:func:`build_reshaped` of ``trace`` (a path, a loaded trace or features).

    Built anew on every call; ``sim.replay.session.Session.reshaped`` keeps the reshaped session (and
    so the simulator's memo tables for it) per spec.
    """
    from sim.workload import features

    tf = trace if isinstance(trace, TraceFeatures) else features.load(trace)
    return build_reshaped(tf, ReshapeSpec.coerce(spec))


def describe(tf: TraceFeatures) -> dict | None:
    """``{"reshaped": True, "source", "spec", "seed", ...}`` for reshaped features, else ``None``."""
    r = (tf.manifest or {}).get("reshaped")
    return dict(r) if r else None


__all__ = ["ReshapeSpec", "ReshapedTrace", "build_reshaped", "reshape_trace", "reshape_problem", "describe",
           "MAX_PREFIX_TOKENS", "MAX_BRANCHES", "MAX_GEN_TOKENS"]
