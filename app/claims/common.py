"""What every claim unit and the reproduction driver share: the paper's targets, rounding, the evidence
words (whether a policy acted, whose timing a row reuses, what a profile rests on) and the row builder.

Below both: ``app.reproduce`` (the driver) and the units of ``app.claims`` import it, and it imports neither.
"""
from __future__ import annotations

import math

import pandas as pd

from app.verdicts import fmt

# The paper's targets (model preset, hardware preset): a 7B-class model on an H100 for RKSC, the
# Qwen3 sizes VASE reports on, both at bf16 (DESIGN §7 names the figures, not the GPUs: this is our
# reading, stated in every row).
RKSC_TARGET = ("qwen2.5-7b", "h100-sxm")
VASE_TARGETS = (("qwen3-4b", "h100-sxm"), ("qwen3-14b", "h100-sxm"))
PAPER_SHAPE = "prefix_tokens=1024,branches=8,gen_tokens=256"


def rounded(x, nd: int = 4):
    """A float rounded for the report (None / NaN stay None)."""
    if x is None:
        return None
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return x
    if not math.isfinite(xf):
        return None
    return float(f"{xf:.{nd}g}")


def reused_timings(res: dict) -> set:
    """Policies whose ``verify_reuses_kv`` timing is the recompute run's, copied rather than measured.

    ``calibrate speedup`` names them (``reused_timings``); older files are recognised by the copy
    itself (the same float, bit for bit, in both sections).
    """
    r2 = res.get("verify_reuses_kv") or {}
    if "reused_timings" in r2:
        return set(r2["reused_timings"])
    lat, lat2 = res.get("latency_s") or {}, r2.get("latency_s") or {}
    return {k for k, v in lat2.items() if k in lat and lat[k] == v}


# a profile's status in a condition's kind
PROFILE_PHRASE = {"datasheet": "datasheet profile", "public profiles": "profile fitted on public per-operator measurements",
                  "fitted end to end": "profile fitted end to end", "provisional": "provisional profile"}


def profile_status(hw: str) -> str:
    """What a hardware profile rests on, in the words of ``rksim profiles`` (datasheet, public profiles,
    fitted end to end, provisional): a property of the profile, never of the host running the report."""
    from sim.cost.catalog import STATUS_WORDS
    from sim.cost.profiles import load_hardware
    st = load_hardware(hw).calibration_status
    return STATUS_WORDS.get(st, st)


SHARING_LAYOUTS = ("persona-prefix", "paraphrase")   # layouts whose branches share a prompt to reuse


def acted(pol: str, p: pd.DataFrame, L: int) -> str | None:
    """Why ``pol`` could not have changed anything on these problems (None when it acted), with the numbers."""
    n = len(p)
    why = []
    if pol in ("asks", "rksc"):
        shared = int(p["shared_branches"].sum())
        if shared == 0:
            why.append(f"ASKS shared no branch on {n} problems")
    if pol in ("cgee", "rksc"):
        skipped = p["skipped"].astype(bool)
        early = (~skipped) & (p["exit_layer_sum"] < p["verified_branches"] * L)
        if not (skipped.any() or early.any()):
            ver = float(p["verified_branches"].sum())
            mean_exit = float(p["exit_layer_sum"].sum()) / ver if ver else float("nan")
            why.append(f"CGEE skipped 0 and exited early on 0 of {n} problems (mean exit layer {fmt(mean_exit)} "
                       f"of {L})")
    if pol == "rksc" and len(why) < 2:
        return None   # one of its two parts acted
    return "; ".join(why) + ": it never acted" if why else None


def claim_row(group: str, claim: str, paper: str, simulated: str, measured: str, source: str, verdict: tuple,
              data: dict | None = None, conds: list | None = None) -> dict:
    """One claim row (its ``id`` is given by :class:`Reproducer` in report order); ``verdict`` is
    ``(verdict, why)`` or ``(verdict, why, also-lines)`` from :func:`combine`."""
    also = list(verdict[2]) if len(verdict) > 2 else []
    data = dict(data or {})
    if conds is not None:
        data["conditions"] = [c.as_dict() for c in conds]
    return {"group": group, "claim": claim, "paper": paper, "simulated": simulated, "measured": measured,
            "source": source, "verdict": verdict[0], "why": verdict[1], "also": also, "data": data}
