"""Measured serving figures of LLMServingSim's four vLLM 0.19.0 bench runs, computed as the artifact defines them.

The data (``calibrate/data/llmservingsim-bench/``, MIT, see its SOURCE.md) are the per-request timestamps
(``*-requests.jsonl``) and engine settings (``*-meta.json``) of four measured runs of LLMServingSim's
``bench/examples/`` (snapshot 5daddb21a545658d5150b535712d0494584b5278): ``python -m bench run``
(``bench/core/runner.py``) replays a 300-request ShareGPT trace at 10 requests/s through an in-process
``vllm.v1.engine.async_llm.AsyncLLM`` (no API server), each request's prompt token ids and output length pinned
(``min_tokens = max_tokens = output_toks``, ``ignore_eos``), sent at the trace's ``arrival_time_ns`` by an asyncio
sleep, and records vLLM's ``RequestStateStats`` of each request: ``arrival_time`` (wall-clock epoch seconds, taken
by the front end), ``queued_ts`` / ``scheduled_ts`` / ``first_token_ts`` / ``last_token_ts`` (the engine core's
monotonic clock).

The figures are the artifact's own (``bench/core/validate.py`` ``_bench_latencies``, ``bench/core/plots.py``
``_mean`` and ``_percentile``), in milliseconds:

    anchor = arrival_time if it shares first/last_token_ts's clock (within 100,000 s), else queued_ts
    TTFT   = first_token_ts - anchor
    TPOT   = (last_token_ts - first_token_ts) / (output_toks - 1)     # requests with output_toks > 1 only
    E2EL   = last_token_ts - anchor
    mean: the arithmetic mean; median: the 50th percentile by linear interpolation between closest ranks

In all four runs ``arrival_time`` is wall-clock time, so the anchor is ``queued_ts``: the engine core's time of
taking the request in (``Scheduler.add_request``, between two engine steps), not the send. The artifact computes
no throughput; here ``output_throughput`` = the run's output tokens / (the latest ``last_token_ts`` - the earliest
anchor), tokens per second.

``arrival_time_ns`` of the traces is shipped in ``sharegpt-300-sps10-arrivals.csv`` (workload, request,
input_toks, output_toks, arrival_time_ns), derived from the trace files by ``--derive-arrivals`` (the traces
themselves, 2.5 MB each with token ids, are not shipped).

``python -m calibrate.llmservingsim_bench`` prints each run's figures; ``--check FILE`` compares them, and the
workload lists, with the entries of a figure file of ``rksim validate`` (ids :func:`figure_id`; values as
written there: rounded to :data:`DECIMALS`), and exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "llmservingsim-bench"
REPO = "github:casys-kaist/LLMServingSim"
SNAPSHOT = "5daddb21a545658d5150b535712d0494584b5278"
ARRIVALS = DATA / "sharegpt-300-sps10-arrivals.csv"
ARRIVAL_COLUMNS = ("workload", "request", "input_toks", "output_toks", "arrival_time_ns")
# run -> (files' stem here, the example's folder in LLMServingSim's bench/examples/, figure id stem, trace)
RUNS = {
    "rtxpro6000-llama-3.1-8b": ("RTXPRO6000/Llama-3.1-8B", "rtxpro6000-llama3.1-8b",
                                "sharegpt-llama-3.1-8b-300-sps10"),
    "rtxpro6000-qwen3-32b": ("RTXPRO6000/Qwen3-32B", "rtxpro6000-tp2-qwen3-32b", "sharegpt-qwen3-32b-300-sps10"),
    "rtxpro6000-qwen3-30b-a3b-instruct-2507": ("RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
                                               "rtxpro6000-dp2-ep-qwen3-30b-a3b", "sharegpt-qwen3-30b-a3b-300-sps10"),
    "rtx4090-llama-3.1-8b": ("RTX4090/Llama-3.1-8B", "rtx4090-llama3.1-8b", "sharegpt-llama-3.1-8b-300-sps10"),
}
METRICS = ("mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_e2el_ms", "median_e2el_ms",
           "output_throughput")
DECIMALS = 2                # the figures as the figure file writes them: ms and tokens/s to 0.01
SAME_CLOCK_S = 100_000      # bench/core/validate.py _same_time_domain: timestamps this close share a clock


def figure_id(run: str, metric: str) -> str:
    """``llmservingsim-rtxpro6000-llama3.1-8b-sharegpt300-rate10-mean-ttft`` and so on."""
    stat = metric[:-3].replace("_", "-") if metric.endswith("_ms") else metric.replace("_", "-")
    return f"llmservingsim-{RUNS[run][1]}-sharegpt300-rate10-{stat}"


def requests_path(run: str) -> Path:
    return DATA / f"{run}-requests.jsonl"


def meta_path(run: str) -> Path:
    return DATA / f"{run}-meta.json"


def load_requests(run: str) -> list[dict]:
    """The run's ``requests.jsonl`` rows, in file order (``bench-0`` .. ``bench-299``: the trace's order)."""
    with requests_path(run).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def load_meta(run: str) -> dict:
    return json.loads(meta_path(run).read_text())


def _same_clock(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) < SAME_CLOCK_S


def anchor(req: dict) -> tuple[float | None, bool]:
    """The arrival timestamp on first/last_token_ts's clock and whether it is ``queued_ts``
    (bench/core/validate.py ``_bench_arrival_ts``, the same rule)."""
    arr, queued = req.get("arrival_time"), req.get("queued_ts")
    first, last = req.get("first_token_ts"), req.get("last_token_ts")
    if queued is None:
        return arr, False
    if arr is None:
        return queued, True
    if _same_clock(arr, first) and _same_clock(arr, last):
        return arr, False
    if _same_clock(queued, first) or _same_clock(queued, last):
        return queued, True
    return arr, False


def latencies(reqs: list[dict]) -> tuple[list[float], list[float], list[float]]:
    """TTFT, TPOT and E2E latency in ms (bench/core/validate.py ``_bench_latencies``)."""
    ttft, tpot, e2el = [], [], []
    for r in reqs:
        arr, _ = anchor(r)
        first, last = r.get("first_token_ts"), r.get("last_token_ts")
        if arr is None or first is None or last is None:
            continue
        out = max(1, int(r.get("output_toks", 1)))
        ttft.append((first - arr) * 1000.0)
        if out > 1:
            tpot.append((last - first) / (out - 1) * 1000.0)
        e2el.append((last - arr) * 1000.0)
    return ttft, tpot, e2el


def percentile(xs, q: float) -> float:
    """bench/core/plots.py ``_percentile``: linear interpolation between the closest ranks."""
    if not xs:
        return math.nan
    s = sorted(xs)
    idx = (q / 100.0) * (len(s) - 1)
    lo = int(idx)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] * (1 - (idx - lo)) + s[hi] * (idx - lo)


def mean(xs) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def figures(run: str) -> dict:
    """The run's figures (unrounded; :data:`METRICS`) and what they were read from: ``requests``, ``output_tokens``,
    ``span_s`` (the throughput's denominator), ``anchor`` (which timestamp TTFT and E2EL start at)."""
    reqs = load_requests(run)
    ttft, tpot, e2el = latencies(reqs)
    anchors = [anchor(r) for r in reqs]
    start = min(a for a, _ in anchors if a is not None)
    span = max(r["last_token_ts"] for r in reqs if r.get("last_token_ts") is not None) - start
    tokens = sum(int(r["output_toks"]) for r in reqs)
    out = {"mean_ttft_ms": mean(ttft), "median_ttft_ms": percentile(ttft, 50),
           "mean_tpot_ms": mean(tpot), "median_tpot_ms": percentile(tpot, 50),
           "mean_e2el_ms": mean(e2el), "median_e2el_ms": percentile(e2el, 50),
           "output_throughput": tokens / span}
    kinds = {"queued_ts" if q else "arrival_time" for _, q in anchors}
    out.update(requests=len(reqs), timed=len(e2el), output_tokens=tokens, span_s=span, anchor="/".join(sorted(kinds)))
    return out


def rounded(run: str) -> dict:
    """:func:`figures` as the figure file writes them (:data:`DECIMALS`)."""
    f = figures(run)
    return {m: round(f[m], DECIMALS) for m in METRICS}


# ---------------------------------------------------------------------------- the traces' send times
def derive_arrivals(paths) -> str:
    """The CSV of :data:`ARRIVALS` from LLMServingSim trace files (``workloads/<name>.jsonl``: per request
    ``input_toks``, ``output_toks``, ``arrival_time_ns``; the token ids are dropped), one block per file in the
    order given, requests in file order."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(ARRIVAL_COLUMNS)
    for p in map(Path, paths):
        name = p.name[:-len(".jsonl")] if p.name.endswith(".jsonl") else p.stem
        with p.open() as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for i, r in enumerate(rows):
            w.writerow((name, i, int(r["input_toks"]), int(r["output_toks"]), int(r["arrival_time_ns"])))
    return buf.getvalue()


def load_arrivals(path: Path = ARRIVALS) -> dict:
    """Trace name -> ``{"input_toks": [...], "output_toks": [...], "arrival_time_ns": [...]}`` in request order."""
    out: dict = {}
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            d = out.setdefault(row["workload"], {"input_toks": [], "output_toks": [], "arrival_time_ns": []})
            if int(row["request"]) != len(d["input_toks"]):
                raise ValueError(f"{path}: {row['workload']}: request {row['request']} out of order")
            for k in ("input_toks", "output_toks", "arrival_time_ns"):
                d[k].append(int(row[k]))
    return out


def workload(run: str) -> dict:
    """The run's figure workload: ``input_lens`` / ``output_lens`` as its requests.jsonl records them (the lengths
    the engine was given), ``arrival_times_ns`` its trace's send times."""
    reqs = load_requests(run)
    return {"input_lens": [int(r["input_toks"]) for r in reqs], "output_lens": [int(r["output_toks"]) for r in reqs],
            "arrival_times_ns": load_arrivals()[RUNS[run][2]]["arrival_time_ns"]}


