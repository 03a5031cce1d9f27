"""Fit the hardware profile's coefficients to measured phases (``rksim calibrate fit``).

The cost model (``sim.cost.terms``) reduces every operation to terms (flops, bytes,
kernels, layers, sampled vocabulary entries, forward calls, the operator
groups); a hardware profile turns them into seconds
(:meth:`sim.cost.hardware.HardwareProfile.time`)::

    t = roof + kernels * per_kernel_s + layers * per_layer_s
          + samples * sample_s_per_vocab + iters * host_per_iter_s [+ graph_kernels * per_kernel_graph_s]

with ``roof`` the whole-iteration roofline ``max(flops / (peak eff_c), bytes / (bw eff_m))``
(weights of a one-token-row forward at ``bw eff_mv``)
or the per-operator one (sum over operators of the same max, plus element-wise
traffic). ``peak`` and ``bw`` stay at the base profile's values (datasheet
numbers: only their products with the efficiencies are identifiable); the fit
finds ``eff_c``, ``eff_m``, ``per_kernel_s``, ``per_layer_s``,
``sample_s_per_vocab``, ``host_per_iter_s`` (and ``per_kernel_graph_s`` where a
phase replayed a CUDA graph, ``eff_mv`` where a forward had a single token row,
the matrix-vector regime of :mod:`sim.cost.terms`, and ``eff_att`` / ``eff_kv``, attention's
own compute and KV-traffic efficiencies, where a phase ran attention) minimising the robust (soft-L1) sum of *relative*
residuals ``(t_model - t_measured) / t_measured`` with
:func:`scipy.optimize.least_squares` — relative, so that a 20 ms decode step
counts as much as a 7 s prefill. Efficiencies are fitted in log space (always
positive); the other coefficients are bounded below by 0. A coefficient whose
term no fitted phase exercises stays at the base profile's value and is
reported as not fitted.

Both rooflines are fitted (``roofline="auto"``) and the one with the lower
robust loss on the fit phases is kept; both residuals are reported.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from traces.store import atomic_write_text
from scipy.optimize import least_squares

from sim.cost import terms as C
from sim.cost.roofline import ROOFLINES
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import ModelShape
from sim.cost.profiles import PRESET_DIR, load_hardware
from sim.base.errors import PresetError

# (parameter, term it multiplies, optimiser scale in seconds); eff_c / eff_m are the roofline's.
_LINEAR = (("per_kernel_s", "kernels", 1e-6), ("per_layer_s", "layers", 1e-6),
           ("sample_s_per_vocab", "samples", 1e-9), ("host_per_iter_s", "iters", 1e-6),
           ("per_kernel_graph_s", "graph_kernels", 1e-6))
# The small-M GEMM path (sim.cost.terms, "Row blocking"): candidate rows per weight pass and largest small-M
# row count, searched on a grid (each a least-squares fit of the coefficients with them fixed)
ROW_BLOCKS = (2, 3, 4, 6, 8)
SMALL_M_MAX = (7, 11, 15, 23, 31, 63, None)
ROW_TERM_GAIN = 0.9   # kept only if it lowers the robust loss by 10% or more
# eff_mv: the matrix-vector regime's efficiency (weights of one-token-row forwards), fitted in log space
# like the roofline's where a phase has one token row; else it stays at the base profile's (None: eff_m)
# eff_att / eff_kv: attention's own compute and KV-traffic efficiencies, fitted (log space) where
# some phase runs attention; else None (= eff_c / eff_m)
# eff_kv_shared: KV re-read from blocks another item of the iteration read (sim.cost.terms, "Shared KV reads"),
# fitted where some phase has such reads; else None (= eff_kv)
# eff_elem: the element-wise operators' (norms, RoPE, SiLU*mul, adds: sum_i n_i l_i tokens through them), charged
# by the per-operator roofline only, so fitted only there, where some phase has element-wise work (eager CPU
# runs them as separate kernels: a per-token-row cost outside the GEMMs' max)
_LOG_OPTIONAL = ("eff_mv", "eff_att", "eff_kv", "eff_kv_shared", "eff_elem")
FIT_PARAMS = ("eff_c", "eff_m") + _LOG_OPTIONAL + tuple(p for p, _, _ in _LINEAR) + ("gemm_row_block",
                                                                                    "gemm_small_m_max")
_IDX = {k: i for i, k in enumerate(C.TERM_NAMES)}
# decode phases sample every row once per step (runs recorded before the `sampled` column)
_SAMPLING_PHASES = ("decode",)


def phase_terms(m: ModelShape, phases: pd.DataFrame) -> np.ndarray:
    """``(len(sim.cost.terms.TERM_NAMES), N)`` terms of every row of a phases table.

    Rows sampled: the ``sampled`` column, or for runs recorded before it, one per decode row.
    """
    out = np.zeros((len(C.TERM_NAMES), len(phases)))
    has_sampled = "sampled" in phases.columns
    for j, row in enumerate(phases.itertuples(index=False)):
        kind = row.kind
        if kind == "forward":
            n = np.asarray(row.n, dtype=np.float64)
            if n.size == 0:
                raise ValueError(f"phases.parquet: row {j} ({row.phase}): forward with no items")
            lay = np.asarray(row.layers, dtype=np.float64)
            lay = np.where(lay < 0, m.n_layers, lay)
            k = int(row.sampled) if has_sampled and not pd.isna(row.sampled) else (
                n.size if row.phase in _SAMPLING_PHASES else 0)
            samp = np.zeros(n.size)
            samp[:min(k, n.size)] = 1.0
            h = getattr(row, "shared", None)
            h = np.asarray(h, dtype=np.float64) if h is not None and len(h) == n.size else 0.0
            t = C.batch_terms(m, n, np.asarray(row.c, dtype=np.float64), layers=lay,
                              probes=np.asarray(row.probes, dtype=np.float64),
                              logits=np.asarray(row.logits, dtype=np.float64), sampled=samp, shared=h)
        elif kind == "probe":
            t = C.probe_terms(m, row.cand)
        elif kind == "evict":
            t = C.eviction_scoring_terms(m, row.cand, row.window, n_layers=row.evict_layers)
        elif kind == "copy":
            t = C.kv_copy_terms(m, row.cand)
        else:
            raise ValueError(f"phases.parquet: row {j} ({row.phase}): kind {kind!r} has no cost-model terms")
        out[:, j] = t.as_full_array().reshape(len(C.TERM_NAMES))
    return out


def _full(terms: np.ndarray) -> np.ndarray:
    """Pad a ``(4, N)`` [flops, bytes, kernels, layers] array to every term (the rest 0)."""
    terms = np.asarray(terms, dtype=np.float64)
    if terms.shape[0] == len(C.TERM_NAMES):
        return terms
    out = np.zeros((len(C.TERM_NAMES),) + terms.shape[1:])
    out[:terms.shape[0]] = terms
    return out


def predict(hw: HardwareProfile, terms: np.ndarray, roofline: str | None = None) -> np.ndarray:
    """Seconds of every column of ``terms`` (``phase_terms``'s array) under ``hw``."""
    return np.asarray(hw.time(C.OpTerms.from_array(_full(terms)), roofline=roofline), dtype=np.float64)


def _log_params(free: list[str]) -> list[str]:
    """Parameters in log space at the front of x: eff_c, eff_m and, where fitted, eff_mv, eff_att, eff_kv."""
    return ["eff_c", "eff_m"] + [p for p in _LOG_OPTIONAL if p in free]


def _with(hw: HardwareProfile, x: np.ndarray, free: list[str], roofline: str) -> HardwareProfile:
    logp = _log_params(free)
    kw = {p: float(math.exp(x[i])) for i, p in enumerate(logp)}
    kw["roofline"] = roofline
    nl = len(logp)
    scale = {p: sc for p, _, sc in _LINEAR}
    for i, p in enumerate(q for q in free if q not in _LOG_OPTIONAL):
        kw[p] = float(x[nl + i] * scale[p])
    return dataclasses.replace(hw, **kw)


@dataclass
class FitResult:
    profile: HardwareProfile
    rel_rms: float            # root mean square of relative residuals
    rel_median_abs: float
    n: int
    cost: float
    success: bool
    message: str
    roofline: str = "iteration"
    fitted: list = field(default_factory=list)          # coefficients the data identified
    by_roofline: dict = field(default_factory=dict)     # roofline -> {rel_rms, rel_median_abs, cost}
    residuals: np.ndarray | None = None
    row_blocks: dict | None = None    # the row-block grid's choice (None: the term did not pay)


def _start_from(x: np.ndarray, free: list[str], free_r: list[str]) -> np.ndarray:
    """``x`` (parameters ``free``) laid out for ``free_r`` (a superset); a parameter ``x`` lacks starts at
    eff_m's value (eff_mv: the matrix-vector rate starts at the matrix rate)."""
    logp, logr = _log_params(free), _log_params(free_r)
    val = dict(zip(logp, x[:len(logp)]))
    lin = dict(zip([q for q in free if q not in _LOG_OPTIONAL], x[len(logp):]))
    return np.array([val.get(p, val["eff_m"]) for p in logr]
                    + [lin.get(q, 1.0) for q in free_r if q not in _LOG_OPTIONAL])


def _fit_one(base, A, y, roofline, loss, f_scale, free, x0=None, starts: int = 5):
    def resid(x):
        return (predict(_with(base, x, free, roofline), A) - y) / y

    best = None
    logp = _log_params(free)
    nl = len(logp)
    nlin = len(free) - (nl - 2)
    if x0 is not None:   # one start (the row-block grid starts from the fit without the term)
        r = least_squares(resid, x0, bounds=([-20] * nl + [0] * nlin, [5] * nl + [1e7] * nlin),
                          loss=loss, f_scale=f_scale, x_scale=[1.0] * nl + [10.0] * nlin, method="trf",
                          max_nfev=2000)
        return r, resid(r.x)
    logp = _log_params(free)
    nl = len(logp)
    nlin = len(free) - (nl - 2)
    # A few starts: the max() makes the objective piecewise; pick the best local optimum.
    for ec, em in ((1.0, 1.0), (0.1, 0.1), (0.01, 1.0), (1.0, 0.01), (0.3, 0.03))[:starts]:
        start = {"eff_c": ec, "eff_m": em, "eff_mv": em, "eff_att": ec, "eff_kv": em, "eff_kv_shared": em,
                 "eff_elem": em}
        x0 = np.array([math.log(start[p]) for p in logp] + [1.0] * nlin)
        r = least_squares(resid, x0, bounds=([-20] * nl + [0] * nlin, [5] * nl + [1e7] * nlin),
                          loss=loss, f_scale=f_scale, x_scale=[1.0] * nl + [10.0] * nlin, method="trf",
                          max_nfev=4000)
        if best is None or r.cost < best.cost:
            best = r
    return best, resid(best.x)


def fit_profile(base: HardwareProfile, terms: np.ndarray, seconds: np.ndarray, loss: str = "soft_l1",
                f_scale: float = 0.05, roofline: str = "auto", attention: bool = True,
                row_blocks: bool = True) -> FitResult:
    """Least-squares fit of the coefficients (see module docstring).

    ``roofline``: ``"iteration"``, ``"operator"``, or ``"auto"`` (fit both, keep the lower
    robust loss; ``FitResult.by_roofline`` has both residuals). ``attention``: fit the
    attention operator's own efficiencies ``eff_att`` and ``eff_kv`` where some phase runs
    attention (False: they stay at the base profile's, None = ``eff_c`` / ``eff_m``).
    """
    y = np.asarray(seconds, dtype=np.float64)
    A = _full(terms)
    # the row-block term and eff_elem are the fit's own choices (below): a base profile's (e.g. the preset being
    # re-fitted) must not price the fit without them, or a re-fit would depend on the file it replaces; wave
    # quantisation (sm_count) needs matrix shapes the phase terms do not carry: the fit prices without it
    base = dataclasses.replace(base, gemm_row_block=None, gemm_small_m_max=None, eff_elem=None, sm_count=None)
    if A.ndim != 2 or A.shape[1] != y.size:
        raise ValueError(f"fit: terms shape {np.shape(terms)} does not match {y.size} timings")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("fit: measured seconds must be finite and > 0")
    # A coefficient is fitted only if some phase exercises its term and it is not the same
    # column as another's (a CUDA graph's kernels are fitted only where a phase replayed one).
    free = ((["eff_mv"] if np.any(A[_IDX["b_lin_mv"]] > 0) else [])
            + (["eff_att", "eff_kv"] if attention and np.any(A[_IDX["f_att"]] > 0) else [])
            + (["eff_kv_shared"] if attention and np.any(A[_IDX["b_kv_shared"]] > 0) else [])
            + [p for p, t, _ in _LINEAR if np.any(A[_IDX[t]] > 0)])
    if y.size < 2 + len(free):
        raise ValueError(f"fit: {y.size} measured phases; need at least {2 + len(free)}")
    modes = ROOFLINES if roofline == "auto" else (roofline,)
    for md in modes:
        if md not in ROOFLINES:
            raise ValueError(f"--roofline: {md!r} is not one of auto, {', '.join(ROOFLINES)}")
    grid_ok = row_blocks and np.any(A[_IDX["rows"]] >= 2) and len(np.unique(A[_IDX["rows"]])) >= 4
    fits, cands = {}, {}
    for md in modes:
        # eff_elem prices b_elem, which only the per-operator roofline charges
        fr = free + (["eff_elem"] if md == "operator" and np.any(A[_IDX["b_elem"]] > 0) else [])
        if y.size < 2 + len(fr):
            fr = free
        r, rel = _fit_one(base, A, y, md, loss, f_scale, fr)
        fits[md] = (r, rel)
        cand = (r, rel, fr, _with(base, r.x, fr, md), None)
        if grid_ok:
            # the small-M GEMM path (sim.cost.terms): grid over (mr, m_small); eff_mv prices its weight passes
            free_r = fr if "eff_mv" in fr else ["eff_mv"] + fr
            x0 = _start_from(r.x, fr, free_r)
            grid = []
            for mr in ROW_BLOCKS:
                for mmax in SMALL_M_MAX:
                    if mmax is not None and mmax <= mr:
                        continue
                    b = dataclasses.replace(base, gemm_row_block=mr, gemm_small_m_max=mmax)
                    # warm (the fit without the term) and one cold start: the grid is 30 fits per roofline
                    rg, rr = _fit_one(b, A, y, md, loss, f_scale, free_r, x0=x0)
                    rc_, rrc = _fit_one(b, A, y, md, loss, f_scale, free_r, starts=1)
                    if rc_.cost < rg.cost:
                        rg, rr = rc_, rrc
                    grid.append((rg.cost, mr, mmax, rg, rr, b))
            cost_r, mr, mmax, rg, rr, b = min(grid, key=lambda g: g[0])
            if cost_r < ROW_TERM_GAIN * r.cost:
                cand = (rg, rr, free_r, _with(b, rg.x, free_r, md),
                        {"gemm_row_block": mr, "gemm_small_m_max": mmax, "cost_without": float(r.cost),
                         "cost_with": float(cost_r)})
                fits[md] = (rg, rr)
        cands[md] = cand
    # the roofline is chosen on each one's best fit (row blocks included)
    pick = min(cands, key=lambda k: cands[k][0].cost)
    best, rel, free, prof, rows_fit = cands[pick]
    return FitResult(profile=prof, rel_rms=float(np.sqrt(np.mean(rel ** 2))),
                     rel_median_abs=float(np.median(np.abs(rel))), n=int(y.size), cost=float(best.cost),
                     success=bool(best.success), message=str(best.message), roofline=pick,
                     fitted=["eff_c", "eff_m"] + free,
                     by_roofline={k: {"rel_rms": float(np.sqrt(np.mean(v[1] ** 2))),
                                      "rel_median_abs": float(np.median(np.abs(v[1]))), "cost": float(v[0].cost)}
                                  for k, v in fits.items()},
                     residuals=rel, row_blocks=rows_fit)


def fitted_range(model: ModelShape, phases: pd.DataFrame, device: str | None = None,
                 dtype: str | None = None) -> dict:
    """The envelope of what was measured: a fitted profile refuses queries beyond it.

    Sizes (context, tokens of one forward item, batch), the model, and where given the
    device and dtype the measurements ran on.
    """
    fw = phases[phases["kind"] == "forward"]
    ctx = [int(n) + int(c) for ns, cs in zip(fw["n"], fw["c"]) for n, c in zip(ns, cs)]
    new = [int(n) for ns in fw["n"] for n in ns]
    out = {"max_context_tokens": int(max(ctx)), "max_new_tokens": int(max(new)),
           "max_batch": int(max(len(ns) for ns in fw["n"])),
           "max_tokens_per_iteration": int(max(int(sum(ns)) for ns in fw["n"])),
           "mixed_iterations": bool(any(any(int(n) > 1 for n in ns) and any(int(n) == 1 for n in ns)
                                        for ns in fw["n"])),
           "models": [model.name]}
    if device is not None:
        out["device"] = str(device)
    if dtype is not None:
        out["dtypes"] = [str(dtype)]
    return out


def merge_ranges(frs: list[dict]) -> dict:
    """The envelope of several runs' fitted ranges (maxima; mixed if any run had mixed iterations)."""
    out = {}
    for k in ("max_context_tokens", "max_new_tokens", "max_batch", "max_tokens_per_iteration"):
        vals = [f[k] for f in frs if k in f]
        if vals:
            out[k] = max(vals)
    if any("mixed_iterations" in f for f in frs):
        out["mixed_iterations"] = any(f.get("mixed_iterations", False) for f in frs)
    out["models"] = sorted({m for f in frs for m in f.get("models", [])})
    return out


def profile_out_path(name: str, out: Path | None = None, force: bool = False) -> Path:
    """Where a fit writes: ``out``, else the user profile directory's ``hardware/<name>.yaml``.

    Never over a shipped preset (a file in the package's ``sim/presets``) without ``force``.
    """
    from sim.cost.profiles import is_shipped, user_profile_dir

    path = Path(out) if out else user_profile_dir() / "hardware" / f"{name}.yaml"
    if path.exists() and is_shipped(path) and not force:
        raise ValueError(f"--out: {path} is a shipped preset; a fit goes to the user profile directory "
                         f"({user_profile_dir()}) unless --force replaces the shipped file")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def run_fingerprint(runs: list[dict], dirs: list) -> dict | None:
    """The one host fingerprint the runs recorded (None if none did); runs from two hosts are refused."""
    from sim.cost.fingerprint import fingerprint_differences

    fps = [(d, r.get("fingerprint")) for d, r in zip(dirs, runs) if r.get("fingerprint")]
    if not fps:
        return None
    d0, f0 = fps[0]
    for d, f in fps[1:]:
        diff = fingerprint_differences(f0, f)
        if diff:
            raise ValueError(f"calibrate fit: {d} was measured on another host than {d0} ({'; '.join(diff)}); "
                             "one profile is fitted per host")
    return dict(f0)


def _yaml_dump(obj) -> str:
    import yaml
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None, width=100)


