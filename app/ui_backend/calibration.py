"""Calibration folders (``rksim calibrate run`` / ``serve``) as the Calibration page reads them."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


# ------------------------------------------------------------------ calibration folders
SERVE_SUMMARIES = ("serve.json", "summary.json")  # calibrate/serve.py's SUMMARY_FILE, and the older name


def _serve_summary(folder: Path) -> Path | None:
    for name in SERVE_SUMMARIES:
        p = folder / name
        if p.is_file():
            try:
                if "scheduling_parity" in json.loads(p.read_text()):
                    return p
            except (OSError, ValueError):
                continue
    return None


def calibration_kind(folder: Path) -> str | None:
    """``"serve"`` for a ``calibrate serve`` folder (its summary holds ``scheduling_parity``; it also has a
    run.json and phases.parquet for ``calibrate fit``), ``"run"`` for a ``calibrate run`` one, else None."""
    folder = Path(folder)
    if _serve_summary(folder) is not None:
        return "serve"
    if all((folder / f).is_file() for f in ("run.json", "phases.parquet", "decisions.parquet")):
        return "run"
    return None


def calibration_run(folder: str) -> dict:
    """Simulated vs measured per held-out (problem, policy) of a ``calibrate run`` folder, read-only.

    The numbers are ``calibrate.report``'s own (``simulate_records`` — the cost model charged for the
    executed operations — and ``fit_errors``); without ``fit.json`` the folder is shown unfitted.
    """
    from calibrate.report import fit_errors, load_run, simulate_records
    from sim.cost.profiles import load_hardware, model_from_manifest

    d = Path(folder)
    run_json = json.loads((d / "run.json").read_text())
    out = {"run": run_json, "fit": None, "frame": None, "errors": None,
           "decision_parity": run_json.get("decision_parity", run_json.get("replay_parity"))}
    if (d / "parity.parquet").is_file():
        out["parity"] = pd.read_parquet(d / "parity.parquet")
    if not (d / "fit.json").is_file():
        return out
    phases, dec, run_json, fit = load_run(d)
    out["fit"] = fit
    hw = load_hardware(fit["preset"])  # the preset `calibrate fit` wrote (its path or name)
    model = model_from_manifest({"model": run_json["model"]})
    hold = {int(p) for p in fit.get("holdout_problems", [])}
    sim = simulate_records(phases, hw, model)
    df = dec[["problem", "policy", "seconds"]].merge(sim, on=["problem", "policy"], how="left")
    df = df[df["problem"].isin(hold)].rename(columns={"seconds": "measured"}).dropna(subset=["sim"])
    if df.empty:
        return out
    errors, frame = fit_errors(df)
    out["errors"], out["frame"] = errors, frame
    return out


def calibration_serve(folder: str) -> dict:
    """A ``calibrate serve`` folder: its summary, the per-iteration real and simulated seconds (on the run's
    clock), and the per-problem end-to-end pairs of its comparison, where present."""
    d = Path(folder)
    path = _serve_summary(d)
    if path is None:
        raise ValueError(f"{d}: no serve.json with scheduling_parity (not a `calibrate serve` folder)")
    s = json.loads(path.read_text())
    out = {"summary": s, "iterations": None, "e2e": None}
    clock = f"{s.get('clock', 'wall')}_s"
    if (d / "iterations.parquet").is_file():
        it = pd.read_parquet(d / "iterations.parquet")
        if {clock, "sim_s"} <= set(it.columns):
            out["iterations"] = it.rename(columns={clock: "measured_s", "sim_s": "simulated_s"})
    c = s.get("comparison") or {}
    if c.get("e2e_real_s") and len(c["e2e_real_s"]) == len(c.get("e2e_sim_s") or []):
        out["e2e"] = pd.DataFrame({"measured_s": c["e2e_real_s"], "simulated_s": c["e2e_sim_s"]})
    return out
