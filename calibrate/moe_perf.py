"""Held-out check of rksim's MoE layer against vLLM's sparse-MoE block measured with forced routing.

LLMServingSim's profile of Qwen3-30B-A3B on the RTX PRO 6000 (``moe.csv``, :mod:`calibrate.llmservingsim_perf`)
times vLLM 0.19's whole ``Qwen3MoeSparseMoeBlock`` (router gate and fused experts) at ``T`` tokens routed so that
exactly ``E_hit`` distinct experts receive the ``T k`` picks. Each row is priced with the products rksim's engine
charges for that layer (:func:`sim.cost.gemm.variant_gemms`' router and routed experts, with the row's ``E_hit`` in
place of the expected count) on the ``rtx-pro-6000`` preset, whose coefficients were fitted on dense operators and
attention only (:mod:`calibrate.public_profiles`): no MoE row set any of them, so every row is held out::

    t = max(F_q(T, d, E) / rc, d E s / rm)                                      # router gate
        + sum_{p in (w13, w2)} max(F_q,p / rc_moe, E_hit K_p N_p s / rm)        # E_hit groups of T k / E_hit rows
        + 3 Fe T k s / (mem_bw eff_elem)                                        # silu_and_mul
        + (1 + 6) per_kernel_s                                                  # gate + fused_moe's six launches

``F_q``: whole waves of tiles where the preset has ``sm_count`` (:func:`sim.cost.gemm.grouped_wave_flops`);
``rc = peak_flops eff_c``, ``rc_moe`` the experts' rate (:func:`sim.cost.gemm.expert_rate`), ``rm = mem_bw eff_m``.

``python -m calibrate.moe_perf`` prints every row and the median |error| by regime; ``--write`` writes them to
:data:`OUT` (docs/calibration.md quotes it), ``--check`` exits 1 where that file differs from what the rows give.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .moe_kernels import expert_seconds
from .shipped import write_or_check

DEVICE, MODEL, PRESET, HARDWARE = "rtxpro6000", "qwen3-30b-a3b", "qwen3-30b-a3b", "rtx-pro-6000"
OUT = Path(__file__).resolve().parent / "data" / "moe" / "llmservingsim-rtxpro6000-check.json"


def block_seconds(m, hw, tokens: int, hit: int) -> float:
    """One MoE block of ``m`` at ``tokens`` tokens over ``hit`` distinct experts on ``hw`` (module formula):
    :func:`calibrate.moe_kernels.expert_seconds` with the router and the row's ``hit``."""
    return expert_seconds(m, hw, tokens, hit=hit, router=True)


def compare(hardware: str = HARDWARE, eff_c_moe: float | None = None) -> list[dict]:
    """Every measured row with ``predicted_us`` and ``error`` (``predicted / measured - 1``), with the preset's
    ``eff_c_moe`` set to ``eff_c_moe`` (None: the dense products' rate, the preset as no MoE row fitted it)."""
    import dataclasses
    from sim.cost.profiles import load_hardware, load_model
    from . import llmservingsim_perf
    m = load_model(PRESET)
    hw = dataclasses.replace(load_hardware(hardware), eff_c_moe=eff_c_moe)
    d = llmservingsim_perf.load(DEVICE, MODEL, "moe")
    out = []
    for T, hit, sec in zip(d["tokens"].tolist(), d["activated_experts"].tolist(), d["seconds"].tolist()):
        if not (m.experts_per_token <= hit <= min(m.num_experts, T * m.experts_per_token)):
            raise ValueError(f"{llmservingsim_perf.path(DEVICE, MODEL, 'moe')}: activated_experts {hit} at {T} "
                             f"tokens is impossible for {PRESET} (top-{m.experts_per_token} of {m.num_experts})")
        p = block_seconds(m, hw, T, hit)
        out.append({"tokens": T, "activated_experts": hit, "measured_us": sec * 1e6, "predicted_us": p * 1e6,
                    "error": p / sec - 1.0})
    return out