def write_preset(path: Path, res: FitResult, frange: dict, device: str, fitted_on: dict, notes: str,
                 clock: str = "wall", calibration_note: str | None = None, fingerprint: dict | None = None) -> dict:
    p = res.profile
    data = {
        "name": p.name, "peak_flops": float(p.peak_flops), "mem_bw": float(p.mem_bw),
        "mem_capacity": float(p.mem_capacity), "eff_c": float(p.eff_c), "eff_m": float(p.eff_m),
        "per_kernel_s": float(p.per_kernel_s), "per_layer_s": float(p.per_layer_s),
        "sample_s_per_vocab": float(p.sample_s_per_vocab), "host_per_iter_s": float(p.host_per_iter_s),
        "per_kernel_graph_s": None if p.per_kernel_graph_s is None else float(p.per_kernel_graph_s),
        "roofline": p.roofline, "eff_elem": None if p.eff_elem is None else float(p.eff_elem),
        "eff_mv": None if p.eff_mv is None else float(p.eff_mv),
        "eff_att": None if p.eff_att is None else float(p.eff_att),
        "eff_kv": None if p.eff_kv is None else float(p.eff_kv),
        **({"eff_kv_shared": float(p.eff_kv_shared)} if p.eff_kv_shared is not None else {}),
        **({"decode_attention": p.decode_attention} if p.decode_attention != "paged" else {}),
        **({"gemm_row_block": int(p.gemm_row_block),
            "gemm_small_m_max": None if p.gemm_small_m_max is None else int(p.gemm_small_m_max)}
           if p.gemm_row_block else {}),
        "calibrated": True, "provisional": False, "fitted_range": frange, "device": device,
        "fitted_on": fitted_on,
        **({"fingerprint": fingerprint} if fingerprint else {}),
        "calibration_note": calibration_note or (f"fitted end to end on {device} ({fitted_on.get('model')} "
                                                 f"{fitted_on.get('dtype')}, {clock} clock)"),
        "fit": {"method": "scipy.optimize.least_squares (trf, soft_l1 on relative residuals)",
                "params": list(res.fitted), "clock": clock, "roofline": res.roofline,
                "by_roofline": res.by_roofline, "n_phases": res.n, "rel_rms": res.rel_rms,
                "rel_median_abs": res.rel_median_abs, "success": res.success, "row_blocks": res.row_blocks},
        "notes": notes,
    }
    # keep what the fit does not own (capacity / scheduler keys another tool or person set in this file)
    try:
        import yaml
        old = yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict):
        for k, v in old.items():
            if k not in data and k not in ("fit", "notes", "fitted_on", "residuals", "reference", "fingerprint"):
                data[k] = v
    header = ("# Fitted by `rksim calibrate fit` (calibrate/fit.py) on measured phases; do not edit by hand.\n"
              "# peak_flops / mem_bw are the base profile's; the coefficients in fit.params are fitted.\n")
    atomic_write_text(path, header + _yaml_dump(data))
    load_hardware(str(path))  # what the simulator will read must load
    return data


