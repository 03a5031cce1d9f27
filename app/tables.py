"""The comparison table the CLI prints and the HTML report and dashboard show (one formatting for all)."""
from __future__ import annotations

import math

# Columns of the printed comparison table (all in the JSON too).
TABLE_COLS = ["latency_mean_s", "speedup_vs_no_kv", "speedup_vs_exact_prefix", "kv_reuse", "asks_gate_auc",
              "skip_rate", "mean_exit_layer", "cgee_error_rate", "cgee_branch_disagreement_rate", "accuracy",
              "peak_kv_bytes", "evictions",
              "recompute_tokens", "attn_output_rel_error", "attn_mass_recall", "kv_capacity_bytes", "kv_budget_blocks"]


def fmt_ci(value, ci, spec: str = "{:.4g}") -> str:
    """``"0.25 [0.1, 0.47]"``: a figure and its interval (``sim.replay.intervals``) as table text (``"—"``
    for no figure)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    s = spec.format(float(value))
    if ci is None or len(ci) != 2 or ci[0] is None or ci[1] is None:
        return s
    return f"{s} [{spec.format(float(ci[0]))}, {spec.format(float(ci[1]))}]"


def fmt_table(policies: dict):
    """``{"policy": metrics}`` as a DataFrame of :data:`TABLE_COLS` (MB / GB columns; the trace model's figures marked *)."""
    import pandas as pd
    df = pd.DataFrame({k: {c: v.get(c) for c in TABLE_COLS} for k, v in policies.items()}).T
    df = df.apply(pd.to_numeric, errors="coerce")
    if "peak_kv_bytes" in df:
        df["peak_kv_MB"] = df.pop("peak_kv_bytes") / 1e6
    if "kv_capacity_bytes" in df:
        # the KV capacity each policy ran under (block and token policies: the budget too)
        df["kv_capacity_GB"] = df.pop("kv_capacity_bytes") / 1e9
    marked = {k for v in policies.values() for k in (v.get("trace_model_figures") or [])}
    return df.rename(columns={c: c + "*" for c in df.columns if c in marked})


def ci_table(policies: dict):
    """:func:`fmt_table` as text, a figure with a 95% interval (``<metric>_ci95`` of its policy) shown as
    ``"0.25 [0.1, 0.47]"`` (:func:`fmt_ci`); figures without one as plain numbers."""
    from sim.replay.intervals import SUFFIX
    df = fmt_table(policies)
    out = df.astype(object)
    for col in df.columns:
        key = col.rstrip("*")
        for pol in df.index:
            v = df.at[pol, col]
            out.at[pol, col] = fmt_ci(None if v != v else float(v), policies[pol].get(key + SUFFIX))
    return out


def trace_model_note(summaries) -> str:
    """The footnote for figures marked * (the trace model's own: sim.replay.problem_metrics.TRACE_MODEL_FIGURES)."""
    for m in summaries:
        if m.get("trace_model_figures"):
            return (f"* the trace model's own figures ({m.get('decisions_model')}), not {m.get('cost_model')}'s: "
                    "replay keeps its answers, confidences, entropies and generation lengths")
    return ""


def provenance_line(policies: dict) -> str:
    """Whose decisions, whose costs, the profile's status and the serving limits the table holds under."""
    from sim.cost.catalog import STATUS_WORDS
    from sim.cost.profiles import load_hardware
    m = next((v for v in policies.values() if v.get("decisions_model")), None)
    if m is None:
        return ""
    hw = m.get("hardware")
    try:
        status = STATUS_WORDS.get(load_hardware(hw).calibration_status, "")
    except Exception:  # a profile given as a file that moved since the run: the name still says what priced it
        status = ""
    status = f" ({status})" if status else ""
    cap = m.get("kv_capacity_bytes")
    cap = f", KV capacity {cap / 2**30:.1f} GiB" if isinstance(cap, (int, float)) else ""
    mode = m.get("mode", "isolated")
    limits = ("isolated: one problem at a time, its branches batched without a limit" if mode == "isolated" else
              f"{mode}, scheduler {m.get('scheduler')}, max_num_seqs {m.get('max_num_seqs')}, "
              f"max_num_batched_tokens {m.get('max_num_batched_tokens')}")
    return (f"decisions: {m['decisions_model']} (the trace's model) | costs: {m.get('cost_model')} on {hw}{status} | "
            f"{limits}{cap}, {m.get('n_problems')} problems")


def table_blocks(policies: dict, width: int | None = None) -> list[str]:
    """:func:`ci_table` as text blocks that fit a terminal ``width`` (default: this terminal's, 120 when
    not one): the sequence/block policies and the token (eviction) policies apart, each with only the
    columns it has figures in, wrapped by pandas at ``width``. The KV capacity column is left out (the
    :func:`provenance_line` states it); the JSON keeps every column."""
    import shutil

    from policies import list_policies
    width = width or shutil.get_terminal_size((120, 24)).columns
    table = ci_table(policies).drop(columns=["kv_capacity_GB"], errors="ignore")
    token = set(list_policies("token"))
    blocks = []
    for rows in ([p for p in table.index if p not in token], [p for p in table.index if p in token]):
        if not rows:
            continue
        part = table.loc[rows]
        keep = [c for c in part.columns if any(v not in (None, "—") and v == v for v in part[c])]
        blocks.append(part[keep].to_string(line_width=width))
    return blocks


def print_table(policies: dict, width: int | None = None) -> None:
    """Print the :func:`provenance_line`, :func:`table_blocks` of ``policies`` (figures with their 95%
    intervals) and its footnote."""
    line = provenance_line(policies)
    if line:
        print(wrap(line, width))
    print("\n\n".join(table_blocks(policies, width)))
    if any(k.endswith("_ci95") for v in policies.values() for k in v):
        print(wrap("[lo, hi]: 95% intervals over the problems (Wilson for rates, paired bootstrap for speedups, "
                   "reuse and AUC)", width))
    note = trace_model_note(policies.values())
    if note:
        print(wrap(note, width))


# The figures a user reads first (``rksim demo``, ``make run``): printed name -> summary key. Every other
# column is in the HTML report and ``rksim compare --json``.
HEADLINE = {"vs exact-prefix": "speedup_vs_exact_prefix", "vs no-kv": "speedup_vs_no_kv",
            "peak KV GB": "peak_kv_bytes", "answers changed": "answer_change_rate"}
TOKEN_HEADLINE = {"latency s": "latency_mean_s", "peak KV GB": "peak_kv_bytes",
                  "attn output error": "attn_output_rel_error", "attn mass recall": "attn_mass_recall"}
HEADLINE_WIDTH = 100


def headline_blocks(policies: dict) -> list[str]:
    """The headline figures of ``policies`` as text blocks of at most :data:`HEADLINE_WIDTH` columns: the
    sequence/block policies' speedups over exact-prefix and No-KV, peak KV and the share of shared branches
    whose answer changed (each with its 95% interval where it has one), and the token (eviction) policies'
    latency, peak KV and attention fidelity at their 4x budget. Trace-model figures are marked *."""
    import pandas as pd

    from policies import list_policies
    from sim.replay.intervals import SUFFIX
    token = set(list_policies("token"))
    blocks = []
    for cols, rows in ((HEADLINE, [p for p in policies if p not in token]),
                       (TOKEN_HEADLINE, [p for p in policies if p in token])):
        if not rows:
            continue
        table = {}
        for label, key in cols.items():
            marked = any(key in (policies[p].get("trace_model_figures") or []) for p in rows)
            col = {}
            for p in rows:
                v = policies[p].get(key)
                if key == "peak_kv_bytes":
                    col[p] = "—" if v is None else f"{v / 1e9:.3g}"
                else:
                    col[p] = fmt_ci(None if v is None else float(v), policies[p].get(key + SUFFIX))
            table[label + ("*" if marked else "")] = col
        text = pd.DataFrame(table).to_string()
        if max(len(line) for line in text.splitlines()) > HEADLINE_WIDTH:   # pragma: no cover - long policy names
            text = pd.DataFrame(table).to_string(line_width=HEADLINE_WIDTH)
        blocks.append(text)
    return blocks


def print_headline(policies: dict, width: int = HEADLINE_WIDTH) -> None:
    """Print the :func:`provenance_line`, the :func:`headline_blocks` and their footnotes, within ``width``."""
    line = provenance_line(policies)
    if line:
        print(wrap(line, width))
    print("\n\n".join(headline_blocks(policies)))
    if any(k.endswith("_ci95") for v in policies.values() for k in v):
        print(wrap("[lo, hi]: 95% intervals over the problems (Wilson for rates, paired bootstrap for speedups)",
                   width))
    note = trace_model_note(policies.values())
    if note:
        print(wrap(note, width))


def wrap(text: str, width: int | None = None) -> str:
    """``text`` wrapped at ``width`` (default: this terminal's, 120 when not one), continued lines indented."""
    import shutil
    import textwrap
    return textwrap.fill(text, width or shutil.get_terminal_size((120, 24)).columns, subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)


__all__ = ["fmt_ci", "TABLE_COLS", "HEADLINE", "TOKEN_HEADLINE", "fmt_table", "ci_table", "table_blocks",
           "headline_blocks", "trace_model_note", "print_table", "print_headline", "wrap"]
