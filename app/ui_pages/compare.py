"""Compare: the `rksim compare` table for the chosen trace and target, downloadable as CSV."""
from __future__ import annotations

import streamlit as st

from app import ui_backend as B
from app import ui_common as U


def page() -> None:
    st.title("Compare")
    with st.sidebar:
        trace = U.pick("trace", "trace", key="trace", query_param="trace")
    if trace is None:
        return
    slots = U.ErrorSlots("compare")
    model, hardware, seed, ok = U.target_controls("compare", trace, slots=slots)
    target = U.precision_controls("compare", slots)
    mode = st.sidebar.radio("mode", ["isolated", "serving"], horizontal=True, key="compare.mode")
    slots.under("mode", st.sidebar)
    if not ok:
        return
    st.caption("Every registered policy at its defaults (token-eviction policies at 4x compression), "
               "as `rksim compare --trace ... --model-preset ... --hardware ... [--quantization Q] "
               "[--kv-cache-dtype D]` prints it.")
    try:
        with st.spinner("comparing every policy..."):
            df = U.compare(trace, model, hardware, mode, None, int(seed), target)
    except ValueError as exc:
        if not slots.show(exc):
            U.error(exc)
        if B.out_of_calibration(exc):
            st.info(U.refusal_advice(trace, model or "the trace's model", model, hardware, mode))
        return
    st.dataframe(df, width="stretch", height=35 * (len(df) + 1) + 3, key="compare.table")  # every row
    st.caption(B.CI_NOTE)
    name = f"compare-{model or 'trace-model'}-{hardware}-{mode}.csv"
    st.download_button("download CSV", df.to_csv().encode(), file_name=name, mime="text/csv", key="compare.csv")


page()
