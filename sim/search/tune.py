"""Threshold tuning with a held-out split: grid search, then scipy refinement, judged on unseen problems.

Procedure (``rksim tune``)
--------------------------
1. **Split.** The trace's problems are permuted with
   ``numpy.random.default_rng(seed)`` and cut into a *tune* split
   (``round(split * n)`` problems, at least one) and a disjoint *held-out*
   split (the rest, at least one); both are passed to ``evaluate`` as
   ``problems=``. The same seed always gives the same split.
2. **Grid search** on the tune split over ``--grid`` (or the policy's
   default grid, :data:`DEFAULT_GRIDS`).
3. **Refinement** on the tune split: ``scipy.optimize.differential_evolution``
   (seeded, no polishing — the metrics are step functions of the thresholds
   over a finite set of problems, so gradient polishing has nothing to follow)
   over the grid's numeric keys inside the grid's box (min..max of each key;
   integer keys stay integers via ``integrality``), every other key fixed at
   the grid winner's value, started from the grid winner (``x0``). Values are
   rounded to 6 significant digits before evaluation so that the chosen
   thresholds print and reproduce exactly. A refined point replaces the grid
   winner only if it is strictly better on the tune split.
   Refinement is off by default for token-eviction policies (``vase-*``...):
   each of their evaluations replays every long decode (seconds, not
   milliseconds), and the problem split does not divide long decodes, so
   their "held-out" row is the same sequences (the result notes both).
4. **Report** the chosen values and the metrics of both splits; the held-out
   numbers are the honest ones (nothing was chosen on them).

Objective and constraints
-------------------------
The objective is any metric ``evaluate`` returns; it is maximised unless its
name marks it as a cost (:func:`sim.search.pareto.default_minimise`: errors,
latencies, bytes...) or ``direction`` says otherwise. Constraints enter as
penalties — a configuration is *feasible* when its violation is 0:

* ``max_cgee_error = E``: ``cgee_error_rate <= E`` (problems whose selected
  *answer* differs from full-depth verification's, DESIGN §4; the branch-level
  ``cgee_branch_disagreement_rate`` is reported, not constrained). A policy
  that does not exit early (metric NaN/None) induces no CGEE error and satisfies it.
* ``max_accuracy_drop = X``: ``accuracy >= accuracy(no-kv) - X`` on the same
  split, where ``no-kv`` (full recompute, full-depth verification of every
  branch) is the reference that changes no decision.

The winner is the feasible configuration with the best objective (ties: the
first in grid order); if none is feasible, the least-violating one, and the
result says ``feasible: false``.

``conservative`` reads each constraint at the far end of its 95% interval
instead of the point estimate (:mod:`sim.replay.intervals`): ``cgee_error_rate``
at its Wilson upper bound and ``accuracy`` at its Wilson lower bound (the
no-kv reference stays a point). With few problems this is strict: 0 errors
of 4 problems has a Wilson upper bound of 0.49, so ``max_cgee_error = 0.01``
is met only by configurations that induce no error on many problems.

After the choice, the held-out split is checked against the same
constraints (point estimates); a break is reported in ``held_out_breaks``
(one line per constraint), which ``rksim tune`` prints as a warning.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from sim.search.grid import Grid, config_id, parse_grids
from sim.replay.intervals import wilson_of_rate
from sim.search.pareto import default_minimise
from sim.search.sweep import SweepOptions, default_evaluate, run_sweep

# Default grids per policy (values as --grid strings; "{L}" stands for the trace's layer count).
# Chosen from the parameters' meaning (docs/policies.md) and the papers' settings; see docs/sweeps.md.
DEFAULT_GRIDS: dict[str, list[str]] = {
    "asks": ["tau=0.5:1.0:0.02", "alpha=0,0.5,1,2,4"],
    "cgee": ["tau_conf=0.5:1.0:0.1", "delta_rel=0:0.5:0.1", "theta=0,0.25,0.5,1,2",
             "eps=0.02,0.05,0.1,0.2", "l_min={L/4},{L/2},{3L/4}"],
    "vase-attnv": ["budget=64,128,256", "n_value=0,8,16,32", "temperature=0.5,1,2"],
    "vase-dkv": ["budget=64,128,256", "n_value=0,8,16,32", "temperature=0.5,1,2"],
}

PENALTY = 1e6  # weight of a constraint violation in the refinement's objective


@dataclass
class TuneSpec:
    """What to optimise and under which constraints (see module doc)."""

    objective: str = "speedup_vs_no_kv"
    direction: str | None = None  # "max" | "min"; None = from the metric's name
    max_cgee_error: float | None = None
    max_accuracy_drop: float | None = None
    split: float = 0.5
    seed: int = 0
    refine: bool | None = None  # None: on, except for token-eviction policies (see module doc)
    refine_maxiter: int = 20
    refine_popsize: int = 8
    conservative: bool = False  # constraints at their 95% interval's far end (module doc)

    def __post_init__(self):
        if self.direction not in (None, "max", "min"):
            raise ValueError(f"--direction: {self.direction!r} is not one of max, min")
        if not (0.0 < self.split < 1.0):
            raise ValueError(f"--split {self.split}: must be strictly between 0 and 1")
        for name in ("max_cgee_error", "max_accuracy_drop"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise ValueError(f"--{name.replace('_', '-')} {v}: must be a number >= 0")
        if self.refine_maxiter < 1 or self.refine_popsize < 1:
            raise ValueError("--refine-iters / popsize must be >= 1")

    @property
    def maximize(self) -> bool:
        if self.direction is None:
            return not default_minimise(self.objective)
        return self.direction == "max"


def split_problems(n: int, frac: float = 0.5, seed: int = 0) -> tuple[list[int], list[int]]:
    """Seeded disjoint split of problem indices ``0..n-1`` into (tune, held-out), each sorted."""
    if not (0.0 < frac < 1.0):
        raise ValueError(f"--split {frac}: must be strictly between 0 and 1")
    if n < 2:
        raise ValueError(f"--split: the trace has {n} problem(s); a held-out split needs at least 2")
    perm = np.random.default_rng(seed).permutation(n)
    k = min(max(int(round(frac * n)), 1), n - 1)
    return sorted(int(i) for i in perm[:k]), sorted(int(i) for i in perm[k:])


def default_grid(policy: str, n_layers: int) -> Grid:
    """The default grid of ``policy`` for a model of ``n_layers`` (``--grid`` omitted)."""
    if policy not in DEFAULT_GRIDS:
        raise ValueError(f"--grid: policy {policy!r} has no default grid (defaults exist for "
                         f"{', '.join(DEFAULT_GRIDS)}); give --grid key=... flags")
    L = int(n_layers)
    subs = {"{L/4}": str(max(1, round(L / 4))), "{L/2}": str(max(1, round(L / 2))),
            "{3L/4}": str(max(1, round(3 * L / 4)))}
    args = []
    for text in DEFAULT_GRIDS[policy]:
        for k, v in subs.items():
            text = text.replace(k, v)
        key, vals = text.split("=", 1)
        # de-duplicate l_min values that coincide on a very shallow model
        if key == "l_min":
            vals = ",".join(dict.fromkeys(vals.split(",")))
        args.append(f"{key}={vals}")
    return parse_grids(args)


@dataclass
class TuneResult:
    policy: str
    spec: TuneSpec
    tune_problems: list[int]
    held_problems: list[int]
    params: dict[str, Any]
    source: str  # "grid" | "refined"
    feasible: bool
    tune: dict[str, Any]
    held: dict[str, Any]
    baseline_tune: dict[str, Any]
    baseline_held: dict[str, Any]
    grid_size: int
    n_evaluations: int
    grid_best: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refinement_ran: bool = False
    held_out_breaks: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "objective": self.spec.objective,
            "maximize": self.spec.maximize,
            "constraints": {"max_cgee_error": self.spec.max_cgee_error,
                            "max_accuracy_drop": self.spec.max_accuracy_drop,
                            "conservative": self.spec.conservative},
            "seed": self.spec.seed,
            "split": {"tune": self.tune_problems, "held_out": self.held_problems},
            "chosen": {"params": self.params, "config_id": config_id(self.params),
                       "source": self.source, "feasible": self.feasible},
            "grid_best": self.grid_best,
            "metrics": {"tune": self.tune, "held_out": self.held},
            "baseline_no_kv": {"tune": self.baseline_tune, "held_out": self.baseline_held},
            "grid_size": self.grid_size,
            "n_evaluations": self.n_evaluations,
            "notes": self.notes,
            "refinement_ran": self.refinement_ran,
            "held_out_breaks": self.held_out_breaks,
        }

    def table(self) -> pd.DataFrame:
        """Both splits' metrics, one row each, objective and constraint metrics first."""
        keys = [self.spec.objective]
        if self.spec.max_cgee_error is not None:
            keys.append("cgee_error_rate")
        keys += ["accuracy"]
        for k in ("speedup_vs_no_kv", "speedup_vs_exact_prefix", "latency_mean_s", "kv_reuse",
                  "skip_rate", "mean_exit_layer", "cgee_error_rate", "cgee_branch_disagreement_rate",
                  "attn_output_rel_error",
                  "attn_mass_recall"):
            if k not in keys and k in self.tune:
                keys.append(k)
        rows = {}
        for name, m, base, probs in (("tune", self.tune, self.baseline_tune, self.tune_problems),
                                     ("held-out", self.held, self.baseline_held, self.held_problems)):
            row = {"problems": len(probs)}
            row.update({k: m.get(k) for k in keys})
            row["accuracy_no_kv"] = base.get("accuracy")
            rows[name] = row
        df = pd.DataFrame.from_dict(rows, orient="index")
        df = df.astype(object).where(df.notna(), np.nan).infer_objects()  # None -> NaN
        # metrics that do not apply to this policy (NaN on both splits) are left out
        keep = [c for c in df.columns if c == self.spec.objective or not df[c].isna().all()]
        return df[keep]