def summary(rows: list[dict]) -> dict:
    """Median and largest |error|, and the median signed error, at decode sizes (T <= 256), above, and overall."""
    out = {}
    for name, sel in (("T<=256", lambda r: r["tokens"] <= 256), ("T>256", lambda r: r["tokens"] > 256),
                      ("all", lambda r: True)):
        e = np.array([r["error"] for r in rows if sel(r)])
        out[name] = {"rows": int(e.size), "median_error": float(np.median(e)),
                     "median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.max(np.abs(e)))}
    return out


def fit_eff_c_moe() -> float:
    """The experts' fraction of ``peak_flops`` that minimises the mean squared log ratio over the prefill-sized rows
    (more than 256 tokens: below, the weight stream binds and no fraction shows), as :func:`calibrate.moe_kernels.
    fit_format` fits the H100's; bounded scalar minimisation over [0.02, 1], 4 digits."""
    from scipy.optimize import minimize_scalar
    from sim.cost.profiles import load_hardware, load_model
    from . import llmservingsim_perf
    import dataclasses
    m, hw0 = load_model(PRESET), load_hardware(HARDWARE)
    d = llmservingsim_perf.load(DEVICE, MODEL, "moe")
    big = d[d["tokens"] > 256]

    def cost(g):
        hw = dataclasses.replace(hw0, eff_c_moe=float(g))
        return float(np.mean([np.log(block_seconds(m, hw, t, e) / sec) ** 2 for t, e, sec in
                              zip(big["tokens"], big["activated_experts"], big["seconds"])]))
    return round(float(minimize_scalar(cost, bounds=(0.02, 1.0), method="bounded",
                                       options={"xatol": 1e-6}).x), 4)


def render() -> str:
    """The file :data:`OUT` holds: every row and the summaries held out (no MoE row fitted anything) and with
    ``eff_c_moe`` fitted on the prefill-sized rows, 4 significant digits."""
    g = fit_eff_c_moe()
    held, fitted = compare(), compare(eff_c_moe=g)
    r4 = lambda v: float(f"{v:.4g}") if isinstance(v, float) else v  # noqa: E731
    src = "calibrate/data/llmservingsim-perf/rtxpro6000-qwen3-30b-a3b-moe.csv"
    doc = {"preset": HARDWARE, "model": PRESET, "source": src, "eff_c_moe": g,
           "summary": {k: {k2: r4(v2) for k2, v2 in v.items()} for k, v in summary(held).items()},
           "summary_with_fit": {k: {k2: r4(v2) for k2, v2 in v.items()} for k, v in summary(fitted).items()},
           "rows": [{**{k: r4(v) for k, v in r.items()}, "predicted_with_fit_us": r4(f["predicted_us"])}
                    for r, f in zip(held, fitted)]}
    return json.dumps(doc, indent=1) + "\n"


def preset_line(g: float) -> str:
    """The ``eff_c_moe`` line of the rtx-pro-6000 preset."""
    return (f"eff_c_moe: {g:.4f}".ljust(26) + "# fitted (calibrate/moe_perf.py): Qwen3-30B-A3B's sparse-MoE block\n"
            + " " * 26 + "# above 256 tokens (LLMServingSim's vLLM 0.19 profile); the check before the fit, every\n"
            + " " * 26 + "# row held out: calibrate/data/moe/llmservingsim-rtxpro6000-check.json")


def render_preset(text: str, g: float) -> str:
    import re
    line_re = re.compile(r"^eff_c_moe:.*(?:\n {26}#.*)*$", re.M)
    if not line_re.search(text):
        raise ValueError(f"{HARDWARE}.yaml: no 'eff_c_moe:' line to rewrite")
    return line_re.sub(lambda _: preset_line(g), text, count=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.moe_perf", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write the rows and the summary to {OUT.name}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if {OUT.name} differs from what the rows give")
    a = ap.parse_args(argv)
    rows = compare()
    for r in rows:
        print(f"T={r['tokens']:5d} E_hit={r['activated_experts']:4d}  measured {r['measured_us']:8.1f} us  "
              f"predicted {r['predicted_us']:8.1f} us  {100 * r['error']:+6.1f}%")
    for k, v in summary(rows).items():
        print(f"{k}: {v['rows']} rows, median |error| {100 * v['median_abs_error']:.1f}% "
              f"(signed {100 * v['median_error']:+.1f}%), max {100 * v['max_abs_error']:.1f}%")
    from sim.cost.profiles import PRESET_DIR
    text = render()
    ppath = PRESET_DIR / "hardware" / f"{HARDWARE}.yaml"
    ptext = render_preset(ppath.read_text(), json.loads(text)["eff_c_moe"])
    return write_or_check({OUT: text, ppath: ptext}, write=a.write, check=a.check,
                          how="python -m calibrate.moe_perf --write")


if __name__ == "__main__":
    sys.exit(main())
