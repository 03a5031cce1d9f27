"""``eff_c_fp8``: FP8 matrix products' fraction of ``peak_flops_fp8``, fitted on a public per-shape FP8 GEMM table.

Source (``calibrate/data/deepgemm/SOURCE.md``): DeepGEMM's README table "Normal GEMMs for dense models",
https://github.com/deepseek-ai/DeepGEMM/blob/a9967bc27cdcead54e8d11e1736644eb51d49b33/README.md (MIT): 18 shapes
``M x K`` by ``K x N``, FP8 e4m3 with fine-grained (1x128 / 128x128) scaling, timed on an H800 SXM5 with NVCC 12.8,
in TFLOPS, with the speedup over DeepSeek's CUTLASS 3.6 implementation of the same product.

Carried to H100 SXM and H200 unchanged: the H800 SXM5 is the same GH100 die with the same 132 SMs, FP8 tensor-core
peak (1,979 TFLOPS dense) and HBM3 bandwidth (3.35 TB/s) as the H100 SXM5; it differs in NVLink (400 vs 900 GB/s),
which no single-GPU GEMM touches. The H200 has the same die and SM count (only HBM3e differs), so a compute-bound
product's fraction of peak is the same.

Fit (only compute-bound rows constrain a fraction of peak: ``M = 4096``; at ``M <= 128`` the product streams its
weight, which ``eff_m`` prices)::

    t_i = 2 M N K / (TFLOPS_i 1e12)                        measured time of row i
    e_i = F_q(M, K, N) / (peak_flops_fp8 t_i)              F_q: whole waves of tiles (sim.cost.gemm.gemm_wave_flops)
    eff_c_fp8 = median_i e_i                               DeepGEMM's kernels
    band: median_i e_i with TFLOPS_i / speedup_i           the CUTLASS 3.6 implementation of the same products

``python -m calibrate.fp8_gemm`` prints the fit; ``--write`` rewrites the ``eff_c_fp8`` and ``eff_c_fp8_low`` lines
of the presets in :data:`PRESETS`; ``--check`` exits 1 if a shipped preset's lines differ.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .shipped import write_or_check

DATA = Path(__file__).resolve().parent / "data" / "deepgemm" / "normal_gemm_h800.csv"
REPO = "https://github.com/deepseek-ai/DeepGEMM"
COMMIT = "a9967bc27cdcead54e8d11e1736644eb51d49b33"
PRESETS = ("h100-sxm", "h200")
COMPUTE_BOUND_M = 4096


def rows() -> pd.DataFrame:
    """The shipped table, checked (a missing column or a non-positive value names the file)."""
    df = pd.read_csv(DATA)
    need = ("M", "N", "K", "tflops", "speedup_vs_cutlass")
    miss = [c for c in need if c not in df.columns]
    if miss:
        raise ValueError(f"{DATA}: missing column(s) {miss}")
    if (df[list(need)] <= 0).any().any():
        raise ValueError(f"{DATA}: every value of {need} must be positive")
    return df


def _datasheet(preset: str) -> tuple[float, int | None]:
    from sim.cost.profiles import PRESET_DIR, read_preset_file

    d = read_preset_file(PRESET_DIR / "hardware" / f"{preset}.yaml")
    sms = d.get("sm_count")
    return float(d["peak_flops_fp8"]), None if sms is None else int(sms)


def efficiencies(df: pd.DataFrame, peak_fp8: float, sms: int | None, tflops_col: str = "tflops") -> np.ndarray:
    """``e_i`` of the compute-bound rows (module docstring); ``sms`` None (a preset without ``sm_count``, which
    the simulator does not wave-quantise): ``F = 2 M N K``."""
    from sim.cost.gemm import gemm_wave_flops

    cb = df[df["M"] >= COMPUTE_BOUND_M]
    if cb.empty:
        raise ValueError(f"{DATA}: no compute-bound row (M >= {COMPUTE_BOUND_M})")
    t = 2.0 * cb["M"] * cb["N"] * cb["K"] / (cb[tflops_col] * 1e12)
    fq = (2.0 * cb["M"] * cb["N"] * cb["K"]).to_numpy() if sms is None else \
        gemm_wave_flops(cb["M"].to_numpy(), cb["K"].to_numpy(), cb["N"].to_numpy(), sms)
    return np.asarray(fq / (peak_fp8 * t.to_numpy()))


def fit(preset: str = "h100-sxm") -> dict:
    df = rows()
    peak, sms = _datasheet(preset)
    e = efficiencies(df, peak, sms)
    df = df.assign(cutlass_tflops=df["tflops"] / df["speedup_vs_cutlass"])
    e_cut = efficiencies(df, peak, sms, "cutlass_tflops")
    return {"preset": preset, "eff_c_fp8": round(float(np.median(e)), 4),
            "band": [round(float(np.median(e_cut)), 4), round(float(np.median(e)), 4)],
            "rows": int(len(e)), "range": [round(float(e.min()), 4), round(float(e.max()), 4)]}


LINE = re.compile(r"^eff_c_fp8:.*$", re.M)
LOW_LINE = re.compile(r"^eff_c_fp8_low:.*\n", re.M)


def render(preset: str, text: str, f: dict) -> str:
    """The preset's text with its ``eff_c_fp8`` line rewritten and an ``eff_c_fp8_low`` line (the CUTLASS 3.6
    baseline: an FP8 run's band, ``sim.cost.bands``) right after it."""
    if not LINE.search(text):
        raise ValueError(f"{preset}.yaml: no 'eff_c_fp8:' line to rewrite")
    line = (f"eff_c_fp8: {f['eff_c_fp8']:.4f}".ljust(26)
            + f"# fitted (calibrate/fp8_gemm.py): median of {f['rows']} compute-bound FP8 GEMMs' fraction of "
              f"peak_flops_fp8 in whole waves, DeepGEMM README @ {COMMIT[:12]} (H800 SXM5 = H100 SXM die, 132 SMs; "
              f"range {f['range'][0]}-{f['range'][1]}; CUTLASS 3.6 baseline {f['band'][0]})")
    low = (f"eff_c_fp8_low: {f['band'][0]:.4f}".ljust(26)
           + f"# the same {f['rows']} products in DeepSeek's CUTLASS 3.6 implementation (the README's speedup column): "
             "an FP8 run's band prices its FP8 products at this rate too (sim/cost/bands.py)")
    text = LOW_LINE.sub("", text)
    return LINE.sub(lambda _: line + "\n" + low, text, count=1)


def main(argv=None) -> int:
    from sim.cost.profiles import PRESET_DIR

    ap = argparse.ArgumentParser(prog="python -m calibrate.fp8_gemm", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the eff_c_fp8 line of the presets")
    g.add_argument("--check", action="store_true", help="exit 1 if a shipped preset's eff_c_fp8 line differs")
    a = ap.parse_args(argv)
    files = {}
    for p in PRESETS:
        f = fit(p)
        print(f)
        path = PRESET_DIR / "hardware" / f"{p}.yaml"
        files[path] = render(p, path.read_text(), f)
    return write_or_check(files, write=a.write, check=a.check, how="python -m calibrate.fp8_gemm --write")


if __name__ == "__main__":
    sys.exit(main())
