"""Fidelity report: simulated vs measured per-problem latency and speedups on held-out problems.

``calibrate fit`` splits the run's problems (seeded) into a fit set and a
held-out set and fits the hardware profile on the fit set's phases (plus the
op sweep). Here every held-out (problem, policy) is *simulated* by charging
the cost model (``sim.cost.terms`` terms, the fitted ``HardwareProfile``) for
every operation the real run executed — the decisions it took, its batch
shapes, its context lengths, the layers each verification ran — and compared
with the measured end-to-end seconds of that run.

Two simulations are compared with the measurements: the simulator itself
(``sim.api.simulate`` on the run's parity trace — its job model, its batching,
decisions replayed from the trace) gives the primary numbers;
``cost_model_replay`` charges the cost model for the operations the run
executed and isolates the cost model's error from the job model's.

Metrics (all on held-out problems only):

- ``mean_abs_pct_error``: per policy ``|mean(sim) - mean(meas)| / mean(meas)``
  of the end-to-end latency, averaged over policies;
- ``median_abs_pct_error``, ``p90_abs_pct_error``: of ``|sim - meas| / meas``
  over every held-out (problem, policy);
- ``speedup_ratio_error``: per policy the speedup over No-KV
  ``mean(meas no-kv) / mean(meas policy)`` against the simulated one,
  ``|S_sim / S_meas - 1|``, averaged over the non-baseline policies;
- ``decision_parity``: share of decision records the policies reproduce on replay;
- ``n_fit``, ``n_holdout``: problems in each split;
- ``clock``: the clock the measured seconds come from (``--clock``: thread CPU time on
  CPU by default, wall on CUDA; wall for runs recorded without CPU time, ``clock_note``
  says so) and ``by_clock``: the same metrics measured by each clock the run recorded;
- ``hardware_calibrated`` and ``calibration_note``: whether the profile was fitted end to
  end, in words.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fit import phase_terms, predict


def load_run(dir_: Path):
    for f in ("phases.parquet", "decisions.parquet", "run.json"):
        if not (dir_ / f).is_file():
            raise FileNotFoundError(f"{dir_ / f}: missing (run 'rksim calibrate run --out {dir_}' first)")
    if not (dir_ / "fit.json").is_file():
        raise FileNotFoundError(f"{dir_ / 'fit.json'}: missing (run 'rksim calibrate fit {dir_}' first)")
    return (pd.read_parquet(dir_ / "phases.parquet"), pd.read_parquet(dir_ / "decisions.parquet"),
            json.loads((dir_ / "run.json").read_text()), json.loads((dir_ / "fit.json").read_text()))


def simulate_records(phases: pd.DataFrame, hw, model, seconds: str = "seconds") -> pd.DataFrame:
    """Per (problem, policy): the cost model's seconds for the operations the run executed."""
    ph = phases[phases["problem"] >= 0].copy()
    ph["sim_seconds"] = predict(hw, phase_terms(model, ph))
    return ph.groupby(["problem", "policy"], as_index=False).agg(sim=("sim_seconds", "sum"),
                                                                 phase_sum=(seconds, "sum"))


def simulate_with_sim(trace_dir: Path, dec: pd.DataFrame, hw_path: str, policy_params: dict) -> pd.DataFrame:
    """Per (problem, policy): ``sim.api.simulate``'s latency on the run's own trace (same problems and seeds)."""
    from sim.api import Session, simulate
    from traces.store import load_trace

    tr = load_trace(trace_dir)
    session = Session(tr)  # this report's: the trace's features are built once
    pos_of = {int(p.index): i for i, p in enumerate(tr.problems)}
    rows = []
    for (prob, pol), _ in dec.groupby(["problem", "policy"]):
        if int(prob) not in pos_of:
            continue
        # What the runner executed: verification recomputed; no block budget (every block stays
        # resident; RKSC's RSBCM part is measured in tree mode by `calibrate speedup`), so the
        # simulator's pool must not evict: budget = the problem's unconstrained peak; and each phase
        # one left-padded batch of the problem's branches (eager HF): batching = static.
        r = simulate(session, pol, params=policy_params.get(pol, {}), hardware=hw_path, problems=[pos_of[int(prob)]],
                     workload={"verify_reuses_kv": False, "kv_budget_frac": 1.0, "batching": "static"},
                     baselines=False)
        rows.append({"problem": int(prob), "policy": pol, "sim": float(r.problems["latency_s"].iloc[0])})
    return pd.DataFrame(rows)


