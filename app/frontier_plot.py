"""Pareto-frontier figures (plotly): a sweep's configurations and frontier, a plan's deployments per policy.

``sim.search.pareto`` and ``sim.search.planner`` compute the frontiers (DataFrames); the figures are built here, so the
simulator imports no plotting library.
"""
from __future__ import annotations

import pandas as pd

from sim.search.planner import plan_caption, plan_frontiers


def frontier_figure(df: pd.DataFrame, front: pd.DataFrame, x: str, y: str, title: str | None = None):
    """Plotly figure: every configuration as a point, the frontier as a line over it."""
    import plotly.graph_objects as go

    params = [c for c in df.columns if c.startswith("param.")]
    hover_cols = (["config_id"] if "config_id" in df.columns else []) + params

    def hover(frame: pd.DataFrame):
        if not hover_cols:
            return None
        return ["<br>".join(f"{c}={frame[c].iloc[i]}" for c in hover_cols) for i in range(len(frame))]

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df[x], y=df[y], mode="markers", name="configurations",
                             marker=dict(size=7, color="rgba(120,120,160,0.55)"),
                             text=hover(df), hovertemplate=f"{x}=%{{x}}<br>{y}=%{{y}}<br>%{{text}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=front[x], y=front[y], mode="lines+markers", name="Pareto frontier",
                             line=dict(color="crimson", width=2, shape="hv"),
                             marker=dict(size=9, color="crimson"),
                             text=hover(front), hovertemplate=f"{x}=%{{x}}<br>{y}=%{{y}}<br>%{{text}}<extra></extra>"))
    fig.update_layout(title=title or f"Pareto frontier: {y} against {x}", xaxis_title=x, yaxis_title=y,
                      template="plotly_white")
    return fig


def plan_figure(df: pd.DataFrame, meta: dict, x: str = "gpus", y: str = "goodput_problems_per_s"):
    """``(plotly figure, curves)``: per policy its deployments (markers) and its frontier (a step line), and the
    frontier over all policies; ``curves[i]`` lists the table rows (index) of the figure's trace ``i``, so a
    clicked point (curve number, point index) names its deployment."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    overall, per = plan_frontiers(df, x, y)
    fig, curves = go.Figure(), []

    def hover(frame):
        return [f"{r.policy}: TP {r.tensor_parallel_size} x PP {r.pipeline_parallel_size} x DP {r.data_parallel_size}"
                f"<br>max_num_seqs {r.max_num_seqs}, max_num_batched_tokens {r.max_num_batched_tokens}"
                for r in frame.itertuples()]

    tmpl = f"{x}=%{{x}}<br>{y}=%{{y:.4g}}<br>%{{text}}<extra></extra>"
    for i, (pol, front) in enumerate(per.items()):
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        rows = df[df["policy"] == pol].dropna(subset=[x, y])
        fig.add_trace(go.Scatter(x=rows[x], y=rows[y], mode="markers", name=f"{pol}: deployments",
                                 legendgroup=pol, marker=dict(size=7, color=color, opacity=0.35), text=hover(rows),
                                 hovertemplate=tmpl))
        curves.append(list(rows.index))
        fig.add_trace(go.Scatter(x=front[x], y=front[y], mode="lines+markers", name=f"{pol}: frontier",
                                 legendgroup=pol, line=dict(color=color, width=2, shape="hv"),
                                 marker=dict(size=10, color=color), text=hover(front), hovertemplate=tmpl))
        curves.append(list(front.index))
    fig.add_trace(go.Scatter(x=overall[x], y=overall[y], mode="lines", name="frontier, all policies",
                             line=dict(color="black", width=1, dash="dot", shape="hv"), hoverinfo="skip"))
    curves.append(list(overall.index))
    fig.update_layout(title=dict(text=f"Deployments: {y} against {x}<br><sup>{plan_caption(meta)}</sup>",
                                 font=dict(size=15)),
                      xaxis_title=x, yaxis_title=y, template="plotly_white", legend=dict(orientation="h", y=-0.2))
    return fig, curves