# ---------------------------------------------------------------------------- the check
def check(figs: list) -> list[str]:
    """Differences between the entries of a figure file (its ``figures:`` list, loaded) and the shipped runs: each
    run's :data:`METRICS` figure present under :func:`figure_id` with its value rounded to :data:`DECIMALS`, and
    its workload lists equal to :func:`workload`'s; and no other ``llmservingsim-rtx*`` entry."""
    by_id = {f.get("id"): f for f in figs if isinstance(f, dict)}
    want = {figure_id(run, m): (run, m) for run in RUNS for m in METRICS}
    problems = [f"{i}: no such run's figure (expected one of {len(want)} ids)" for i in by_id
                if isinstance(i, str) and i.startswith("llmservingsim-rtx") and i not in want]
    values = {run: rounded(run) for run in RUNS}
    loads = {run: workload(run) for run in RUNS}
    for fid, (run, m) in want.items():
        f = by_id.get(fid)
        if f is None:
            problems.append(f"{fid}: missing")
            continue
        if f.get("metric") != m:
            problems.append(f"{fid}: metric {f.get('metric')!r}, expected {m!r}")
        if f.get("value") != values[run][m]:
            problems.append(f"{fid}: value {f.get('value')!r}, the shipped run gives {values[run][m]!r}")
        w = f.get("workload") or {}
        for k, v in loads[run].items():
            if w.get(k) != v:
                problems.append(f"{fid}: workload {k} differs from the shipped run's")
    return problems