def fit_errors(df: pd.DataFrame) -> dict:
    """The fidelity metrics of a frame with columns problem, policy, measured, sim."""
    df = df.copy()
    df["abs_pct_error"] = (df["sim"] - df["measured"]).abs() / df["measured"]
    per_pol = df.groupby("policy").agg(measured=("measured", "mean"), sim=("sim", "mean"))
    per_pol["mean_abs_pct_error"] = (per_pol["sim"] - per_pol["measured"]).abs() / per_pol["measured"]
    speed = {}
    if "no-kv" in per_pol.index:
        base = per_pol.loc["no-kv"]
        for pol, row in per_pol.iterrows():
            if pol == "no-kv":
                continue
            s_meas = base["measured"] / row["measured"]
            s_sim = base["sim"] / row["sim"]
            speed[pol] = {"measured": float(s_meas), "simulated": float(s_sim),
                          "error": float(abs(s_sim / s_meas - 1.0))}
    return {
        "mean_abs_pct_error": float(per_pol["mean_abs_pct_error"].mean()),
        "median_abs_pct_error": float(df["abs_pct_error"].median()),
        "p90_abs_pct_error": float(df["abs_pct_error"].quantile(0.9)),
        "speedup_ratio_error": float(np.mean([v["error"] for v in speed.values()])) if speed else None,
        "per_policy": {p: {"measured_s": float(r["measured"]), "simulated_s": float(r["sim"]),
                           "abs_pct_error": float(r["mean_abs_pct_error"])} for p, r in per_pol.iterrows()},
        "speedup_vs_no_kv": speed,
    }, df


def _errors_by_clock(base, sim_tab) -> dict:
    """The same simulation (``sim_tab``) against each clock the run recorded (``base``'s ``seconds`` = wall,
    ``cpu_seconds`` = cpu): its error figures and the measured total, by clock."""
    by_clock = {}
    for ck, c in (("wall", "seconds"), ("cpu", "cpu_seconds")):
        if c in base and base[c].notna().all():
            dk = base[["problem", "policy", c]].rename(columns={c: "measured"}).merge(sim_tab, on=["problem", "policy"])
            e, _ = fit_errors(dk)
            by_clock[ck] = {k: e[k] for k in ("mean_abs_pct_error", "median_abs_pct_error", "p90_abs_pct_error",
                                              "speedup_ratio_error")}
            by_clock[ck]["measured_total_s"] = float(dk["measured"].sum())
    return by_clock


def fidelity_report(dir_: Path, hardware: str | None = None, clock: str = "auto",
                    allow_other_host: bool = False) -> dict:
    """Held-out fidelity. Primary numbers: the simulator (``sim.api.simulate`` on the run's parity trace,
    decisions from the trace, costs from the fitted profile); ``cost_model_replay``: the cost model
    charged for the operations the run itself executed (isolates the cost model from the job model).
    Without a trace (``--no-capture``) the replay numbers are the primary ones (``source`` says which).
    ``clock`` picks the measured seconds (see the module docstring)."""
    from calibrate.fit import run_device
    from calibrate.timing import select_clock
    from sim.base.errors import OutOfCalibrationError
    from sim.cost.profiles import load_hardware, model_from_manifest

    dir_ = Path(dir_)
    phases, dec, run, fit = load_run(dir_)
    hw_path = hardware or fit["preset"]
    hw = load_hardware(hw_path)
    model = model_from_manifest({"model": run["model"]})
    hold = set(int(p) for p in fit["holdout_problems"])
    if not hold:
        raise ValueError(f"{dir_ / 'fit.json'}: holdout_problems: empty; refit with --holdout > 0")
    # the profile's fitted range covers the device and dtype of this run too
    hw.check_query(model, max_context=0, device=run_device(run))
    # ... and the host: a run measured here against a profile fitted on another host is refused
    host = {"hardware_calibrated": bool(hw.calibrated), "host_match": None, "host_note": ""}
    if run.get("fingerprint"):
        from calibrate.serve_config import check_host
        host = check_host(str(hw_path), run["fingerprint"], allow_other_host=allow_other_host)
    _, _, used, clock_note = select_clock(phases, dec, clock, run.get("device", "cpu"))
    col = "cpu_seconds" if used == "cpu" else "seconds"
    sim = simulate_records(phases, hw, model, seconds=col)
    base = dec[["problem", "policy", "seconds"] + (["cpu_seconds"] if "cpu_seconds" in dec else [])]
    base = base.merge(sim, on=["problem", "policy"], how="left")
    base = base[base["problem"].isin(hold)]
    df = base.rename(columns={col: "measured"})
    if df.empty or df["sim"].isna().any():
        raise ValueError(f"{dir_}: held-out problems have no timed phases")
    replay, df_replay = fit_errors(df[["problem", "policy", "measured", "sim", "phase_sum"]])
    source = "cost-model replay of the executed operations (no trace: run without --no-capture for the simulator)"
    primary, df_primary = replay, df_replay
    sim_tab = df[["problem", "policy", "sim"]]
    if (dir_ / "trace" / "manifest.json").is_file():
        try:
            s2 = simulate_with_sim(dir_ / "trace", dec[dec["problem"].isin(hold)], str(hw_path),
                                   run.get("policy_params", {}))
        except OutOfCalibrationError as exc:  # e.g. a run without the op sweep: a narrow fitted range
            source = f"cost-model replay of the executed operations (the simulator refused: {exc})"
        else:
            d2 = df[["problem", "policy", "measured"]].merge(s2, on=["problem", "policy"], how="inner")
            if len(d2) == len(df):
                primary, df_primary = fit_errors(d2)
                sim_tab = s2
                source = "sim.api.simulate on the run's trace (decisions from the trace, costs from the fitted profile)"
    by_clock = _errors_by_clock(base, sim_tab)
    par = run.get("decision_parity")
    rep = {
        **{k: primary[k] for k in ("mean_abs_pct_error", "median_abs_pct_error", "p90_abs_pct_error",
                                   "speedup_ratio_error")},
        "decision_parity": float(par if par is not None else run.get("replay_parity", float("nan"))),
        "n_fit": int(len(fit["fit_problems"])),
        "n_holdout": int(len(hold)),
        "source": source,
        "hardware": hw.name,
        "hardware_calibrated": bool(host["hardware_calibrated"]),
        "host_match": host["host_match"], "host_note": host["host_note"],
        "calibration_note": hw.calibration_note,
        "roofline": hw.roofline,
        "clock": used,
        "clock_note": clock_note,
        "by_clock": by_clock,
        "unaccounted_host_share": float(1.0 - df["phase_sum"].sum() / df["measured"].sum()),
        "per_policy": primary["per_policy"],
        "speedup_vs_no_kv": primary["speedup_vs_no_kv"],
        "cost_model_replay": replay,
    }
    _scatter(df_primary, dir_ / "report.html", rep)
    return rep


