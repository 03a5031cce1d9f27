"""Per-problem and aggregate metrics (DESIGN §5), as pandas DataFrames and plain dicts."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.stats import rankdata

# Keys every summary holds (docs/sim-api.md); None where not applicable.
SUMMARY_KEYS = ("asks_gate_auc", "latency_mean_s", "latency_p50_s", "latency_p95_s", "speedup_vs_no_kv",
                "speedup_vs_exact_prefix", "kv_reuse", "skip_rate", "mean_exit_layer", "cgee_error_rate",
                "cgee_branch_disagreement_rate", "accuracy", "peak_kv_bytes", "evictions", "recompute_tokens", "attn_output_rel_error",
                "attn_mass_recall")


# Figures that are the trace model's own whatever the cost target: they come from what the
# trace's model generated and decided (answers, confidences, entropies, hidden states, K/V),
# not from the cost model. When the cost target is another model they are marked
# (``trace_model_figures`` in every summary), so nobody reads them as the target's.
TRACE_MODEL_FIGURES = ("accuracy", "vote_accuracy", "skip_rate", "asks_gate_auc", "cgee_error_rate",
                       "cgee_branch_disagreement_rate", "answer_changes", "answer_change_rate",
                       "answer_diversity", "gen_tokens_per_branch", "attn_output_rel_error", "attn_mass_recall")


def mark_trace_model_figures(summary: dict) -> dict:
    """Add ``trace_model_figures`` to ``summary`` (in place; also returned).

    The list names the keys of :data:`TRACE_MODEL_FIGURES` the summary holds (not None) when
    ``summary["cost_model"]`` differs from ``summary["decisions_model"]``; empty when the trace's
    model is also the cost target.
    """
    dm, cm = summary.get("decisions_model"), summary.get("cost_model")
    other = dm is not None and cm is not None and dm != cm
    summary["trace_model_figures"] = ([k for k in TRACE_MODEL_FIGURES if summary.get(k) is not None]
                                      if other else [])
    return summary


def roc_auc(scores, labels) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (Mann-Whitney U with average ranks for ties).

    ``AUC = (sum of the positives' ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``;
    NaN when only one class is present or no finite score.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    ok = np.isfinite(s)
    s, y = s[ok], y[ok]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def clean(x):
    """Plain JSON-able Python value: numpy scalars unwrapped, NaN/inf → None."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return [clean(v) for v in x.tolist()]
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    return x


def problem_row(f, dec, res: dict, L: int) -> dict:
    """One row of the per-problem frame; ``L`` is the cost target's depth (exit layers are in it)."""
    plan = dec.plan
    share = dec.share
    prompt_ctx = int((plan.reused + plan.computed).sum())
    answers = np.asarray(dec.answers)
    nonempty = answers[answers != ""]
    own_ans = f.gen["own"]["answer"]
    changed = int(np.sum(share & (answers != own_ans)))
    # Majority vote (self-consistency): most frequent non-empty answer, ties to the earliest branch.
    vote = ""
    if nonempty.size:
        vals, first_idx, counts = np.unique(nonempty, return_index=True, return_counts=True)
        best = max(range(len(vals)), key=lambda i: (counts[i], -first_idx[i]))
        vote = str(vals[best])
    exits = dec.exit_layers
    gen_tokens = int(f.eff(share, "len").sum())
    row = {
        "pos": f.pos, "problem_index": f.index, "n_branches": f.B,
        "latency_s": res["latency_s"], "gate_s": res["gate_s"], "prefill_s": res["prefill_s"],
        "decode_s": res["decode_s"], "verify_s": res["verify_s"], "ttft_s": res["ttft_s"],
        "queue_s": res.get("queue_s", 0.0),
        "peak_kv_bytes": res["peak_kv_bytes"], "iterations": res["iterations"],
        "prompt_tokens": prompt_ctx, "reused_tokens": int(plan.reused.sum()),
        "computed_tokens": int(plan.computed.sum()), "gate_tokens": int(plan.gate_tokens.sum()),
        "kv_reuse": float(plan.reused.sum()) / prompt_ctx if prompt_ctx else float("nan"),
        "shared_branches": int(share.sum()), "answer_changes": changed,
        "gen_tokens": gen_tokens,
        "skipped": bool(dec.skipped),
        "verified_branches": 0 if dec.skipped else f.B,
        "exit_layer_sum": float(np.sum(exits)) if exits is not None else (0.0 if dec.skipped else float(L * f.B)),
        "selected": dec.selected, "full_selected": dec.full_selected, "cgee_differs": bool(dec.differs),
        "cgee_branch_differs": bool(dec.branch_differs),
        "correct": bool(dec.correct[dec.selected]) if dec.selected >= 0 else False,
        "vote_answer": vote, "vote_correct": vote == f.truth and vote != "",
        "answer_diversity": len(set(nonempty.tolist())) / f.B if f.B else float("nan"),
        "evictions": int(res.get("evictions", 0)), "recompute_tokens": int(res.get("recompute_tokens", 0)),
        # serving: prompt tokens found in the prefix cache, of those admitted (prefix_hit_rate's interval)
        "prefix_hit_tokens": int(res.get("prefix_hit_tokens", 0)),
        "prompt_tokens_admitted": int(res.get("prompt_tokens_admitted", 0)),
    }
    return row


