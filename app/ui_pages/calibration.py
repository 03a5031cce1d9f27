"""Calibration: simulated against measured latency, the error figures and the decision / scheduling parity
of a `rksim calibrate run` folder (after `calibrate fit`) or a `rksim calibrate serve` folder."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import streamlit as st

from app import ui_backend as B
from app import ui_common as U


def _signed(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:+.2f}%"


def _pct(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.2f}%"


def _run_folder(path: str) -> None:
    import plotly.express as px

    rep = U.calibration_run(path)
    run = rep["run"]
    st.caption(f"model {run.get('model', {}).get('name', '?')} on {run.get('device', '?')}, "
               f"{len(run.get('problems', []))} problems, created {run.get('created', '?')}")
    c = st.columns(4)
    c[0].metric("decision parity vs the simulator", _pct(rep["decision_parity"]))
    if rep["fit"] is None:
        st.info("Not fitted yet: run `rksim calibrate fit DIR` to see simulated against measured latency.")
        return
    fit = rep["fit"]
    c[1].metric("fit rms relative error", _pct(fit.get("rel_rms")))
    if rep["errors"] is None:
        st.info("The held-out problems have no timed phases.")
        return
    e = rep["errors"]
    c[2].metric("mean |error| of mean latency (held out)", _pct(e["mean_abs_pct_error"]))
    c[3].metric("median |error| per problem (held out)", _pct(e["median_abs_pct_error"]))
    st.caption(f"cost model charged for the operations the run executed (calibrate.report); "
               f"fit on problems {fit.get('fit_problems')}, held out {fit.get('holdout_problems')}; "
               f"preset {fit.get('name')}. `rksim calibrate report DIR` adds the simulator-on-trace numbers.")
    df = rep["frame"]
    fig = px.scatter(df, x="measured", y="sim", color="policy", hover_data=["problem", "abs_pct_error"],
                     labels={"measured": "measured end-to-end latency (s)", "sim": "simulated latency (s)"},
                     title="held-out problems: simulated against measured")
    hi = float(max(df["measured"].max(), df["sim"].max())) * 1.05
    fig.add_shape(type="line", x0=0, y0=0, x1=hi, y1=hi, line=dict(dash="dash", color="grey"))
    st.plotly_chart(fig, key="cal.scatter")
    per = pd.DataFrame(e["per_policy"]).T
    st.plotly_chart(px.bar(per.reset_index(names="policy"), x="policy", y="abs_pct_error",
                           title="|error| of mean latency per policy (held out)",
                           labels={"abs_pct_error": "relative error"}), key="cal.err")
    st.dataframe(per, width="stretch", key="cal.per_policy")
    if e.get("speedup_vs_no_kv"):
        st.dataframe(pd.DataFrame(e["speedup_vs_no_kv"]).T.rename_axis("policy"), width="stretch",
                     key="cal.speedup")
    if rep.get("parity") is not None:
        par = rep["parity"]
        st.subheader("Decision parity by decision")
        st.dataframe(par.groupby(["policy", "decision"])["match"].mean().unstack(), width="stretch",
                     key="cal.parity")


def _serve_folder(path: str) -> None:
    import plotly.express as px

    rep = U.calibration_serve(path)
    s = rep["summary"]
    c = st.columns(4)
    # calibrate/serve.py: parity a share, makespan/throughput errors signed fractions (sim - real) / real,
    # the e2e median already in percent
    c[0].metric("scheduling parity", _pct(s.get("scheduling_parity")))
    c[1].metric("makespan error (sim vs real)", _signed(s.get("makespan_error")))
    c[2].metric("throughput error (sim vs real)", _signed(s.get("throughput_error")))
    e2e = s.get("e2e_median_abs_pct_error")
    c[3].metric("median |error| end to end", "n/a" if not U.finite(e2e) else f"{e2e:.2f}%")
    st.caption(f"{s.get('n_iterations', '?')} iterations, {s.get('preemptions', '?')} preemptions, clock "
               f"{s.get('clock', '?')}; the real continuous-batching loop against the simulator's replay")
    for key, df, title in (("cal.serve_iter", rep["iterations"], "per iteration"),
                           ("cal.serve_e2e", rep["e2e"], "per problem, end to end")):
        if df is None or not len(df):
            continue
        fig = px.scatter(df, x="measured_s", y="simulated_s", title=f"{title}: simulated against measured (s)",
                         labels={"measured_s": "measured (s)", "simulated_s": "simulated (s)"})
        hi = float(max(df["measured_s"].max(), df["simulated_s"].max())) * 1.05
        fig.add_shape(type="line", x0=0, y0=0, x1=hi, y1=hi, line=dict(dash="dash", color="grey"))
        st.plotly_chart(fig, key=key)
    flat = {k: v for k, v in s.items() if not isinstance(v, (dict, list))}
    st.dataframe(pd.DataFrame({"value": flat}).astype(str), width="stretch", key="cal.serve_summary")


def page() -> None:
    st.title("Calibration")
    path = U.pick("calibration", "calibration folder (rksim calibrate run / serve --out)", key="cal.folder",
                  query_param="calibration")
    if path is None:
        st.caption("A `calibrate run` folder holds run.json and phases.parquet (fit.json after `calibrate fit`); "
                   "a `calibrate serve` folder holds summary.json with scheduling_parity.")
        return
    kind = B.calibration_kind(Path(path))
    try:
        if kind == "run":
            _run_folder(path)
        elif kind == "serve":
            _serve_folder(path)
    except (ValueError, OSError, KeyError) as exc:
        U.error(exc)



page()
