"""What-if: several policies side by side against No-KV and exact prefix, on one trace and target."""
from __future__ import annotations

import json
import os
import time

import pandas as pd
import streamlit as st

from app import params as P
from app import ui_backend as B
from app import ui_common as U
from app import ui_policy, ui_serving

DEFAULT_POLICIES = ["asks", "cgee", "rksc"]


def _load_from_sweep() -> None:
    """A configuration sent by the Sweeps page: select its policy, put its values in the exact box."""
    load = st.session_state.pop("whatif.load", None)
    if not load:
        return
    pol = load["policy"]
    chosen = list(st.session_state.get("whatif.policies", DEFAULT_POLICIES))
    if pol not in chosen:
        chosen.append(pol)
    st.session_state["whatif.policies"] = chosen
    st.session_state[f"whatif.p.{pol}.exact"] = "; ".join(f"{k}={v}" for k, v in load["params"].items())
    if load.get("trace_label"):
        st.session_state["trace"] = load["trace_label"]


def _kpis(name: str, s: dict, keys: list[str], ref: dict | None, info: dict | None = None) -> None:
    st.markdown(f"**{name}**")
    note = B.capacity_note(info or {}, s)
    if note:
        st.caption(note)
    for k in keys:
        if k not in s:
            continue
        delta = None
        if ref is not None and U.finite(s.get(k)) and U.finite(ref.get(k)) and k == "latency_mean_s":
            delta = f"{s[k] - ref[k]:+.3g} s vs exact prefix"
        ci = B.fmt_ci(k, s)
        st.metric(f"{name} · {B.label(k)}", B.fmt(k, s.get(k)), delta=delta, delta_color="inverse",
                  help=f"95% interval over the problems: {ci[len(B.fmt(k, s.get(k))):].strip()}"
                  if ci != B.fmt(k, s.get(k)) else None)


def _table(results: dict, keys: list[str]) -> pd.DataFrame:
    rows = {}
    for k in keys:
        if any(k in r["summary"] for r in results.values()):
            rows[B.label(k)] = {n: B.fmt_ci(k, r["summary"]) for n, r in results.items()}
    return pd.DataFrame(rows).T


@st.fragment
def _whatif(trace: str, facts: dict, chosen: list[str], model, hardware: str, mode: str, workload: dict,
            seed: int, serving: dict, slots, target: dict) -> None:
    """Policy controls and their results: a slider change re-runs only this fragment."""
    t0, wall0 = time.perf_counter(), time.time()
    top = st.container()  # the KPIs go above the controls (filled once the results exist)
    configs, deferred = _controls(trace, facts, chosen)
    results, refused = _results(trace, configs, model, hardware, mode, workload, seed, serving, slots, target)
    if refused is not None:
        U.error(refused)
        st.info(U.refusal_advice(trace, model or facts["model"], model, hardware, mode))
        return
    if not results:
        return
    info = next(iter(results.values()))["info"]
    top.caption(f"{info.get('note', '')}. Figures marked 'target' are the cost model's ({info.get('cost_model')} "
               f"on {info.get('hardware')}); 'trace model' ones come from the trace's own model "
               f"({info.get('decisions_model')}, {facts['n_layers']} layers) and do not change with the target.")
    not_applied = sorted({k for r in results.values() for k in r["not_applied"]})
    if not_applied:
        st.warning(f"not applied by this simulator build: {', '.join(not_applied)} (serving at capacity)")
    branch = {n: r for n, r in results.items() if B.policy_kind(n) != "token"}
    token = {n: r for n, r in results.items() if B.policy_kind(n) == "token"}
    ref = branch.get("exact-prefix", {}).get("summary")
    kpi_keys = B.serving_kpis(ref or {}) if mode == "serving" else B.KPI_BRANCH
    shown = [n for n in branch if n not in B.BASELINES]
    if shown:
        with top:
            _headline(branch, shown, kpi_keys, ref, facts)
    t_kpi = time.perf_counter()
    for draw in deferred:
        draw()
    if shown:
        _side_by_side(branch, kpi_keys, info, mode)
    if token:
        _token_view(trace, token, configs, seed, facts, top)
    _log_timing(t0, t_kpi, wall0)


def _controls(trace: str, facts: dict, chosen: list[str]) -> tuple[dict[str, dict], list]:
    """One tab of controls per chosen policy: its valid parameters, and the control figures to draw later."""
    configs: dict[str, dict] = {}
    bad = False
    deferred: list = []   # control figures, drawn after the KPIs
    tabs = st.tabs([f"tune {n}" for n in chosen]) if chosen else []
    for pol, tab in zip(chosen, tabs):
        with tab:
            params, notes = ui_policy.controls(pol, trace, facts, key=f"whatif.p.{pol}", deferred=deferred)
            for n in notes:
                st.caption(n)
        if params is None:
            bad = True
        else:
            configs[pol] = params
    if bad:
        st.warning("Fix the value above to see results (the other policies are shown).")
    return configs, deferred


def _results(trace: str, configs: dict, model, hardware: str, mode: str, workload: dict, seed: int,
             serving: dict, slots, target: dict) -> tuple[dict, Exception | None]:
    """The baselines and every valid policy run; an out-of-calibration refusal stops them (returned)."""
    results = {}
    for name in list(B.BASELINES) + list(configs):
        try:
            results[name] = U.run(trace, name, configs.get(name, {}), model, hardware, mode, workload, seed,
                                  serving, target)
        except ValueError as exc:
            if B.out_of_calibration(exc):
                return results, exc
            if not slots.show(exc, name):  # beside the widget of the error's field, where the page has one
                U.error(f"{name}: {U.one_line(exc)}")
    return results, None


