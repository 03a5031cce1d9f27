"""Deployment: a model on TP x PP GPUs per replica, replicas behind a router, judged on SLO goodput; and the
planner's frontier (a ``rksim plan`` file or a small plan run here), whose points load into Serving."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import ui_backend as B
from app import ui_common as U
from app import ui_deploy, ui_serving

DEFAULT_POLICIES = ["exact-prefix", "asks"]
DEFAULT_TARGET = {"deploy.model": "qwen2.5-32b", "deploy.hardware": "h100-sxm", "deploy.dep.tp": 2,
                  "deploy.dep.dp": "2", "deploy.dep.slo.ttft": "1", "deploy.dep.slo.e2e": "20"}
KPIS = ["goodput_problems_per_s", "throughput_problems_per_s", "slo_attainment", "throughput_tokens_per_s",
        "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "lost_asks_shares"]
TOTALS = KPIS + ["ttft_p50_s", "e2e_p50_s", "prefix_hit_rate", "lost_prefix_reuse", "split_problems", "preemptions",
                 "gpu_utilisation", "kv_capacity_bytes"]


def _serve(trace: str, chosen: list[str], model, hardware: str, seed: int, serving: dict, dep: dict,
           slots: dict) -> None:
    results = {}
    for n in chosen:
        try:
            results[n] = U.run(trace, n, {}, model, hardware, "serving", {}, seed, {**serving, **dep})
        except ValueError as exc:
            if not ui_deploy.show_error(exc, slots):
                U.error(f"{n}: {U.one_line(exc)}")
            return  # the same deployment refuses every policy: one line is enough
    if not results:
        return
    first = next(iter(results.values()))
    st.caption(f"{first['info'].get('note', '')}; {B.capacity_note(first['info'], first['summary']) or ''}; "
               f"scheduler {first['summary'].get('scheduler', 'vllm-v1')}, max_num_seqs "
               f"{first['summary'].get('max_num_seqs')}, max_num_batched_tokens "
               f"{first['summary'].get('max_num_batched_tokens')} per replica; SLO {dep['slo'] or 'none'}")
    cols = st.columns(len(results))
    for col, (n, r) in zip(cols, results.items()):
        with col:
            st.markdown(f"**{n}**")
            for k in KPIS:
                st.metric(f"{n} · {B.label(k)}", B.fmt(k, r["summary"].get(k)))
    st.dataframe(pd.DataFrame({B.label(k): {n: B.fmt(k, r["summary"].get(k)) for n, r in results.items()}
                               for k in TOTALS}).T, width="stretch", key="deploy.totals")
    import plotly.express as px

    tabs = st.tabs([f"{n}: per replica" for n in results])
    for tab, (n, r) in zip(tabs, results.items()):
        with tab:
            table = B.per_replica(r["summary"])
            st.dataframe(table.rename(columns=B.label), width="stretch", key=f"deploy.rep.{n}")
            lat = table.drop(index="total", errors="ignore")
            if lat.empty:
                lat = table
            long = lat.reset_index().melt(id_vars="replica", value_vars=["ttft_p50_s", "ttft_p99_s", "tpot_p99_s",
                                                                         "e2e_p50_s", "e2e_p99_s"],
                                          var_name="percentile", value_name="seconds").dropna()
            if len(long):
                st.plotly_chart(px.bar(long, x="replica", y="seconds", color="percentile", barmode="group",
                                       title=f"{n}: latency percentiles per replica (s, target)"),
                                key=f"deploy.lat.{n}")
            thr = lat.reset_index().melt(id_vars="replica", value_vars=["throughput_problems_per_s",
                                                                        "goodput_problems_per_s"],
                                         var_name="figure", value_name="problems/s").dropna()
            if len(thr):
                st.plotly_chart(px.bar(thr, x="replica", y="problems/s", color="figure", barmode="group",
                                       title=f"{n}: throughput and goodput per replica"), key=f"deploy.thr.{n}")


def _small_plan(trace: str | None):
    st.caption(f"The planner of `rksim plan` run here (at most {B.SMALL_PLAN_MAX} deployments, local, not written "
               "to disk); each policy at its defaults, served on the trace's problems under the SLOs and the target "
               "flags above (weights, KV cache, expert parallel, MoE routing), as `rksim plan` takes them.")
    pr = B.presets()
    c = st.columns(3)
    model = c[0].selectbox("model", pr["models"], key="deploy.plan.model",
                           index=pr["models"].index("qwen2.5-32b") if "qwen2.5-32b" in pr["models"] else 0)
    nodes = B.node_presets()
    node = c[1].selectbox("node", nodes, key="deploy.plan.node",
                          index=nodes.index("dgx-h100") if "dgx-h100" in nodes else 0)
    with c[2]:
        gpus, ok_g = U.text_number("GPU budget", "deploy.plan.gpus", "--gpus", default="4", lo=1, hi=64, integer=True)
    d = st.columns(3)
    from policies import list_policies

    pols = d[0].multiselect("policies", [p for p in list_policies() if B.policy_kind(p) != "token"],
                            default=["exact-prefix", "asks"], key="deploy.plan.policies")
    tps = d[1].multiselect("TP sizes", list(B.tp_sizes()), default=[1, 2, 4], key="deploy.plan.tp")
    pps = d[2].multiselect("PP sizes", [1, 2, 4], default=[1], key="deploy.plan.pp")
    e = st.columns(3)
    with e[0]:
        rate, ok_r = U.text_number("arrival rate (problems/s, empty = closed loop)", "deploy.plan.rate",
                                   "--arrival-rate", default="", lo=0, lo_open=True, allow_none=True)
    with e[1]:
        conc, ok_c = U.text_number("concurrency (closed loop)", "deploy.plan.conc", "--concurrency", default="8",
                                   lo=1, hi=4096, integer=True)
    with e[2]:
        nreq, ok_n = U.text_number(f"requests (empty = each problem once; at most {ui_serving.MAX_REQUESTS:,})",
                                   "deploy.plan.requests", "--requests", default="", lo=1,
                                   hi=ui_serving.MAX_REQUESTS, integer=True, allow_none=True)
    rules = st.selectbox("vLLM memory rules (KV sizing)", list(B.memory_rules_choices()),
                         key="deploy.plan.memory_rules",
                         help="how each deployment's KV cache is sized: the activation peak, non-torch and CUDA-graph "
                              "terms of one vLLM generation (v1: vLLM >= 0.21; --vllm-memory-rules)")
    ok = ok_g and ok_r and ok_c and ok_n and bool(pols and tps and pps) and trace is not None
    if not (pols and tps and pps):
        U.error("--policies / --tensor-parallel-size / --pipeline-parallel-size: choose at least one of each")
    if st.button("run plan", key="deploy.plan.run", disabled=not ok):
        dep = st.session_state.get("deploy.dep.current", {})
        try:
            with st.spinner("planning..."):
                df, meta = U.run_small_plan(trace, model, node, int(gpus), tuple(pols), tuple(sorted(tps)),
                                            tuple(sorted(pps)), dep.get("router", "prefix-affinity"),
                                            dep.get("slo"), rate, int(conc), nreq, 0,
                                            {**{k: dep.get(k) for k in B.PLAN_TARGET_OPTIONS}, "memory_rules": rules})
        except ValueError as exc:
            U.error(exc)
            return None
        st.session_state["deploy.plan.ran"] = (df, meta)
    return st.session_state.get("deploy.plan.ran")


def _frontier(df: pd.DataFrame, meta: dict) -> None:
    c = st.columns(2)
    x = c[0].radio("x axis (fewer is better)", ["gpus", "cost"], horizontal=True, key="deploy.front.x",
                   help="cost = cost per million output tokens; it needs a plan run with --gpu-hour-cost")
    y = c[1].radio("y axis (more is better)", ["goodput", "throughput"], horizontal=True, key="deploy.front.y")
    try:
        fig, curves, xc, yc = B.plan_figure(df, meta, x, y)
    except ValueError as exc:
        U.error(exc)
        return
    front = B.plan_frontier(df, xc, yc)
    st.caption(f"{len(front)} of {len(df)} deployments on the frontier over all policies; each policy's own "
               "frontier is its line. Click a point (or choose a row below) to load it into the Serving page."
               + (f" Each step priced: {meta['overheads']}." if meta.get("overheads") else ""))
    ev = st.plotly_chart(fig, on_select="rerun", selection_mode="points", key="deploy.front.fig")
    pts = (ev or {}).get("selection", {}).get("points", []) if isinstance(ev, dict) else \
        getattr(getattr(ev, "selection", None), "points", []) or []
    clicked = None
    if pts:
        p = pts[0]
        cn, idx = int(p.get("curve_number", -1)), int(p.get("point_index", p.get("point_number", -1)))
        if 0 <= cn < len(curves) and 0 <= idx < len(curves[cn]):
            clicked = int(curves[cn][idx])
    cols = [k for k in ("policy", "gpus", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                        "max_num_seqs", "max_num_batched_tokens", "goodput_problems_per_s", "slo_attainment",
                        "throughput_tokens_per_s", "e2e_p99_s", "cost_per_million_output_tokens") if k in df.columns]
    st.dataframe(front[cols], hide_index=True, width="stretch", key="deploy.front.table")
    choices = list(front.index) + [i for i in df.index if i not in set(front.index)]
    if clicked is not None and clicked in choices and st.session_state.get("deploy.front.clicked") != clicked:
        st.session_state["deploy.front.row"] = clicked      # a new click selects its row; the box may then differ
        st.session_state["deploy.front.clicked"] = clicked

    def name(i):
        r = df.loc[i]
        return (f"{'frontier · ' if i in set(front.index) else ''}{r['policy']}: TP {r['tensor_parallel_size']} x "
                f"PP {r['pipeline_parallel_size']} x DP {r['data_parallel_size']}, max_num_seqs {r['max_num_seqs']}, "
                f"max_num_batched_tokens {r['max_num_batched_tokens']} → {yc} {r[yc]:.4g}, {xc} {r[xc]:.4g}")

    if st.session_state.get("deploy.front.row") not in choices:
        st.session_state.pop("deploy.front.row", None)
    row = st.selectbox("deployment", choices, format_func=name, key="deploy.front.row")
    st.caption(f"selected: {name(row)}")  # the box truncates a long line
    if st.button("open this deployment in Serving", key="deploy.open"):
        st.session_state["serving.load"] = B.serving_load(df.loc[row].to_dict(), meta)
        st.switch_page("ui_pages/serving.py")
    _knee(df.loc[row].to_dict(), meta, name(row))


def _knee(row: dict, meta: dict, title: str) -> None:
    """The latency-rate curve and knee of the selected deployment (``rksim plan --knee``'s function)."""
    with st.expander("latency-rate curve and knee of this deployment", expanded=False):
        st.caption("Its problems served at each Poisson rate (problems/s), the plan's model, node, router, problem "
                   "count and seed; the knee is the highest rate up to which every rate meets the SLO and no queue "
                   "grows without bound (docs/sweeps.md). One run per rate.")
        c = st.columns(3)
        rates = c[0].text_input("rates (problems/s: 1,2,4 or START:STOP:STEP)", "0.5,1,2,4,8", key="deploy.knee.rates")
        slo = c[1].text_input("knee SLO (ms, vllm bench serve keys)", "p99_ttft_ms=1000,mean_tpot_ms=50",
                              key="deploy.knee.slo")
        with c[2]:
            refine, ok = U.text_number("bisection steps", "deploy.knee.refine", "--knee-refine", "2", lo=0, hi=8,
                                       integer=True)
        if st.button("find the knee", key="deploy.knee.run", disabled=not ok):
            try:
                with st.spinner("serving each rate..."):
                    st.session_state["deploy.knee.ran"] = (title, *B.deployment_knee(row, meta, rates, slo,
                                                                                      int(refine or 0)))
            except ValueError as exc:
                U.error(exc)
                return
        got = st.session_state.get("deploy.knee.ran")
        if got is None or got[0] != title:
            return
        _, curve, cap = got
        st.caption(cap)
        st.plotly_chart(B.knee_figure(curve, cap), key="deploy.knee.fig")
        st.dataframe(pd.DataFrame(curve["points"]), hide_index=True, width="stretch", key="deploy.knee.table")


def page() -> None:
    st.title("Deployment")
    for k, v in DEFAULT_TARGET.items():
        st.session_state.setdefault(k, v)
    with st.sidebar:
        trace = U.pick("trace", "trace", key="trace", query_param="trace")
    if trace is None:
        return
    model, hardware, seed, ok = U.target_controls("deploy", trace)
    from policies import list_policies

    names = [n for n in list_policies() if B.policy_kind(n) != "token"]
    chosen = st.multiselect("policies (at their defaults)", names, default=DEFAULT_POLICIES, key="deploy.policies")
    st.subheader("Deployment")
    dep, dok, slots = ui_deploy.controls("deploy.dep")
    st.session_state["deploy.dep.current"] = dep
    with st.expander("serving controls (arrivals, scheduler limits, KV capacity)", expanded=False):
        serving, sok = ui_serving.controls("deploy.srv")
    if not (ok and dok and sok) or not chosen:
        st.warning("Fix the value above (or choose a policy) to see results.")
    else:
        _serve(trace, list(chosen), model, hardware, int(seed), serving, dep, slots)
    st.subheader("Planner frontier")
    src = st.radio("source", ["a plan file under the trace roots", "run a small plan here"], horizontal=True,
                   key="deploy.plan.source")
    if src.startswith("a plan"):
        got = U.pick_table("plan", "plan file (rksim plan --out)", "deploy.plan.file", "plan", U.read_plan)
        if got is None:
            return
        df, meta = got
    else:
        got = _small_plan(trace)
        if got is None:
            return
        df, meta = got
    _frontier(df, meta)


page()