def _num(v) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _bound(m: dict, key: str, end: int, conservative: bool) -> float:
    """``m[key]``, or (``conservative``) the end ``end`` (0 lower, 1 upper) of its Wilson interval over ``n_problems``."""
    v = _num(m.get(key))
    if not conservative or math.isnan(v):
        return v
    ci = wilson_of_rate(v, m.get("n_problems"))
    if ci is None:
        raise ValueError(f"--conservative: the metrics give no n_problems to bound {key} with")
    return float(ci[end])


def violation(m: dict, spec: TuneSpec, baseline_accuracy: float, conservative: bool | None = None) -> float:
    """Total amount by which ``m`` breaks the constraints (0 = feasible); ``conservative`` (default the
    spec's): the error rate at its Wilson upper bound, the accuracy at its lower bound."""
    cons = spec.conservative if conservative is None else conservative
    v = 0.0
    if spec.max_cgee_error is not None:
        e = _bound(m, "cgee_error_rate", 1, cons)
        if not math.isnan(e):
            v += max(0.0, e - spec.max_cgee_error)
    if spec.max_accuracy_drop is not None:
        acc = _bound(m, "accuracy", 0, cons)
        if math.isnan(acc) or math.isnan(baseline_accuracy):
            v += 1.0  # cannot show the constraint holds
        else:
            v += max(0.0, (baseline_accuracy - acc) - spec.max_accuracy_drop)
    return v