def run_device(run: dict) -> str:
    """The device a run measured: the GPU's name on CUDA (``run.json`` ``device_name``), else ``cpu``."""
    dev = str(run.get("device", "cpu"))
    return str(run.get("device_name") or dev) if dev.startswith("cuda") else dev.split(":")[0]


def cpu_kernels(device: str) -> dict:
    """Profile fields fixed by the kernels a run on ``device`` used, not fitted: on a CPU, calibrate's loops
    attend decode rows in one call padded to the longest context (``calibrate.serve_forward``, and
    ``calibrate run``'s left-padded decode batch), so ``decode_attention`` is ``padded``."""
    return {"decode_attention": "padded"} if str(device).startswith("cpu") else {}


# the base every CPU fit starts from (calibrate host's, calibrate fit's under any --name)
CPU_BASE = "local-cpu"


def default_base(name: str, device: str = "cpu") -> HardwareProfile:
    """The profile a fit starts from.

    The fit's starting points are efficiencies relative to the base's ``peak_flops`` and ``mem_bw``,
    and its objective (a max of rooflines) has several local optima, so the base decides which one a fit
    lands in. A CPU fit therefore always starts from the shipped ``local-cpu`` (:data:`CPU_BASE`), whatever
    ``--name`` says: the same phases give the same profile under any name, and ``calibrate fit`` of a
    ``calibrate host --keep`` folder gives the profile ``calibrate host`` wrote. A GPU fit starts from the
    preset of that name (its datasheet peaks), else a generic device.
    """
    if str(device).startswith("cpu"):
        return dataclasses.replace(load_hardware(str(PRESET_DIR / "hardware" / f"{CPU_BASE}.yaml")), name=name)
    try:
        # an end-to-end fit's coefficients hold the runner's host time (host_per_iter_s): the preset's
        # host_step / frontend (sim.cost.overheads) would count it twice, so the fitted profile carries neither
        return dataclasses.replace(load_hardware(name), host_step=None, frontend=None)
    except PresetError:
        return HardwareProfile(name=name, peak_flops=2.0e11, mem_bw=2.0e10, mem_capacity=16e9, source="default")


