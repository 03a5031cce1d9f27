"""What the public-profile fits write: the presets' fitted YAML, the fit JSON, and the tables
docs/calibration.md quotes (``python -m calibrate.public_profiles --write``)."""
from __future__ import annotations

import json
from pathlib import Path

from .public_rows import FAMILY_ORDER

FIT_JSON = Path(__file__).resolve().parent / "data" / "public-profiles-fit.json"
COEFS = ("eff_c", "eff_m", "eff_elem", "eff_att", "eff_kv", "per_kernel_s")


FIT_MARK = "# Not on a datasheet"


def _fmt(v: float | None, spec: str) -> str:
    return "null" if v is None else format(v, spec)


BAND_TABLE = {"h100-sxm": "h100", "a100-80gb": "a100"}   # the cross-validation table whose fits make a preset's band


def band_fits(preset: str, cross: dict) -> list[dict]:
    """The preset's device fitted on each public source alone (``cross_validate``'s fits of
    :data:`BAND_TABLE`): the band every figure carries (``sim.cost.bands``). Coefficients a source
    cannot fit (None) are left out: the central fit's value applies."""
    out = []
    for r in cross.get(BAND_TABLE.get(preset, ""), []):
        out.append({"fit_on": r["fit_on"], **{k: v for k, v in r["coefficients"].items() if v is not None
                                              and k != "host_call_s"}})
    return out


def _coefficient_comments(k: dict, fit: dict) -> tuple[str, str, str, str, str]:
    """What each fitted line's comment says: where ``eff_att``, ``eff_kv``, ``eff_elem`` came from, the
    ``per_layer_s`` line itself (fitted where attention was timed whole, else the assumption), and the calibration
    note's words on attention."""
    vllm_att = fit.get("attention_source") == "vllm"   # LLMServingSim's vLLM profiles: prefill and decode batches
    fa3 = fit.get("attention_source") == "vllm-fa3"    # aiconfigurator's vLLM FlashAttention 3 batches
    att = (("fitted: attention's fraction of peak (vLLM's FlashAttention 3: prefill and decode batches, aiconfigurator)"
            if fa3 else
            "fitted: attention's fraction of peak (vLLM's backend: prefill chunks and decodes, LLMServingSim)"
            if vllm_att else "fitted: attention's fraction of peak (prefill over an empty cache, LLMServingSim)")
           if k["eff_att"] is not None else "not fitted: no source times attention; eff_c applies")
    kv = ("fitted: attention over cached tokens' fraction of mem_bw (decode KV reads, vLLM's backend)"
          if k["eff_kv"] is not None else
          "not fitted: no source times attention over cached tokens (decode KV reads); eff_m applies")
    elem = ("fitted: fused element-wise kernels' fraction of mem_bw" if k["eff_elem"] is not None
            else "not fitted: no source times element-wise kernels; eff_m applies")
    per_layer = (f"per_layer_s: {_fmt(k['per_layer_s'], '.3e')}".ljust(26)
                 + "# fitted: attention's fixed time beyond per_kernel_s, once a layer (one attention kernel a layer)"
                 if k.get("per_layer_s") is not None else
                 "per_layer_s: 0.0".ljust(26) + "# assumption: no per-layer cost beyond its kernels")
    att_note = (("prefill and decode attention from vLLM 0.24's FlashAttention 3 (aiconfigurator), decode over "
                 "cached tokens included" if fa3 else
                 "prefill and decode attention from vLLM 0.19's backend (LLMServingSim); batches mixing a prefill "
                 "chunk with decodes held out" if vllm_att else
                 "prefill attention from LLMServingSim (HF SDPA); decode KV reads not measured")
                if k["eff_att"] is not None else "attention not in any source; decode KV reads not measured")
    return att, kv, elem, per_layer, att_note


