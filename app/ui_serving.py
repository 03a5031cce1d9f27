"""The serving-at-capacity controls, shared by the What-if and Serving pages.

Each box is checked by :func:`app.params.number` with the bounds of the CLI flag of the same
name; :func:`app.ui_backend.serving_kwargs` routes the values to the simulator. Each box is keyed
``{key}.{name}`` and has a place under it for a simulator error about its field (``ui_common.ErrorSlots``).
"""
from __future__ import annotations

import streamlit as st

from app import ui_common as U
from sim.serving.capacity import ServingConfig
from sim.base.options import flag_for
from sim.replay.runconfig import RunConfig
from sim.workload.config import Workload


def _flag(name: str) -> str:
    """The CLI flag of a serving field, from its declaration (the box's errors name it)."""
    return flag_for(name, RunConfig, Workload, ServingConfig)

# name, label, CLI flag, default text, check. The upper bounds keep a typed size from building work in
# proportion to itself on the dashboard's server (the CLI, run by its own user, takes any size).
MAX_REQUESTS = 100_000
SPEC = [("arrival_rate", "problem rate (problems/s, each B branch requests; empty = closed loop)", _flag("arrival_rate"), "",
         dict(lo=0, lo_open=True, allow_none=True)),
        ("concurrency", "max concurrent problems (problems in flight)", _flag("concurrency"), "4",
         dict(lo=1, hi=4096, integer=True)),
        ("n_requests", f"number of problems (empty = each problem once; at most {MAX_REQUESTS:,})", _flag("n_requests"), "",
         dict(lo=1, hi=MAX_REQUESTS, integer=True, allow_none=True)),
        ("max_num_seqs", "max_num_seqs (empty = the hardware preset's)", _flag("max_num_seqs"), "",
         dict(lo=1, hi=65536, integer=True, allow_none=True)),
        ("max_num_batched_tokens", "max_num_batched_tokens (empty = preset)", _flag("max_num_batched_tokens"), "",
         dict(lo=1, hi=1 << 24, integer=True, allow_none=True)),
        ("gpu_memory_utilization", "gpu_memory_utilization (0–1, empty = 0.90)", _flag("gpu_memory_utilization"), "",
         dict(lo=0, hi=1, lo_open=True, allow_none=True)),
        ("kv_capacity_bytes", "KV capacity in bytes (empty = memory x utilisation - weights - reserve)",
         _flag("kv_capacity_bytes"), "", dict(lo=0, hi=1e18, allow_none=True)),
        ("decode_tokens", "decode tokens per long sequence (empty = recorded; at most 131,072)", _flag("decode_tokens"), "",
         dict(lo=1, hi=131072, integer=True, allow_none=True))]


def controls(key: str, skip: tuple[str, ...] = (), slots=None) -> tuple[dict, bool]:
    """Render the boxes (except ``skip``, set elsewhere on the page); returns ``(options, all valid)``.

    ``slots``: the page's ``ui_common.ErrorSlots`` (prefix ``key`` without its last part), given a place under
    each box.
    """
    st.caption("Serving: problems arrive at one server and contend for its batch and KV memory (simpy engine).")
    c = st.columns(2)
    opts, ok = {}, True
    from app import ui_backend as B

    sched = B.scheduler_choices()
    if sched:
        opts["scheduler"] = c[0].selectbox("scheduler", list(sched), key=f"{key}.scheduler",
                                           help="vllm-v1: running decodes first, chunked prefill; "
                                                "prefill-first: the older rule")
        if slots is not None:
            slots.under("srv.scheduler", c[0])
    rules = B.memory_rules_choices()
    if rules:
        opts["memory_rules"] = c[1].selectbox(
            "vLLM memory rules (KV sizing)", list(rules), key=f"{key}.memory_rules",
            help="how the KV cache is sized: the activation peak, non-torch and CUDA-graph terms of one vLLM "
                 f"generation, each from its logs (v1: vLLM >= 0.21; {_flag('memory_rules')})")
        if slots is not None:
            slots.under("srv.memory_rules", c[1])
    for i, (name, lab, flag, default, check) in enumerate([s for s in SPEC if s[0] not in skip]):
        with c[i % 2]:
            v, good = U.text_number(lab, f"{key}.{name}", flag, default=default, **check)
            if slots is not None:
                slots.under(f"srv.{name}")
        ok &= good
        opts[name] = v
    opts.update(step_toggles(key, st.columns(3)))
    return opts, ok


# beyond the kernels, each a switch of ServingConfig (the CLI's flags): label, field, help. Shown as what is priced
# (checked: vLLM's serve default); a box unchecked sets the field's ``no_...`` / ``enforce_eager`` switch.
STEP_TOGGLES = [("host time per step", "no_host_time",
                 "the hardware profile's host_step (scheduling, input preparation, sampling, output processing); "
                 "unchecked: --no-host-time (kernels only)"),
                ("async scheduling", "no_async_scheduling",
                 "vLLM 0.33's default: a step's host work overlaps the GPU; unchecked: --no-async-scheduling"),
                ("CUDA graphs", "enforce_eager",
                 "decode batches replay vLLM's captured graphs (padded to its capture sizes); unchecked: "
                 "--enforce-eager")]


def step_toggles(key: str, cols) -> dict:
    """How each served step is priced beyond its kernels (:data:`STEP_TOGGLES`, keyed ``{key}.{field}``): the
    ServingConfig switches, set only where a box is unchecked (a checked box is the default)."""
    out = {}
    for col, (label, field, helptext) in zip(cols, STEP_TOGGLES):
        if not col.checkbox(label, value=True, key=f"{key}.{field}", help=f"{helptext} ({_flag(field)})"):
            out[field] = True
    return out