def held_out_breaks(tune_m: dict, held_m: dict, spec: TuneSpec, acc_tune: float, acc_held: float,
                    n_tune: int, n_held: int) -> list[str]:
    """One line per constraint the held-out split breaks (point estimates), naming both splits' figures."""
    out = []
    if spec.max_cgee_error is not None:
        e = _num(held_m.get("cgee_error_rate"))
        if not math.isnan(e) and e > spec.max_cgee_error:
            out.append(f"held-out cgee_error_rate {e:.4g} on {n_held} problems breaks --max-cgee-error "
                       f"{spec.max_cgee_error:g} (tuned to {_num(tune_m.get('cgee_error_rate')):.4g} on {n_tune} "
                       f"tuning problems{'' if spec.conservative else '; --conservative tunes on the Wilson upper bound'})")
    if spec.max_accuracy_drop is not None:
        a = _num(held_m.get("accuracy"))
        if not math.isnan(a) and not math.isnan(acc_held) and (acc_held - a) > spec.max_accuracy_drop:
            out.append(f"held-out accuracy {a:.4g} is {acc_held - a:.4g} below no-kv's {acc_held:.4g} on {n_held} "
                       f"problems, breaking --max-accuracy-drop {spec.max_accuracy_drop:g} (tuning split: "
                       f"{_num(tune_m.get('accuracy')):.4g} against {acc_tune:.4g})")
    return out


def score(m: dict, spec: TuneSpec) -> float:
    """Objective oriented so that larger is better; NaN -> -inf."""
    if spec.objective not in m:
        raise ValueError(f"--objective {spec.objective!r}: evaluate returns no such metric "
                         f"(metrics: {', '.join(sorted(m))})")
    s = _num(m[spec.objective])
    if math.isnan(s):
        return -math.inf
    return s if spec.maximize else -s