def render_preset(preset: str, fit: dict, current_text: str, cross: dict | None = None) -> str:
    """The preset's YAML: its datasheet header kept, everything from ``FIT_MARK`` on regenerated."""
    import yaml

    if FIT_MARK not in current_text:
        raise ValueError(f"{preset}.yaml: no line starting {FIT_MARK!r} to regenerate from")
    head = current_text[:current_text.index(FIT_MARK)]
    k = fit["coefficients"]
    srcs = fit["sources"]
    names = ", ".join(s["profile"] for s in srcs)
    att, kv, elem, per_layer, att_note = _coefficient_comments(k, fit)
    lines = [
        f"{FIT_MARK}: fitted on public per-operator profiles ({names}) by",
        "# `python -m calibrate.public_profiles --write` (calibrate/public_profiles.py); do not edit below by hand.",
        f"eff_c: {_fmt(k['eff_c'], '.4f')}".ljust(26) + "# fitted: matrix products' fraction of peak_flops"
        + (" within whole waves of tiles (sm_count)" if fit.get("sm_count") else ""),
        f"eff_m: {_fmt(k['eff_m'], '.4f')}".ljust(26) + "# fitted: weight streams' fraction of mem_bw",
        f"eff_elem: {_fmt(k['eff_elem'], '.4f')}".ljust(26) + f"# {elem}",
        f"eff_att: {_fmt(k['eff_att'], '.4f')}".ljust(26) + f"# {att}",
        f"eff_kv: {_fmt(k['eff_kv'], '.4f')}".ljust(26) + f"# {kv}",
        f"per_kernel_s: {_fmt(k['per_kernel_s'], '.3e')}".ljust(26) + "# fitted: the per-operator intercept",
        per_layer,
        "roofline: operator".ljust(26) + "# the form fitted: each operator its own roofline, element-wise kernels charged",
        "calibrated: false".ljust(26) + "# not end to end on this device: see calibration_status",
        "calibration_status: public-profiles",
    ]
    fr = {"device": fit["device"]}
    measured = fit.get("measured_dtype", "float16")
    if fit["enforce_dtypes"] and measured == "bfloat16":
        fr["dtypes"] = ["float16", "bfloat16"]
        why = "measured in bfloat16; fp16 runs at bf16's tensor-core peak (datasheet)"
    elif fit["enforce_dtypes"]:
        fr["dtypes"] = ["float16", "bfloat16"]
        why = "measured in float16; bf16 runs at fp16's tensor-core peak (datasheet)"
    else:
        why = (f"measured in {measured}; dtypes not enforced (float32 priced at the 16-bit peak, as before; "
               "8-/4-bit refused)")
    fr["max_new_tokens"] = fit["max_tokens"]
    lines.append("fitted_range: " + json.dumps(fr) + f"   # {why}; no model restriction: see docs/calibration.md")
    rows = " + ".join(f"{s['rows_used']:,}" for s in srcs)
    block = {
        "calibration_note": (f"fitted on public per-operator profiles ({names}; {rows} operator rows, {measured}, "
                             f"1-{fit['max_tokens']} tokens); {att_note}; host time "
                             "per step and front-end time priced apart (host_step, frontend); not end to end"),
        "reference": {
            "sources": [{k2: s[k2] for k2 in ("profile", "repo", "path", "commit", "license", "shipped", "rows_used",
                                              "rows_held_out", "operators_used", "tokens")} for s in srcs],
            "rows": fit["rows"],
            "residuals_median_abs_by_profile": {p: {f: v["median_abs"] for f, v in r["by_family"].items()}
                                                for p, r in fit["residuals"].items()},
            "layer_sum_median_abs_by_profile": {p: r["layer"]["median_abs"] for p, r in fit["residuals"].items()
                                                if "layer" in r},
            "details": "calibrate/data/public-profiles-fit.json",
        },
    }
    band = band_fits(preset, cross or {})
    if band:
        # each public source fitted alone: every figure is priced with these too, as its low-high band
        block["band_fits"] = band
    return head + "\n".join(lines) + "\n" + yaml.safe_dump(block, sort_keys=False, width=100)


def preset_path(preset: str) -> Path:
    from sim.cost.profiles import PRESET_DIR

    return PRESET_DIR / "hardware" / f"{preset}.yaml"


def outputs(res: dict) -> dict[Path, str]:
    """Every file the fit writes, path -> text."""
    out = {FIT_JSON: json.dumps(res, indent=1, sort_keys=False) + "\n"}
    for p, fit in res["fits"].items():
        path = preset_path(p)
        out[path] = render_preset(p, fit, path.read_text(), res["cross_validation"])
    return out


# ----------------------------------------------------------------------------- doc tables
def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _apct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _short(name: str) -> str:
    """A joined profile's name as the table shows it: ``a+a-attention`` is ``a (+ attention)``."""
    parts = name.split("+")
    return parts[0] + "".join(" (+ attention)" if p == parts[0] + "-attention" else f" + {p}" for p in parts[1:])


def crossval_markdown(cv: dict) -> str:
    """The cross-validation tables docs/calibration.md quotes (one per device)."""
    parts = []
    for dev, pairs in cv.items():
        fams = [f for f in FAMILY_ORDER if any(f in p["held_out"]["by_family"] for p in pairs)]
        hdr = ("| fit on → predict | tokens | " + " | ".join(fams)
               + " | layer sum | layer: families both time | layer: GEMM + attention | layer: GEMM |")
        sep = "| --- " * (len(fams) + 6) + "|"
        lines = [f"{dev.upper()} (median signed error per operator family; layer sums: median / p90 of |error|)", "",
                 hdr, sep]
        for p in pairs:
            h = p["held_out"]
            cells = [_pct(h["by_family"][f]["median"]) if f in h["by_family"] else "—" for f in fams]
            lay = [f"{_apct(h[g]['median_abs'])} / {_apct(h[g]['p90_abs'])}" if g in h else "—" for g in
                   ("layer", "layer_shared", "layer_gemm_attention", "layer_gemm")]
            lines.append(f"| {_short(p['fit_on'])} → {_short(p['predict'])} | {h['tokens'][0]}–{h['tokens'][1]} | "
                         + " | ".join(cells) + " | " + " | ".join(lay) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def fits_markdown(fits: dict) -> str:
    """The fitted coefficients table docs/calibration.md quotes."""
    lines = ["| preset | rows | eff_c | eff_m | eff_elem | eff_att | eff_kv | per_kernel_s | layer sum median abs error |",
             "| --- " * 9 + "|"]
    for p, f in fits.items():
        k = f["coefficients"]
        lay = ", ".join(f"{q}: {_apct(r['layer']['median_abs'])}" for q, r in f["residuals"].items() if "layer" in r)
        lines.append(f"| `{p}` | {f['rows']:,} | " + " | ".join(_fmt(k[c], ".3f") for c in COEFS[:5])
                     + f" | {k['per_kernel_s'] * 1e6:.2f} µs | {lay} |")
    return "\n".join(lines)
