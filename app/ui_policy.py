"""One policy's controls: a slider per numeric parameter (ranges from the trace and the policy's own checks),
a select box per choice, a checkbox per flag, and a ``--set``-style text box for exact values.

What the widgets produce goes through :func:`app.params.policy_params` (the simulator's own
validation, as the CLI's ``--set``), so a bad value is one line in the page.
"""
from __future__ import annotations

import math

import numpy as np
import streamlit as st

from app import params as P
from app import ui_backend as B
from app import ui_common as U

# Fixed spans for parameters whose useful range does not come from the trace (lo, hi, step).
_SPANS = {
    "alpha": (0.0, 5.0, 0.1), "eps": (0.0, 1.0, 0.005), "tau_conf": (0.0, 1.0, 0.01), "delta_rel": (0.0, 1.0, 0.01),
    "nb_conf": (0.0, 1.0, 0.01), "nb_margin": (0.0, 1.0, 0.01), "value_frac": (0.0, 1.0, 0.005),
    "temperature": (0.05, 5.0, 0.05), "mix_lambda": (0.0, 1.0, 0.01), "threshold": (-1.0, 1.0, 0.01),
    "unscored_value": (0.0, 1.0, 0.01), "budget_frac": (0.05, 1.0, 0.05),
    "buffer": (1, 256, 1), "sinks": (0, 64, 1), "window": (0, 128, 1), "kernel": (1, 15, 1), "rank": (1, 64, 1),
    "g_seed": (0, 100, 1), "block_size": (1, 64, 1), "n_value": (0, 64, 1),
}
BLOCK_EXTRA = {"budget_frac": 0.5}  # sim.workload.decisions.BLOCK_PARAMS accepted by block and composite policies


def tau_span(sig: np.ndarray) -> tuple[float, float]:
    if sig.size == 0:
        return 0.0, 1.05
    lo = math.floor((float(sig.min()) - 0.005) * 1000) / 1000
    hi = math.ceil((float(sig.max()) + 0.005) * 1000) / 1000
    return lo, hi


def span(policy: str, field: str, default, facts: dict, sig: np.ndarray | None, rng: dict | None):
    """``(lo, hi, step, integer)`` of a parameter's slider."""
    integer = isinstance(default, int) and not isinstance(default, bool) or bool((rng or {}).get("integer"))
    if field == "tau":
        lo, hi = tau_span(sig if sig is not None else np.zeros(0))
        return lo, hi, 0.001, False
    if field == "theta":
        return 0.0, max(0.5, math.ceil(facts["entropy_max"] * 10) / 10), 0.01, False
    if field == "l_min":
        return 1, int(facts["n_layers"]), 1, True
    if field == "budget":
        return 1, max(2, max(facts["long_T"] or [512])), 1, True
    if field in _SPANS:
        lo, hi, step = _SPANS[field]
    elif integer:
        lo, hi, step = 0, max(8, 4 * int(default or 1)), 1
    else:
        lo, hi, step = 0.0, max(1.0, 4 * float(default or 1.0)), 0.01
    r = rng or {}
    if r.get("lo") is not None:
        lo = max(lo, r["lo"] + (step if r.get("lo_open") else 0))
    if r.get("hi") is not None:
        hi = min(hi, r["hi"])
    if integer:
        return int(lo), int(max(hi, lo + 1)), 1, True
    return float(lo), float(max(hi, lo + step)), float(step), False


