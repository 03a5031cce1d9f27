"""From a policy name + parameters to per-problem decisions, by calling ``policies`` objects.

The simulator never decides anything itself: the sharing plan comes from
``policy.plan``, the early-exit decision from ``policy.decide``, block
eviction from the block policy's ``evict_key`` (in ``sim.serving.kvcache.BlockManager``), token eviction
from ``policies.run_token_eviction``. This module only picks the trace
columns each policy reads and combines the pieces a policy does not set with
the baseline (documented in docs/simulator.md):

* a sharing policy runs with full-depth verification and no block budget;
* ``cgee`` runs on top of ``workload["base_sharing"]`` (default ``no-kv``,
  the RKSC paper's baseline for its component ablation);
* ``lru``/``fifo``/``rsbcm`` run on ``exact-prefix`` sharing (the block pool
  is a prefix cache) under a block budget;
* ``rksc`` is ASKS + CGEE + RSBCM;
* token-eviction policies act on the long-decode sequences only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies import PolicyError, get_policy, list_policies, yes_score

from sim.base.errors import ConfigError
from sim.workload.job import build_job
from sim.workload.config import Workload

# Parameters of the block pool accepted in ``params`` of a block policy (not policy fields).
BLOCK_PARAMS = ("budget_blocks", "budget_frac")


@dataclass
class SimConfig:
    policy: str
    params: dict
    kind: str
    sharing: Any
    exit: Any = None
    block: Any = None
    token: Any = None
    workload: Workload = field(default_factory=Workload)
    budget_blocks: int | None = None
    budget_frac: float = 0.5
    # Memos of this config's keys (its policy objects are not changed after make_config; bind_vocab resets them).
    static: tuple | None = field(default=None, repr=False, compare=False)       # static_key(cfg)
    workload_key: tuple | None = field(default=None, repr=False, compare=False)  # frozen workload options

    @property
    def no_kv(self) -> bool:
        return getattr(self.sharing, "name", "") == "no-kv"

    def describe(self) -> dict:
        return {"policy": self.policy, "kind": self.kind,
                "sharing": getattr(self.sharing, "name", None),
                "exit": getattr(self.exit, "name", None) if self.exit is not None else None,
                "block": getattr(self.block, "name", None) if self.block is not None else None,
                "token": getattr(self.token, "name", None) if self.token is not None else None}


def workload_options(workload) -> Workload:
    """The workload options as a validated :class:`sim.workload.config.Workload` (a dict, None or one already)."""
    return Workload.from_any(workload)


def _default_policy(name: str):
    """A policy at its defaults (policy objects hold only their parameters)."""
    return get_policy(name)


def make_config(policy: str, params: dict | None, workload: dict | None) -> SimConfig:
    """Build the policy objects of a configuration (unknown keys raise naming them)."""
    params = dict(params or {})
    opts = workload_options(workload)
    if policy not in list_policies():
        raise ConfigError(f"unknown policy {policy!r}; valid: {', '.join(list_policies())}", field="policy")
    try:
        kind = policy_kind(policy)
        budget_blocks = opts.kv_budget_blocks
        budget_frac = opts.budget_frac
        if kind in ("block", "composite"):
            base = get_policy(policy, **{k: v for k, v in params.items() if k not in BLOCK_PARAMS})
            budget_blocks = params.get("budget_blocks", budget_blocks)
            budget_frac = params.get("budget_frac", budget_frac)
            if budget_blocks is not None and (isinstance(budget_blocks, bool) or not isinstance(budget_blocks, (int, float))
                                              or int(budget_blocks) != budget_blocks or budget_blocks < 0):
                raise ConfigError(f"policy {policy!r}: budget_blocks: must be an integer >= 0, got {budget_blocks!r}", field="params")
            if isinstance(budget_frac, bool) or not isinstance(budget_frac, (int, float)) or not budget_frac > 0:
                raise ConfigError(f"policy {policy!r}: budget_frac: must be a number > 0, got {budget_frac!r}", field="params")
        else:
            base = get_policy(policy, **params)
    except PolicyError as exc:
        raise ConfigError(str(exc), field="params") from None
    cfg = SimConfig(policy=policy, params=params, kind=kind, sharing=None, workload=opts,
                    budget_blocks=None if budget_blocks is None else int(budget_blocks), budget_frac=budget_frac)
    if kind == "sharing":
        cfg.sharing = base
    elif kind == "exit":
        cfg.sharing, cfg.exit = _default_policy(opts.base_sharing), base
    elif kind == "block":
        cfg.sharing, cfg.block = _default_policy(opts.block_sharing), base
    elif kind == "composite":
        cfg.sharing, cfg.exit, cfg.block = base.asks, base.cgee, base.rsbcm
    elif kind == "token":
        cfg.sharing, cfg.token = get_policy(opts.base_sharing), base
    return cfg


# CGEE parameters that act only through the level-1 skip outcome (which the key holds instead).
_SKIP_ONLY = frozenset({"tau_conf", "delta_rel", "level1_rule", "nb_conf", "nb_margin"})


def fields_of(obj) -> dict:
    """A leaf policy's parameters by name (``dataclasses.asdict`` without its deep copy)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def static_key(cfg: SimConfig) -> tuple:
    """The threshold-free part of :func:`decision_key` (same for every problem of a configuration).

    Returns ``(base, tau, theta, eps, l_min, level1)``: ``base`` names the policies and their
    parameters that no key below resolves; ``level1`` the parameters of CGEE's skip rule.
    Memoised on the config (its policy objects are not changed after :func:`make_config`).
    """
    if cfg.static is not None:
        return cfg.static
    sh, ex = cfg.sharing, cfg.exit
    sp = fields_of(sh)
    tau = sp.pop("tau", None)
    key = (sh.name, tuple(sorted((k, repr(v)) for k, v in sp.items())))
    theta = eps = l_min = level1 = None
    if ex is not None:
        ep = fields_of(ex)
        # theta in nats: the unit and vocabulary act only through it.
        ep.pop("theta"), ep.pop("theta_unit", None), ep.pop("vocab_size", None)
        theta, eps, l_min = ex.theta_nats, float(ep.pop("eps")), ep.pop("l_min")
        # What the skip rule reads; its outcome (not these values) enters the decision key.
        level1 = tuple(sorted((k, repr(v)) for k, v in ep.items()))
        key += ("cgee", tuple((k, v) for k, v in level1 if k not in _SKIP_ONLY))
    out = cfg.static = (key, (None if tau is None else float(tau)), theta, eps, l_min, level1)
    return out


