"""Fit the hardware profile's coefficients to measured phases (``rksim calibrate fit``).

The cost model (``sim.cost``) reduces every operation to terms
``(flops, bytes, kernels, layers)``; a hardware profile turns them into seconds::

    t = max(flops / (peak * eff_c), bytes / (bw * eff_m)) + kernels * per_kernel_s + layers * per_layer_s

``peak`` and ``bw`` stay at the base profile's values (datasheet numbers: only
their products with the efficiencies are identifiable); the fit finds
``eff_c``, ``eff_m``, ``per_kernel_s`` and ``per_layer_s`` minimising the
robust (soft-L1) sum of *relative* residuals ``(t_model - t_measured) / t_measured``
with :func:`scipy.optimize.least_squares` — relative, so that a 20 ms decode
step counts as much as a 7 s prefill. Efficiencies are fitted in log space
(always positive); the overheads are bounded below by 0.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.store import atomic_write_text
from scipy.optimize import least_squares

from sim import cost as C
from sim.profiles import HardwareProfile, ModelShape, PRESET_DIR, PresetError, load_hardware

FIT_PARAMS = ("eff_c", "eff_m", "per_kernel_s", "per_layer_s")
# Scale of the overhead parameters inside the optimiser (seconds -> microseconds).
_US = 1e-6


def phase_terms(m: ModelShape, phases: pd.DataFrame) -> np.ndarray:
    """``(4, N)`` terms [flops, bytes, kernels, layers] of every row of a phases table."""
    out = np.zeros((4, len(phases)))
    for j, row in enumerate(phases.itertuples(index=False)):
        kind = row.kind
        if kind == "forward":
            n = np.asarray(row.n, dtype=np.float64)
            if n.size == 0:
                raise ValueError(f"phases.parquet: row {j} ({row.phase}): forward with no items")
            lay = np.asarray(row.layers, dtype=np.float64)
            lay = np.where(lay < 0, m.n_layers, lay)
            t = C.batch_terms(m, n, np.asarray(row.c, dtype=np.float64), layers=lay,
                              probes=np.asarray(row.probes, dtype=np.float64),
                              logits=np.asarray(row.logits, dtype=np.float64))
        elif kind == "probe":
            t = C.probe_terms(m, row.cand)
        elif kind == "evict":
            t = C.eviction_scoring_terms(m, row.cand, row.window, n_layers=row.evict_layers)
        elif kind == "copy":
            t = C.kv_copy_terms(m, row.cand)
        else:
            raise ValueError(f"phases.parquet: row {j} ({row.phase}): kind {kind!r} has no cost-model terms")
        out[:, j] = t.as_array().reshape(4)
    return out


def predict(hw: HardwareProfile, terms: np.ndarray) -> np.ndarray:
    F, B, K, L = terms
    return np.maximum(F / (hw.peak_flops * hw.eff_c), B / (hw.mem_bw * hw.eff_m)) + K * hw.per_kernel_s + L * hw.per_layer_s


def _with(hw: HardwareProfile, x: np.ndarray) -> HardwareProfile:
    import dataclasses
    return dataclasses.replace(hw, eff_c=float(math.exp(x[0])), eff_m=float(math.exp(x[1])),
                               per_kernel_s=float(x[2] * _US), per_layer_s=float(x[3] * _US))


@dataclass
class FitResult:
    profile: HardwareProfile
    rel_rms: float            # root mean square of relative residuals
    rel_median_abs: float
    n: int
    cost: float
    success: bool
    message: str


def fit_profile(base: HardwareProfile, terms: np.ndarray, seconds: np.ndarray, loss: str = "soft_l1",
                f_scale: float = 0.05) -> FitResult:
    """Least-squares fit of ``eff_c, eff_m, per_kernel_s, per_layer_s`` (see module docstring)."""
    y = np.asarray(seconds, dtype=np.float64)
    if terms.shape != (4, y.size):
        raise ValueError(f"fit: terms shape {terms.shape} does not match {y.size} timings")
    if y.size < len(FIT_PARAMS):
        raise ValueError(f"fit: {y.size} measured phases; need at least {len(FIT_PARAMS)}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("fit: measured seconds must be finite and > 0")

    def resid(x):
        return (predict(_with(base, x), terms) - y) / y

    best = None
    # A few starts: the max() makes the objective piecewise; pick the best local optimum.
    for ec, em in ((1.0, 1.0), (0.1, 0.1), (0.01, 1.0), (1.0, 0.01), (0.3, 0.03)):
        x0 = np.array([math.log(ec), math.log(em), 1.0, 10.0])
        r = least_squares(resid, x0, bounds=([-20, -20, 0, 0], [5, 5, 1e6, 1e7]), loss=loss, f_scale=f_scale,
                          x_scale=[1.0, 1.0, 10.0, 100.0], method="trf", max_nfev=4000)
        if best is None or r.cost < best.cost:
            best = r
    prof = _with(base, best.x)
    rel = resid(best.x)
    return FitResult(profile=prof, rel_rms=float(np.sqrt(np.mean(rel ** 2))),
                     rel_median_abs=float(np.median(np.abs(rel))), n=int(y.size), cost=float(best.cost),
                     success=bool(best.success), message=str(best.message))


def fitted_range(model: ModelShape, phases: pd.DataFrame) -> dict:
    """The envelope of what was measured: a calibrated profile refuses queries beyond it."""
    fw = phases[phases["kind"] == "forward"]
    ctx = [int(n) + int(c) for ns, cs in zip(fw["n"], fw["c"]) for n, c in zip(ns, cs)]
    new = [int(n) for ns in fw["n"] for n in ns]
    return {"max_context_tokens": int(max(ctx)), "max_new_tokens": int(max(new)),
            "max_batch": int(max(len(ns) for ns in fw["n"])), "models": [model.name]}


def _yaml_dump(obj) -> str:
    import yaml
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None, width=100)


def write_preset(path: Path, res: FitResult, frange: dict, device: str, fitted_on: dict, notes: str) -> dict:
    p = res.profile
    data = {
        "name": p.name, "peak_flops": float(p.peak_flops), "mem_bw": float(p.mem_bw),
        "mem_capacity": float(p.mem_capacity), "eff_c": float(p.eff_c), "eff_m": float(p.eff_m),
        "per_kernel_s": float(p.per_kernel_s), "per_layer_s": float(p.per_layer_s),
        "calibrated": True, "provisional": False, "fitted_range": frange, "device": device,
        "fitted_on": fitted_on,
        "fit": {"method": "scipy.optimize.least_squares (trf, soft_l1 on relative residuals)",
                "params": list(FIT_PARAMS), "n_phases": res.n, "rel_rms": res.rel_rms,
                "rel_median_abs": res.rel_median_abs, "success": res.success},
        "notes": notes,
    }
    header = ("# Fitted by `rksim calibrate fit` (calibrate/fit.py) on measured phases; do not edit by hand.\n"
              "# peak_flops / mem_bw are the base profile's; eff_c, eff_m, per_kernel_s, per_layer_s are fitted.\n")
    atomic_write_text(path, header + _yaml_dump(data))
    load_hardware(str(path))  # what the simulator will read must load
    return data


def default_base(name: str) -> HardwareProfile:
    """The profile to start from: the existing preset of that name, else a generic CPU."""
    try:
        return load_hardware(name)
    except PresetError:
        return HardwareProfile(name=name, peak_flops=2.0e11, mem_bw=2.0e10, mem_capacity=16e9, source="default")


def split_problems(problems: list[int], holdout: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Seeded split into (fit, held-out); both non-empty when there are >= 2 problems and 0 < holdout < 1."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"--holdout: must be in [0, 1), got {holdout}")
    ps = sorted(int(p) for p in problems)
    if holdout == 0 or len(ps) < 2:
        return ps, []
    perm = np.random.default_rng(seed).permutation(len(ps))
    n_hold = min(len(ps) - 1, max(1, int(round(holdout * len(ps)))))
    hold = sorted(ps[i] for i in perm[:n_hold])
    return [p for p in ps if p not in hold], hold


def fit_run_dir(dir_: Path, name: str = "local-cpu", out: Path | None = None, holdout: float = 0.5,
                seed: int = 0) -> dict:
    """``rksim calibrate fit DIR``: fit on the fit split's phases and the op sweep; write the preset."""
    from sim.profiles import model_from_manifest

    dir_ = Path(dir_)
    for f in ("phases.parquet", "run.json"):
        if not (dir_ / f).is_file():
            raise FileNotFoundError(f"{dir_ / f}: missing (not a 'rksim calibrate run' directory)")
    run = json.loads((dir_ / "run.json").read_text())
    phases = pd.read_parquet(dir_ / "phases.parquet")
    fit_p, hold_p = split_problems(run["problems"], holdout, seed)
    use = phases[(phases["problem"] < 0) | phases["problem"].isin(fit_p)]
    use = use[use["kind"] != "host"]
    model = model_from_manifest({"model": run["model"]})
    terms = phase_terms(model, use)
    base = default_base(name)
    import dataclasses
    base = dataclasses.replace(base, name=name)
    res = fit_profile(base, terms, use["seconds"].to_numpy())
    frange = fitted_range(model, use)
    path = Path(out) if out else PRESET_DIR / "hardware" / f"{name}.yaml"
    notes = (f"fitted on {len(use)} phases of {run['model']['name']} ({run['model']['dtype']}) on "
             f"{run['device']} with {run.get('threads')} threads; fit problems {fit_p}, held out {hold_p}")
    write_preset(path, res, frange, device=run["device"],
                 fitted_on={"run": str(dir_.resolve()), "created": run.get("created"),
                            "model": run["model"]["name"], "dtype": run["model"]["dtype"],
                            "threads": run.get("threads")}, notes=notes)
    info = {"preset": str(path.resolve()), "path": str(path), "name": name, "fit_problems": fit_p,
            "holdout_problems": hold_p, "n_phases": res.n, "rel_rms": res.rel_rms,
            "rel_median_abs": res.rel_median_abs, "fitted_range": frange,
            "coefficients": {k: getattr(res.profile, k) for k in FIT_PARAMS},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    atomic_write_text(dir_ / "fit.json", json.dumps(info, indent=2) + "\n")
    return {**info, "n_fit_problems": len(fit_p)}
