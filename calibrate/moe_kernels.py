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

with ``rc`` the routed experts' rate (:func:`sim.cost.gemm.expert_rate`: ``peak_flops eff_c_moe`` for 16-bit experts,
``peak_flops_fp8 eff_c_moe_fp8`` for w8a8 FP8, ``peak_flops eff_c_moe_mxfp4`` for MXFP4; each None: the dense
products' rate, ``peak_flops eff_c`` or ``peak_flops_fp8 eff_c_fp8``), ``rm = mem_bw eff_m``, ``w`` bytes per
weight, ``s`` bytes per activation. The error of a row is ``predicted / measured - 1``; the issue's goal is a
median |error| of at most 15% on rows the fit did not see.

The fit (:func:`fit`): per weight format, the fraction minimising the mean squared log ratio over that format's
prefill-sized rows (more than 256 tokens; at decode sizes the weight stream binds and no fraction shows), and each
set held out in turn (fitted on the format's other sets). The H100 SXM and the H200 are one die, so one fraction
serves both (:data:`PRESETS`). A format in :data:`NOT_WRITTEN` is fitted and reported, not taken, for the reason
given there.

``python -m calibrate.moe_kernels`` prints the table by set and regime, beside the same rows without a fitted
fraction, and the fits; ``--write`` writes ``calibrate/data/moe/comparison.json`` and the ``eff_c_moe*`` lines of
the presets; ``--check`` exits 1 where a shipped line or the file's fitted values differ from what the rows give.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from sim.cost.gemm import EXPERT_FIELDS

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
    p = Path(path)
    with p.open(newline="") as f:
        rd = csv.DictReader(f)
        if tuple(rd.fieldnames or ()) != _COLS:
            raise ValueError(f"{p}: columns must be {', '.join(_COLS)}; got {rd.fieldnames}")
        rows = list(rd)
    for r in rows:
        for k in ("tp", "num_experts", "topk", "hidden_size", "config_n", "batch_size"):
            r[k] = int(r[k])
        r["kernel_us"] = float(r["kernel_us"])
    _check_shapes(rows, p, first_line=2)
    return rows


def _check_shapes(rows: list[dict], where, first_line: int) -> None:
    from sim.cost.profiles import load_model
    for i, r in enumerate(rows):
        m = load_model(r["model"])
        want = (m.num_experts, m.experts_per_token, m.hidden_size, m.moe_intermediate_size // r["tp"])
        got = (r["num_experts"], r["topk"], r["hidden_size"], r["config_n"])
        if want != got:
            raise ValueError(f"{where}: row {i + first_line}: shape (E, k, d, N) {got} is not preset {r['model']}'s "
                             f"at TP {r['tp']} {want}")


# aiconfigurator's vLLM 0.24 MoE table (calibrate.aiconfigurator): gpt-oss's MXFP4 experts, one layer, TP 1. The H100's
# rows only: the engine prices routed experts one product at a time (their own rate) only where a preset quantises
# products into waves (sm_count: h100-sxm), so only there is this term the engine's; h200 (no sm_count) prices a
# step's products as one roofline at the dense rate.
AIC_MODELS = {32: "gpt-oss-20b", 128: "gpt-oss-120b"}
AIC_HARDWARE = {"h100": "h100-sxm"}


def aiconfigurator_rows() -> list[dict]:
    """The shipped aiconfigurator MXFP4 MoE rows as measurement rows (one set per model and device), shape-checked."""
    from . import aiconfigurator as aic
    rows = []
    for dev, hw in AIC_HARDWARE.items():
        d = aic.load(dev, "moe")
        for r in d.itertuples(index=False):
            if r.moe_dtype != "w4a16_mxfp4" or int(r.num_experts) not in AIC_MODELS:
                raise ValueError(f"{aic.csv_path(dev, 'moe')}: unexpected row ({r.moe_dtype}, E={r.num_experts})")
            model = AIC_MODELS[int(r.num_experts)]
            rows.append({"set": f"{model}-tp1-mxfp4-{dev}-aiconfigurator",
                         "source_url": f"{aic.REPO} {aic.WHEEL}: {aic.TABLES['moe'][0].format(v=aic.VLLM)}",
                         "where": f"kernel_source {aic.MXFP4_KERNEL}, distribution balanced, moe_tp 1, moe_ep 1",
                         "device": aic.DEVICES[dev][1], "hardware": hw, "model": model, "tp": 1,
                         "quantization": "mxfp4", "num_experts": int(r.num_experts), "topk": int(r.topk),
                         "hidden_size": int(r.hidden_size), "config_n": int(r.inter_size),
                         "batch_size": int(r.num_tokens), "kernel_us": float(r.latency) * 1e3})
    _check_shapes(rows, aic.DATA, first_line=1)
    return rows


def expert_seconds(m, hw, rows: float, hit: float | None = None, router: bool = False) -> float:
    """The routed experts of one MoE layer of ``m`` (a rank's shape) at ``rows`` tokens on ``hw`` (module formula).

    ``hit``: the distinct experts the rows reach, in place of the expected count (a measurement with forced
    routing: ``hit`` groups of ``rows k / hit`` rows, ``hit`` experts' weights read). ``router``: the router gate's
    product too (the engine's, at the dense products' rate) and its launch."""
    from sim.cost.gemm import expert_rate, grouped_wave_flops, variant_gemms
    from sim.cost.roofline import linear_rates
    rc, rc8 = linear_rates(hw)
    # the engine's rate of the routed products (sim.cost.roofline.seconds: rc_lin is rc8 for FP8 weights)
    rc_moe = expert_rate(hw, m, rc, rc8 if m.quantization == "fp8" else rc)
    rm = hw.mem_bw * hw.eff_m
    gemms = variant_gemms(m, float(rows))
    routed = gemms[-2:]        # (w13, w2): the grouped products of the routed experts
    if hit is not None:        # (K, N, share, groups, rows per group, params): params are the groups' weights
        routed = [(K, N, f, float(hit), rows * m.local_k / hit, params / groups * hit)
                  for K, N, f, groups, _, params in routed]
    share = routed[0][2]
    # the router: before the shared experts' two products, if any, and the routed ones (sim.cost.gemm.variant_gemms)
    gate = [(gemms[-5 if m.shared_width else -3], rc)] if router else []
    t = 0.0
    for (K, N, _, groups, grows, params), rate in gate + [(g, rc_moe) for g in routed]:
        # without sm_count (a datasheet preset) the products are priced unquantised, as the engine does
        fq = (float(grouped_wave_flops(groups, grows, K, N, hw.sm_count)) if hw.sm_count
              else 2.0 * float(groups * grows) * K * N)
        t += max(fq / rate, params / share * m.weight_elem_bytes / rm)
    eelem = hw.eff_m if hw.eff_elem is None else hw.eff_elem
    t += 3.0 * m.moe_intermediate_size * rows * m.local_k * m.dtype_bytes / (hw.mem_bw * eelem)
    return t + (FUSED_MOE_KERNELS + len(gate)) * hw.per_kernel_s


def _shape(r):
    from sim.cost.parallel import rank_model
    from sim.cost.profiles import load_hardware, load_model
    m = load_model(r["model"])
    if r["quantization"]:
        m = m.with_precision(r["quantization"])
    return rank_model(m, r["tp"]), load_hardware(r["hardware"])


# the experts' weight format of a row (its ``quantization`` column) and the preset field that prices it
FORMATS = {"": "bf16", "fp8": "fp8", "mxfp4": "mxfp4"}
FORMAT_FIELD = {FORMATS[q]: f for q, f in EXPERT_FIELDS.items()}   # sim.cost.gemm's one table
# the presets the fit is written to: the H100 SXM and the H200 are one die (GH100, 132 SMs), so a kernel's fraction
# of peak carries from one to the other as calibrate/fp8_gemm.py carries DeepGEMM's
PRESETS = ("h100-sxm", "h200")
# a format fitted but not written to the presets, and why (docs/calibration.md, "Fused-MoE kernels")
NOT_WRITTEN = {
    "fp8": "per-tensor FP8 Triton kernel only (Qwen3-30B-A3B); the FP8 MoE checkpoints served (Qwen3, DeepSeek) are "
           "128x128 block-scaled, another kernel; the dense FP8 rate (eff_c_fp8) applies",
}


def fmt_of(quantization: str) -> str:
    return FORMATS[quantization]


def predict_rows(rows, eff: dict | None = None) -> list[dict]:
    """Each row with ``predicted_us`` and ``error`` (``predicted / measured - 1``); ``eff``: ``{format: compute
    fraction}`` in place of the presets' (None: the dense products' rate; a format not named keeps its preset's)."""
    out = []
    for r in rows:
        m, hw = _shape(r)
        fmt = fmt_of(r["quantization"])
        if eff is not None and fmt in eff:
            hw = dataclasses.replace(hw, **{FORMAT_FIELD[fmt]: eff[fmt]})
        p = expert_seconds(m, hw, r["batch_size"]) * 1e6
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


def fit_format(rows, fmt: str) -> float | None:
    """The experts' compute fraction of ``fmt`` that minimises the mean squared log ratio over its prefill-sized
    rows (more than 256 tokens: at decode sizes the weight stream bounds the term, so those rows cannot tell a
    fraction; bounded scalar minimisation over [0.02, 1], rounded to 4 digits; the memory side and every other
    coefficient unchanged); None: no such row."""
    from scipy.optimize import minimize_scalar
    sub = [r for r in rows if fmt_of(r["quantization"]) == fmt and regime(r["batch_size"]) == "T>256"]
    if not sub:
        return None
    shaped = [(r, *_shape(r)) for r in sub]
    field = FORMAT_FIELD[fmt]

    def cost(g):
        return float(np.mean([np.log(expert_seconds(m, dataclasses.replace(hw, **{field: float(g)}),
                                                    r["batch_size"]) * 1e6 / r["kernel_us"]) ** 2
                              for r, m, hw in shaped]))
    res = minimize_scalar(cost, bounds=(0.02, 1.0), method="bounded", options={"xatol": 1e-6})
    return round(float(res.x), 4)


def fit(rows) -> dict:
    """Per format: the fraction fitted on every set of that format, and each set held out in turn (the fraction
    fitted on the format's other sets, where it has some; a held-out set is a model or shape the fit did not see)."""
    out = {}
    for fmt in FORMAT_FIELD:
        sets = sorted({r["set"] for r in rows if fmt_of(r["quantization"]) == fmt})
        if not sets:
            out[fmt] = {"field": FORMAT_FIELD[fmt], "fitted": None, "value": None, "not_written": None, "sets": [],
                        "held_out": []}
            continue
        held = []
        for s in sets:
            g = fit_format([r for r in rows if r["set"] != s], fmt)
            if g is None:
                continue
            pred = predict_rows([r for r in rows if r["set"] == s], {fmt: g})
            e = np.array([p["error"] for p in pred])
            big = np.array([p["error"] for p in pred if p["batch_size"] > 256])
            held.append({"set": s, "fitted_without_it": g, "rows": int(e.size),
                         "median_abs_error": float(np.median(np.abs(e))),
                         "median_abs_error_T>256": float(np.median(np.abs(big))) if big.size else None})
        g = fit_format(rows, fmt)
        why = NOT_WRITTEN.get(fmt) if g is not None else None
        out[fmt] = {"field": FORMAT_FIELD[fmt], "fitted": g, "value": None if why else g, "not_written": why,
                    "sets": sets, "held_out": held}
    return out


def _fitted_eff(fits: dict) -> dict:
    """What the presets take: every format's written fraction (None: the dense rate), whatever their lines say now."""
    return {f: v["value"] for f, v in fits.items()}


def table(path=CSV) -> dict:
    rows = load_rows(path) + aiconfigurator_rows()
    fits = fit(rows)
    pred = predict_rows(rows, _fitted_eff(fits))
    before = predict_rows(rows, dict.fromkeys(FORMAT_FIELD))   # the dense products' rate (no fitted fraction)
    held = [h for f in fits.values() for h in f["held_out"]]
    return {"source": str(Path(path).relative_to(DATA.parents[2])) if Path(path).is_relative_to(DATA.parents[2])
            else str(path), "formula": __doc__.split("::")[1].split("\n\n")[1].strip(),
            "fits": fits,
            "held_out_median_abs_error": float(np.median([h["median_abs_error"] for h in held])) if held else None,
            "rows": [{k: p[k] for k in ("set", "hardware", "model", "tp", "quantization", "batch_size", "kernel_us",
                                        "predicted_us", "error")} for p in pred],
            "summary": summarise(pred), "summary_without_fit": summarise(before)}


def _write_json(obj, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def render(preset: str, text: str, fits: dict) -> str:
    """``preset``'s YAML with its ``eff_c_moe*`` lines set to the fit (each line must be there already)."""
    for fmt, f in fits.items():
        field = f["field"]
        line_re = re.compile(rf"^{field}:.*$", re.M)
        if not line_re.search(text):
            raise ValueError(f"{preset}.yaml: no '{field}:' line to rewrite")
        if f["value"] is None and f["not_written"]:
            line = f"{field}: null".ljust(26) + (f"# fitted {f['fitted']:.4f} (calibrate/moe_kernels.py), not taken: "
                                                 f"{f['not_written']}")
        elif f["value"] is None:
            line = f"{field}: null".ljust(26) + f"# no public per-operator timing of {fmt} fused-MoE kernels on H100/H200 " \
                                                 "in calibrate/data/{moe,aiconfigurator}: the dense products' rate applies"
        else:
            held = ", ".join(f"{h['set']} {h['median_abs_error']:.3f}" for h in f["held_out"]) or "none (one set)"
            line = (f"{field}: {f['value']:.4f}".ljust(26)
                    + f"# fitted (calibrate/moe_kernels.py): {fmt} fused-MoE grouped GEMMs on {len(f['sets'])} "
                      f"per-operator set(s) of calibrate/data/{{moe,aiconfigurator}} ({', '.join(f['sets'])}); held-out median |error| "
                      f"by set: {held}")
        text = line_re.sub(lambda _: line, text, count=1)
    return text


def main(argv=None) -> int:
    from sim.cost.profiles import PRESET_DIR
    from traces.store import atomic_write_text

    ap = argparse.ArgumentParser(prog="python -m calibrate.moe_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=str(CSV), help="measurement file (default: the shipped one)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(DATA.parents[2])} and the "
                   f"eff_c_moe* lines of the presets {', '.join(PRESETS)}")
    g.add_argument("--check", action="store_true", help="exit 1 if a shipped preset's eff_c_moe* lines or "
                   f"{OUT.relative_to(DATA.parents[2])}'s fits differ from what the rows give")
    a = ap.parse_args(argv)
    res = table(a.csv)
    print(f"{'set':30} {'regime':7} {'rows':>4} {'median err':>10} {'median |err|':>12} {'max |err|':>9} "
          f"{'(no fit: median |err|)':>22}")
    for s, b in zip(res["summary"], res["summary_without_fit"]):
        print(f"{s['set']:30} {s['regime']:7} {s['rows']:4d} {s['median_error']:+10.3f} {s['median_abs_error']:12.3f} "
              f"{s['max_abs_error']:9.3f} {b['median_abs_error']:22.3f}")
    for fmt, f in res["fits"].items():
        v = ("not fitted (no prefill-sized rows)" if f["fitted"] is None else f"{f['value']:.4f}" if f["value"] is not None
             else f"{f['fitted']:.4f}, not written: {f['not_written']}")
        print(f"{f['field']} ({fmt}): {v}")
        for h in f["held_out"]:
            print(f"  held out {h['set']:30} fitted without it {h['fitted_without_it']:.4f}: "
                  f"median |error| {h['median_abs_error']:.3f} over {h['rows']} rows")
    if res["held_out_median_abs_error"] is not None:
        print(f"held-out sets, median of their median |error|: {res['held_out_median_abs_error']:.3f}")
    bad = []
    for p in PRESETS:
        path = PRESET_DIR / "hardware" / f"{p}.yaml"
        text = path.read_text()
        new = render(p, text, res["fits"])
        if a.check and new != text:
            bad.append(str(path))
        if a.write:
            atomic_write_text(path, new)
            print(f"wrote {path}")
    if a.check and OUT.exists():
        # the fitted values (rounded, so the same on any CPU), not the last bits of the held-out errors
        pick = {f: (v.get("fitted"), v.get("value")) for f, v in json.loads(OUT.read_text()).get("fits", {}).items()}
        if pick != {f: (v["fitted"], v["value"]) for f, v in res["fits"].items()}:
            bad.append(str(OUT))
    if a.write:
        _write_json(res, OUT)
        print(f"wrote {OUT}")
    if bad:
        print(f"differs from the fit (run python -m calibrate.moe_kernels --write): {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