def _plan_of(f, cfg: SimConfig, cache: dict, skey: tuple):
    """The sharing policy's plan for ``f`` and its effective answers, memoised per sharing outcome ``skey``."""
    hit = cache.get(skey)
    if hit is None:
        sh = cfg.sharing
        cos = f.cos[sh.trace_column] if getattr(sh, "name", "") == "asks" else None
        plan = sh.plan(f.prompt_ids, cos=cos, variant_spans=f.spans)
        share = np.asarray(plan.share_root, bool)
        hit = cache[skey] = (share, f.eff(share, "answer"), {})
    return hit


def prefetch_exits(probs, cfg: SimConfig, cache: dict, static: tuple | None = None) -> None:
    """Fill :func:`decision_key`'s exit-layer memo for every problem of ``probs`` with one call.

    The policy's vectorised layer-exit rule works row by row, so stacking every problem's own
    and counterfactual entropy rows into one matrix gives each row the layer it gets alone;
    a sweep then calls it once per (theta, eps, l_min) instead of twice per problem.
    """
    ex = cfg.exit
    exits = getattr(ex, "_exit_layers", None)
    if exits is None or not probs:
        return
    _, _, theta, eps, l_min, _ = static if static is not None else static_key(cfg)
    first = probs[0]
    if (first.pos, "exit", ex.lens, theta, eps, l_min) in cache:
        return
    skey = ("H-stack", ex.lens, tuple(f.pos for f in probs))
    stack = cache.get(skey)
    if stack is None:
        norm = ex.lens == "norm"
        parts, bounds, at = [], [], 0
        for f in probs:
            own, cf = f.lens[("own", norm)]["entropy"], f.lens[("cf", norm)]["entropy"]
            if own.shape[1] != first.lens[("own", norm)]["entropy"].shape[1] or own.shape != cf.shape:
                return  # ragged layers: leave it to decision_key, problem by problem
            parts += [own, cf]
            bounds.append((f.pos, at, at + own.shape[0], at + 2 * own.shape[0]))
            at += 2 * own.shape[0]
        stack = cache[skey] = (np.concatenate(parts, axis=0) if parts else None, bounds)
    H, bounds = stack
    if H is None or H.shape[0] == 0:
        return
    e = exits(H)
    for pos, a, b, c in bounds:
        cache[(pos, "exit", ex.lens, theta, eps, l_min)] = (e[a:b].tobytes(), e[b:c].tobytes())


