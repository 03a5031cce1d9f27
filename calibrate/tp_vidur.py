"""Tensor parallelism against measurement: predict Vidur's A100 Llama-3-8B operators at TP 2, 4, 8 from TP 1.

Vidur's profile (``calibrate/data/vidur/a100-meta-llama-3-8b-mlp.csv``, :mod:`calibrate.vidur`) times the
per-layer operators of one tensor-parallel rank at ``num_tensor_parallel_workers`` = 1, 2, 4, 8 (each
rank's shard; the all-reduces are not in it, they are the network profile's). ``a100-80gb``'s
coefficients (``eff_c``, ``eff_m``, ``eff_elem``, ``per_kernel_s``) were fitted on the TP 1 rows only
(``python -m calibrate.vidur``). Here the same cost model prices the shard of :func:`sim.parallel.rank_model`
(``H / TP`` query heads, ``max(1, Hkv / TP)`` KV heads, ``F / TP`` MLP width) at every measured
``num_tokens`` and TP, operator by operator::

    t_op = max(F_op / (peak eff_c), B_op / (bw eff)) + per_kernel_s     (eff = eff_m for GEMMs, eff_elem else)

with the operator terms of :func:`calibrate.vidur.op_terms` on the rank's shape, and the layer's time as
the sum over its operators (the per-operator roofline the preset uses). The error of each is
``predicted / measured - 1``; the goal is a median |error| of the layer sums of at most 10% at each TP.

``python -m calibrate.tp_vidur`` prints the table; ``--write`` writes ``calibrate/data/vidur/tp-prediction.json``.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd

from .vidur import CSV, ELEMWISE, GEMMS, LAYER_OPS, SOURCE, op_terms

OUT = CSV.parent / "tp-prediction.json"
TOKEN_RANGES = ((1, 64), (65, 1024), (1025, 32768))


def measured(tp: int) -> pd.DataFrame:
    """Per ``num_tokens``: the median seconds of each layer operator at TP ``tp`` (duplicates: median)."""
    d = pd.read_csv(CSV)
    d = d[d["num_tensor_parallel_workers"] == tp]
    cols = {f"time_stats.{op}.median": op for op in LAYER_OPS}
    g = d.groupby("num_tokens")[list(cols)].median().rename(columns=cols) * 1e-3
    return g


def predict(m, hw, tp: int, n: np.ndarray) -> pd.DataFrame:
    """Predicted seconds of each layer operator of one TP rank at ``n`` tokens."""
    from sim.parallel import rank_model

    r = rank_model(m, tp)
    rc = hw.peak_flops * hw.eff_c
    out = {}
    for op in LAYER_OPS:
        F, B = op_terms(r, op, n)
        rm = hw.mem_bw * (hw.eff_elem if op in ELEMWISE and hw.eff_elem is not None else hw.eff_m)
        out[op] = np.maximum(F / rc, B / rm) + hw.per_kernel_s
    return pd.DataFrame(out, index=n)


def table(model="llama-3-8b", hardware="a100-80gb") -> dict:
    from sim.profiles import load_hardware, load_model

    m, hw = load_model(model), load_hardware(hardware)
    res = {"source": SOURCE, "model": m.name, "hardware": hw.name,
           "coefficients": {"eff_c": hw.eff_c, "eff_m": hw.eff_m, "eff_elem": hw.eff_elem,
                            "per_kernel_s": hw.per_kernel_s, "fitted_on": "TP 1 rows only (python -m calibrate.vidur)"},
           "goal": "layer-sum median |error| <= 0.10 at TP 2, 4, 8", "by_tp": {}}
    for tp in (1, 2, 4, 8):
        meas = measured(tp)
        n = meas.index.to_numpy(np.float64)
        pred = predict(m, hw, tp, n)
        lay_m = meas[list(LAYER_OPS)].sum(axis=1).to_numpy()
        lay_p = pred[list(LAYER_OPS)].sum(axis=1).to_numpy()
        rel = lay_p / lay_m - 1
        by_range = {}
        for lo, hi in TOKEN_RANGES:
            sel = (n >= lo) & (n <= hi)
            by_range[f"{lo}-{hi}"] = {"n": int(sel.sum()), "median_rel_error": float(np.median(rel[sel])),
                                      "median_abs_rel_error": float(np.median(np.abs(rel[sel])))}
        ops = {}
        for op in LAYER_OPS:
            e = pred[op].to_numpy() / meas[op].to_numpy() - 1
            ops[op] = {"median_rel_error": float(np.median(e)), "median_abs_rel_error": float(np.median(np.abs(e)))}
        res["by_tp"][str(tp)] = {
            "num_tokens": [int(n.min()), int(n.max())], "points": int(n.size),
            "layer_sum": {"median_rel_error": float(np.median(rel)), "median_abs_rel_error": float(np.median(np.abs(rel))),
                          "p90_abs_rel_error": float(np.percentile(np.abs(rel), 90)),
                          "by_num_tokens": by_range,
                          "at": {str(int(t)): {"measured_ms": float(lay_m[i] * 1e3), "predicted_ms": float(lay_p[i] * 1e3)}
                                 for t in (1, 64, 512, 4096, 32768) for i in np.nonzero(n == t)[0][:1]}},
            "by_operator": ops, "in_fit": tp == 1}
    res["goal_met"] = all(res["by_tp"][str(tp)]["layer_sum"]["median_abs_rel_error"] <= 0.10 for tp in (2, 4, 8))
    return res


def main(argv=None) -> int:
    from traces.store import atomic_write_text

    ap = argparse.ArgumentParser(prog="python -m calibrate.tp_vidur", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    a = ap.parse_args(argv)
    res = table()
    print(f"{'TP':>3} {'layer median err':>17} {'median |err|':>13} {'p90 |err|':>10}  "
          + "  ".join(f"{op}" for op in GEMMS))
    for tp, r in res["by_tp"].items():
        ls = r["layer_sum"]
        print(f"{tp:>3} {ls['median_rel_error']:>+17.3f} {ls['median_abs_rel_error']:>13.3f} {ls['p90_abs_rel_error']:>10.3f}  "
              + "  ".join(f"{r['by_operator'][op]['median_rel_error']:+.3f}" for op in GEMMS)
              + ("   (fit)" if r["in_fit"] else ""))
    print("goal met:", res["goal_met"])
    if a.write:
        atomic_write_text(OUT, json.dumps(res, indent=1) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
