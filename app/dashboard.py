"""The rksim what-if dashboard (``make app``): pick a trace, a target model and
hardware, a policy and its thresholds, and see what it buys against No-KV and
exact-prefix caching.

Everything is computed by the simulator (``sim.api.simulate``) from the trace;
the policy parameters come from the policy dataclasses themselves, so a new
policy parameter shows up here without touching this file. No torch is loaded.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import streamlit as st

from app import report
from policies import get_policy, list_policies, policy_defaults
from sim.api import default_trace_path, load_presets, simulate
from sim.decisions import workload_options

try:  # choices of string parameters (e.g. pooling: mean | last), where the library exposes them
    from policies import param_choices
except ImportError:  # pragma: no cover - older policy library
    param_choices = None

# Shown in this order; the rest of each result is in the raw JSON expander.
KEY_METRICS = ["latency_mean_s", "latency_p95_s", "speedup_vs_no_kv", "speedup_vs_exact_prefix", "kv_reuse",
               "asks_gate_auc", "skip_rate", "mean_exit_layer", "cgee_error_rate", "cgee_branch_disagreement_rate",
               "accuracy", "peak_kv_bytes",
               "evictions", "recompute_tokens", "attn_output_rel_error", "attn_mass_recall"]


@st.cache_data(show_spinner=False, max_entries=256)
def _run(trace: str, policy: str, params_json: str, model_preset: str | None, hardware: str, mode: str,
         verify_reuses_kv: bool, seed: int):
    """One simulation, cached on its inputs (params as canonical JSON so the key is hashable)."""
    r = simulate(trace, policy=policy, params=json.loads(params_json), model_preset=model_preset,
                 hardware=hardware, mode=mode, workload={"verify_reuses_kv": verify_reuses_kv}, seed=seed)
    return r.summary, r.problems, r.branches, r.kv_timeline, r.info


def _param_widget(policy: str, field: str, default, choices):
    key = f"{policy}.{field}"
    if choices:
        return st.sidebar.selectbox(field, list(choices), index=list(choices).index(default), key=key)
    if isinstance(default, bool):
        return st.sidebar.checkbox(field, value=default, key=key)
    if isinstance(default, int):
        return int(st.sidebar.number_input(field, value=default, step=1, key=key))
    if isinstance(default, float):
        return float(st.sidebar.number_input(field, value=default, format="%.4f", key=key))
    if default is None:
        text = st.sidebar.text_input(f"{field} (empty = default)", value="", key=key)
        return json.loads(text) if text.strip() else None
    return st.sidebar.text_input(field, value=str(default), key=key)


def _fmt(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main() -> None:
    st.set_page_config(page_title="rksim what-if", layout="wide")
    st.title("rksim — what would this policy buy?")

    presets = load_presets()
    trace = st.sidebar.text_input("trace directory", value=str(default_trace_path()))
    if not Path(trace, "manifest.json").is_file():
        st.error(f"{trace}: no manifest.json — not an rksim trace (make one with `rksim capture`)")
        st.stop()
    models = ["(trace's model)"] + presets["models"]
    model_choice = st.sidebar.selectbox("target model", models, index=0)
    model_preset = None if model_choice == models[0] else model_choice
    hw = presets["hardware"]
    hardware = st.sidebar.selectbox("hardware", hw, index=hw.index("local-cpu") if "local-cpu" in hw else 0, key="hardware")
    mode = st.sidebar.radio("mode", ["isolated", "serving"], horizontal=True)
    verify_reuses_kv = st.sidebar.checkbox("verification reuses the branch's KV (No-KV always recomputes)",
                                           value=bool(workload_options(None)["verify_reuses_kv"]))
    seed = int(st.sidebar.number_input("seed", value=0, step=1))

    names = list_policies()
    policy = st.sidebar.selectbox("policy", names, index=names.index("rksc") if "rksc" in names else 0, key="policy")
    st.sidebar.markdown(f"**{policy} parameters**")
    choices = param_choices(policy) if param_choices else {}
    params = {}
    for field, default in policy_defaults(policy).items():
        value = _param_widget(policy, field, default, choices.get(field))
        if value != default:
            params[field] = value
    try:
        get_policy(policy, **params)  # same validation as the CLI, before any work
    except ValueError as exc:
        st.error(str(exc))
        st.stop()

    try:
        with st.spinner("simulating…"):
            summary, problems, branches, timeline, info = _run(
                trace, policy, json.dumps(params, sort_keys=True), model_preset, hardware, mode,
                verify_reuses_kv, seed)
    except ValueError as exc:  # out of calibration range, bad preset, bad trace: say so, never extrapolate
        st.error(str(exc))
        st.stop()

    st.caption(info.get("note", ""))
    cols = st.columns(4)
    for col, key in zip(cols, ["speedup_vs_no_kv", "speedup_vs_exact_prefix", "latency_mean_s", "accuracy"]):
        col.metric(key, _fmt(summary.get(key)))
    table = pd.DataFrame({"metric": [k for k in KEY_METRICS if k in summary],
                          "value": [_fmt(summary[k]) for k in KEY_METRICS if k in summary]})
    st.subheader("Metrics")
    st.dataframe(table, hide_index=True, width="stretch")

    kind = get_policy(policy).kind
    if kind in ("sharing", "composite") and "sigma" in branches:
        tau = float(params.get("tau", policy_defaults(policy).get("tau", 1.0)))
        st.plotly_chart(report.fig_sigma(branches, tau), width="stretch")
    if len(timeline):
        st.subheader("KV memory over time")
        first = timeline[timeline["pos"] == timeline["pos"].iloc[0]]
        st.line_chart(first, x="t_s", y="kv_bytes")
    st.subheader("Per problem")
    st.dataframe(problems, hide_index=True, width="stretch")
    with st.expander("raw result (JSON)"):
        st.json({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()})
    with st.expander("policy parameters"):
        st.json(dataclasses.asdict(get_policy(policy, **params)))


main()
