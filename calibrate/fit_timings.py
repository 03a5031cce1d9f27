"""Provisional hardware fit from a trace's own ``timings.parquet`` (scipy least squares).

``rksim calibrate fit`` (``calibrate/``) is the real calibration: it times
every operation on purpose. Until it has been run on a machine, the
simulator ships a *provisional* ``local-cpu`` profile fitted here to the
phases the capture measured anyway, so that no coefficient is hand-made.

Each measured phase is turned into the cost model's terms (``sim.cost.terms``) the
way capture ran it: HF eager forwards over left-padded batches (every row
computes ``max`` length; ``logits_to_keep=1``):

=============  ==============================================================
phase          operation(s)
=============  ==============================================================
prefill        one forward, ``batch`` rows of ``max(prompt_len)`` new tokens
decode         ``n_new / batch`` steps, each ``batch`` rows over ``max + k``
cf_prefill     one forward of the root prompt
cf_decode      like decode, rows over ``prompt_len[0] + k``
verify         one forward, ``batch`` rows of the longest verification
               sequence, a logit-lens probe at every layer but the last
cf_verify      same for the counterfactual generations
gate           one forward, ``batch`` rows of the longest variant span
long_prefill   one forward of ``n_new`` tokens
long_decode    ``n_new`` steps of one row over ``n_cached + k``
=============  ==============================================================

The fitted parameters are the effective compute rate ``peak_flops`` and
memory rate ``mem_bw`` (``eff_c = eff_m = 1``: the efficiencies are folded in,
there is no datasheet for "this CPU under eager PyTorch"), ``per_kernel_s``
and ``per_layer_s``. Residuals are relative (log time), loss ``soft_l1``.
``fitted_range`` records the largest context, forward item, batch and the
model seen, and the simulator refuses queries beyond them.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys

import numpy as np

from sim.cost.terms import batch_terms
from sim.cost.hardware import HardwareProfile
from sim.cost.profiles import model_from_manifest

_SEQ = ("decode", "cf_decode", "long_decode")


def _row_terms(m, phase: str, n_new: int, n_cached: int, batch: int, f) -> tuple[np.ndarray, dict] | None:
    """(terms (4,), range info) of one measured phase, or None for phases this fit does not model."""
    L = m.n_layers
    plen = f.prompt_len if f is not None else None

    def fwd(rows, n, c=0.0, probes=0.0, logits=1.0):
        t = batch_terms(m, np.full(rows, float(n)), np.full(rows, float(c)), probes=np.full(rows, float(probes)),
                        logits=np.full(rows, float(logits)))
        return t.as_array()

    def steps(rows, start, k):
        j = np.arange(k, dtype=np.float64)[:, None]
        c = np.broadcast_to(start + j, (k, rows))
        t = batch_terms(m, np.ones((k, rows)), c)
        return t.as_array().sum(axis=1)

    if phase == "prefill" and plen is not None:
        T = float(plen.max())
        return fwd(batch, T), {"ctx": T, "new": T, "batch": batch}
    if phase == "decode" and plen is not None and batch > 0:
        k = int(round(n_new / batch))
        T = float(plen.max())
        return steps(batch, T, k), {"ctx": T + k, "new": 1, "batch": batch}
    if phase == "cf_prefill" and plen is not None:
        return fwd(1, plen[0]), {"ctx": float(plen[0]), "new": float(plen[0]), "batch": 1}
    if phase == "cf_decode" and plen is not None and batch > 0:
        k = int(round(n_new / batch))
        return steps(batch, float(plen[0]), k), {"ctx": float(plen[0]) + k, "new": 1, "batch": batch}
    if phase in ("verify", "cf_verify") and f is not None and batch > 0:
        g = "own" if phase == "verify" else "cf"
        lens = f.prompt_len + f.gen[g]["len"] + f.verify_len
        if phase == "cf_verify":
            lens = np.where(np.arange(f.B) > 0, f.prompt_len[0] + f.gen["cf"]["len"] + f.verify_len, 0)[1:]
        T = float(lens.max())
        return fwd(batch, T, probes=L - 1), {"ctx": T, "new": T, "batch": batch}
    if phase == "gate" and f is not None and batch > 0:
        span = float((f.spans[1:, 1] - f.spans[1:, 0]).max()) if f.B > 1 else 0.0
        return fwd(batch, span), {"ctx": span, "new": span, "batch": batch}
    if phase == "long_prefill":
        return fwd(1, n_new), {"ctx": float(n_new), "new": float(n_new), "batch": 1}
    if phase == "long_decode":
        return steps(1, float(n_cached), int(n_new)), {"ctx": float(n_cached + n_new), "new": 1, "batch": 1}
    return None


def design(tf):
    """Terms matrix (rows, 4), measured seconds (rows,), phase names, and the range covered."""
    m = model_from_manifest(tf.manifest)
    rows, secs, names = [], [], []
    rng = {"ctx": 0.0, "new": 0.0, "batch": 0}
    # Problem shards' timings, then the long-decode shards' own timings.parquet (long_prefill / long_decode).
    import pandas as pd
    sources = [(tim, f) for f, tim in zip(tf.problems, tf.timings)]
    for ld in getattr(tf.trace, "long_decodes", []) or []:
        path = os.path.join(str(ld.root), ld.rel, "timings.parquet")
        if os.path.isfile(path):
            sources.append((pd.read_parquet(path), None))
    for tim, f in sources:
        for r in tim.itertuples(index=False):
            out = _row_terms(m, str(r.phase), int(r.n_new), int(r.n_cached), int(r.batch), f)
            if out is None or not (r.seconds > 0):
                continue
            t, info = out
            rows.append(t)
            secs.append(float(r.seconds))
            names.append(str(r.phase))
            rng["ctx"] = max(rng["ctx"], info["ctx"])
            rng["new"] = max(rng["new"], info["new"])
            rng["batch"] = max(rng["batch"], int(info["batch"]))
    if not rows:
        raise ValueError(f"{tf.path}: timings.parquet: no measured phase this fit can model")
    return m, np.array(rows), np.array(secs), names, rng


def _predict(x, A):
    rate_c, rate_m, pk, pl = np.exp(x[0]), np.exp(x[1]), x[2], x[3]
    return np.maximum(A[:, 0] / rate_c, A[:, 1] / rate_m) + A[:, 2] * pk + A[:, 3] * pl


def fit(tf, name: str = "local-cpu") -> tuple[HardwareProfile, dict]:
    from scipy.optimize import least_squares

    m, A, y, names, rng = design(tf)

    def resid(x):
        return np.log(np.maximum(_predict(x, A), 1e-12)) - np.log(y)

    best = None
    # A few seeds of the two rates across decades: the max() makes the loss piecewise.
    for c0 in (1e9, 1e10, 1e11):
        for m0 in (1e9, 1e10, 1e11):
            x0 = np.array([np.log(c0), np.log(m0), 1e-5, 1e-4])
            r = least_squares(resid, x0, loss="soft_l1", f_scale=0.1,
                              bounds=([np.log(1e6), np.log(1e6), 0.0, 0.0], [np.log(1e16), np.log(1e14), 1.0, 1.0]))
            if best is None or r.cost < best.cost:
                best = r
    x = best.x
    pred = _predict(x, A)
    rel = pred / y - 1.0
    try:
        capacity = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        capacity = float(m.weight_bytes * 4)
    hw = HardwareProfile(
        name=name, peak_flops=float(np.exp(x[0])), mem_bw=float(np.exp(x[1])), mem_capacity=capacity,
        eff_c=1.0, eff_m=1.0, per_kernel_s=float(x[2]), per_layer_s=float(x[3]), calibrated=False, provisional=True,
        fitted_range={"max_context_tokens": int(rng["ctx"]), "max_new_tokens": int(rng["new"]),
                      "max_batch": int(rng["batch"]), "models": [m.name]})
    report = {"n_rows": int(len(y)), "median_abs_rel_error": float(np.median(np.abs(rel))),
              "max_abs_rel_error": float(np.max(np.abs(rel))),
              "per_phase_median_rel_error": {p: float(np.median(rel[[i for i, n in enumerate(names) if n == p]]))
                                             for p in sorted(set(names))}}
    return hw, report


def to_yaml(hw: HardwareProfile, trace_path: str, report: dict) -> str:
    fr = hw.fitted_range
    lines = [
        f"# {hw.name}: PROVISIONAL profile fitted by `python -m calibrate.fit_timings` (scipy least squares, soft_l1 on",
        f"# log time) to the phases measured while capturing {trace_path} (timings.parquet of every problem).",
        "# Replace it with `rksim calibrate fit` (calibrate/), which times each operation on purpose.",
        f"# Fitted {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')} on {platform.machine()} "
        f"{platform.processor() or ''}".rstrip(),
        f"# {report['n_rows']} phases; median |relative error| {report['median_abs_rel_error']:.3f}, "
        f"max {report['max_abs_rel_error']:.3f}.",
        f"name: {hw.name}",
        f"peak_flops: {hw.peak_flops:.6e}    # fitted effective FLOP/s (eff_c folded in)",
        f"mem_bw: {hw.mem_bw:.6e}        # fitted effective bytes/s (eff_m folded in)",
        f"mem_capacity: {hw.mem_capacity:.6e}  # physical RAM of the fitting machine (os.sysconf)",
        "eff_c: 1.0",
        "eff_m: 1.0",
        f"per_kernel_s: {hw.per_kernel_s:.6e}  # fitted",
        f"per_layer_s: {hw.per_layer_s:.6e}   # fitted",
        "calibrated: false",
        "provisional: true",
        "fitted_range:              # the simulator refuses queries beyond these (no extrapolation)",
        f"  max_context_tokens: {fr['max_context_tokens']}",
        f"  max_new_tokens: {fr['max_new_tokens']}",
        f"  max_batch: {fr['max_batch']}",
        "  models:",
        *[f"    - {json_str(x)}" for x in fr["models"]],
        "fit:",
        f"  trace: {json_str(str(trace_path))}",
        f"  median_abs_rel_error: {report['median_abs_rel_error']:.6f}",
        f"  max_abs_rel_error: {report['max_abs_rel_error']:.6f}",
        "  per_phase_median_rel_error:",
        *[f"    {k}: {v:.6f}" for k, v in report["per_phase_median_rel_error"].items()],
    ]
    return "\n".join(lines) + "\n"


def json_str(s: str) -> str:
    import json
    return json.dumps(s)


def main(argv=None) -> int:
    from traces.store import atomic_write_bytes

    from sim.workload import features
    from sim.cost.profiles import load_hardware
    ap = argparse.ArgumentParser(prog="python -m calibrate.fit_timings", description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True, help="YAML file to write (atomically)")
    ap.add_argument("--name", default="local-cpu")
    a = ap.parse_args(argv)
    tf = features.load(a.trace)
    hw, rep = fit(tf, a.name)
    atomic_write_bytes(a.out, to_yaml(hw, a.trace, rep).encode())
    load_hardware(a.out)  # what the simulator will read must load
    print(f"wrote {a.out}: {rep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
