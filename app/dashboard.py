"""The rksim dashboard (``rksim dashboard`` / ``make app``): an engineer's workbench over the simulator.

A Streamlit multipage app (``st.navigation``): What-if, Serving, Trace explorer, Sweeps,
Deployment, Calibration, Compare. Every simulator call goes through :mod:`app.ui_backend`; every file it
reads is picked from :mod:`app.ui_paths`' listing of the trace roots
(``streamlit run app/dashboard.py -- --trace-root DIR``, or ``$RKSIM_TRACE_ROOT``; default the
bundled ``examples/`` and ``./runs``). No torch is loaded.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
PAGES = [("ui_pages/whatif.py", "What-if", ":material/science:"), ("ui_pages/serving.py", "Serving", ":material/dns:"),
         ("ui_pages/explorer.py", "Trace explorer", ":material/search:"),
         ("ui_pages/sweeps.py", "Sweeps", ":material/scatter_plot:"),
         ("ui_pages/deployment.py", "Deployment", ":material/hub:"),
         ("ui_pages/calibration.py", "Calibration", ":material/target:"),
         ("ui_pages/compare.py", "Compare", ":material/table:")]


def main() -> None:
    st.set_page_config(page_title="rksim", layout="wide")
    pages = [st.Page(str(HERE / f), title=t, icon=i, default=(n == 0)) for n, (f, t, i) in enumerate(PAGES)]
    nav = st.navigation(pages)
    from app import ui_common

    st.sidebar.caption("trace roots: " + ", ".join(ui_common.roots()))
    nav.run()


main()