def table() -> str:
    rows = [["run", "requests", "output tokens", "span s", *METRICS]]
    for run in RUNS:
        f = figures(run)
        rows.append([run, str(f["requests"]), str(f["output_tokens"]), f"{f['span_s']:.3f}",
                     *(f"{f[m]:.{DECIMALS}f}" for m in METRICS)])
    return "\n".join("| " + " | ".join(r) + " |" for r in [rows[0], ["---"] * len(rows[0]), *rows[1:]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llmservingsim_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--check", metavar="FILE", default=None,
                    help="a figure file of rksim validate: exit 1 where its entries of these runs differ from the "
                         "shipped files (default: none, print the figures)")
    ap.add_argument("--derive-arrivals", metavar="JSONL", nargs="+", default=None,
                    help="LLMServingSim trace files (workloads/*.jsonl): write their per-request lengths and send "
                         f"times to {ARRIVALS.name} (default: none)")
    a = ap.parse_args(argv)
    for f in ([a.check] if a.check else []) + (a.derive_arrivals or []):
        if not Path(f).is_file():
            ap.error(f"{f}: no such file")
    if a.derive_arrivals:
        from traces.store import atomic_write_text
        atomic_write_text(ARRIVALS, derive_arrivals(a.derive_arrivals))
        for p in a.derive_arrivals:
            print(f"{p}: sha256 {hashlib.sha256(Path(p).read_bytes()).hexdigest()}")
        print(f"wrote {ARRIVALS}")
        return 0
    if a.check:
        from sim.base.yamlio import safe_load
        data = safe_load(Path(a.check).read_text())
        problems = check((data or {}).get("figures") or [])
        for p in problems:
            print(f"{a.check}: {p}", file=sys.stderr)
        if problems:
            return 1
        print(f"{a.check}: {len(RUNS) * len(METRICS)} figures of {len(RUNS)} runs equal the shipped files'")
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
