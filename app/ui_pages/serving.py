"""Serving: policies on one server at capacity — throughput, latency from arrival, queueing, KV in use."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import ui_backend as B
from app import ui_common as U
from app import ui_deploy, ui_serving

LOAD_POINTS = (1, 2, 4, 8, 16)


@st.fragment
def _results(trace: str, chosen: list[str], model, hardware: str, seed: int, serving: dict, slots) -> None:
    conc = st.select_slider("max concurrent problems (problems in flight)", options=list(LOAD_POINTS),
                            value=None if "serving.srv.concurrency" in st.session_state else
                            int(serving.get("concurrency") or 4), key="serving.srv.concurrency")
    slots.under("srv.concurrency")
    opts = {**serving, "concurrency": int(conc)}
    results = {}
    for n in chosen:
        try:
            results[n] = U.run(trace, n, {}, model, hardware, "serving", {}, seed, opts)
        except ValueError as exc:
            if not slots.show(exc, n):
                U.error(f"{n}: {U.one_line(exc)}")
            if B.out_of_calibration(exc):
                st.info(U.refusal_advice(trace, model or "the trace's model", model, hardware, "serving"))
                return
    if not results:
        return
    keys = B.serving_kpis(next(iter(results.values()))["summary"])
    not_applied = sorted({k for r in results.values() for k in r["not_applied"]})
    if not_applied:
        st.warning(f"not applied by this simulator build: {', '.join(not_applied)} (serving at capacity)")
    cols = st.columns(len(results))
    for col, (n, r) in zip(cols, results.items()):
        with col:
            st.markdown(f"**{n}**")
            note = B.capacity_note(r["info"], r["summary"])   # under what capacity its figures hold
            if note:
                st.caption(note)
            for k in keys[:6]:
                st.metric(f"{n} · {B.label(k)}", B.fmt(k, r["summary"].get(k)))
    st.dataframe(pd.DataFrame({B.label(k): {n: B.fmt(k, r["summary"].get(k)) for n, r in results.items()}
                               for k in keys}).T, width="stretch")
    reps = {n: r for n, r in results.items() if r["summary"].get("per_replica")}
    if reps:
        with st.expander("per replica (throughput, goodput, latency percentiles)"):
            for n, r in reps.items():
                st.markdown(f"**{n}** · {r['summary'].get('router', '')}, ASKS shares lost to routing: "
                            f"{r['summary'].get('lost_asks_shares', 0)}")
                st.dataframe(B.per_replica(r["summary"]).rename(columns=B.label), width="stretch",
                             key=f"serving.rep.{n}")
    import plotly.express as px

    kv = pd.concat([r["kv"].assign(policy=n) for n, r in results.items() if len(r["kv"])], ignore_index=True)
    if len(kv):
        st.plotly_chart(px.line(kv, x="t_s", y="kv_bytes", color="policy", title="KV cache in use on the server",
                                labels={"t_s": "time (s)", "kv_bytes": "bytes"}), key="serving.kv")
    # Load curve: the same policies at each concurrency (cached runs).
    rows = []
    for c in LOAD_POINTS:
        for n in results:
            try:
                s = U.run(trace, n, {}, model, hardware, "serving", {}, seed, {**serving, "concurrency": c})["summary"]
            except ValueError:
                continue
            rows.append({"policy": n, "concurrency": c, "throughput_tokens_per_s": s.get("throughput_tokens_per_s"),
                         "latency_p95_s": s.get("e2e_p99_s") or s.get("latency_p95_s")})
    if rows:
        df = pd.DataFrame(rows)
        st.plotly_chart(px.line(df, x="concurrency", y="throughput_tokens_per_s", color="policy", markers=True,
                                title="Throughput against concurrency (target)",
                                labels={"throughput_tokens_per_s": "generated tokens/s"}), key="serving.load")


def _load_from_plan() -> dict | None:
    """A deployment sent by the Deployment page (a planner row): its policy, target, layout, scheduler limits
    and arrivals go into this page's widgets before they are drawn."""
    load = st.session_state.pop("serving.load", None)
    if not load:
        return None
    st.session_state["serving.model"] = load["model"] or "(the trace's own model)"
    if load.get("hardware"):
        st.session_state["serving.hardware"] = load["hardware"]
    st.session_state["serving.policies"] = [load["policy"]]
    ui_deploy.set_state("serving.dep", load["deployment"])
    for k, v in load["serving"].items():
        if isinstance(v, bool):   # a step toggle (ui_serving.STEP_TOGGLES): checked is the default, the switch off
            st.session_state[f"serving.srv.{k}"] = not v
            continue
        st.session_state[f"serving.srv.{k}"] = "" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
    if load.get("concurrency"):
        st.session_state["serving.srv.concurrency"] = min(LOAD_POINTS, key=lambda c: abs(c - int(load["concurrency"])))
        if st.session_state["serving.srv.concurrency"] != int(load["concurrency"]):
            load["note"] = "; ".join(x for x in (load.get("note"), (
                f"the plan ran {load['concurrency']} problems in flight; this page's max-concurrent-problems "
                f"slider is at the nearest of {', '.join(map(str, LOAD_POINTS))}")) if x)
    if load.get("seed") is not None:
        st.session_state["serving.seed"] = str(load["seed"])
    return load


def page() -> None:
    loaded = _load_from_plan()
    if loaded:
        d = loaded["deployment"]
        st.success(f"loaded from the planner: {loaded['policy']} on {loaded['model']}, TP {d['tensor_parallel_size']}"
                   f" x PP {d['pipeline_parallel_size']} x DP {d['data_parallel_size']} ({d['router']}, SLO "
                   f"{d['slo'] or 'none'})" + (f"; {loaded['note']}" if loaded.get("note") else ""))
    st.title("Serving")
    with st.sidebar:
        trace = U.pick("trace", "trace", key="trace", query_param="trace")
    if trace is None:
        return
    slots = U.ErrorSlots("serving")
    model, hardware, seed, ok = U.target_controls("serving", trace, slots=slots)
    from policies import list_policies

    names = [n for n in list_policies() if B.policy_kind(n) != "token"]
    chosen = st.multiselect("policies (at their defaults; tune them on What-if)", names,
                            default=None if "serving.policies" in st.session_state else
                            ["no-kv", "exact-prefix", "asks", "rsbcm"], key="serving.policies")
    with st.expander("serving controls", expanded=True):
        serving, sok = ui_serving.controls("serving.srv", skip=("concurrency",), slots=slots)
    with st.expander("deployment (TP, PP, replicas, router, SLOs)", expanded=bool(loaded)):
        dep, dok, dslots = ui_deploy.controls("serving.dep")
    if not (ok and sok and dok) or not chosen:
        st.warning("Fix the value above (or choose a policy) to see results.")
        return
    try:  # a deployment the target refuses is said beside its widget, before any run
        B.check_deployment(U.session(str(trace)).refresh(), model, hardware, {**serving, **dep})
    except ValueError as exc:
        if not ui_deploy.show_error(exc, dslots):
            U.error(exc)
        return
    _results(trace, list(chosen), model, hardware, int(seed), {**serving, **dep}, slots)


page()