def decision_key(f, cfg: SimConfig, cache: dict, static: tuple | None = None, scaled: bool = False) -> tuple:
    """A key equal for two configurations iff the policies must decide the same on problem ``f``.

    Thresholds enter the key only through what they decide: ASKS's ``sign(sigma - tau)``
    per branch (``sigma`` from ``policy.sigma``), CGEE's level-1 outcome (``policy.skip`` on
    the confidences of the branches the sharing plan produces) and, unless it skipped, the
    exit layer of every branch's own and counterfactual verification (from the policy's own
    vectorised layer-exit rule) with ``l_min`` (it sets the logit-lens probes). A threshold
    sweep so calls ``plan``/``decide`` once per distinct outcome; the policy objects still
    make every decision. ``scaled``: exit layers are mapped onto a deeper or shallower
    target, whose probe counts depend on ``l_min`` even for a skipped verification.
    """
    sh, ex = cfg.sharing, cfg.exit
    base, tau, theta, eps, l_min, level1 = static if static is not None else static_key(cfg)
    key = (f.pos,) + base
    if tau is not None:
        skey = (f.pos, "sigma", sh.trace_column, sh.alpha, sh.layer_weights)
        sig = cache.get(skey)
        if sig is None:
            sig = cache[skey] = np.asarray(sh.sigma(f.cos[sh.trace_column]), np.float64)
        key += (np.sign(sig - tau).astype(np.int8).tobytes() if tau <= 1.0 else b"off",)
    if ex is not None:
        share, answers, skips = _plan_of(f, cfg, cache, ("plan",) + key)
        skipped = skips.get(level1)
        if skipped is None:
            conf = _confidence(f, share, answers, ex.trace_columns["confidence"])
            skipped = skips[level1] = bool(ex.skip(conf, list(answers))[0])
        key += (skipped,)
        if skipped and not scaled:
            return key  # no verification: exit thresholds and l_min decide nothing
        key += (l_min,)
        if skipped:
            return key
        hkey = (f.pos, "H", ex.lens)
        H = cache.get(hkey)
        if H is None:
            norm = ex.lens == "norm"
            own, cf = f.lens[("own", norm)]["entropy"], f.lens[("cf", norm)]["entropy"]
            H = cache[hkey] = (own, cf, np.abs(np.diff(own, axis=1)), np.abs(np.diff(cf, axis=1)))
        exits = getattr(ex, "_exit_layers", None)
        if exits is not None:
            # The policy's own (vectorised) layer-exit rule, for both generations of every branch.
            ekey = (f.pos, "exit", ex.lens, theta, eps, l_min)
            e = cache.get(ekey)
            if e is None:
                e = cache[ekey] = (exits(H[0]).tobytes(), exits(H[1]).tobytes())
            key += e
        else:
            key += (theta, eps, np.packbits(H[0] < theta).tobytes(), np.packbits(H[1] < theta).tobytes(),
                    np.packbits(H[2] < eps).tobytes(), np.packbits(H[3] < eps).tobytes())
    return key


def bind_vocab(cfg: SimConfig, vocab_size) -> SimConfig:
    """Give CGEE the trace model's vocabulary when its ``theta`` is a fraction of ``ln V``.

    The entropies replayed are the trace model's, so ``theta * ln V`` uses that model's V
    whatever the cost target. A ``vocab_size`` set by the user must agree. Call before
    :func:`static_key` (it reads the threshold in nats).
    """
    ex = cfg.exit
    if ex is None or getattr(ex, "theta_unit", "nats") != "ln_v":
        return cfg
    if vocab_size is None:
        raise ConfigError(f"policy {cfg.policy!r}: theta_unit: 'ln_v' needs the trace's model.vocab_size "
                          "(manifest.json has none); state theta in nats", field="params")
    if ex.vocab_size is None:
        cfg.exit = dataclasses.replace(ex, vocab_size=int(vocab_size))
        cfg.static = None
    elif int(ex.vocab_size) != int(vocab_size):
        raise ConfigError(f"policy {cfg.policy!r}: vocab_size: {ex.vocab_size} differs from the trace model's "
                          f"vocabulary ({vocab_size}); the entropies tested are the trace model's", field="params")
    return cfg


def scale_layers(layers: np.ndarray, L_trace: int, L_target: int) -> np.ndarray:
    """Layers recorded on a ``L_trace``-deep model mapped onto a ``L_target``-deep one.

    Same fraction of depth, rounded up: ``min(ceil(l * L_target / L_trace), L_target)``, at
    least 1; a full-depth pass (``l = L_trace``) maps to ``L_target``.
    """
    lay = np.asarray(layers, np.int64)
    if L_trace == L_target:
        return lay
    return np.maximum(np.minimum(np.ceil(lay * L_target / L_trace).astype(np.int64), L_target), 1)