def branch_rows(f, dec, L: int | None = None) -> list[dict]:
    """Per-branch rows (for the gate-quality and exit-layer figures).

    ``L``: depth of the cost target (a full-depth pass's exit layer; default the trace's).
    """
    L = f.L if L is None else int(L)
    out = []
    own, cf = f.gen["own"], f.gen["cf"]
    for b in range(f.B):
        out.append({"pos": f.pos, "branch": b, "sigma": float(dec.sigma[b]), "shared": bool(dec.share[b]),
                    "cf_same_answer": bool(cf["answer"][b] == own["answer"][b]),
                    "exit_layer": int(dec.exit_layers[b]) if dec.exit_layers is not None else
                    (0 if dec.skipped else L),
                    "selected": b == dec.selected})
    return out


def columns(rows: list[dict]) -> dict:
    """List of row dicts -> dict of numpy columns (cheaper than a DataFrame inside sweeps)."""
    if not rows:
        return {}
    return {k: np.asarray([r[k] for r in rows]) for k in rows[0]}


def summarize(rows: list[dict], brows: list[dict], *, cfg, L: int, makespan: float | None = None,
              peak_kv_bytes: float | None = None) -> dict:
    """Aggregate metrics over problems (the keys of :data:`SUMMARY_KEYS` and more).

    ``L`` is the cost target's depth: ``layers`` and ``mean_exit_layer`` are in its units.
    """
    c = columns(rows)
    n = len(rows)
    nan = float("nan")
    if n == 0:
        raise ValueError("problems: no problem selected")
    lat = c["latency_s"].astype(np.float64)
    has_exit = cfg.exit is not None
    is_asks = getattr(cfg.sharing, "name", "") == "asks"
    verified = float(c["verified_branches"].sum())
    total_time = float(makespan) if makespan is not None else float(lat.sum())
    auc = nan
    if is_asks and brows:
        sig = np.array([r["sigma"] for r in brows if r["branch"] > 0], dtype=np.float64)
        lab = np.array([r["cf_same_answer"] for r in brows if r["branch"] > 0], dtype=bool)
        auc = roc_auc(sig, lab)
    shared = float(c["shared_branches"].sum())
    prompt = float(c["prompt_tokens"].sum())
    gen = float(c["gen_tokens"].sum())
    n_branches = float(c["n_branches"].sum())
    return {
        "asks_gate_auc": auc if is_asks else None,
        "latency_mean_s": float(lat.mean()),
        "latency_p50_s": float(np.percentile(lat, 50)),
        "latency_p95_s": float(np.percentile(lat, 95)),
        "speedup_vs_no_kv": None, "speedup_vs_exact_prefix": None,
        "kv_reuse": float(c["reused_tokens"].sum()) / prompt if prompt else nan,
        "skip_rate": float(c["skipped"].mean()) if has_exit else None,
        "mean_exit_layer": float(c["exit_layer_sum"].sum()) / verified if verified else nan,
        # DESIGN §4: an error is a changed *answer*; a changed branch with the same answer is not.
        "cgee_error_rate": float(c["cgee_differs"].mean()) if has_exit else None,
        "cgee_branch_disagreement_rate": float(c["cgee_branch_differs"].mean()) if has_exit else None,
        "accuracy": float(c["correct"].mean()),
        "peak_kv_bytes": float(peak_kv_bytes if peak_kv_bytes is not None else c["peak_kv_bytes"].max()),
        "evictions": int(c["evictions"].sum()),
        "recompute_tokens": int(c["recompute_tokens"].sum()),
        "attn_output_rel_error": None, "attn_mass_recall": None,
        "vote_accuracy": float(c["vote_correct"].mean()),
        "ttft_mean_s": float(c["ttft_s"].mean()),
        "throughput_problems_per_s": n / total_time if total_time > 0 else nan,
        "throughput_tokens_per_s": gen / total_time if total_time > 0 else nan,
        "gate_s_mean": float(c["gate_s"].mean()),
        "prefill_s_mean": float(c["prefill_s"].mean()),
        "decode_s_mean": float(c["decode_s"].mean()),
        "verify_s_mean": float(c["verify_s"].mean()),
        "queue_s_mean": float(c["queue_s"].mean()),
        "answer_changes": int(c["answer_changes"].sum()),
        "answer_change_rate": float(c["answer_changes"].sum()) / shared if shared else None,
        "answer_diversity": float(c["answer_diversity"].mean()),
        "gen_tokens_per_branch": gen / n_branches if n_branches else nan,
        "n_problems": n,
        "layers": L,
    }


def exit_histogram(branches: pd.DataFrame) -> pd.Series:
    """Count of verification passes by exit layer (0 = verification skipped)."""
    return branches["exit_layer"].value_counts().sort_index()
