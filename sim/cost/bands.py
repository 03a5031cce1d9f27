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


def band_profiles(hw) -> list[tuple[str, object]]:
    """``[(label, profile), ...]`` of ``hw``'s band (its own profile not included; empty: no band)."""
    out = []
    for f in band_fits(hw):
        coefs = {k: float(f[k]) for k in BAND_COEFFICIENTS if f.get(k) is not None}
        out.append((f"fit on {f['fit_on']}",
                    dataclasses.replace(hw, source=f"{hw.source}#band:{f['fit_on']}", **coefs)))
    return out


def band_of(values) -> list[float] | None:
    """``[min, max]`` of the finite values (None where none is)."""
    v = [float(x) for x in values if x is not None and isinstance(x, (int, float)) and math.isfinite(x)]
    return [min(v), max(v)] if v else None


__all__ = ["BAND_COEFFICIENTS", "band_fits", "band_profiles", "band_of"]