def in_target_units(dec: "ProblemDecision", L_trace: int, L_target: int) -> "ProblemDecision":
    """The decision with its exit layers in the cost target's depth (what its job runs)."""
    if L_trace == L_target or dec.exit_layers is None:
        return dec
    return dataclasses.replace(dec, exit_layers=scale_layers(dec.exit_layers, L_trace, L_target))


def policy_kind(name: str) -> str:
    from policies import policy_class
    return policy_class(name).kind


@dataclass
class ProblemDecision:
    """What the policies decided for one problem."""

    plan: Any
    share: np.ndarray
    answers: np.ndarray
    correct: np.ndarray
    conf: np.ndarray
    skipped: bool
    exit_layers: np.ndarray | None   # None: full-depth verification (no exit policy)
    selected: int
    full_selected: int
    differs: bool            # CGEE-induced error: the selected answer != full verification's
    sigma: np.ndarray
    branch_differs: bool = False  # selected branch != full verification's branch


def decide(f, cfg: SimConfig) -> ProblemDecision:
    """Run the configuration's policies on problem ``f`` (a :class:`sim.workload.features.ProblemFeatures`)."""
    sh = cfg.sharing
    cos = None
    if getattr(sh, "name", "") == "asks":
        cos = f.cos[sh.trace_column]
    plan = sh.plan(f.prompt_ids, cos=cos, variant_spans=f.spans)
    share = np.asarray(plan.share_root, bool)
    answers = f.eff(share, "answer")
    correct = f.eff(share, "correct").astype(bool)
    ex = cfg.exit
    lens = f.eff_lens(share, norm=True)
    full = yes_score(lens["p_yes"][:, -1], lens["p_no"][:, -1])
    if ex is not None:
        cols = ex.trace_columns
        confcol = cols["confidence"]
        conf = _confidence(f, share, answers, confcol)
        use = lens if ex.lens == "norm" else f.eff_lens(share, norm=False)
        d = ex.decide(conf, use["entropy"], use["p_yes"], use["p_no"], answers=list(answers),
                      full_scores=None if ex.lens == "norm" else full)
        return ProblemDecision(plan, share, answers, correct, conf, bool(d.skipped),
                               None if d.skipped else np.asarray(d.exit_layer, np.int64),
                               int(d.selected), int(d.full_selected), bool(d.differs), np.asarray(plan.sigma),
                               bool(d.branch_differs))
    sel = int(np.argmax(full)) if f.B else -1
    conf = f.eff(share, "mean_prob")
    return ProblemDecision(plan, share, answers, correct, conf, False, None, sel, sel, False, np.asarray(plan.sigma))


def _confidence(f, share, answers, col: str) -> np.ndarray:
    if col == "mean_prob":
        return f.eff(share, "mean_prob")
    # Vote share of the answers the branches actually produce under this plan.
    a = np.asarray(answers)
    out = np.array([(a == x).sum() / len(a) if x != "" else 0.0 for x in a], dtype=np.float64)
    return out


def branch_score(f, dec: ProblemDecision, which: str) -> np.ndarray:
    """The branch score given to the block pool (RSBCM's omega numerator)."""
    if which == "mean_prob":
        return f.eff(dec.share, "mean_prob")
    if which == "vote_share":
        return _confidence(f, dec.share, dec.answers, "vote_share")
    return f.eff(dec.share, "verify_score")


def job_for(f, cfg: SimConfig, dec: ProblemDecision, L: int):
    ex = cfg.exit
    return build_job(f, dec.plan, dec.exit_layers, dec.skipped, L=L, bs=int(cfg.workload.block_size),
                     verify_reuses_kv=bool(cfg.workload.verify_reuses_kv), no_kv=cfg.no_kv,
                     l_min=getattr(ex, "l_min", None), score=branch_score(f, dec, cfg.workload.score),
                     static=cfg.workload.batching == "static")


def workload_key(cfg: SimConfig) -> tuple:
    """The workload options as a sorted tuple of ``(name, repr(value))``, computed once per config."""
    if cfg.workload_key is None:
        cfg.workload_key = cfg.workload.key()
    return cfg.workload_key


def freeze(d) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in (d or {}).items()))


def params_of_config(cfg: SimConfig) -> dict:
    out = {}
    for part in (cfg.sharing, cfg.exit, cfg.block, cfg.token):
        if part is not None and dataclasses.is_dataclass(part):
            out[part.name] = dataclasses.asdict(part)
    return out