def _scatter(df: pd.DataFrame, path: Path, rep: dict) -> None:
    import plotly.express as px
    from traces.store import atomic_write_text

    fig = px.scatter(df, x="measured", y="sim", color="policy", hover_data=["problem", "abs_pct_error"],
                     labels={"measured": "measured end-to-end latency (s)", "sim": "simulated latency (s)"},
                     title=(f"held-out problems: mean error {rep['mean_abs_pct_error']:.1%}, "
                            f"median per problem {rep['median_abs_pct_error']:.1%} ({rep['clock']} clock)<br>"
                            f"<sup>hardware {rep['hardware']}: {rep['calibration_note']}</sup>"))
    hi = float(max(df["measured"].max(), df["sim"].max())) * 1.05
    fig.add_shape(type="line", x0=0, y0=0, x1=hi, y1=hi, line=dict(dash="dash", color="grey"))
    atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))


def format_report(rep: dict) -> str:
    lines = [f"hardware {rep['hardware']}: {rep['n_fit']} fit / {rep['n_holdout']} held-out problems",
             f"hardware profile: {'calibrated' if rep['hardware_calibrated'] else 'NOT calibrated'} "
             f"({rep['calibration_note']}; {rep['roofline']} roofline)",
             f"simulated by: {rep['source']}",
             f"measured by: {rep['clock_note']}",
             f"mean |error| of mean latency  {rep['mean_abs_pct_error']:.2%}",
             f"median / p90 |error| per problem  {rep['median_abs_pct_error']:.2%} / {rep['p90_abs_pct_error']:.2%}"]
    if rep["speedup_ratio_error"] is not None:
        lines.append(f"speedup-ratio error  {rep['speedup_ratio_error']:.2%}")
    lines.append(f"decision parity  {rep['decision_parity']:.1%}")
    lines.append(f"{'policy':<14}{'measured s':>12}{'simulated s':>13}{'error':>8}")
    for p, r in rep["per_policy"].items():
        lines.append(f"{p:<14}{r['measured_s']:>12.3f}{r['simulated_s']:>13.3f}{r['abs_pct_error']:>8.1%}")
    for ck, e in rep.get("by_clock", {}).items():
        lines.append(f"against {ck:<4} clock: mean {e['mean_abs_pct_error']:.2%}, median "
                     f"{e['median_abs_pct_error']:.2%}, speedup-ratio {(e['speedup_ratio_error'] or 0):.2%} "
                     f"(measured {e['measured_total_s']:.2f} s)")
    c = rep["cost_model_replay"]
    lines.append(f"cost model on the executed operations: mean {c['mean_abs_pct_error']:.2%}, median "
                 f"{c['median_abs_pct_error']:.2%}, speedup-ratio {(c['speedup_ratio_error'] or 0):.2%}")
    return "\n".join(lines)
