"""Serving: policies on one server at capacity — throughput, latency from arrival, queueing, KV in use."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import ui_backend as B
from app import ui_common as U
from app import ui_serving

LOAD_POINTS = (1, 2, 4, 8, 16)


@st.fragment
def _results(trace: str, chosen: list[str], model, hardware: str, seed: int, serving: dict, slots) -> None:
    conc = st.select_slider("max concurrent problems (problems in flight)", options=list(LOAD_POINTS),
                            value=int(serving.get("concurrency") or 4), key="serving.srv.concurrency")
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
            for k in keys[:6]:
                st.metric(f"{n} · {B.label(k)}", B.fmt(k, r["summary"].get(k)))
    st.dataframe(pd.DataFrame({B.label(k): {n: B.fmt(k, r["summary"].get(k)) for n, r in results.items()}
                               for k in keys}).T, width="stretch")
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


def page() -> None:
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
                            default=["no-kv", "exact-prefix", "asks", "rsbcm"], key="serving.policies")
    with st.expander("serving controls", expanded=True):
        serving, sok = ui_serving.controls("serving.srv", skip=("concurrency",), slots=slots)
    if not (ok and sok) or not chosen:
        st.warning("Fix the value above (or choose a policy) to see results.")
        return
    _results(trace, list(chosen), model, hardware, int(seed), serving, slots)


page()
