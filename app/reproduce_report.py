"""Markdown and self-contained HTML (plotly) of ``rksim reproduce``'s claim rows.

Deterministic: no timestamps, fixed plotly div ids, rows in a fixed order, so the same
claims give the same files byte for byte.
"""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from app.verdicts import VERDICTS, legend

LEGEND = legend()   # generated from app.verdicts.RULES: the rules are written once


# what a profile's status (sim.cost.catalog.STATUS_WORDS) means for the figures priced with it
PROFILE_MEANING = {
    "datasheet": "datasheet profile: peak rates from the vendor's datasheet with assumed efficiencies, never fitted "
                 "to a measurement",
    "public profiles": "fitted on public per-operator GPU measurements, not end to end on a device",
    "fitted end to end": "fitted end to end on its device",
    "provisional": "provisional fit",
}

def _cell(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency for one function)."""
    if df is None or df.empty:
        return "_(empty)_\n"
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _why(r: dict, md: bool = True) -> str:
    """The verdict cell: the verdict, its reason from the numbers, then every ``also`` condition."""
    v = f"**{r['verdict']}**" if md else r["verdict"]
    return " ".join([v, r["why"], *(f"· {a}" for a in r.get("also") or [])])


def claims_frame(res: dict) -> pd.DataFrame:
    return pd.DataFrame([{"#": r["id"], "claim": r["claim"], "paper": r["paper"], "rksim simulated": r["simulated"],
                          "rksim measured": r["measured"], "verdict": _why(r), "source": r["source"]}
                         for r in res["rows"]])


def _inputs_md(res: dict) -> list[str]:
    inp = res["inputs"]
    out = ["## Inputs", "", "Traces read (decisions of a real model, replayed):", ""]
    for t in inp["traces"]:
        out.append(f"- `{t['name']}` — {t['model']} · {t['dataset']} · {t['layout']}, {t['n_problems']} problems × "
                   f"{t['n_branches']} branches{', long decodes' if t['has_long'] else ''}"
                   f"{', tree search' if t['has_tree'] else ''}; manifest sha256 `{t['manifest_sha256'][:16]}…`; "
                   f"captured by `{t['command']}`")
    if inp["missing_traces"]:
        out += ["", "Not in this checkout (regenerate with `make reproduce-traces`, then `make reproduce`): "
                + ", ".join(f"`{k}` ({v})" for k, v in inp["missing_traces"].items()) + "."]
    out += ["", "Real-module runs read (`--measured`):", ""]
    out += [f"- `{k}` sha256 `{v[:16]}…`" for k, v in inp["measured"].items()] or ["- none"]
    out += ["", f"Cost targets: RKSC claims on {inp['rksc_target'][0]} / {inp['rksc_target'][1]}; VASE throughput "
            "on " + ", ".join(f"{m} / {h}" for m, h in inp["vase_targets"]) + f". The paper's shape: "
            f"`--reshape {inp['paper_shape']}`. Seed {inp['seed']}.", ""]
    prof = inp.get("profiles") or {}
    if prof:
        out += ["Hardware profiles behind the simulated figures: " + ", ".join(
            f"`{k}` ({PROFILE_MEANING.get(v, v)})"
            for k, v in prof.items()) + ".", ""]
    st = inp.get("settings") or {}
    if st:
        out += [f"Settings: shape grid prefix {st['heat_prefix']} × branches {st['heat_branches']} × generation "
                f"{st['heat_gen']}; VASE serving {st['vase_requests']} requests of {st['vase_decode_tokens']}-token "
                f"decodes; block-policy serving {st['serve_requests']} problems at concurrency "
                f"{st['serve_concurrency']}, capacity {st['block_capacity_frac']:.0%} of the unconstrained peak.", ""]
    return out


TABLE_TITLES = {
    "rksc_speedups": "RKSC speedups by trace, shape and verification mode",
    "rksc_speedups_moe": "RKSC speedups on an MoE target (the traces' decisions, the MoE target's costs)",
    "asks": "ASKS: reuse, accuracy, diversity and gate AUC",
    "cgee": "CGEE: skip rate and induced error (95% Wilson interval)",
    "entropy": "Logit-lens entropy by layer, per model",
    "heat": "RKSC vs No-KV over prefix × branches × generation length",
    "vase_sim": "VASE and baselines at 4×: simulated attention-output error on the trace's K/V/Q",
    "vase_measured": "VASE and baselines at 4×: measured on the real model (`calibrate quality`)",
    "vase_throughput": "VASE-DKV at 16K tokens through the capacity-aware serving engine",
    "vase_throughput_moe": "VASE-DKV at 16K tokens on an MoE target",
    "rsbcm": "RSBCM vs LRU vs FIFO at a binding capacity",
    "compat": "The papers' public-code shortcuts (compatibility options)",
}


def to_markdown(res: dict) -> str:
    out = ["# rksim reproduce: the RKSC and VASE papers' claims, measured and simulated", "",
           "Regenerate: `make reproduce` (or `rksim reproduce --out docs/reproduction/`). Every figure names the "
           "traces (whose model made the decisions), the cost target, the shape and the verification mode it holds "
           "for. HTML with figures: [report.html](report.html); numbers: [claims.json](claims.json).", "",
           "Verdicts. " + LEGEND, ""]
    counts = pd.Series([r["verdict"] for r in res["rows"]]).value_counts()
    out += ["Summary: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS) + f" ({len(res['rows'])} claims).", ""]
    out += ["## Claims", "", md_table(claims_frame(res))]
    out += _inputs_md(res)
    for key, title in TABLE_TITLES.items():
        rows = res["tables"].get(key)
        if rows:
            out += [f"## {title}", "", md_table(pd.DataFrame(rows))]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------- figures
def figures(res: dict) -> list:
    import plotly.express as px
    import plotly.graph_objects as go
    figs = []
    sp = pd.DataFrame(res["tables"].get("rksc_speedups") or [])
    if not sp.empty:
        sp = sp.assign(condition=sp["model"] + "/" + sp["benchmark"] + "/" + sp["layout"] + ", " + sp["shape"] + ", verify "
                       + sp["verify"])
        f = px.bar(sp, x="condition", y="vs_no_kv", color="policy", barmode="group",
                   title="Speedup over No-KV (simulated; decisions from the traces, costs from the RKSC target)")
        f.add_hline(y=3.008, line_dash="dash", annotation_text="paper: RKSC 3.008×")
        f.add_hline(y=1.343, line_dash="dot", annotation_text="paper: sharing alone 1.343×")
        figs.append(f)
    heat = res["figures"].get("heat")
    if heat:
        h = pd.DataFrame(heat["rows"])
        gens = sorted(h["gen_tokens"].unique())
        from plotly.subplots import make_subplots
        f = make_subplots(rows=1, cols=len(gens), subplot_titles=[f"T = {g} generated tokens" for g in gens],
                          shared_yaxes=True)
        zmax = float(h["rksc_vs_no_kv"].max())
        for k, g in enumerate(gens, 1):
            p = h[h["gen_tokens"] == g].pivot(index="branches", columns="prefix_tokens", values="rksc_vs_no_kv")
            f.add_trace(go.Heatmap(z=p.values, x=[str(c) for c in p.columns], y=[str(r) for r in p.index],
                                   zmin=1.0 if zmax > 1 else None, zmax=max(zmax, 3.008), colorscale="Viridis",
                                   showscale=k == len(gens), text=p.values.round(3), texttemplate="%{text}"), 1, k)
            f.update_xaxes(title_text="prefix tokens", row=1, col=k)
        f.update_yaxes(title_text="branches", row=1, col=1)
        f.update_layout(title=f"RKSC speedup over No-KV by workload shape (reshaped `{heat['trace']}`; paper 3.008×)")
        figs.append(f)
    ent = res["figures"].get("entropy") or []
    if ent:
        f = go.Figure()
        for r in ent:
            L = len(r["curve"])
            f.add_scatter(x=[(l + 1) / L for l in range(L)], y=r["curve"], mode="lines+markers", name=r["model"])
        f.update_layout(title="Logit-lens entropy of the verification pass by relative depth (mean over branches)",
                        xaxis_title="layer / L", yaxis_title="entropy (nats)")
        figs.append(f)
    vs = pd.DataFrame((res["figures"].get("vase") or {}).get("sim") or [])
    vm = pd.DataFrame((res["figures"].get("vase") or {}).get("measured") or [])
    if not vm.empty:
        figs.append(px.bar(vm, x="policy", y="kl", color="run", barmode="group",
                           title="Measured KL(full ‖ evicted) at 4× compression (real model, teacher-forced)"))
    if not vs.empty:
        figs.append(px.bar(vs, x="policy", y="attn_output_rel_error", color="trace", barmode="group",
                           title="Simulated attention-output relative error at 4× compression (trace K/V/Q)"))
    rb = pd.DataFrame(res["tables"].get("rsbcm") or [])
    if not rb.empty:
        figs.append(px.bar(rb, x="where", y="recompute_tokens", color="policy", barmode="group",
                           title="Recomputed tokens under a binding KV capacity: RSBCM vs LRU vs FIFO"))
    return figs


def to_html(res: dict) -> str:
    import plotly.io as pio
    parts = []
    for k, fig in enumerate(figures(res)):
        fig.update_layout(template="plotly_white", height=460)
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs="inline" if k == 0 else False,
                                 div_id=f"reproduce-fig-{k}"))
    claims = claims_frame(res)
    claims["verdict"] = [_why(r, md=False) for r in res["rows"]]
    tables = [f"<h2>{html.escape(TABLE_TITLES[k])}</h2>" + pd.DataFrame(v).to_html(index=False, na_rep="—")
              for k, v in res["tables"].items() if v and k in TABLE_TITLES]
    counts = pd.Series([r["verdict"] for r in res["rows"]]).value_counts()
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    inputs = "".join(f"<li>{html.escape(x[2:])}</li>" for x in _inputs_md(res) if x.startswith("- "))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rksim reproduce</title><style>"
            "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:4px;vertical-align:top}</style></head><body>"
            "<h1>rksim reproduce: the RKSC and VASE papers' claims, measured and simulated</h1>"
            f"<p>{html.escape(LEGEND.replace('*', ''))}</p><p>Summary: {html.escape(summary)}.</p>"
            "<h2>Claims</h2>" + claims.to_html(index=False, na_rep="—") + "<h2>Inputs</h2><ul>" + inputs + "</ul>"
            + "".join(parts) + "".join(tables) + "</body></html>\n")


def write_report(res: dict, out: Path) -> dict:
    """``claims.json``, ``report.md`` and ``report.html`` under ``out``, each written atomically."""
    from sim.replay.problem_metrics import clean  # NaN / inf -> None, numpy scalars -> Python: claims.json is strict JSON
    from traces.store import atomic_write_json, atomic_write_text
    res = clean(res)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "claims.json", res)
    atomic_write_text(out / "report.md", to_markdown(res))
    atomic_write_text(out / "report.html", to_html(res))
    return {"claims": str(out / "claims.json"), "markdown": str(out / "report.md"), "html": str(out / "report.html")}
