"""KV sharing across the branches of one problem: No-KV, exact prefix, ASKS (DESIGN §4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from .base import PolicyBase, PolicyError, register
from .similarity import cosine


@dataclass
class SharingPlan:
    """What each branch reuses and computes of its prompt (all arrays have length B).

    ``reused + computed`` is the prompt length of the context the branch decodes on
    (the root's prompt length where ``share_root``).
    """

    reused: np.ndarray       # int64: prompt tokens whose KV is reused
    computed: np.ndarray     # int64: prompt tokens prefilled
    share_root: np.ndarray   # bool: ASKS passed, the branch decodes on the root's prompt KV
    gate_tokens: np.ndarray  # int64: tokens of the ASKS gate pass (0 if none)
    sigma: np.ndarray        # float64: ASKS similarity, NaN where not applicable
    source: np.ndarray       # int64: branch whose KV is reused, -1 if none

    @property
    def n_branches(self) -> int:
        return int(self.reused.shape[0])


def _as_id_lists(policy: PolicyBase, prompt_ids: Sequence) -> list[np.ndarray]:
    out = []
    for b, ids in enumerate(prompt_ids):
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise policy._fail(f"prompt_ids[{b}]", f"must be a 1-D list of token ids, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all():
                arr = arr.astype(np.int64)
            else:
                raise policy._fail(f"prompt_ids[{b}]", "must hold integer token ids")
        out.append(arr.astype(np.int64, copy=False))
    return out


def lcp_matrix(ids: list[np.ndarray]) -> np.ndarray:
    """(B, B) longest-common-prefix lengths of every pair of id arrays (vectorised)."""
    n = len(ids)
    lens = np.array([a.shape[0] for a in ids], dtype=np.int64)
    width = int(lens.max()) if n else 0
    if n == 0 or width == 0:
        return np.zeros((n, n), dtype=np.int64)
    M = np.zeros((n, width), dtype=np.int64)
    for b, a in enumerate(ids):
        M[b, : a.shape[0]] = a
    diff = M[:, None, :] != M[None, :, :]
    first = np.where(diff.any(axis=2), diff.argmax(axis=2), width)
    return np.minimum(first, np.minimum(lens[:, None], lens[None, :]))


def _exact_prefix(ids: list[np.ndarray], block_size: int,
                  sources_ok: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per branch: block-rounded longest common prefix with any earlier branch, and that branch.

    ``reused_b = floor(min(LCP, n_b - 1) / block_size) * block_size``: the hit is capped at
    ``n_b - 1`` tokens, as vLLM's prefix cache caps it (``max_cache_hit_length =
    num_tokens - 1``), so the last prompt position is always computed and its logits exist
    to sample the first token. At a whole-prompt match of whole blocks this recomputes the
    last block (vLLM's block-aligned hit; with ``block_size=1``, SGLang's radix cache, just
    the last token).
    ``sources_ok[b']`` False excludes branch b' as a source (its KV is not its own prompt's).
    Ties go to the lowest branch index.
    """
    n = len(ids)
    reused = np.zeros(n, dtype=np.int64)
    source = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return reused, source
    lens = np.array([a.shape[0] for a in ids], dtype=np.int64)
    cap = np.maximum(lens - 1, 0)[:, None]                    # row b: what branch b may reuse
    r = (np.minimum(lcp_matrix(ids), cap) // block_size) * block_size
    earlier = np.tril(np.ones((n, n), bool), k=-1)          # [b, s]: s < b
    if sources_ok is not None:
        earlier &= np.asarray(sources_ok, bool)[None, :]
    r = np.where(earlier, r, -1)
    best = r.argmax(axis=1)                                   # first maximum = lowest source
    val = r[np.arange(n), best]
    ok = val > 0
    reused[ok] = val[ok]
    source[ok] = best[ok]
    return reused, source


@register
@dataclass
class NoKV(PolicyBase):
    """No KV reuse: every branch prefills its whole prompt (``reused = 0``)."""

    kind: ClassVar[str] = "sharing"
    name: ClassVar[str] = "no-kv"

    def plan(self, prompt_ids: Sequence, cos: np.ndarray | None = None,
             variant_spans: np.ndarray | None = None) -> SharingPlan:
        ids = _as_id_lists(self, prompt_ids)
        lens = np.array([a.shape[0] for a in ids], dtype=np.int64)
        n = len(ids)
        return SharingPlan(reused=np.zeros(n, np.int64), computed=lens,
                           share_root=np.zeros(n, bool), gate_tokens=np.zeros(n, np.int64),
                           sigma=np.full(n, np.nan), source=np.full(n, -1, np.int64))


@register
@dataclass
class ExactPrefix(PolicyBase):
    """Exact prefix caching (vLLM automatic prefix caching / SGLang radix tree).

    Branch b reuses ``floor(min(max_{b' < b} LCP(ids_b, ids_b'), n_b - 1) / block_size) * block_size``
    tokens of KV, from the earliest branch attaining the maximum; the rest is computed.
    The cap at ``n_b - 1`` is vLLM's (the last position must be computed to give the logits
    of the first generated token), so a whole-prompt match of whole blocks recomputes its
    last block, never 0 tokens.

    Parameters
    ----------
    block_size : int, default 16
        KV block granularity in tokens (vLLM's default block size).
    """

    kind: ClassVar[str] = "sharing"
    name: ClassVar[str] = "exact-prefix"
    block_size: int = 16
    domains: ClassVar[dict[str, tuple]] = {"block_size": (1, None, "tokens", "granularity of prefix matching")}

    def __post_init__(self) -> None:
        self._check_number("block_size", lo=1, integer=True)

    def plan(self, prompt_ids: Sequence, cos: np.ndarray | None = None,
             variant_spans: np.ndarray | None = None) -> SharingPlan:
        ids = _as_id_lists(self, prompt_ids)
        lens = np.array([a.shape[0] for a in ids], dtype=np.int64)
        reused, source = _exact_prefix(ids, self.block_size)
        n = len(ids)
        return SharingPlan(reused=reused, computed=lens - reused, share_root=np.zeros(n, bool),
                           gate_tokens=np.zeros(n, np.int64), sigma=np.full(n, np.nan), source=source)


def layer_weights(n_layers: int, alpha: float, rule: str = "paper") -> np.ndarray:
    """ASKS layer weights for layers l = 1..L.

    ``rule="paper"``: ``w_l = exp(alpha * l / L)`` (DESIGN §4).
    ``rule="code"``: the RKSC public code's ``w_l = exp(alpha * i / (L - 1))`` over the 0-based
    layer index ``i = l - 1`` (so the first layer gets weight 1 and the last ``exp(alpha)``).
    """
    l = np.arange(1, n_layers + 1, dtype=np.float64)
    if rule == "paper":
        return np.exp(alpha * l / n_layers)
    if rule == "code":
        if n_layers == 1:
            return np.ones(1)
        return np.exp(alpha * (l - 1) / (n_layers - 1))
    raise PolicyError(f"policy 'asks': layer_weights: {rule!r} is not one of 'paper', 'code'")


def pooled_cosine(pooled: np.ndarray, reference: np.ndarray | None = None, root: int = 0) -> np.ndarray:
    """Per-layer cosine of each branch's pooled variant-span vector to the root's.

    Lets pooled vectors stored in a trace (``hidden_mean.npy`` / ``hidden_last.npy``) be
    replayed under another similarity rule.

    Parameters
    ----------
    pooled : (B, L, d) array
        Pooled hidden state of each branch's variant span at each layer.
    reference : (L, d) array or None
        Per-layer reference mean (``reference_mean.npy`` / ``reference_last.npy``). When given,
        the *centered* cosine ``cos(h_l^b - mu_l, h_l^root - mu_l)`` is computed, else raw cosine.
    root : int
        Index of the root branch.

    Returns
    -------
    (B, L) float64 array. Bit-identical vectors give exactly 1.0; a zero vector (after
    centering) gives 0.0 unless both vectors are identical.
    """
    h = np.asarray(pooled, dtype=np.float64)
    if h.ndim != 3:
        raise PolicyError(f"policy 'asks': pooled: must have shape (B, L, d), got {h.shape}")
    if h.size and not np.isfinite(h).all():
        raise PolicyError("policy 'asks': pooled: contains NaN or inf")
    if reference is not None:
        mu = np.asarray(reference, dtype=np.float64)
        if mu.shape != h.shape[1:]:
            raise PolicyError(f"policy 'asks': reference: must have shape {h.shape[1:]}, got {mu.shape}")
        if not np.isfinite(mu).all():
            raise PolicyError("policy 'asks': reference: contains NaN or inf")
        h = h - mu[None]
    if h.shape[0] == 0:
        return np.zeros((0, h.shape[1]))
    # The one cosine (policies.similarity): identical spans -> exactly 1, so tau = 1 shares them.
    return cosine(h, h[root][None])


@register
@dataclass
class ASKS(PolicyBase):
    """Attention-similarity KV sharing (ASKS), DESIGN §4.

    For branch b and layers l = 1..L::

        w_l     = exp(alpha * l / L)
        sigma_b = sum_l w_l * cos(h_l^b, h_l^root) / sum_l w_l

    where h are the pooled hidden states of the variant span. If ``sigma_b >= tau`` the
    branch uses the root's KV for its whole prompt (``share_root``: reused = root prompt
    length, computed = 0, zero-copy); else it falls back to exact-prefix reuse (against
    the root and the earlier branches that hold their own prompt's KV). The gate pass
    over the variant span (``end - start`` tokens, full depth) is charged for every
    branch, the root's included: sigma compares each branch's pooled span with the
    root's, so the real gate runs the root's span too (one batched pass over all spans,
    ``traces.capture_ops.gate_pool``). A single branch has nothing to compare: no gate.
    One refinement: where exact prefix would already reuse *more* tokens
    than the root's whole prompt, exact prefix is kept (so ASKS never reuses fewer tokens
    than exact prefix). With ``tau > 1`` the gate cannot pass, is not run, and the plan
    equals :class:`ExactPrefix` exactly.

    Parameters
    ----------
    tau : float, default 0.9
        Sharing threshold on sigma.
    alpha : float, default 1.0
        Depth emphasis of the layer weights (0 = uniform).
    pooling : {"mean", "last"}, default "mean"
        Pooling of the variant span; tells the caller which trace column to pass.
    similarity : {"cosine", "centered"}, default "cosine"
        Raw cosine (the paper) or cosine after subtracting the reference mean per layer.
    block_size : int, default 16
        Block granularity of the exact-prefix fallback.
    layer_weights : {"paper", "code"}, default "paper"
        "code" reproduces the public code's ``exp(alpha * (l - 1) / (L - 1))``.
    """

    kind: ClassVar[str] = "sharing"
    name: ClassVar[str] = "asks"
    choices: ClassVar[dict[str, tuple[str, ...]]] = {'pooling': ('mean', 'last'), 'similarity': ('cosine', 'centered'), 'layer_weights': ('paper', 'code')}
    tau: float = 0.9
    alpha: float = 1.0
    pooling: str = "mean"
    similarity: str = "cosine"
    block_size: int = 16
    layer_weights: str = "paper"
    domains: ClassVar[dict[str, tuple]] = {
        "tau": (-1.0, 1.0, "cosine similarity",
                "sigma is a layer-weighted mean of cosines, in [-1, 1]; tau > 1: the gate never passes (= exact-prefix)"),
        "alpha": (None, None, "", "layer weight exp(alpha l / L); 0 = uniform, > 0 favours deep layers"),
        "block_size": (1, None, "tokens", "block of the exact-prefix fallback"),
    }

    def __post_init__(self) -> None:
        self._check_number("tau")
        self._check_number("alpha")
        self._check_choice("pooling", ("mean", "last"))
        self._check_choice("similarity", ("cosine", "centered"))
        self._check_number("block_size", lo=1, integer=True)
        self._check_choice("layer_weights", ("paper", "code"))

    @property
    def trace_column(self) -> str:
        """The ``asks.parquet`` column this policy reads (e.g. ``cos_mean_raw``)."""
        return f"cos_{self.pooling}_{'raw' if self.similarity == 'cosine' else 'centered'}"

    def sigma(self, cos: np.ndarray) -> np.ndarray:
        """``sigma_b = sum_l w_l cos_bl / sum_l w_l`` for a (B, L) cosine array."""
        c = self._array("cos", cos, ndim=2)
        if c.shape[1] == 0:
            raise self._fail("cos", "needs at least one layer")
        w = layer_weights(c.shape[1], float(self.alpha), self.layer_weights)
        return (c * w[None, :]).sum(axis=1) / w.sum()

    def plan(self, prompt_ids: Sequence, cos: np.ndarray | None = None,
             variant_spans: np.ndarray | None = None) -> SharingPlan:
        ids = _as_id_lists(self, prompt_ids)
        n = len(ids)
        lens = np.array([a.shape[0] for a in ids], dtype=np.int64)
        exact_reused, exact_src = _exact_prefix(ids, self.block_size)
        sigma = np.full(n, np.nan)
        share = np.zeros(n, bool)
        gate = np.zeros(n, np.int64)
        if n > 1 and self.tau <= 1.0:
            if cos is None:
                raise self._fail("cos", "is required (B, L) when tau <= 1")
            if variant_spans is None:
                raise self._fail("variant_spans", "is required (B, 2) to charge the gate pass")
            c = self._array("cos", cos, ndim=2, shape=(n, None))
            spans = self._array("variant_spans", variant_spans, ndim=2, dtype=np.int64, shape=(n, 2))
            if (spans[:, 1] < spans[:, 0]).any() or (spans < 0).any() or (spans[:, 1] > lens).any():
                raise self._fail("variant_spans", "each row must be 0 <= start <= end <= prompt length")
            sig = self.sigma(c)
            sigma[1:] = sig[1:]
            gate[:] = spans[:, 1] - spans[:, 0]  # the root's span is pooled too (the reference)
            share[1:] = (sig[1:] >= self.tau) & (exact_reused[1:] <= lens[0])
        elif n > 1 and cos is not None:
            # Gate disabled (tau > 1): no gate pass is run; sigma still reported for analysis.
            c = self._array("cos", cos, ndim=2, shape=(n, None))
            sigma[1:] = self.sigma(c)[1:]
        if share.any():
            # Branches that took the root's KV do not hold their own prompt's KV.
            reused, source = _exact_prefix(ids, self.block_size, sources_ok=~share)
        else:
            reused, source = exact_reused, exact_src
        reused = np.where(share, lens[0] if n else 0, reused)
        computed = np.where(share, 0, lens - reused)
        source = np.where(share, 0, source)
        return SharingPlan(reused=reused.astype(np.int64), computed=computed.astype(np.int64),
                           share_root=share, gate_tokens=gate, sigma=sigma, source=source.astype(np.int64))
