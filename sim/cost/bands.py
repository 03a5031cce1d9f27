"""The band of a figure: the same run priced with each public fit of its device.

A fitted hardware preset (``calibration_status: public-profiles``) is one fit over several public
per-operator sources; ``band_fits`` in the preset lists the same device fitted on each source alone
(``python -m calibrate.public_profiles --write``; the cross-validation fits of
``calibrate/data/public-profiles-fit.json``). :func:`band_profiles` turns them into profiles: the
central profile with the coefficients of one source's fit (a coefficient that source cannot fit keeps
the central value). A figure's band is ``[min, max]`` over the central profile and these::

    band(metric) = [min_p metric(run on p), max_p metric(run on p)],  p in {central} + band profiles

so the central prediction always lies inside it. The band says how much the public data disagree
about the device; a measured figure outside it is a finding (something the cost model lacks), not a
tuning target.

The host-time range (issue 30, items 1 and 8). A preset's ``host_step`` is the engine core measured on vLLM
V1 plus a model runner (input preparation, the sampler's host side) cited from an older engine
(``runner_base_s`` / ``runner_per_running_s``: Vidur's Sarathi-Serve rows), which V1's persistent batch
likely undercuts. Where a run prices host time and its device's host time has such a part, every profile
above is priced once more with the engine core alone (:meth:`sim.cost.overheads.HostStepCost.engine_core_only`)::

    p in {central, fits} x {host time as priced, engine core only}

so the band spans both ranges at once (its low edge: the fastest fit with the least host time).

FP8 products. ``eff_c_fp8`` is fitted on DeepGEMM's kernels; the same table times DeepSeek's CUTLASS 3.6
implementation of the same products (``eff_c_fp8_low``, ``calibrate/fp8_gemm.py``). A run whose linear layers
are FP8 is priced with that rate too, on every profile above: ``x {DeepGEMM, CUTLASS 3.6}``.
"""
from __future__ import annotations

import dataclasses
import math

from sim.base.errors import PresetError

BAND_COEFFICIENTS = ("eff_c", "eff_m", "eff_elem", "eff_att", "eff_kv", "per_kernel_s")


def band_fits(hw) -> list[dict]:
    """The ``band_fits`` entries of ``hw``'s preset, checked (``PresetError`` naming the field)."""
    raw = (hw.extra or {}).get("band_fits") or []
    if not isinstance(raw, list):
        raise PresetError(f"{hw.source}: field 'band_fits' must be a list of fits, got {raw!r}")
    out = []
    for i, f in enumerate(raw):
        where = f"{hw.source}: band_fits[{i}]"
        if not isinstance(f, dict) or not str(f.get("fit_on", "")).strip():
            raise PresetError(f"{where}: each fit needs 'fit_on' (the source it was fitted on), got {f!r}")
        bad = sorted(set(f) - {"fit_on", *BAND_COEFFICIENTS})
        if bad:
            raise PresetError(f"{where}: unknown field(s) {', '.join(bad)}; valid: fit_on, {', '.join(BAND_COEFFICIENTS)}")
        for k in BAND_COEFFICIENTS:
            v = f.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0 or (k.startswith("eff") and not 0 < v <= 1.5)):
                raise PresetError(f"{where}: field {k!r} must be a number (an efficiency in (0, 1.5]), got {v!r}")
        out.append(f)
    return out


HOST_LOW = "host time: engine core only"   # the label of a band profile priced without the cited model runner
FP8_LOW = "FP8 products at CUTLASS 3.6's rate"   # ... with FP8 GEMMs at eff_c_fp8_low


def band_profiles(hw, host_time: bool = True, fp8: bool = False) -> list[tuple[str, object]]:
    """``[(label, profile), ...]`` of ``hw``'s band (its own profile not included; empty: no band): each public
    fit; then, where ``host_time`` (the run prices host time) and ``hw``'s host time has a cited model-runner part,
    the central profile and each fit with the engine core's host time alone; then, where ``fp8`` (the run's
    linear layers are FP8) and ``hw`` has ``eff_c_fp8_low``, every profile so far with FP8 products at that rate
    (module docstring: the product of the ranges)."""
    out = [("central", hw)]
    for f in band_fits(hw):
        coefs = {k: float(f[k]) for k in BAND_COEFFICIENTS if f.get(k) is not None}
        out.append((f"fit on {f['fit_on']}",
                    dataclasses.replace(hw, source=f"{hw.source}#band:{f['fit_on']}", **coefs)))
    axes = []
    host = hw.host_step
    if host_time and host is not None and host.has_runner_part:
        axes.append((HOST_LOW, {"host_step": host.engine_core_only()}))
    if fp8 and hw.eff_c_fp8_low is not None:
        axes.append((FP8_LOW, {"eff_c_fp8": hw.eff_c_fp8_low}))
    for name, change in axes:
        out += [(name if label == "central" else f"{label}, {name}",
                 dataclasses.replace(p, source=f"{p.source}#band:{name}", **change)) for label, p in out]
    return out[1:]


def band_options(info: dict | None) -> dict:
    """:func:`band_profiles`' ``host_time`` / ``fp8`` of the run a result's ``rksim`` record describes: whether it
    priced host time per step, and whether its linear layers are FP8 (``quantization``)."""
    return {"host_time": host_priced(info), "fp8": (info or {}).get("quantization") == "fp8"}


def host_priced(info: dict | None) -> bool:
    """Whether the run a result's ``rksim`` record describes priced host time per step (its band then spans the
    host-time range: :func:`band_profiles`' ``host_time``)."""
    return bool((((info or {}).get("overheads") or {}).get("host_step") or {}).get("priced"))


def band_of(values) -> list[float] | None:
    """``[min, max]`` of the finite values (None where none is)."""
    v = [float(x) for x in values if x is not None and isinstance(x, (int, float)) and math.isfinite(x)]
    return [min(v), max(v)] if v else None


__all__ = ["BAND_COEFFICIENTS", "FP8_LOW", "HOST_LOW", "band_fits", "band_profiles", "band_of", "band_options",
           "host_priced"]
