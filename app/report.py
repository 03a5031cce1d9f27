"""The HTML report of ``rksim demo``: plotly figures of a policy comparison, one self-contained file."""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd


def _atomic_write(path: Path, text: str) -> Path:
    from traces.store import atomic_write_text

    atomic_write_text(path, text)
    return path


def fig_latency_breakdown(label: str, policies: dict):
    import plotly.graph_objects as go
    names = [n for n, m in policies.items() if m.get("kind") != "token"]
    fig = go.Figure()
    for ph in ("gate", "prefill", "decode", "verify"):
        fig.add_bar(name=ph, x=names, y=[policies[n].get(f"{ph}_s_mean") or 0.0 for n in names])
    fig.update_layout(barmode="stack", title=f"Mean per-problem latency by phase: {label}",
                      yaxis_title="seconds", xaxis_title="policy")
    return fig


def sigma_bins(values, n: int = 30) -> dict:
    """One set of histogram bin edges for every series of the sigma figure (plotly ``xbins``)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 0.5e-3, hi + 0.5e-3
    size = (hi - lo) / n
    # the last edge a little past the maximum, so the maximum falls inside the last bin
    return {"start": lo, "end": hi + size * 1e-6, "size": size}


def fig_sigma(branches: pd.DataFrame, tau: float):
    import plotly.graph_objects as go
    nr = branches[(branches["branch"] > 0) & np.isfinite(branches["sigma"])]
    bins = sigma_bins(nr["sigma"])  # both series on the same edges, so their bars compare
    fig = go.Figure()
    for same, name in ((True, "counterfactual answer = own"), (False, "answer changed by sharing")):
        fig.add_histogram(x=nr.loc[nr["cf_same_answer"] == same, "sigma"], name=name, opacity=0.7,
                          xbins=bins, autobinx=False)
    fig.add_vline(x=tau, line_dash="dash", annotation_text=f"tau = {tau}")
    fig.update_layout(barmode="overlay", title="ASKS sigma of non-root branches against tau", xaxis_title="sigma",
                      yaxis_title="branches")
    return fig


def fig_entropy(tf, theta: float, l_min: int):
    import plotly.graph_objects as go
    fig = go.Figure()
    curves = []
    for f in tf.problems:
        H = f.lens[("own", True)]["entropy"]
        curves.append(H)
        for b in range(min(H.shape[0], 2)):
            fig.add_scatter(x=np.arange(1, H.shape[1] + 1), y=H[b], mode="lines", line=dict(width=1),
                            opacity=0.35, showlegend=False)
    if curves:
        allH = np.concatenate(curves, axis=0)
        fig.add_scatter(x=np.arange(1, allH.shape[1] + 1), y=np.median(allH, axis=0), mode="lines+markers",
                        name="median over branches", line=dict(width=3))
    fig.add_hline(y=theta, line_dash="dash", annotation_text=f"theta = {theta} nats")
    fig.add_vline(x=l_min, line_dash="dot", annotation_text=f"l_min = {l_min}")
    fig.update_layout(title="Logit-lens entropy of the verification pass by layer (own generations)",
                      xaxis_title="layer", yaxis_title="entropy (nats)")
    return fig


def fig_exit_hist(branches: pd.DataFrame, L: int):
    import plotly.graph_objects as go
    counts = branches["exit_layer"].value_counts().sort_index()
    fig = go.Figure(go.Bar(x=[("skipped" if k == 0 else str(k)) for k in counts.index], y=counts.values))
    fig.update_layout(title=f"CGEE exit layer of each verification pass (L = {L}; 'skipped' = level-1 skip)",
                      xaxis_title="exit layer", yaxis_title="passes")
    return fig


def fig_kv(details: dict, pos: int):
    import plotly.graph_objects as go
    fig = go.Figure()
    for name, r in details.items():
        tl = r.kv_timeline
        tl = tl[tl["pos"] == pos]
        # every policy in the legend: one without a timeline for this problem says so
        fig.add_scatter(x=tl["t_s"], y=tl["kv_bytes"] / 1e6, mode="lines", line_shape="hv",
                        name=name if len(tl) else f"{name} (no KV timeline)", showlegend=True)
    fig.update_layout(title=f"KV memory over time, problem {pos} (isolated)", xaxis_title="seconds since arrival",
                      yaxis_title="MB")
    return fig


def fig_vase(policies: dict):
    import plotly.graph_objects as go
    fig = go.Figure()
    xs_all = sorted({v["budget"] for m in policies.values() for v in (m.get("budgets") or {}).values()})
    for name, m in policies.items():
        if m.get("kind") != "token":
            continue
        b = m.get("budgets")
        if name == "full" and xs_all:
            # the reference: the full cache has no attention-output error at any budget
            fig.add_scatter(x=xs_all, y=[0.0] * len(xs_all), mode="lines", line_dash="dot", name="full (reference)")
            continue
        if not b:
            fig.add_scatter(x=[], y=[], mode="lines+markers", name=f"{name} (not measured)", showlegend=True)
            continue
        xs = [v["budget"] for v in b.values()]
        fig.add_scatter(x=xs, y=[v["attn_output_rel_error"] for v in b.values()], mode="lines+markers", name=name)
    fig.update_layout(title="Attention-output relative error against the KV budget (long decodes)",
                      xaxis_title="budget K (tokens per KV head)", yaxis_title="relative error", xaxis_type="log")
    return fig


def capacity_table(policies: dict) -> pd.DataFrame:
    """What every block and token policy ran under: KV capacity, block budget, token budget K."""
    rows = {}
    for name, m in policies.items():
        kind = m.get("kind")
        if kind not in ("block", "composite", "token"):
            continue
        if kind == "token":
            for label, b in (m.get("budgets") or {}).items():
                cap = b.get("kv_capacity_bytes")
                rows[f"{name} ({label})"] = {
                    "kind": kind, "KV capacity (GB)": cap / 1e9 if cap else None,
                    "block budget (blocks)": "—", "token budget K per KV head": b.get("budget"),
                    "KV per sequence (tokens)": b.get("kv_cap_tokens_per_sequence")}
        else:
            cap = m.get("kv_capacity_bytes")
            bb = m.get("kv_budget_blocks")
            rows[name] = {"kind": kind, "KV capacity (GB)": cap / 1e9 if cap else None,
                          "block budget (blocks)": bb if bb is not None else "per problem (kv_budget_frac)",
                          "token budget K per KV head": "—", "KV per sequence (tokens)": "—"}
    return pd.DataFrame.from_dict(rows, orient="index")


def write_report(path, trace, results: dict, details: dict) -> Path:
    """Write the demo report (figures + tables) to ``path`` atomically."""
    import plotly.io as pio

    from policies import policy_defaults
    from sim.workload import features

    tf = features.load(trace)
    first = next(iter(results.values()))
    label0 = next(iter(results))
    asks_tau = float(policy_defaults("asks")["tau"])
    cg = policy_defaults("cgee")
    figs = []
    for label, r in results.items():
        figs.append(fig_latency_breakdown(label, r["compare"]["policies"]))
    if "asks" in details:
        figs.append(fig_sigma(details["asks"].branches, asks_tau))
    figs.append(fig_entropy(tf, float(cg["theta"]), int(cg["l_min"])))
    if "cgee" in details:
        figs.append(fig_exit_hist(details["cgee"].branches, tf.n_layers))
    if tf.problems:
        figs.append(fig_kv(details, tf.problems[0].pos))
    figs.append(fig_vase(first["compare"]["policies"]))
    parts = []
    for i, fig in enumerate(figs):
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs="inline" if i == 0 else False))
    tables = []
    from app.tables import fmt_table
    for label, r in results.items():
        df = fmt_table(r["compare"]["policies"])
        tables.append(f"<h2>{html.escape(label)}</h2>" + df.to_html(float_format=lambda x: f"{x:.4g}", na_rep="—"))
        cap = capacity_table(r["compare"]["policies"])
        if len(cap):
            any_m = next(iter(r["compare"]["policies"].values()))
            src = any_m.get("capacity_source") or ""
            tables.append(f"<h3>Capacity and budget each block and token policy ran under ({html.escape(label)})</h3>"
                          f"<p>KV capacity = device memory x gpu_memory_utilization - weights - activation reserve "
                          f"({html.escape(str(src))}). Block policies evict under that capacity in blocks unless "
                          f"a budget is set; token policies bound each sequence's KV at K + B (+ sinks).</p>"
                          + cap.to_html(float_format=lambda x: f"{x:.4g}", na_rep="—"))
    info = details[next(iter(details))].info if details else {}
    head = (f"<p>Trace: {html.escape(str(tf.path))} — decisions from <b>{html.escape(tf.model_name)}</b> "
            f"({len(tf.problems)} problems, {tf.problems[0].B if tf.problems else 0} branches, {tf.n_layers} layers). "
            f"Isolated mode; verification reuses the generation KV (<code>verify_reuses_kv = "
            f"{info.get('verify_reuses_kv', True)}</code>). Figures other than the latency breakdowns use the "
            f"first target ({html.escape(label0)}).</p>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>rksim demo</title></head><body>"
            "<h1>rksim demo: policy comparison</h1>" + head + "".join(tables) + "".join(parts) + "</body></html>")
    return _atomic_write(Path(path), page)
