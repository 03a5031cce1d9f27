"""Trace explorer: per problem and branch — prompt segments, answers, sigma against tau, the verification
pass's per-layer entropy and p(Yes) against theta and l_min, exit layers, long-decode value ranges."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import ui_common as U


def _lens_figure(arr: np.ndarray, what: str, hline: float | None, l_min: int, highlight: int):
    import plotly.graph_objects as go

    fig = go.Figure()
    x = np.arange(1, arr.shape[1] + 1)
    for b in range(arr.shape[0]):
        fig.add_scatter(x=x, y=arr[b], mode="lines", name=f"branch {b}",
                        line=dict(width=3 if b == highlight else 1), opacity=1.0 if b == highlight else 0.45)
    if hline is not None:
        fig.add_hline(y=hline, line_dash="dash", annotation_text=f"theta = {hline:g}")
    fig.add_vline(x=l_min, line_dash="dot", annotation_text=f"l_min = {l_min}")
    fig.update_layout(xaxis_title="layer", yaxis_title=what, height=380, margin=dict(t=40))
    return fig


@st.fragment
def _problem(trace: str, facts: dict, pos: int) -> None:
    try:
        _problem_body(trace, facts, pos)
    except ValueError as exc:  # a damaged shard (TraceError names the file and field)
        U.error(exc)


def _problem_body(trace: str, facts: dict, pos: int) -> None:
    import plotly.express as px

    br = U.problem_branches(trace, pos)
    b = st.selectbox("branch", list(br["branch"]), key="explorer.branch")
    row = br[br["branch"] == b].iloc[0]
    st.markdown(f"**branch {b}** — variant: _{row['variant_text']}_ · prompt segments: {row['segments']}")
    c = st.columns(2)
    c[0].metric("own answer", f"{row['answer'] or '(none)'} ({'correct' if row['correct'] else 'wrong'})")
    if "cf_answer" in row:
        c[1].metric("counterfactual answer (from the root's KV)",
                    f"{row['cf_answer'] or '(none)'} ({'correct' if row['cf_correct'] else 'wrong'})")
    st.dataframe(br, hide_index=True, width="stretch", key="explorer.branches")

    st.subheader("ASKS sigma against tau")
    c = st.columns(3)
    from app.ui_policy import tau_span

    lo, hi = tau_span(U.observed_sigmas(trace, {}))  # the span What-if's tau slider has
    tau = c[0].slider("tau (spans the trace's sigmas)", lo, hi, lo, 0.001, format="%.3f", key="explorer.tau")
    alpha = c[1].slider("alpha", 0.0, 5.0, 1.0, 0.1, key="explorer.alpha")
    pooling = c[2].selectbox("pooling", ["mean", "last"], key="explorer.pooling")
    sig = U.problem_sigma(trace, pos, {"tau": tau, "alpha": alpha, "pooling": pooling})
    sdf = pd.DataFrame({"branch": np.arange(len(sig)), "sigma": sig,
                        "shares": ["root" if i == 0 else ("shares" if s >= tau else "own prefix")
                                   for i, s in enumerate(sig)]})
    fig = px.bar(sdf[sdf["branch"] > 0], x="branch", y="sigma", color="shares", title="sigma per branch")
    fig.add_hline(y=tau, line_dash="dash", annotation_text=f"tau = {tau:.3f}")
    lo = np.nanmin(sig) if np.isfinite(sig).any() else 0.9
    fig.update_yaxes(range=[min(lo, tau) - 0.01, max(np.nanmax(sig) if np.isfinite(sig).any() else 1, tau) + 0.01])
    st.plotly_chart(fig, key="explorer.sigma")

    st.subheader("Verification pass by layer (logit lens)")
    c = st.columns(4)
    gen = c[0].selectbox("generation", ["own", "cf"], key="explorer.gen")
    norm = c[1].checkbox("final norm (lens 'norm')", value=True, key="explorer.norm")
    theta = c[2].slider("theta (nats)", 0.0, max(0.5, float(np.ceil(facts["entropy_max"]))), 1.0, 0.01,
                        key="explorer.theta")
    l_min = c[3].slider("l_min", 1, int(facts["n_layers"]), min(26, int(facts["n_layers"])), 1, key="explorer.l_min")
    lens = U.problem_lens(trace, pos, gen, norm)
    st.plotly_chart(_lens_figure(lens["entropy"], "entropy (nats)", theta, l_min, int(b)), key="explorer.entropy")
    st.plotly_chart(_lens_figure(lens["p_yes_ratio"], "p(Yes) / (p(Yes) + p(No))", None, l_min, int(b)),
                    key="explorer.pyes")
    try:
        ex = U.exit_layers(trace, pos, {"theta": theta, "l_min": l_min})
    except ValueError as exc:
        U.error(exc)
    else:
        st.plotly_chart(px.bar(ex, x="branch", y="exit_layer", color="selected",
                               title=f"CGEE exit layer per branch (theta {theta:g}, l_min {l_min}; "
                                     f"{facts['n_layers']} = full depth)"), key="explorer.exit")


def _value_ranges(trace: str, facts: dict) -> None:
    import plotly.express as px

    if not facts["n_longs"]:
        st.caption("This trace has no long-decode sequences (capture with --long-decode T2).")
        return
    st.subheader("Value ranges per layer and head (long decodes)")
    seq = st.selectbox("long-decode sequence", list(range(facts["n_longs"])), key="explorer.seq")
    df = U.value_ranges(trace, int(seq))
    df["layer / head"] = "L" + df["layer"].astype(str) + " h" + df["head"].astype(str)
    st.plotly_chart(px.box(df, x="layer / head", y="value_range", color="layer", points=False,
                           title="max(v) - min(v) over the head dimension, per cached token",
                           labels={"value_range": "value range"}), key="explorer.vr")


def page() -> None:
    st.title("Trace explorer")
    with st.sidebar:
        trace = U.pick("trace", "trace", key="trace", query_param="trace")
    if trace is None:
        return
    try:
        facts = U.trace_facts(trace)
        probs = U.problem_list(trace)
    except ValueError as exc:
        U.error(exc)
        return
    st.caption(f"{facts['model']}, {facts['n_layers']} layers, {facts['n_problems']} problems, "
               f"{facts['n_longs']} long decodes")
    labels = [f"{r.position}: {r.question[:90]}" for r in probs.itertuples()]
    i = st.selectbox("problem", range(len(labels)), format_func=lambda j: labels[j], key="explorer.problem")
    st.markdown(f"**truth:** {probs.iloc[i]['truth']}")
    _problem(trace, facts, int(i))
    try:
        _value_ranges(trace, facts)
    except ValueError as exc:
        U.error(exc)


page()
