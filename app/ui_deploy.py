"""The deployment controls (node, TP, PP, replicas, router, SLOs), shared by the Deployment and Serving pages.

Each widget has a slot under it: an error the simulator raises names its option
(``sim.base.errors.ConfigError.field``), and :func:`show_error` writes it there, beside the widget at
fault, not at the top of the page. The values are the keywords of ``sim.api.simulate``
(``node``, ``tensor_parallel_size``, ``pipeline_parallel_size``, ``data_parallel_size``, ``router``,
``slo``, ``quantization``, ``kv_cache_dtype``, ``enable_expert_parallel``, ``moe_routing``), which
:func:`app.ui_backend.serving_kwargs` routes there.
"""
from __future__ import annotations

import streamlit as st

from app import ui_backend as B
from app import ui_common as U

NODE_AUTO = "(one GPU; with TP x PP > 1 the GPU's node preset)"
MAX_REPLICAS = 64  # replicas a page may run (each is one engine; the CLI takes up to sim.cost.parallel.MAX_DP)
SLO_KEYS = ("ttft", "tpot", "e2e")


def controls(key: str) -> tuple[dict, bool, dict]:
    """Render the controls; returns ``(deployment keywords, all valid, {field: slot})``."""
    slots: dict = {}
    c = st.columns(3)
    nodes = [NODE_AUTO] + B.node_presets()
    with c[0]:
        node = st.selectbox("node (interconnect of TP / PP)", nodes, key=f"{key}.node",
                            help="the node preset whose measured collectives price TP and PP (--node)")
        slots["node"] = st.empty()
        tp = st.selectbox("tensor parallel size (GPUs per stage)", list(B.tp_sizes()), key=f"{key}.tp",
                          help="--tensor-parallel-size: weights and heads split, two all-reduces per layer")
        slots["tensor_parallel_size"] = st.empty()
    with c[1]:
        pp, ok_pp = U.text_number("pipeline parallel size (stages)", f"{key}.pp", "--pipeline-parallel-size", "1", lo=1,
                         hi=64, integer=True)
        slots["pipeline_parallel_size"] = st.empty()
        dp, ok_dp = U.text_number(f"replicas (data parallel size, at most {MAX_REPLICAS})", f"{key}.dp",
                         "--data-parallel-size", "1", lo=1, hi=MAX_REPLICAS, integer=True)
        slots["data_parallel_size"] = st.empty()
    with c[2]:
        rs = list(B.routers())
        router = st.selectbox("router (replicas > 1)", rs, key=f"{key}.router",
                              index=rs.index("prefix-affinity") if f"{key}.router" not in st.session_state else 0,
                              help="round-robin, least-outstanding (fewest in flight), prefix-affinity (the "
                                   "problem's shared prefix hashed to a replica), branch-spread")
        slots["router"] = st.empty()
    w = st.columns(3)
    with w[0]:
        q = U.weights_picker(key)
        slots["quantization"] = st.empty()
    with w[1]:
        kv = U.kv_picker(key)
        slots["kv_cache_dtype"] = st.empty()
    with w[2]:
        ep = st.checkbox("expert parallel (--enable-expert-parallel)", key=f"{key}.ep",
                         help="MoE models: experts sharded over the GPUs; with replicas > 1, vLLM's DP attention")
        slots["enable_expert_parallel"] = st.empty()
        routing = st.selectbox("MoE routing (--moe-routing)", B.moe_routings(), key=f"{key}.routing",
                               help="MoE models: the experts a step reads, by the expected distinct count under "
                                    "uniform routing, or sampled (a seeded draw; with expert parallel, the "
                                    "busiest rank's)")
        slots["moe_routing"] = st.empty()
    st.caption("SLOs in seconds, any subset (empty = not stated); goodput = problems/s meeting every stated one")
    s = st.columns(3)
    slo, ok_slo = {}, True
    for col, k in zip(s, SLO_KEYS):
        with col:
            v, good = U.text_number(f"{k} SLO (s)", f"{key}.slo.{k}", f"--slo {k}", "", lo=0, lo_open=True, allow_none=True)
        slo[k], ok_slo = v, ok_slo and good
    slots["slo"] = st.empty()
    dep = {"node": None if node == NODE_AUTO else node, "tensor_parallel_size": int(tp),
           "pipeline_parallel_size": int(pp or 1), "data_parallel_size": int(dp or 1), "router": router,
           "slo": B.slo_text(**slo), "quantization": q, "kv_cache_dtype": kv, "enable_expert_parallel": bool(ep),
           "moe_routing": routing}
    return dep, bool(ok_pp and ok_dp and ok_slo), slots


def set_state(key: str, dep: dict) -> None:
    """Put a deployment (``controls``' keywords) into the widgets' session state before they are drawn."""
    st.session_state[f"{key}.node"] = dep.get("node") or NODE_AUTO
    st.session_state[f"{key}.tp"] = int(dep.get("tensor_parallel_size") or 1)
    st.session_state[f"{key}.pp"] = str(int(dep.get("pipeline_parallel_size") or 1))
    st.session_state[f"{key}.dp"] = str(int(dep.get("data_parallel_size") or 1))
    if dep.get("router"):
        st.session_state[f"{key}.router"] = dep["router"]
    stated = {}
    for part in (dep.get("slo") or "").split(","):
        k, _, v = part.partition("=")
        if k.strip() in SLO_KEYS:
            stated[k.strip()] = v.strip()
    for k in SLO_KEYS:
        st.session_state[f"{key}.slo.{k}"] = stated.get(k, "")
    st.session_state[f"{key}.quant"] = dep.get("quantization") or B.AS_RELEASED
    st.session_state[f"{key}.kv_dtype"] = dep.get("kv_cache_dtype") or "auto"
    st.session_state[f"{key}.ep"] = bool(dep.get("enable_expert_parallel"))
    st.session_state[f"{key}.routing"] = dep.get("moe_routing") or "expected"


def show_error(exc: BaseException, slots: dict) -> bool:
    """Write the error beside the widget its ``field`` names; False when it names none of these widgets (the
    caller then shows it where it belongs)."""
    slot = slots.get(B.error_field(exc))
    if slot is None:
        return False
    slot.error(U.one_line(exc), icon=":material/error:")
    return True
