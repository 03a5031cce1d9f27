"""Sweeps: a sweep Parquet from under the trace roots (or a small sweep run here), its Pareto frontier for
chosen axes; a click on a point loads its configuration into What-if."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import ui_backend as B
from app import ui_common as U

X_PREFS = ("cgee_error_rate", "attn_output_rel_error", "answer_change_rate", "accuracy", "kv_reuse")
Y_PREFS = ("speedup_vs_no_kv", "speedup_vs_full", "speedup_vs_exact_prefix", "latency_mean_s")
SMALL_MAX = 400  # configurations a sweep started from the page may have (the CLI has no such cap)
EXAMPLE_GRIDS = {"asks": "tau=0.96:0.99:0.002", "cgee": "theta=0,0.25,0.5,1,2\nl_min=8,15,22,26",
                 "rksc": "tau=0.96:0.99:0.005\ntheta=0.5,1,2", "h2o": "budget=32,64,128,256"}


def _small_sweep(trace: str | None):
    from policies import list_policies

    st.caption("The same grid syntax and checks as `rksim sweep --grid` (key=start:stop:step or key=v1,v2,...), "
               f"at most {SMALL_MAX} configurations, run in this process; the table is not written to disk.")
    c = st.columns(2)
    pol = c[0].selectbox("policy", list_policies(), index=list_policies().index("asks"), key="sweeps.policy")
    with c[1]:
        n, ok = U.text_number("max configurations", "sweeps.max", "--max-configs", default=str(SMALL_MAX), lo=1,
                              hi=SMALL_MAX, integer=True)
    grid = st.text_area("grid, one --grid per line", value=EXAMPLE_GRIDS.get(pol, ""), key=f"sweeps.grid.{pol}")
    slots = U.ErrorSlots("sweeps")
    model, hardware, seed, tok = U.target_controls("sweeps", trace, slots=slots)
    target = U.precision_controls("sweeps", slots)
    if st.button("run sweep", key="sweeps.run", disabled=not (ok and tok and trace)):
        specs = [g.strip() for g in grid.splitlines() if g.strip()]
        try:
            if not specs:
                raise ValueError("--grid: give at least one key=values line")
            with st.spinner("sweeping..."):
                df = U.run_small_sweep(trace, pol, specs, int(n), model, hardware, int(seed), target)
        except ValueError as exc:
            if not slots.show(exc):
                U.error(exc)
            return None
        st.session_state["sweeps.ran"] = (df, {"policy": pol, "trace": trace})
    return st.session_state.get("sweeps.ran")


def _frontier(df: pd.DataFrame, meta: dict, trace_label: str | None) -> None:
    from app.frontier_plot import frontier_figure as figure

    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not c.startswith("param.")
               and df[c].nunique(dropna=True) > 1]  # a metric the sweep does not move is no axis
    if len(numeric) < 2:
        st.info("This sweep has fewer than two metrics that vary across its configurations.")
        return

    def first(prefs, other=None):
        return next((numeric.index(k) for k in prefs if k in numeric and k != other),
                    next(i for i, k in enumerate(numeric) if k != other))

    c = st.columns(2)
    x = c[0].selectbox("x axis", numeric, index=first(X_PREFS), key="sweeps.x", format_func=B.label)
    y = c[1].selectbox("y axis", numeric, index=first(Y_PREFS, x), key="sweeps.y", format_func=B.label)
    if x == y:
        U.error("--x and --y: choose two different metrics")
        return
    data = df.dropna(subset=[x, y]).reset_index(drop=True)
    try:
        front = B.pareto(data, x, y)
    except ValueError as exc:
        U.error(exc)
        return
    st.caption(f"{len(front)} of {len(data)} configurations on the frontier "
               f"({'smaller' if B.default_minimise(x) else 'larger'} {x} and "
               f"{'smaller' if B.default_minimise(y) else 'larger'} {y} are better). Click a point to select it.")
    fig = figure(data, front, x, y, title=f"{meta.get('policy', '')}: {y} against {x}")
    ev = st.plotly_chart(fig, on_select="rerun", selection_mode="points", key="sweeps.fig")
    params = B.sweep_param_columns(data)
    st.dataframe(front[(["config_id"] if "config_id" in front else []) + params + [x, y]], hide_index=True,
                 width="stretch", key="sweeps.front")
    pts = (ev or {}).get("selection", {}).get("points", []) if isinstance(ev, dict) else \
        getattr(getattr(ev, "selection", None), "points", []) or []
    if not pts:
        return
    p = pts[0]
    frame = front if p.get("curve_number") == 1 else data
    idx = int(p.get("point_index", p.get("point_number", 0)))
    if not 0 <= idx < len(frame):
        return
    row = frame.iloc[idx]
    cfg = {B.param_name(c): (v.item() if hasattr(v, "item") else v) for c, v in row[params].items()
           if not (isinstance(v, float) and pd.isna(v))}
    st.success(f"selected: {meta.get('policy')} " + ", ".join(f"{k}={v}" for k, v in cfg.items())
               + f" → {x} {row[x]:.4g}, {y} {row[y]:.4g}")
    if st.button("open this configuration in What-if", key="sweeps.open"):
        st.session_state["whatif.load"] = {"policy": meta.get("policy"), "params": cfg, "trace_label": trace_label}
        st.switch_page("ui_pages/whatif.py")


def page() -> None:
    st.title("Sweeps")
    src = st.radio("source", ["a sweep file under the trace roots", "run a small sweep here"], horizontal=True,
                   key="sweeps.source")
    trace_label = st.session_state.get("trace")
    if src.startswith("a sweep"):
        got = U.pick_table("sweep", "sweep file (rksim sweep --out)", "sweeps.file", "sweep", U.read_sweep)
        if got is None:
            return
        df, meta = got
        if meta.get("trace"):
            listed = U.listing("trace", tuple(U.roots()))
            trace_label = next((k for k, v in listed.items() if v == meta["trace"]), trace_label)
    else:
        with st.sidebar:
            trace = U.pick("trace", "trace", key="trace", query_param="trace")
        got = _small_sweep(trace)
        if got is None:
            return
        df, meta = got
    st.caption(f"{len(df)} configurations of {meta.get('policy', '?')}")
    _frontier(df, meta, trace_label)


page()