def _sigma_rug(sig: np.ndarray, lo: float, hi: float):
    """The observed sigmas as tick marks on the tau slider's span (drawn once: it does not depend on tau,
    so moving the slider re-sends an identical figure and the browser does not re-plot it)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_scatter(x=sig, y=np.zeros_like(sig), mode="markers", marker=dict(symbol="line-ns-open", size=14),
                    name="observed sigma", hovertemplate="sigma %{x:.4f}<extra></extra>")
    fig.update_layout(height=90, margin=dict(l=8, r=8, t=4, b=22), showlegend=False,
                      xaxis=dict(range=[lo, hi], title=None), yaxis=dict(visible=False))
    return fig


def controls(policy: str, trace: str, facts: dict, key: str, deferred: list | None = None) -> tuple[dict | None, list[str]]:
    """Render one policy's controls; returns ``(params, notes)`` or ``(None, notes)`` on a bad value.

    Figures that belong to a control (tau's sigma marks) are drawn into a placeholder now and filled
    by the caller after its KPIs (``deferred`` gets ``(placeholder, draw)`` pairs), so a slider's
    KPIs reach the browser before any figure; without ``deferred`` they are drawn at once.
    """
    from policies import param_choices, policy_defaults

    defaults = dict(policy_defaults(policy))
    kind = B.policy_kind(policy)
    if kind in ("block", "composite"):
        defaults.update(BLOCK_EXTRA)
    choices = param_choices(policy)
    ranges = U.param_ranges(policy)
    sig = None
    notes: list[str] = []
    if "tau" in defaults:
        asks_keys = {"alpha", "pooling", "similarity", "layer_weights"}
        cur = {k: st.session_state.get(f"{key}.{k}", defaults[k]) for k in asks_keys if k in defaults}
        try:
            sig = U.observed_sigmas(trace, cur)
        except ValueError:
            sig = np.zeros(0)
    params: dict = {}
    cols = st.columns(3)
    i = 0
    for field, default in defaults.items():
        wkey = f"{key}.{field}"
        col = cols[i % 3]
        i += 1
        if field in choices:
            opts = list(choices[field])
            params[field] = col.selectbox(field, opts, index=opts.index(default) if default in opts else 0, key=wkey)
        elif isinstance(default, bool) or (ranges.get(field) or {}).get("type") == "bool":
            params[field] = col.checkbox(field, value=bool(default), key=wkey)
        elif isinstance(default, (int, float)) or default is None and field in _SPANS:
            lo, hi, step, integer = span(policy, field, default, facts, sig, ranges.get(field))
            if default is None:
                # "None = the policy decides" (e.g. n_value from value_frac): the checkbox turns the slider on
                if not col.checkbox(f"set {field}", value=False, key=f"{wkey}.on"):
                    params[field] = None
                    continue
                default = lo
            v0 = min(max(default, lo), hi)
            v0 = int(round(v0)) if integer else float(v0)
            fmt = None if integer else ("%.3f" if step < 0.01 else "%.2f")
            val = col.slider(field, min_value=lo, max_value=hi, value=v0, step=step, key=wkey, format=fmt,
                             help=f"range {B.range_text(ranges.get(field)) or 'any'}; default {default}")
            try:  # a slider cannot send a value outside its span, but a stale or forged session value can
                val = P.number(val, f"policy {policy!r}: {field}", lo=lo, hi=hi, integer=integer)
            except ValueError as exc:
                U.error(exc)
                return None, notes
            params[field] = val
            if field == "tau" and sig is not None and sig.size:
                slot = col.empty()

                def draw(slot=slot, lo=lo, hi=hi, wkey=wkey):
                    slot.plotly_chart(_sigma_rug(sig, lo, hi), key=f"{wkey}.rug",
                                      config={"displayModeBar": False})
                if deferred is None:
                    draw()
                else:
                    deferred.append(draw)
        else:
            text = col.text_input(f"{field} (empty = default)", value="", key=wkey)
            params[field] = P.parse_value(text) if text.strip() else default
    exact = st.text_input("exact values, as the CLI's --set (e.g. tau=0.975; l_min=20)", value="",
                          key=f"{key}.exact", help="each KEY=VALUE is parsed and checked exactly like `--set`")
    try:
        params.update(P.parse_sets(P.split_sets(exact), "--set"))
        changed = {k: v for k, v in params.items() if k not in defaults or v != defaults[k] or k in BLOCK_EXTRA}
        P.policy_params(policy, changed)
    except ValueError as exc:
        U.error(exc)
        return None, notes
    if sig is not None and sig.size and isinstance(params.get("tau"), (int, float)):
        notes.append(tau_note(sig, float(params["tau"])))
    return changed, notes


def tau_note(sig: np.ndarray, tau: float) -> str:
    """What a tau does on this trace, in words (the sigmas it is compared with)."""
    share = float(np.mean(sig >= tau))
    txt = (f"observed sigmas lie in {sig.min():.3f}–{sig.max():.3f}: tau {tau:.3f} shares {share:.0%} of the "
           f"non-root branches")
    if share == 1:
        return txt + " — every one: any tau below the lowest sigma does the same"
    if share == 0:
        return txt + (" — none: exact prefix's reuse plus the gate's cost (tau > 1 turns the gate off)" if tau <= 1
                      else " — none, and tau > 1 runs no gate: exactly exact prefix")
    return txt