def _round6(v: float) -> float:
    return float(f"{v:.6g}")


def tune(trace, policy: str, spec: TuneSpec, grid: Grid | None = None,
         options: SweepOptions | None = None, *, evaluate: Callable | None = None,
         n_problems: int | None = None, n_layers: int | None = None, backend: str = "local",
         workers: int | None = None, scheduler: str | None = None, progress: bool = True,
         validate: bool = True) -> TuneResult:
    """Tune ``policy`` on one split, report on the other (see module doc).

    ``grid=None`` uses :func:`default_grid`; ``n_problems``/``n_layers`` are read
    from the trace when not given. Runs with one BLAS thread
    (:func:`sim.search.sweep.single_thread_blas`), like every sweep.
    """
    from sim.search.sweep import single_thread_blas

    with single_thread_blas():
        return _tune(trace, policy, spec, grid, options, evaluate=evaluate, n_problems=n_problems,
                     n_layers=n_layers, backend=backend, workers=workers, scheduler=scheduler,
                     progress=progress, validate=validate)


def _tune(trace, policy: str, spec: TuneSpec, grid: Grid | None = None,
         options: SweepOptions | None = None, *, evaluate: Callable | None = None,
         n_problems: int | None = None, n_layers: int | None = None, backend: str = "local",
         workers: int | None = None, scheduler: str | None = None, progress: bool = True,
         validate: bool = True) -> TuneResult:
    import os

    from sim.search.sweep import open_session

    evaluate = evaluate or default_evaluate()
    options = options or SweepOptions()
    trace = os.fspath(trace)
    n_problems, n_layers = _trace_sizes(trace, n_problems, n_layers, need_layers=grid is None)
    if grid is None:
        grid = default_grid(policy, n_layers)
    configs = list(grid.configs())
    if validate:
        from sim.search.sweep import validate_params

        validate_params(policy, configs)
    tune_idx, held_idx = split_problems(n_problems, spec.split, spec.seed)
    notes: list[str] = []
    refine = _refine_default(policy, spec.refine, notes)
    base_opts = dataclasses.asdict(options)
    opts_tune = SweepOptions(**{**base_opts, "problems": tuple(tune_idx)})
    opts_held = SweepOptions(**{**base_opts, "problems": tuple(held_idx)})
    session = open_session(trace)  # the tuning's own: every evaluation reuses its memo tables

    def ev(params: dict, opts: SweepOptions, pol: str = policy) -> dict:
        return dict(evaluate(session, policy=pol, params=dict(params), **opts.kwargs()))

    base_tune = ev({}, opts_tune, "no-kv")
    base_held = ev({}, opts_held, "no-kv")
    acc_tune = _num(base_tune.get("accuracy"))
    _check_objective(spec, base_tune)  # before the sweep: every policy reports the same keys

    df = run_sweep(trace, policy, configs, opts_tune, evaluate=evaluate, backend=backend,
                   workers=workers, scheduler=scheduler, progress=progress)
    metric_cols = [c for c in df.columns if c not in ("config_id", "policy") and not c.startswith("param.")]
    rows = df[metric_cols].to_dict("records")
    _check_objective(spec, metric_cols)
    best = _grid_pick(rows, spec, acc_tune)
    best_params = configs[best.index]
    grid_best = {"params": best_params, "config_id": config_id(best_params), "score": best.score,
                 "feasible": best.violation == 0}
    best_m, best_v, best_s = rows[best.index], best.violation, best.score
    source = "grid"
    n_eval = len(configs) + 2

    numeric = [k for k, vals in grid.axes.items()
               if len(vals) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)]
    refinement_ran = bool(refine and numeric)
    if refinement_ran:
        n_refined, (p, m, v, s) = _refine(lambda q: ev(q, opts_tune), best_params, grid, numeric, spec,
                                          acc_tune, policy, progress)
        n_eval += n_refined
        if v < best_v or (v == best_v and s > best_s):
            best_params, best_m, best_v, best_s = p, m, v, s
            source = "refined"

    held = ev(best_params, opts_held)
    n_eval += 1
    breaks = held_out_breaks(best_m, held, spec, acc_tune, _num(base_held.get("accuracy")), len(tune_idx),
                             len(held_idx))
    return TuneResult(policy=policy, spec=spec, tune_problems=tune_idx, held_problems=held_idx,
                      params=best_params, source=source, feasible=best_v == 0, tune=best_m, held=held,
                      baseline_tune=base_tune, baseline_held=base_held, grid_size=len(configs),
                      n_evaluations=n_eval, grid_best=grid_best, notes=notes,
                      refinement_ran=refinement_ran, held_out_breaks=breaks)