def split_problems(problems: list[int], holdout: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Seeded split into (fit, held-out); both non-empty when there are >= 2 problems and 0 < holdout < 1.

    ``holdout = 0.5`` (the default) is counterbalanced in run order (``calibrate run`` runs the
    problems in index order): positions ``0, 3, 4, 7, 8, ...`` form one half, ``1, 2, 5, 6, ...``
    the other (ABBA), and the seed picks which half is held out. A machine whose speed drifts
    linearly over the run then biases neither half: measured, the decode steps of the last of 4
    problems took 3-9% more CPU time than the first's, and a random split that held out problems
    0 and 2 put a +3% bias on every held-out prediction. Other fractions: a seeded random draw.
    """
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"--holdout: must be in [0, 1), got {holdout}")
    ps = sorted(int(p) for p in problems)
    if holdout == 0 or len(ps) < 2:
        return ps, []
    rng = np.random.default_rng(seed)
    if abs(holdout - 0.5) < 1e-12:
        half = np.array([(i % 4) in (1, 2) for i in range(len(ps))])
        pick = bool(rng.integers(2))
        hold = [p for p, h in zip(ps, half) if h == pick]
        if not hold or len(hold) == len(ps):
            hold = [p for p, h in zip(ps, half) if h != pick]
        return [p for p in ps if p not in hold], hold
    perm = rng.permutation(len(ps))
    n_hold = min(len(ps) - 1, max(1, int(round(holdout * len(ps)))))
    hold = sorted(ps[i] for i in perm[:n_hold])
    return [p for p in ps if p not in hold], hold


def _where(d: Path) -> str:
    """A run directory as the preset records it: relative to the working directory when inside it
    (a shipped preset names no one's home), else absolute."""
    full = Path(d).resolve()
    try:
        return str(full.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(full)


def fit_run_dir(dir_: Path, name: str = "local-cpu", out: Path | None = None, holdout: float = 0.5,
                seed: int = 0, clock: str = "auto", roofline: str = "auto", force: bool = False) -> dict:
    """``rksim calibrate fit DIR``: fit on the fit split's phases and the op sweep; write the preset.

    ``clock``: ``auto`` (thread CPU time on CPU, wall on CUDA), ``cpu`` or ``wall``
    (:func:`calibrate.timing.select_clock`; runs without CPU time fall back to wall).
    """
    return fit_run_dirs([dir_], name=name, out=out, holdout=holdout, seed=seed, clock=clock, roofline=roofline,
                        force=force)


def fit_run_dirs(dirs: list[Path], name: str = "local-cpu", out: Path | None = None, holdout: float = 0.5,
                 seed: int = 0, clock: str = "auto", roofline: str = "auto", force: bool = False) -> dict:
    """``rksim calibrate fit DIR [DIR ...]``: one hardware profile fitted on several runs (several models
    on one device, e.g. the GPU kit's random-weight models). Every run is split into fit / held-out
    problems on its own; its ``fit.json`` records its split and the shared preset."""
    from calibrate.timing import select_clock
    from sim.cost.profiles import model_from_manifest

    dirs = [Path(d) for d in dirs]
    path = profile_out_path(name, out, force)
    parts, runs = [], []
    for dir_ in dirs:
        for f in ("phases.parquet", "run.json"):
            if not (dir_ / f).is_file():
                raise FileNotFoundError(f"{dir_ / f}: missing (not a 'rksim calibrate run' directory)")
        run = json.loads((dir_ / "run.json").read_text())
        phases = pd.read_parquet(dir_ / "phases.parquet")
        fit_p, hold_p = split_problems(run["problems"], holdout, seed)
        use = phases[(phases["problem"] < 0) | phases["problem"].isin(fit_p)]
        use = use[use["kind"] != "host"]
        secs, _, used, clock_note = select_clock(use, None, clock, run.get("device", "cpu"))
        model = model_from_manifest({"model": run["model"]})
        parts.append((dir_, run, use, secs.to_numpy(), used, clock_note, model, fit_p, hold_p))
        runs.append(run)
    devices = {run_device(r) for r in runs}
    dtypes = sorted({str(r["model"]["dtype"]) for r in runs})
    if len(devices) > 1:
        raise ValueError(f"calibrate fit: the runs measured different devices ({', '.join(sorted(devices))}); "
                         "one hardware profile is fitted per device")
    used_clocks = {p[4] for p in parts}
    if len(used_clocks) > 1:
        raise ValueError("calibrate fit: some runs have CPU time and some do not; pass --clock wall")
    used, clock_note = parts[0][4], parts[0][5]
    terms = np.concatenate([phase_terms(p[6], p[2]) for p in parts], axis=1)
    secs = np.concatenate([p[3] for p in parts])
    device = devices.pop()
    base = dataclasses.replace(default_base(name, device), name=name, **cpu_kernels(device))
    res = fit_profile(base, terms, secs, roofline=roofline)
    frs = [fitted_range(p[6], p[2]) for p in parts]
    frange = {**merge_ranges(frs), "device": device, "dtypes": dtypes}
    fp = run_fingerprint(runs, dirs)
    models = ", ".join(f"{p[1]['model']['name']} ({p[1]['model']['dtype']}; fit {p[7]}, held out {p[8]})"
                       for p in parts)
    notes = (f"fitted on {res.n} phases of {models} on {device} with {runs[0].get('threads')} threads, "
             f"{used} clock")
    fitted_on = {"run": _where(dirs[0]) if len(dirs) == 1 else [_where(d) for d in dirs],
                 "created": runs[0].get("created"), "model": ", ".join(sorted({r["model"]["name"] for r in runs})),
                 "dtype": "/".join(dtypes), "threads": runs[0].get("threads")}
    write_preset(path, res, frange, device=device, fitted_on=fitted_on, notes=notes, clock=used, fingerprint=fp)
    info = {}
    for dir_, run, use, _, _, _, model, fit_p, hold_p in parts:
        info = {"preset": str(path.resolve()), "path": str(path), "name": name, "fit_problems": fit_p,
                "holdout_problems": hold_p, "n_phases": res.n, "rel_rms": res.rel_rms,
                "rel_median_abs": res.rel_median_abs, "fitted_range": frange, "clock": used, "clock_note": clock_note,
                "roofline": res.roofline, "by_roofline": res.by_roofline, "fitted_params": res.fitted,
                "coefficients": {k: getattr(res.profile, k) for k in FIT_PARAMS},
                "runs": [str(d) for d in dirs],
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        atomic_write_text(dir_ / "fit.json", json.dumps(info, indent=2) + "\n")
    return {**info, "n_fit_problems": sum(len(p[7]) for p in parts)}
