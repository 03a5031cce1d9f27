"""Tensor parallelism against measurement: predict Vidur's A100 Llama-3-8B operators at TP 2, 4, 8 from TP 1.

Vidur's profile (``calibrate/data/vidur/a100-meta-llama-3-8b-mlp.csv``) times the per-layer operators of
one tensor-parallel rank at ``num_tensor_parallel_workers`` = 1, 2, 4, 8 (each rank's shard; the
all-reduces are not in it, they are the network profile's). ``a100-80gb``'s coefficients were fitted on
tensor-parallel-1 rows only (:mod:`calibrate.public_profiles`). Here the same operator terms
(:func:`calibrate.public_rows.vidur_rows` at the rank's shape: ``H / TP`` query heads,
``max(1, Hkv / TP)`` KV heads, ``F / TP`` MLP width) and the preset's per-operator roofline
(:func:`calibrate.public_profiles.predict`) price every measured ``num_tokens`` and TP::

    t_op = max(F_op / (peak eff_c), B_op / (bw eff)) + per_kernel_s     (eff = eff_m for GEMMs, eff_elem else)

and a layer's time is the sum over its operators. The error of each is ``predicted / measured - 1``;
the goal is a median |error| of the layer sums of at most 10% at each TP > 1.

``python -m calibrate.tp_vidur`` prints the table; ``--write`` writes ``calibrate/data/vidur/tp-prediction.json``.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from . import vidur
from .public_profiles import Coefs, evaluate, layer_sums, predict
from .public_rows import vidur_rows

OUT = vidur.DATA / "tp-prediction.json"
TP_SIZES = (1, 2, 4, 8)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def coefficients(hw) -> Coefs:
    """The preset's coefficients as the fit's :class:`Coefs`."""
    return Coefs(eff_c=hw.eff_c, eff_m=hw.eff_m, eff_elem=hw.eff_elem, eff_att=hw.eff_att, eff_kv=hw.eff_kv,
                 per_kernel_s=hw.per_kernel_s)


def table(model: str = "llama-3-8b", hardware: str = "a100-80gb") -> dict:
    """Per TP: layer-sum and per-operator errors of the preset on Vidur's rows of that TP."""
    from sim.cost.profiles import load_hardware

    hw = load_hardware(hardware)
    k = coefficients(hw)
    f, path, commit = vidur.MLP_FILES[("a100", model)]
    res = {"source": {"repo": vidur.REPO, "path": path, "commit": commit, "shipped": f"calibrate/data/vidur/{f}"},
           "model": model, "hardware": hw.name, "coefficients": k.as_dict(),
           "fitted_on": "tensor-parallel-1 rows only (calibrate/public_profiles.py)",
           "goal": "layer-sum median |error| <= 0.10 at TP 2, 4, 8", "by_tp": {}}
    for tp in TP_SIZES:
        rows = vidur_rows("a100", model, tp)
        p = predict(rows, k, hw.peak_flops, hw.mem_bw, hw.sm_count)
        ev = evaluate(rows, k, hw.peak_flops, hw.mem_bw, sms=hw.sm_count)
        ls = layer_sums(rows, p)
        n = ls.index.to_numpy()
        ops = {}
        for op in GEMM_OPS:
            sel = (rows["op"] == op).to_numpy()
            e = p[sel] / rows["seconds"].to_numpy()[sel] - 1
            ops[op] = {"median_rel_error": float(np.median(e)), "median_abs_rel_error": float(np.median(np.abs(e)))}
        at = {str(int(t)): {"measured_ms": float(ls.loc[t, "y"] * 1e3), "predicted_ms": float(ls.loc[t, "p"] * 1e3)}
              for t in (1, 64, 512, 4096, 32768) if t in ls.index}
        res["by_tp"][str(tp)] = {"num_tokens": [int(n.min()), int(n.max())], "points": int(n.size),
                                 "layer_sum": {**ev["layer"], "at": at}, "by_operator": ops, "in_fit": tp == 1}
    res["goal_met"] = all(res["by_tp"][str(tp)]["layer_sum"]["median_abs"] <= 0.10 for tp in TP_SIZES[1:])
    return res


def main(argv=None) -> int:
    from traces.store import atomic_write_text

    ap = argparse.ArgumentParser(prog="python -m calibrate.tp_vidur", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    a = ap.parse_args(argv)
    res = table()
    print(f"{'TP':>3} {'layer median err':>17} {'median |err|':>13} {'p90 |err|':>10}  " + "  ".join(GEMM_OPS))
    for tp, r in res["by_tp"].items():
        ls = r["layer_sum"]
        print(f"{tp:>3} {ls['median']:>+17.3f} {ls['median_abs']:>13.3f} {ls['p90_abs']:>10.3f}  "
              + "  ".join(f"{r['by_operator'][op]['median_rel_error']:+13.3f}" for op in GEMM_OPS)
              + ("   (fit)" if r["in_fit"] else ""))
    print("goal met:", res["goal_met"])
    if a.write:
        atomic_write_text(OUT, json.dumps(res, indent=1) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
