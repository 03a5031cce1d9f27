"""Words for the metrics: labels, units and formatting of every figure the dashboard shows."""
from __future__ import annotations

import math

import numpy as np


# ------------------------------------------------------------------ words for the metrics
# key -> (label with unit, whose figure it is: "target" = the cost model's model on the hardware,
# "trace" = decided on the trace's own model's signals and answers)
METRICS: dict[str, tuple[str, str]] = {
    "latency_mean_s": ("mean latency per problem (s)", "target"),
    "latency_p95_s": ("p95 latency per problem (s)", "target"),
    "speedup_vs_no_kv": ("speedup vs No-KV (x)", "target"),
    "speedup_vs_exact_prefix": ("speedup vs exact prefix (x)", "target"),
    "throughput_tokens_per_s": ("throughput (generated tokens/s)", "target"),
    "throughput_problems_per_s": ("throughput (problems/s)", "target"),
    "ttft_mean_s": ("mean time to first token (s)", "target"),
    "queue_s_mean": ("mean queueing delay (s)", "target"),
    "peak_kv_bytes": ("peak KV cache (MB)", "target"),
    "kv_reuse": ("prompt tokens reused from cache (share)", "trace"),
    "skip_rate": ("verifications skipped (share)", "trace"),
    "mean_exit_layer": ("mean exit layer (trace model's layers)", "trace"),
    "cgee_error_rate": ("answer changed by early exit (share)", "trace"),
    "cgee_branch_disagreement_rate": ("selected branch changed by early exit (share)", "trace"),
    "accuracy": ("accuracy of the selected answer (share)", "trace"),
    "asks_gate_auc": ("ASKS gate AUC (sigma vs answer kept)", "trace"),
    "evictions": ("KV blocks/tokens evicted (count)", "trace"),
    "recompute_tokens": ("tokens recomputed after eviction (count)", "trace"),
    "attn_output_rel_error": ("attention-output relative error", "trace"),
    "attn_mass_recall": ("attention mass kept (share)", "trace"),
    "speedup_vs_full": ("speedup vs full cache (x)", "target"),
    "budget": ("token budget K (tokens)", "trace"),
    # serving at capacity (present where the simulator reports them)
    "ttft_p50_s": ("median time to first token per problem (s)", "target"),
    "ttft_p99_s": ("p99 time to first token per problem (s)", "target"),
    "e2e_p50_s": ("median end-to-end latency per problem (s)", "target"),
    "e2e_p99_s": ("p99 end-to-end latency per problem (s)", "target"),
    "request_ttft_p50_s": ("median time to first token per request (s)", "target"),
    "request_ttft_p99_s": ("p99 time to first token per request (s)", "target"),
    "request_tpot_p50_s": ("median time per output token per request (s)", "target"),
    "request_itl_p50_s": ("median inter-token latency (s)", "target"),
    "request_itl_p99_s": ("p99 inter-token latency (s)", "target"),
    "queue_p50_s": ("median queueing delay (s)", "target"),
    "preemptions": ("preemptions (count)", "target"),
    "max_running_seqs": ("most sequences running at once", "target"),
    "mean_running_seqs": ("mean sequences running", "target"),
    "kv_capacity_bytes": ("KV capacity (MB)", "target"),
    "prefix_hit_rate": ("prefix-cache hit rate (share)", "target"),
}
# the deployment metrics (TP, PP, replicas, router, SLO)
METRICS.update({
    "goodput_problems_per_s": ("goodput (problems/s meeting every SLO)", "target"),
    "slo_attainment": ("problems meeting every SLO (share)", "target"),
    "tpot_p50_s": ("median time per output token (s)", "target"),
    "tpot_p99_s": ("p99 time per output token (s)", "target"),
    "gpu_utilisation": ("GPU busy (share of the run)", "target"),
    "lost_asks_shares": ("ASKS shares lost to routing (count)", "target"),
    "lost_prefix_reuse": ("exact-prefix reuses lost to routing (count)", "target"),
    "split_problems": ("problems split over replicas (count)", "target"),
    "problems": ("problems served (count)", "target"),
})
BYTES_KEYS = ("peak_kv_bytes", "kv_capacity_bytes")
KPI_BRANCH = ["speedup_vs_no_kv", "speedup_vs_exact_prefix", "latency_mean_s", "accuracy"]
KPI_TOKEN = ["attn_output_rel_error", "attn_mass_recall", "peak_kv_bytes", "speedup_vs_full",
             "throughput_tokens_per_s"]
KPI_SERVING = ["throughput_tokens_per_s", "throughput_problems_per_s", "goodput_problems_per_s", "slo_attainment",
               "ttft_p50_s", "ttft_p99_s", "e2e_p50_s",
               "e2e_p99_s", "queue_p50_s", "preemptions", "recompute_tokens", "max_running_seqs",
               "mean_running_seqs", "kv_capacity_bytes", "peak_kv_bytes", "prefix_hit_rate", "request_ttft_p50_s",
               "request_ttft_p99_s", "request_tpot_p50_s", "request_itl_p50_s", "request_itl_p99_s"]
TABLE_BRANCH = ["latency_mean_s", "latency_p95_s", "speedup_vs_no_kv", "speedup_vs_exact_prefix", "kv_reuse",
                "skip_rate", "mean_exit_layer", "cgee_error_rate", "cgee_branch_disagreement_rate", "accuracy",
                "peak_kv_bytes", "evictions",
                "recompute_tokens", "asks_gate_auc"]
PHASES = ("gate", "prefill", "decode", "verify", "queue")
BASELINES = ("no-kv", "exact-prefix")


def label(key: str) -> str:
    """``latency_mean_s`` -> ``mean latency per problem (s) · target``."""
    lab, src = METRICS.get(key, (key.replace("_", " "), ""))
    return f"{lab} · {'target' if src == 'target' else 'trace model'}" if src else lab


def fmt(key: str, v) -> str:
    """A metric value in its unit (bytes as MB, shares as %), "n/a" where it does not apply."""
    if v is None or isinstance(v, str) or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a" if v is None or not isinstance(v, str) else v
    if key in BYTES_KEYS:
        return f"{v / 1e6:.3g} MB"
    if key.startswith("speedup"):
        return f"{v:.3f}x"
    if key == "throughput_tokens_per_s":  # before the "_s" = seconds rule: these end in "per_s"
        return f"{v:.4g} tokens/s"
    if key in ("throughput_problems_per_s", "goodput_problems_per_s"):
        return f"{v:.4g} problems/s"
    if key.endswith("_s") and not isinstance(v, bool):
        return f"{v:.4g} s"
    lab = METRICS.get(key, ("",))[0]
    if "(share)" in lab:
        return f"{100 * v:.1f}%"
    if isinstance(v, (bool, np.bool_)):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    return f"{v:.4g}"


def fmt_ci(key: str, s: dict) -> str:
    """:func:`fmt` of ``s[key]`` with its 95% interval ``s[key + "_ci95"]`` in the same unit, where it has one."""
    from sim.replay.intervals import SUFFIX
    v, ci = s.get(key), s.get(key + SUFFIX)
    txt = fmt(key, v)
    if not is_finite_number(v) or not ci or not all(is_finite_number(x) for x in ci):
        return txt
    return f"{txt} [{fmt(key, ci[0])}, {fmt(key, ci[1])}]"


CI_NOTE = ("[lo, hi]: 95% interval over the trace's problems (Wilson for rates; a paired bootstrap over problems "
           "for speedups, reuse and AUC)")


def is_finite_number(v) -> bool:
    """A real number (not a bool, not NaN or infinite): what the pages print as a figure."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
