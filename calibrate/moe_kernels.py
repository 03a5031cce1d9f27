"""Mixture-of-experts layers against measurement: vLLM's fused-MoE kernel timings priced by rksim's expert term.

``calibrate/data/moe/vllm-benchmark-moe.csv`` holds public ``benchmarks/kernels/benchmark_moe.py`` timings of
vLLM's Triton ``fused_moe`` for one MoE layer (sources and what the call covers: the directory's README). Each
row is priced with the routed-expert part of rksim's per-operator roofline for that layer at ``T`` tokens on
the row's hardware preset (the rank's shape: :func:`sim.cost.parallel.rank_model`; ``--quantization fp8`` where
the row is fp8), the same products the engine charges (:func:`sim.cost.gemm.variant_gemms` and
:func:`sim.cost.gemm.grouped_wave_flops`)::

    t = sum_{p in (w13, w2)} max(F_q,p / rc, E_hit K_p N_p w / rm)       # E_hit = E (1 - (1 - k / E)^T) groups
                                                                          # (F_q = 2 T k K N without sm_count)
        + (3 Fe) T k s / (mem_bw eff_elem)                                # silu_and_mul: read 2 Fe, write Fe per row
        + 6 per_kernel_s                                                  # topk, align, w13, act, w2, moe_sum

with ``rc`` the preset's ``peak_flops eff_c`` (``peak_flops_fp8 eff_c`` for w8a8 FP8 weights), ``rm = mem_bw
eff_m``, ``w`` bytes per weight, ``s`` bytes per activation. No coefficient is fitted here: every row is held out
from the presets' fits (the H100's were fitted on dense operators only, the H200's are datasheet assumptions).
The error of a row is ``predicted / measured - 1``; the issue's goal is a median |error| of at most 15%.

``python -m calibrate.moe_kernels`` prints the table by set and regime; ``--write`` writes
``calibrate/data/moe/comparison.json``. ``--fit-eff-c SET`` reports, beside it, what one grouped-GEMM compute
fraction fitted on SET's rows would give on the others (a what-if; no preset takes it).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "moe"
CSV = DATA / "vllm-benchmark-moe.csv"
OUT = DATA / "comparison.json"
# fused_moe's launches per call (vllm/model_executor/layers/fused_moe/fused_moe.py, fused_experts_impl):
# topk_softmax, moe_align_block_size, the w13 GEMM, silu_and_mul, the w2 GEMM, moe_sum
FUSED_MOE_KERNELS = 6
_COLS = ("set", "source_url", "where", "device", "hardware", "model", "tp", "quantization", "num_experts", "topk",
         "hidden_size", "config_n", "batch_size", "kernel_us")


def load_rows(path=CSV) -> list[dict]:
    """The measurement rows, checked against the shape rksim holds for the named preset (E, k, d, N / TP)."""
    from sim.cost.profiles import load_model
    p = Path(path)
    with p.open(newline="") as f:
        rd = csv.DictReader(f)
        if tuple(rd.fieldnames or ()) != _COLS:
            raise ValueError(f"{p}: columns must be {', '.join(_COLS)}; got {rd.fieldnames}")
        rows = list(rd)
    for i, r in enumerate(rows):
        for k in ("tp", "num_experts", "topk", "hidden_size", "config_n", "batch_size"):
            r[k] = int(r[k])
        r["kernel_us"] = float(r["kernel_us"])
        m = load_model(r["model"])
        want = (m.num_experts, m.experts_per_token, m.hidden_size, m.moe_intermediate_size // r["tp"])
        got = (r["num_experts"], r["topk"], r["hidden_size"], r["config_n"])
        if want != got:
            raise ValueError(f"{p}: row {i + 2}: shape (E, k, d, N) {got} is not preset {r['model']}'s at TP "
                             f"{r['tp']} {want}")
    return rows


def expert_seconds(m, hw, rows: float, eff_c: float | None = None) -> float:
    """The routed experts of one MoE layer of ``m`` (a rank's shape) at ``rows`` tokens on ``hw`` (module formula)."""
    from sim.cost.gemm import grouped_wave_flops, variant_gemms
    fp8 = m.quantization == "fp8" and hw.fp8_weights == "w8a8"
    ec = hw.eff_c if eff_c is None else eff_c
    rc = (hw.peak_flops_fp8 if fp8 else hw.peak_flops) * ec
    rm = hw.mem_bw * hw.eff_m
    routed = variant_gemms(m, float(rows))[-2:]        # (w13, w2): the grouped products of the routed experts
    share = routed[0][2]
    t = 0.0
    for K, N, _, groups, grows, params in routed:
        # without sm_count (a datasheet preset) the products are priced unquantised, as the engine does
        fq = (float(grouped_wave_flops(groups, grows, K, N, hw.sm_count)) if hw.sm_count
              else 2.0 * float(groups * grows) * K * N)
        t += max(fq / rc, params / share * m.weight_elem_bytes / rm)
    eelem = hw.eff_m if hw.eff_elem is None else hw.eff_elem
    t += 3.0 * m.moe_intermediate_size * rows * m.local_k * m.dtype_bytes / (hw.mem_bw * eelem)
    return t + FUSED_MOE_KERNELS * hw.per_kernel_s


def _shape(r):
    from sim.cost.parallel import rank_model
    from sim.cost.profiles import load_hardware, load_model
    m = load_model(r["model"])
    if r["quantization"]:
        m = m.with_precision(r["quantization"])
    return rank_model(m, r["tp"]), load_hardware(r["hardware"])


def predict_rows(rows, eff_c: dict | None = None) -> list[dict]:
    """Each row with ``predicted_us`` and ``error`` (``predicted / measured - 1``)."""
    out = []
    for r in rows:
        m, hw = _shape(r)
        p = expert_seconds(m, hw, r["batch_size"], (eff_c or {}).get(r["hardware"])) * 1e6
        out.append({**r, "predicted_us": p, "error": p / r["kernel_us"] - 1.0})
    return out


def regime(T: int) -> str:
    """Decode-sized batches (at most 256 tokens per step) or prefill-sized ones."""
    return "T<=256" if T <= 256 else "T>256"


def summarise(pred: list[dict]) -> list[dict]:
    """Median and largest |error| per set and regime, and over all rows."""
    keys = sorted({(p["set"], regime(p["batch_size"])) for p in pred}) + [("all", "all")]
    out = []
    for s, g in keys:
        e = np.array([p["error"] for p in pred if s in ("all", p["set"]) and g in ("all", regime(p["batch_size"]))])
        out.append({"set": s, "regime": g, "rows": int(e.size), "median_error": float(np.median(e)),
                    "median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.max(np.abs(e)))})
    return out


def fit_eff_c(rows, fit_set: str) -> float:
    """What-if: the grouped GEMMs' compute fraction of the peak that minimises the median |log ratio| on
    ``fit_set``'s rows (a grid over 0.05..1; the memory side and every other coefficient unchanged)."""
    sub = [r for r in rows if r["set"] == fit_set]
    if not sub:
        raise ValueError(f"--fit-eff-c: no rows in set {fit_set!r}")
    hw = sub[0]["hardware"]
    grid = np.linspace(0.05, 1.0, 96)
    cost = [np.median([abs(np.log1p(p["error"])) for p in predict_rows(sub, {hw: float(g)})]) for g in grid]
    return float(grid[int(np.argmin(cost))])


def table(path=CSV, fit_set: str | None = None) -> dict:
    rows = load_rows(path)
    pred = predict_rows(rows)
    res = {"source": str(Path(path).relative_to(DATA.parents[2])) if Path(path).is_relative_to(DATA.parents[2])
           else str(path), "formula": __doc__.split("::")[1].split("\n\n")[1].strip(),
           "rows": [{k: p[k] for k in ("set", "hardware", "model", "tp", "quantization", "batch_size", "kernel_us",
                                       "predicted_us", "error")} for p in pred],
           "summary": summarise(pred)}
    if fit_set:
        g = fit_eff_c(rows, fit_set)
        hw = next(r["hardware"] for r in rows if r["set"] == fit_set)
        held = [r for r in rows if r["set"] != fit_set and r["hardware"] == hw]
        res["what_if"] = {"fit_set": fit_set, "hardware": hw, "eff_c": g,
                          "held_out": summarise(predict_rows(held, {hw: g})) if held else []}
    return res


def _write_json(obj, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.moe_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=str(CSV), help="measurement file (default: the shipped one)")
    ap.add_argument("--fit-eff-c", metavar="SET", help="what-if: fit a grouped-GEMM compute fraction on SET")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(DATA.parents[2])}")
    a = ap.parse_args(argv)
    res = table(a.csv, a.fit_eff_c)
    print(f"{'set':30} {'regime':7} {'rows':>4} {'median err':>10} {'median |err|':>12} {'max |err|':>9}")
    for s in res["summary"]:
        print(f"{s['set']:30} {s['regime']:7} {s['rows']:4d} {s['median_error']:+10.3f} {s['median_abs_error']:12.3f} "
              f"{s['max_abs_error']:9.3f}")
    if "what_if" in res:
        w = res["what_if"]
        print(f"what-if: eff_c {w['eff_c']:.3f} fitted on {w['fit_set']} ({w['hardware']}); held out:")
        for s in w["held_out"]:
            print(f"  {s['set']:28} {s['regime']:7} {s['rows']:4d} {s['median_abs_error']:12.3f}")
    if a.write:
        _write_json(res, OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
