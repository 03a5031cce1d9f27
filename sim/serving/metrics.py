"""Serving metrics of one engine run (serving at capacity): latency percentiles from arrival,
throughput, queueing, preemptions, running sequences, KV use and the timelines the report draws.

Two kinds of figure, named apart. **Per problem** (``ttft_*``, ``e2e_*``, ``queue_*``; one problem =
its B branch requests): all latencies are measured from each problem's *arrival*: ``ttft`` = first
token (mean over the problem's branches) - arrival; ``e2e`` = answer - arrival; ``queue`` = (first scheduled -
arrival) + the mean over its branches of (first scheduled - ready), ready = gate done and KV source's
first token out: the time spent waiting for memory, sequence or token caps.

**Per request** (``request_ttft_*``, ``request_tpot_*``, ``request_itl_*``: one request = one branch,
what ``vllm bench serve`` reports per request): ``request_ttft`` = the branch's first token - the
problem's arrival (a client that sends a problem's branches when it arrives); ``request_tpot`` =
(last token - first token) / (output tokens - 1) over branches with more than one token; ``request_itl``
= every gap between consecutive tokens of a branch, pooled over branches. Percentiles p50, p90, p99.
"""
from __future__ import annotations

import numpy as np

REQUEST_KEYS = tuple(f"request_{m}_{q}_s" for m in ("ttft", "tpot", "itl") for q in ("p50", "p90", "p99"))
SERVING_KEYS = ("throughput_tokens_per_s", "throughput_problems_per_s", "ttft_p50_s", "ttft_p99_s", "ttft_mean_s",
                "e2e_p50_s", "e2e_p99_s", "e2e_mean_s", "queue_p50_s", "queue_mean_s", "preemptions",
                "recompute_tokens", "max_running_seqs", "mean_running_seqs", "kv_capacity_bytes",
                "kv_budget_blocks", "peak_kv_bytes", "prefix_hit_rate", "length_extrapolated", "makespan_s",
                "iterations", "events", "evictions") + REQUEST_KEYS


def request_summary(recs: list) -> dict:
    """The per-request (per-branch) TTFT, TPOT and ITL percentiles of the engine's records (module docstring).

    ``recs`` need ``first_token_times`` and ``token_times`` (the engine's ``record_token_times``); without
    token times only TTFT is given.
    """
    ttft, tpot, itl = [], [], []
    timed = False
    for r in recs:
        first = np.asarray(r.get("first_token_times", ()), np.float64)
        ttft.extend(first[np.isfinite(first)].tolist())
        tok = r.get("token_times")
        if tok is None:
            continue
        timed = True
        for t in tok:
            if len(t) > 1:
                d = np.diff(np.asarray(t, np.float64))
                tpot.append(float(d.sum()) / d.size)   # (last - first) / (n - 1)
                itl.extend(d.tolist())
    out = {}
    for m, x in (("ttft", ttft), ("tpot", tpot if timed else None), ("itl", itl if timed else None)):
        for q in (50, 90, 99):
            out[f"request_{m}_p{q}_s"] = None if x is None else _pct(x, q)
    return out


def _pct(x, q) -> float | None:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else None


def serving_summary(recs: list, res, cap: dict, budget: int, gen_tokens: float | None = None) -> dict:
    """The serving keys of one run (``res``: :class:`sim.serving.engine.EngineResult`)."""
    ttft = [r["ttft_s"] for r in recs]
    e2e = [r["latency_s"] for r in recs]
    queue = [r["queue_s"] for r in recs]
    span = res.makespan
    gen = float(res.gen_tokens if gen_tokens is None else gen_tokens)
    hit = sum(r.get("prefix_hit_tokens", 0) for r in recs)
    prompt = sum(r.get("prompt_tokens_admitted", 0) for r in recs)
    st = res.stats
    return {
        "throughput_tokens_per_s": gen / span if span > 0 else None,
        "throughput_problems_per_s": len(recs) / span if span > 0 else None,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99), "ttft_mean_s": float(np.mean(ttft)) if ttft else None,
        "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99), "e2e_mean_s": float(np.mean(e2e)) if e2e else None,
        "queue_p50_s": _pct(queue, 50), "queue_mean_s": float(np.mean(queue)) if queue else None,
        "preemptions": int(st["preemptions"]),
        "recompute_tokens": int(sum(r["recompute_tokens"] for r in recs)),
        "max_running_seqs": int(st["max_running_seqs"]), "mean_running_seqs": float(res.mean_running),
        "kv_capacity_bytes": float(cap["kv_capacity_bytes"]), "kv_budget_blocks": int(budget),
        "peak_kv_bytes": float(res.timeline_b.max()) if res.timeline_b.size else 0.0,
        "prefix_hit_rate": hit / prompt if prompt else 0.0,
        "length_extrapolated": False, "makespan_s": float(span), "iterations": int(res.iterations),
        "events": int(res.events), "evictions": int(res.kv.evictions),
        **request_summary(recs),
    }


def timelines(res, max_points: int = 500) -> dict:
    """KV bytes and running sequences after each iteration, thinned to at most ``max_points`` (for plots)."""
    t, b, r = res.timeline_t, res.timeline_b, res.timeline_running
    if t.size > max_points:
        idx = np.unique(np.linspace(0, t.size - 1, max_points).round().astype(np.int64))
        t, b, r = t[idx], b[idx], r[idx]
    return {"t_s": t.tolist(), "kv_bytes": b.tolist(), "running_seqs": r.tolist()}


def percentile_word(p: float) -> str:
    """A percentile as ``vllm bench serve`` names its keys: ``99`` for 99.0, ``99.9`` for 99.9 (``p99_ttft_ms``)."""
    return str(int(p)) if int(p) == p else str(p)
