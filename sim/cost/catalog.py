"""The profile catalogue: every hardware profile a name resolves to, with what it rests on (``rksim profiles``)."""
from __future__ import annotations

from sim.cost.fingerprint import describe, profile_host_status
from sim.base.errors import PresetError
from sim.cost.profiles import list_presets, load_hardware, preset_origin, preset_path, user_profile_dir

# HardwareProfile.calibration_status -> the words the table shows
STATUS_WORDS = {"datasheet": "datasheet", "public-profiles": "public profiles", "end-to-end": "fitted end to end",
                "provisional": "provisional"}


def profiles_table(current: dict | None = None):
    """Every hardware profile a name resolves to: status, host, date, origin, and whether it is this host's.

    Status: ``datasheet`` (uncalibrated numbers), ``public profiles`` (fitted on published operator
    measurements), ``provisional``, ``fitted end to end``. Origin: ``user`` (the user profile
    directory), ``package`` (shipped), ``RKSIM_PRESETS``.
    """
    import pandas as pd


    rows = []
    for name in list_presets("hardware"):
        try:
            hw = load_hardware(name)
        except PresetError as exc:
            rows.append({"name": name, "status": f"unreadable: {exc}"})
            continue
        note = hw.calibration_note
        status = STATUS_WORDS.get(hw.calibration_status, hw.calibration_status)
        st = profile_host_status(hw, current) if hw.calibrated else {"host_match": None}
        fo = hw.extra.get("fitted_on") or {}
        rows.append({"name": name, "status": status,
                     "host": describe(hw.fingerprint) if hw.fingerprint else ("unrecorded" if hw.calibrated else ""),
                     "this_host": {True: "yes", False: "no", None: ""}[st["host_match"]],
                     "date": str(fo.get("created") or "")[:10],
                     "origin": preset_origin(preset_path("hardware", name)), "note": note})
    df = pd.DataFrame(rows)
    df.attrs["user_profile_dir"] = str(user_profile_dir())
    return df


__all__ = ["profiles_table", "STATUS_WORDS"]
