"""The latency-rate figure of a :func:`sim.search.knee.sweep` curve (plotly; sim/ returns the data, the figure is built here).

Three panels against the offered rate: TTFT, TPOT and E2E latency, p50 and p99 each (and the mean
where the SLO states one), the SLO's limits as dotted lines, the knee and the saturation rate as
vertical lines; the title carries the caption (:func:`sim.search.knee.caption`: which target priced it,
under what scheduler, batch and capacity).
"""
from __future__ import annotations

PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E"))
STATS = (("median", "p50", "solid"), ("p99", "p99", "dash"), ("mean", "mean", "dot"))


def curve_figure(curve: dict, caption: str, unit: str = "req/s"):
    """A plotly figure of ``curve`` (``sim.search.knee.sweep``'s dict); trace names ``"TTFT p50"``, ``"TTFT p99"``, ..."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pts = curve["points"]
    x = [p["rate"] for p in pts]
    slo = dict(_limits(curve["slo"]))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{t} (ms)" for _, t in PANELS], horizontal_spacing=0.07)
    for c, (m, title) in enumerate(PANELS, start=1):
        for stat, word, dash in STATS:
            key = f"{stat}_{m}_ms"
            if stat == "mean" and key not in slo:
                continue
            y = [p.get(key) for p in pts]
            if all(v is None for v in y):
                continue
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"{title} {word}",
                                     line=dict(dash=dash), marker=dict(symbol=["diamond" if p["refined"] else "circle"
                                                                               for p in pts]),
                                     hovertemplate=f"%{{x:.4g}} {unit}: %{{y:.4g}} ms<extra>{title} {word}</extra>"),
                          row=1, col=c)
        for key, lim in slo.items():
            if key.endswith(f"_{m}_ms"):
                fig.add_hline(y=lim, line=dict(color="gray", dash="dot"), annotation_text=f"SLO {key} {lim:g}",
                              row=1, col=c)
        for rate, what, color in ((curve.get("knee_rate"), "knee", "green"),
                                  (curve.get("saturation_rate"), "saturation", "red")):
            if rate is not None:
                fig.add_vline(x=rate, line=dict(color=color, dash="dash"), annotation_text=f"{what} {rate:.3g}",
                              row=1, col=c)
        fig.update_xaxes(title_text=f"offered rate ({unit})", row=1, col=c)
        fig.update_yaxes(type="log", row=1, col=c)
    fig.update_layout(title=dict(text=f"Latency against offered rate<br><sup>{caption}</sup>", font=dict(size=14)),
                      template="plotly_white", legend=dict(orientation="h", y=-0.25), height=480)
    return fig


def _limits(text: str):
    for part in (text or "").split(","):
        k, _, v = part.partition("=")
        if k.strip() and v.strip():
            yield k.strip(), float(v)