def _headline(branch: dict, shown: list[str], kpi_keys: list[str], ref: dict | None, facts: dict) -> None:
    """Each policy's first four KPIs, and why it loses where it does."""
    cols = st.columns(len(shown))
    for col, n in zip(cols, shown):
        with col:
            _kpis(n, branch[n]["summary"], kpi_keys[:4], ref, branch[n]["info"])
    for n in shown:
        why = B.why_it_loses(n, B.policy_kind(n), branch[n]["summary"], ref or {}, "exact prefix", facts,
                             nokv=branch.get("no-kv", {}).get("summary"))
        if why:
            st.info(why, icon=":material/trending_down:")


def _side_by_side(branch: dict, kpi_keys: list[str], info: dict, mode: str) -> None:
    """The table of every KPI, the latency breakdown and (serving) the KV cache in use over time."""
    st.subheader("Side by side")
    st.table(_table(branch, kpi_keys + [k for k in B.TABLE_BRANCH if k not in kpi_keys]))
    st.caption(B.CI_NOTE)
    from app.report import fig_latency_breakdown

    summ = {n: {**r["summary"], "kind": B.policy_kind(n)} for n, r in branch.items()}
    st.plotly_chart(fig_latency_breakdown(f"{info.get('cost_model')} on {info.get('hardware')}", summ),
                    key="whatif.breakdown")
    if mode == "serving":
        import plotly.express as px

        kv = pd.concat([r["kv"].assign(policy=n) for n, r in branch.items() if len(r["kv"])], ignore_index=True)
        if len(kv):
            st.plotly_chart(px.line(kv, x="t_s", y="kv_bytes", color="policy",
                                    labels={"t_s": "time (s)", "kv_bytes": "KV cache in use (bytes)"},
                                    title="KV cache in use on the server"), key="whatif.kv")


def _log_timing(t0: float, t_kpi: float, wall0: float) -> None:
    """With ``$RKSIM_DASH_TIMING`` = a file, append this fragment run's server-side seconds (the browser
    test reads them to split its slider -> KPI latency into server and browser time)."""
    path = os.environ.get("RKSIM_DASH_TIMING")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"start_wall": wall0, "to_kpis_s": t_kpi - t0,
                                "total_s": time.perf_counter() - t0}) + "\n")


def _token_view(trace: str, token: dict, configs: dict, seed: int, facts: dict, top) -> None:
    import plotly.express as px

    st.subheader("Token eviction (long decodes)")
    st.caption(f"Quality (error, recall) is measured on the trace's {facts['n_longs']} recorded long decodes of "
               f"{facts['model']}; KV size, speedup and throughput are the target's, against a full cache.")
    with top:
        st.markdown("**Token eviction** (long decodes, against a full cache)")
        cols = st.columns(len(token))
        for col, (n, r) in zip(cols, token.items()):
            with col:
                _kpis(n, r["summary"], B.KPI_TOKEN, None, r["info"])
    T = max(facts["long_T"] or [512])
    budgets = sorted({b for b in (16, 32, 64, 128, 256, 384, T // 2) if 1 <= b < T})
    with st.spinner("error against budget..."):
        curves = [U.token_curve(trace, n, budgets, {k: v for k, v in configs.get(n, {}).items()}, seed)
                  for n in token]
    df = pd.concat(curves, ignore_index=True)
    fig = px.line(df, x="budget", y="attn_output_rel_error", color="policy", markers=True, log_y=True,
                  labels={"budget": "token budget K", "attn_output_rel_error": "attention-output relative error"},
                  title="Attention-output error against budget (lower is better)")
    for n in token:
        K = token[n]["summary"].get("budget")
        if K:
            fig.add_vline(x=K, line_dash="dot", line_color="grey")
    st.plotly_chart(fig, key="whatif.token_curve")


def page() -> None:
    st.title("What-if")
    _load_from_sweep()
    with st.sidebar:
        trace = U.pick("trace", "trace", key="trace", query_param="trace",
                       help="traces under the trace roots (rksim dashboard --trace-root DIR)")
    if trace is None:
        return
    slots = U.ErrorSlots("whatif")
    model, hardware, seed, ok = U.target_controls("whatif", trace, slots=slots)
    target = U.precision_controls("whatif", slots)
    with st.sidebar:
        mode = st.radio("mode", ["isolated", "serving"], horizontal=True, key="whatif.mode",
                        help="isolated: one problem at a time; serving: arrivals and contention (simpy engine)")
        slots.under("mode")
        verify = st.checkbox("verification reuses the branch's KV", value=True, key="whatif.verify",
                             help="No-KV always recomputes (workload option verify_reuses_kv)")
        slots.under("verify")
    try:
        facts = U.trace_facts(trace)
    except ValueError as exc:
        U.error(exc)
        return
    serving, sok = ({}, True)
    if mode == "serving":
        with st.expander("serving controls", expanded=True):
            serving, sok = ui_serving.controls("whatif.srv", slots=slots)
    from policies import list_policies

    names = [n for n in list_policies() if n not in B.BASELINES]
    if "whatif.policies" not in st.session_state:
        st.session_state["whatif.policies"] = DEFAULT_POLICIES
    chosen = st.multiselect("policies (each against No-KV and exact prefix)", names, key="whatif.policies")
    if not (ok and sok):
        st.warning("Fix the value above to see results.")
        return
    workload = {"verify_reuses_kv": bool(verify)}
    P.workload(workload)
    _whatif(trace, facts, list(chosen), model, hardware, mode, workload, int(seed), serving, slots, target)


page()
