"""GPU presets fitted on public per-operator profiles, and a cross-validation across models.

Sources (``calibrate/data/<source>/SOURCE.md``: repository, commit, license):

* Vidur (MIT): H100 Llama-2-7B, A100 Llama-2-7B and Llama-3-8B non-attention operators,
  vLLM-style fused kernels (:mod:`calibrate.vidur`);
* LLMServingSim (MIT): H100 Llama-3.1-8B layer types under Hugging Face transformers,
  prefill attention included (:mod:`calibrate.llmservingsim`);
* LLMCompass (BSD-3): A100 matmul, softmax, LayerNorm, GELU (:mod:`calibrate.llmcompass`).

Every measured row is one operator: ``n`` tokens through a matrix product with a ``K x N``
weight, an element-wise kernel, or attention over ``c`` cached tokens. Its terms follow the
cost model's accounting (:mod:`sim.cost.terms`, ``s = 2`` bytes, float16)::

    matrix product   F = 2 n K N              B = s K N                      (the weight stream)
    RMSNorm          B = s (2 n d + d)        RoPE  B = s 2 n (H + Hkv) Dh
    SiLU(gate)*up    B = s 3 n F_mlp          add   B = s 3 n d
    (vLLM's fused kernels; under the ``hf-eager`` stack, k kernels and their bytes:
    :mod:`calibrate.kernel_stacks`)
    softmax, LayerNorm over M x N, GELU over M:    B = s 2 (elements)
    attention        F = 4 H Dh (n c + n (n + 1) / 2)    B = s 2 Hkv Dh (c + n)

and its time is the per-operator roofline of :class:`sim.cost.hardware.HardwareProfile`::

    t = max(F / (peak eff_c), B / (bw eff_m)) + per_kernel_s          matrix products
    t = B / (bw eff_elem) + k per_kernel_s                            element-wise (k kernels)
    t = max(F / (peak eff_att), B / (bw eff_kv)) + per_kernel_s       attention

Where the preset's datasheet header sets ``sm_count`` (the H100's 132 SMs), a matrix
product's ``F`` is whole waves of CTA tiles, ``F_q = ceil(tiles / sm) sm tm tn 2 K`` with
``tiles = ceil(n / tm) ceil(N / tn)`` (:func:`sim.cost.gemm.gemm_wave_flops`, the simulator's own
function; fixed tiles, nothing fitted), so each row carries its weight's ``K`` and ``N``.

Fit: ``scipy.optimize.least_squares`` on relative residuals with a soft-L1 loss
(``f_scale = 0.05``), each profile weighted equally (its rows share weight 1), all
efficiencies bounded by 1 (achieved <= peak). A coefficient is fitted only where a row
constrains it: ``eff_att`` where a source times attention, ``eff_kv`` only where that
attention reads cached tokens (``c > 0``; no shipped row does, so ``eff_kv`` stays null =
``eff_m``), ``eff_elem`` only on fused element-wise kernels.

Which kernels a preset follows: vLLM's (fused q/k/v and gate/up GEMMs, fused RMSNorm, RoPE
and SiLU*mul, one kernel each: :data:`sim.cost.terms.K_LAYER`). Vidur's and LLMCompass's
element-wise rows are such single kernels; LLMServingSim's Hugging Face element-wise
operators (RMSNorm as 8 PyTorch kernels, RoPE as 10: :mod:`calibrate.kernel_stacks`) are
not, so they are held out of the preset fit and reported in the cross-validation as the
stack difference they are. Its GEMMs (cuBLAS) and attention (PyTorch SDPA) are fit rows.

Cross-validation (:func:`cross_validate`, tables :data:`CROSS`): the same fit on one model's
profile predicts another model's measured operators and layer sums at 1..4,096 tokens per
forward: H100 Vidur Llama-2-7B <-> LLMServingSim Llama-3.1-8B with every element-wise row
priced as vLLM's fused kernel (``h100``) and with each source's rows priced under its own
kernel stack (``h100-by-stack``: LLMServingSim's as Hugging Face eager runs them, kernel
counts and bytes from the shape, fit rows when it is the source); H100 Vidur Llama-2-7B <->
CodeLlama-34B and InternLM-20B, one profiler and one stack (``h100-same-stack``); A100 Vidur
Llama-2-7B <-> Llama-3-8B (``a100``).

``python -m calibrate.public_profiles`` prints the fits; ``--write`` rewrites the fitted part
of ``sim/presets/hardware/{h100-sxm,a100-80gb}.yaml`` (the datasheet header above the
``# Not on a datasheet`` line is kept) and ``calibrate/data/public-profiles-fit.json``;
``--check`` exits 1 if a shipped preset or the JSON differs byte for byte from what the
shipped data gives (``tests/test_public_profiles.py`` runs it).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import numpy as np
import pandas as pd

from .public_render import crossval_markdown, fits_markdown, outputs
from .public_rows import FAMILY_ORDER, LAYER_FAMILIES, PERF_PROFILES, PROFILES, source_of
from .shipped import write_or_check

F_SCALE = 0.05
MAX_TOKENS_CV = 4096
LAYER_INTERCEPT_SOURCE = "aiconfigurator-"


# ----------------------------------------------------------------------------- the model and the fit
@dataclasses.dataclass(frozen=True)
class Coefs:
    """Fitted coefficients; None: not constrained by the rows (the profile's default applies)."""

    eff_c: float
    eff_m: float
    eff_elem: float | None
    eff_att: float | None
    eff_kv: float | None
    per_kernel_s: float
    host_call_s: float | None = None   # host-timed rows' launch + synchronise overhead (LLMCompass); not a preset field
    per_layer_s: float | None = None   # attention's fixed time beyond per_kernel_s, once a layer (aiconfigurator's FA3)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def predict(rows: pd.DataFrame, k: Coefs, peak: float, bw: float, sms: int | None = None) -> np.ndarray:
    """Seconds of every row under the per-operator roofline (module docstring); None = the profile default.

    ``sms`` (the preset's ``sm_count``): matrix products' flops are whole waves of CTA tiles,
    :func:`sim.cost.gemm.gemm_wave_flops` (the simulator's function), instead of ``2 n K N``.
    """
    F, B = rows["F"].to_numpy(), rows["B"].to_numpy()
    kind = rows["kind"].to_numpy()
    if sms:
        from sim.cost.gemm import gemm_wave_flops
        F = np.where(kind == "gemm", gemm_wave_flops(rows["n"].to_numpy(), rows["K"].to_numpy(),
                                                     rows["N"].to_numpy(), sms), F)
    e_elem = k.eff_m if k.eff_elem is None else k.eff_elem
    e_att = k.eff_c if k.eff_att is None else k.eff_att
    e_kv = k.eff_m if k.eff_kv is None else k.eff_kv
    att = np.char.startswith(kind.astype(str), "attn")     # attn, and attn_mixed (held out, reported)
    rc = np.where(att, peak * e_att, peak * k.eff_c)
    rb = np.select([kind == "gemm", att], [bw * k.eff_m, bw * e_kv], bw * e_elem)
    host = rows["host_timed"].to_numpy(dtype=bool) * (k.host_call_s or 0.0)
    layer = att * (k.per_layer_s or 0.0)   # one attention kernel a layer: its fixed time is the layer's
    return np.maximum(F / rc, B / rb) + k.per_kernel_s * rows["kernels"].to_numpy() + host + layer


def _soft_l1(r: np.ndarray) -> np.ndarray:
    """Signed residual whose square is scipy's soft-L1 rho: ``2 f^2 (sqrt(1 + (r/f)^2) - 1)``."""
    return np.sign(r) * F_SCALE * np.sqrt(2.0 * (np.sqrt(1.0 + (r / F_SCALE) ** 2) - 1.0))


def fit_rows(rows: pd.DataFrame, peak: float, bw: float, sms: int | None = None) -> Coefs:
    """Least-squares fit of the coefficients the rows constrain (module docstring)."""
    from scipy.optimize import least_squares

    kind = rows["kind"].to_numpy()
    has_elem = bool(np.any(kind == "elem"))
    has_att = bool(np.any(kind == "attn"))
    has_kv = has_att and bool(np.any(rows.loc[kind == "attn", "c"].to_numpy() > 0))
    y = rows["seconds"].to_numpy()
    w = 1.0 / rows.groupby("profile")["profile"].transform("size").to_numpy(np.float64)
    sw = np.sqrt(w / w.sum())
    has_host = bool(rows["host_timed"].any())
    # attention's own fixed time, where attention is timed as vLLM runs it whole (aiconfigurator's FA3 rows: a
    # ~9 us floor no GEMM has); other sources' attention rows keep one intercept, so their presets are unchanged
    has_layer = has_att and bool(rows.loc[kind == "attn", "profile"].str.startswith(LAYER_INTERCEPT_SOURCE).any())
    # parameters: log eff_c, log eff_m, log eff_elem, log eff_att, log eff_kv, per_kernel_s (us), host_call_s (us),
    # per_layer_s (us); only those the rows constrain are optimised (a free parameter with no gradient slows trf)
    free = np.array([True, True, has_elem, has_att, has_kv, True, has_host, has_layer])

    def full(z):
        x = np.zeros(8)
        x[free] = z
        return x

    def coefs(x) -> Coefs:
        e = [math.exp(v) for v in x[:5]]
        return Coefs(e[0], e[1], e[2] if free[2] else None, e[3] if free[3] else None,
                     e[4] if free[4] else None, x[5] * 1e-6, x[6] * 1e-6 if has_host else None,
                     x[7] * 1e-6 if has_layer else None)

    def resid(z):
        return sw * _soft_l1(predict(rows, coefs(full(z)), peak, bw, sms) / y - 1.0)

    lo = np.array([-10.0] * 5 + [0.0, 0.0, 0.0])[free]
    hi = np.array([0.0] * 5 + [1e3, 1e4, 1e3])[free]
    best = None
    for start in ((math.log(0.7), math.log(0.8), math.log(0.5), math.log(0.3), math.log(0.5), 4.0, 20.0, 4.0),
                  (math.log(0.3), math.log(0.3), math.log(0.3), math.log(0.1), math.log(0.2), 1.0, 5.0, 1.0),
                  (-0.01, -0.01, -0.01, -0.01, -0.01, 10.0, 50.0, 10.0)):
        r = least_squares(resid, np.asarray(start, float)[free], method="trf", x_scale=1.0, bounds=(lo, hi),
                          ftol=1e-12, xtol=1e-12, gtol=1e-12)   # converged well past the 4 digits written
        if best is None or r.cost < best.cost:
            best = r
    return coefs(full(best.x))


# ----------------------------------------------------------------------------- reporting
def _stats(rel: np.ndarray) -> dict:
    a = np.abs(rel)
    return {"rows": int(rel.size), "median": float(np.median(rel)), "median_abs": float(np.median(a)),
            "p90_abs": float(np.quantile(a, 0.9)), "max_abs": float(a.max())}


def layer_sums(rows: pd.DataFrame, pred: np.ndarray, families=None) -> pd.DataFrame:
    """Measured and predicted sums over one decoder layer's timed operators, per token count.

    Sizes profiled twice are averaged per operator first (median), then summed.
    """
    sel = rows["in_layer"].to_numpy(dtype=bool).copy()
    if families is not None:
        sel &= rows["family"].isin(families).to_numpy()
    d = rows.loc[sel, ["n", "op"]].assign(y=rows.loc[sel, "seconds"].to_numpy(), p=pred[sel])
    per_op = d.groupby(["n", "op"], sort=True)[["y", "p"]].median()
    return per_op.groupby(level="n").sum()


def _r4(x):
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _r4(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_r4(v) for v in x]
    return x


def evaluate(rows: pd.DataFrame, k: Coefs, peak: float, bw: float, max_tokens: int | None = None,
             shared: tuple | None = None, sms: int | None = None) -> dict:
    """Per-family and per-layer-sum relative errors of ``k`` on ``rows`` (``n <= max_tokens``).

    Layer sums: ``layer`` (every timed operator of the layer), ``layer_gemm_attention``,
    ``layer_gemm`` and, with ``shared`` (the families the fit's source also times, so that the
    fit constrains their coefficients), ``layer_shared``.
    """
    if max_tokens is not None:
        rows = rows[rows["n"] <= max_tokens].reset_index(drop=True)
    p = predict(rows, k, peak, bw, sms)
    rel = p / rows["seconds"].to_numpy() - 1.0
    fams = {f: _stats(rel[(rows["family"] == f).to_numpy()]) for f in FAMILY_ORDER if (rows["family"] == f).any()}
    out = {"tokens": [int(rows["n"].min()), int(rows["n"].max())], "by_family": fams}
    ops = rows["op"].to_numpy()
    regimes = [o for o in ("attention_decode", "attention_prefill", "attention_mixed") if (ops == o).any()]
    if regimes:   # vLLM-profile attention by batch kind, and where kernels run over 100 us (the intercept aside)
        big = rows["seconds"].to_numpy() > 1e-4
        out["attention_by_regime"] = {o: {"all": _stats(rel[ops == o]),
                                          "over_100us": _stats(rel[(ops == o) & big]) if ((ops == o) & big).any()
                                          else None} for o in regimes}
    if rows["in_layer"].any():
        groups = {"layer": None, "layer_gemm_attention": ("qkv", "o", "gate_up", "down", "attention"),
                  "layer_gemm": ("qkv", "o", "gate_up", "down")}
        if shared is not None:
            groups["layer_shared"] = tuple(f for f in LAYER_FAMILIES if f in shared)
        for name, fam in groups.items():
            ls = layer_sums(rows, p, fam)
            if ls.empty:    # a profile of attention alone has no GEMM sums
                continue
            r = (ls["p"] / ls["y"] - 1.0).to_numpy()
            n = ls.index.to_numpy()
            out[name] = {**_stats(r), "decode_like_n_le_128": _stats(r[n <= 128]),
                         "prefill_like_n_gt_128": _stats(r[n > 128]) if np.any(n > 128) else None,
                         "ops": sorted(rows.loc[rows["in_layer"] & (rows["family"].isin(fam) if fam else True),
                                                "op"].unique().tolist())}
    return out


# ----------------------------------------------------------------------------- presets
PRESETS = {
    # preset -> (profiles fitted, kinds held out of the fit, device words, fitted_range.dtypes enforced)
    # h100-sxm does not enforce its dtypes: as a datasheet preset it priced float32 models (the synthetic and
    # bundled traces' own models) at the 16-bit peak, and that use stays; 8-/4-bit dtypes are refused on
    # every profile (sim.cost.hardware.HardwareProfile.check_dtype). a100-80gb enforced them before and still does.
    "h100-sxm": (("vidur-h100-llama-2-7b", "llmservingsim-h100-llama-3.1-8b"), ("elem_unfused",),
                 "NVIDIA H100 (Vidur's 'h100'; LLMServingSim's 'H100')", False),
    "a100-80gb": (("vidur-a100-llama-2-7b", "vidur-a100-llama-3-8b", "llmcompass-a100"), ("elem_unfused",),
                  "NVIDIA A100 (Vidur's 'a100'; LLMCompass's real A100 80GB)", True),
    # vLLM 0.19's own kernels, one decoder layer per model (calibrate.llmservingsim_perf); batches mixing a prefill
    # chunk with decodes are held out and reported (attn_mixed)
    "rtx-pro-6000": (tuple(f"llmservingsim-rtxpro6000-{m}{p}" for m in ("llama-3.1-8b", "qwen3-32b", "qwen3-30b-a3b")
                           for p in ("", "-attention")), ("attn_mixed",),
                     "NVIDIA RTX PRO 6000 Blackwell Server Edition (LLMServingSim's 'RTXPRO6000')", True),
    "rtx-4090": (("llmservingsim-rtx4090-llama-3.1-8b", "llmservingsim-rtx4090-llama-3.1-8b-attention"),
                 ("attn_mixed",), "NVIDIA GeForce RTX 4090 (LLMServingSim's 'RTX4090')", True),
    # vLLM 0.24's cuBLAS GEMMs and FlashAttention 3 timed by aiconfigurator (calibrate.aiconfigurator); dtypes not
    # enforced, as h100-sxm (a datasheet preset before, it priced float32 models at the 16-bit peak)
    "h200": (("aiconfigurator-h200-gemm", "aiconfigurator-h200-attention"), (),
             "NVIDIA H200 (aiconfigurator's 'h200_sxm', vLLM 0.24.0)", False),
}
CROSS = {  # table -> ((fit profile, held-out profile), ...)
    # across sources, every element-wise row priced as vLLM's fused kernel (LLMServingSim's held out of its fit)
    "h100": (("vidur-h100-llama-2-7b", "llmservingsim-h100-llama-3.1-8b"),
             ("llmservingsim-h100-llama-3.1-8b", "vidur-h100-llama-2-7b")),
    "a100": (("vidur-a100-llama-2-7b", "vidur-a100-llama-3-8b"),
             ("vidur-a100-llama-3-8b", "vidur-a100-llama-2-7b")),
    # across sources, each source's rows priced under the kernel stack that produced them (kernel_stacks)
    "h100-by-stack": (("vidur-h100-llama-2-7b", "llmservingsim-h100-llama-3.1-8b@hf-eager"),
                      ("llmservingsim-h100-llama-3.1-8b@hf-eager", "vidur-h100-llama-2-7b")),
    # one source, one stack (Vidur's profiler, vLLM's kernels, the same H100), another model
    "h100-same-stack": (("vidur-h100-llama-2-7b", "vidur-h100-codellama-34b"),
                        ("vidur-h100-codellama-34b", "vidur-h100-llama-2-7b"),
                        ("vidur-h100-llama-2-7b", "vidur-h100-internlm-20b"),
                        ("vidur-h100-internlm-20b", "vidur-h100-llama-2-7b")),
}
_RTX = {m: f"llmservingsim-rtxpro6000-{m}+llmservingsim-rtxpro6000-{m}-attention"
        for m in ("llama-3.1-8b", "qwen3-32b", "qwen3-30b-a3b")}
CROSS["rtxpro6000-same-stack"] = (   # one profiler, vLLM's kernels, one device, another model ("+": profiles joined)
    (_RTX["llama-3.1-8b"], _RTX["qwen3-32b"]), (_RTX["qwen3-32b"], _RTX["llama-3.1-8b"]),
    (_RTX["llama-3.1-8b"], _RTX["qwen3-30b-a3b"]))
CROSS["rtxpro6000-tp2"] = tuple(   # the same model's fit at TP 1 predicts one rank's shard at TP 2 (no all-reduce)
    (_RTX[m], f"llmservingsim-rtxpro6000-{m}-tp2+llmservingsim-rtxpro6000-{m}-tp2-attention")
    for m in ("llama-3.1-8b", "qwen3-32b"))
_AIC = {d: f"aiconfigurator-{d}-gemm+aiconfigurator-{d}-attention" for d in ("h100", "h200")}
# H100: vLLM's kernels timed whole (aiconfigurator) against the two sources h100-sxm is fitted on, both ways
CROSS["h100-aiconfigurator"] = ((_AIC["h100"], "vidur-h100-llama-2-7b"), (_AIC["h100"], "llmservingsim-h100-llama-3.1-8b"),
                                ("vidur-h100-llama-2-7b+llmservingsim-h100-llama-3.1-8b", _AIC["h100"]))
# H200: decode over an fp8 KV cache, priced by the bf16 fit with its bytes halved
CROSS["h200"] = ((_AIC["h200"], "aiconfigurator-h200-attention-kv-fp8"),)
CROSS_PRESET = {"h100": "h100-sxm", "a100": "a100-80gb", "h100-by-stack": "h100-sxm", "h100-same-stack": "h100-sxm",
                "h100-aiconfigurator": "h100-sxm", "h200": "h200",
                "rtxpro6000-same-stack": "rtx-pro-6000", "rtxpro6000-tp2": "rtx-pro-6000"}


def _datasheet(preset: str) -> tuple[float, float, int | None]:
    """``peak_flops``, ``mem_bw`` and ``sm_count`` (None: no wave quantisation) of a preset's datasheet header."""
    from sim.cost.profiles import PRESET_DIR, read_preset_file

    d = read_preset_file(PRESET_DIR / "hardware" / f"{preset}.yaml")
    sms = d.get("sm_count")
    return float(d["peak_flops"]), float(d["mem_bw"]), None if sms is None else int(sms)


def _fit_scope(rows: pd.DataFrame, held_kinds) -> pd.DataFrame:
    return rows[~rows["kind"].isin(held_kinds)].reset_index(drop=True)


def fit_preset(preset: str, cache: dict | None = None) -> dict:
    """Fit one preset on its profiles; coefficients, per-profile residuals, sources and row counts."""
    profiles, held, device, enforce = PRESETS[preset]
    cache = {} if cache is None else cache
    peak, bw, sms = _datasheet(preset)
    allrows = {p: cache.setdefault(p, PROFILES[p]()) for p in profiles}
    fitrows = pd.concat([_fit_scope(r, held) for r in allrows.values()], ignore_index=True)
    k = fit_rows(fitrows, peak, bw, sms)
    srcs = []
    for p, r in allrows.items():
        used = _fit_scope(r, held)
        srcs.append({"profile": p, **source_of(p), "rows_used": int(len(used)),
                     "rows_held_out": int(len(r) - len(used)),
                     "operators_used": sorted(used["op"].unique().tolist()),
                     "tokens": [int(r["n"].min()), int(r["n"].max())]})
    resid = {p: evaluate(r, k, peak, bw, sms=sms) for p, r in allrows.items()}
    # LLMServingSim's vLLM profiles are bf16 and time vLLM's attention backend (the preset's notes say so)
    notes = ({"measured_dtype": "bfloat16", "attention_source": "vllm"} if set(profiles) <= set(PERF_PROFILES) else
             {"measured_dtype": "bfloat16", "attention_source": "vllm-fa3"}
             if all(p.startswith(LAYER_INTERCEPT_SOURCE) for p in profiles) else {})
    sized = fitrows["in_layer"] | fitrows["family"].isin(["lm_head"] if not notes.get("attention_source") == "vllm-fa3"
                                                         else ["matmul"])   # aiconfigurator: GEMMs' rows
    return {"preset": preset, "device": device, "enforce_dtypes": enforce, **notes, "peak_flops": peak, "mem_bw": bw,
            "sm_count": sms, "coefficients": k.as_dict(),
            "rows": int(len(fitrows)), "max_tokens": int(fitrows.loc[sized, "n"].max()), "sources": srcs, "residuals": resid}


def _joined(name: str, cache: dict) -> pd.DataFrame:
    """The rows of a profile, or of several joined by ``+`` (a model's operators and its attention)."""
    return pd.concat([cache.setdefault(p, PROFILES[p]()) for p in name.split("+")], ignore_index=True)


def cross_validate(cache: dict | None = None) -> dict:
    """Fit on one model's profile, predict the other's (module docstring); both directions per device."""
    cache = {} if cache is None else cache
    out = {}
    for dev, pairs in CROSS.items():
        peak, bw, sms = _datasheet(CROSS_PRESET[dev])
        held = PRESETS[CROSS_PRESET[dev]][1]
        res = []
        for fit_p, test_p in pairs:
            fr, tr = _joined(fit_p, cache), _joined(test_p, cache)
            scope = _fit_scope(fr, held)
            shared = tuple(sorted(set(scope.loc[scope["in_layer"], "family"]) & set(tr.loc[tr["in_layer"], "family"])))
            k = fit_rows(scope, peak, bw, sms)
            res.append({"fit_on": fit_p, "predict": test_p, "coefficients": k.as_dict(), "sm_count": sms,
                        "held_out": evaluate(tr, k, peak, bw, MAX_TOKENS_CV, shared, sms)})
        out[dev] = res
    return out


def run_all() -> dict:
    cache: dict = {}
    fits = {p: fit_preset(p, cache) for p in PRESETS}
    return _r4({"fits": fits, "cross_validation": cross_validate(cache)})


def main(argv=None) -> int:

    ap = argparse.ArgumentParser(prog="python -m calibrate.public_profiles", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the fitted presets and the JSON")
    g.add_argument("--check", action="store_true", help="exit 1 if a shipped preset or the JSON differs from the fit")
    a = ap.parse_args(argv)
    res = run_all()
    print(fits_markdown(res["fits"]))
    print()
    print(crossval_markdown(res["cross_validation"]))
    rc = write_or_check(outputs(res), write=a.write, check=a.check, how="python -m calibrate.public_profiles --write")
    if a.check and rc == 0:
        print("shipped presets and JSON match the fit byte for byte")
    return rc


if __name__ == "__main__":
    sys.exit(main())