def _trace_sizes(trace: str, n_problems: int | None, n_layers: int | None,
                 need_layers: bool) -> tuple[int | None, int | None]:
    """``n_problems`` and ``n_layers`` as given, read from the trace where missing (and needed)."""
    if n_problems is None or (need_layers and n_layers is None):
        from traces.store import load_trace

        tr = load_trace(trace, verify=False)
        n_problems = len(tr.problems) if n_problems is None else n_problems
        n_layers = tr.n_layers if n_layers is None else n_layers
    return n_problems, n_layers


def _refine_default(policy: str, refine: bool | None, notes: list[str]) -> bool:
    """Whether to refine: ``spec.refine`` where set; off for token-eviction policies (noted), else on."""
    from policies import policy_class

    if policy_class(policy).kind == "token":
        notes.append("token-eviction policies are judged on the trace's long decodes, which the problem "
                     "split does not divide: both rows use the same sequences (no held-out check)")
        if refine is None:
            refine = False  # each evaluation replays every long decode: seconds, not milliseconds
            notes.append("refinement off by default for token-eviction policies (pass --refine to force it)")
    return True if refine is None else refine


def _check_objective(spec: TuneSpec, metrics) -> None:
    if spec.objective not in metrics:
        raise ValueError(f"--objective {spec.objective!r}: evaluate returns no such metric "
                         f"(metrics: {', '.join(sorted(metrics))})")


@dataclass(frozen=True)
class _Pick:
    index: int
    violation: float
    score: float


def _grid_pick(rows: list[dict], spec: TuneSpec, acc_tune: float) -> _Pick:
    """The grid's best row: feasible with the highest score (first on ties); else least violation, then score."""
    viol = np.array([violation(r, spec, acc_tune) for r in rows])
    scores = np.array([score(r, spec) for r in rows])
    if (viol == 0).any():
        cand = np.flatnonzero(viol == 0)
        best = int(cand[np.argmax(scores[cand])])
    else:
        best = int(np.lexsort((-scores, viol))[0])
    return _Pick(best, float(viol[best]), float(scores[best]))


def _refine(ev: Callable[[dict], dict], start: dict, grid: Grid, numeric: list[str], spec: TuneSpec,
            acc_tune: float, policy: str, progress: bool) -> tuple[int, tuple[dict, dict, float, float]]:
    """Differential evolution over the grid's numeric axes, from the grid's best ``start``.

    Minimises ``PENALTY * violation - score``; every distinct config is evaluated once.
    Returns (evaluations, (params, metrics, violation, score) at the optimiser's answer).
    """
    from scipy.optimize import differential_evolution
    from tqdm.auto import tqdm

    is_int = [all(isinstance(v, int) for v in grid.axes[k]) for k in numeric]
    bounds = [(min(grid.axes[k]), max(grid.axes[k])) for k in numeric]
    cache: dict[str, tuple[float, float, dict]] = {}
    bar = tqdm(desc=f"refine {policy}", unit="eval", disable=not progress, mininterval=0.5)

    def params_at(x) -> dict:
        p = dict(start)
        for k, xi, integer in zip(numeric, x, is_int):
            p[k] = int(round(xi)) if integer else _round6(float(xi))
        return p

    def f(x) -> float:
        p = params_at(x)
        cid = config_id(p)
        if cid not in cache:
            m = ev(p)
            cache[cid] = (violation(m, spec, acc_tune), score(m, spec), m)
            bar.update(1)
        v, s, _ = cache[cid]
        return PENALTY * v - (s if math.isfinite(s) else -PENALTY)

    x0 = [float(start[k]) for k in numeric]
    try:
        res = differential_evolution(f, bounds, x0=x0, seed=spec.seed, maxiter=spec.refine_maxiter,
                                     popsize=spec.refine_popsize, tol=0, polish=False,
                                     integrality=is_int, init="latinhypercube", updating="immediate")
    finally:
        bar.close()
    p = params_at(res.x)
    f(res.x)  # res.x was evaluated already (no polishing); this is a cache hit
    v, s, m = cache[config_id(p)]
    return len(cache), (p, m, v, s)
