"""The text ``rksim bench serve`` and ``bench throughput`` print: vLLM's result blocks, then the provenance line.

``sim.bench.plain`` returns the result dictionaries (vLLM's keys); the text is built here.
"""
from __future__ import annotations

from sim.bench.plain import provenance
from sim.serving.metrics import percentile_word

_HEAD = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
         "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}


def format_serve(res: dict, metrics=("ttft", "tpot", "itl", "e2el"), percentiles=(99.0,)) -> str:
    """vLLM's ``Serving Benchmark Result`` block, then the line saying what produced it."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label, v, f="{:<10}"):
        lines.append(("{:<40} " + f).format(label, v))
    row("Successful requests:", res["completed"])
    row("Failed requests:", res["failed"])
    if res.get("max_concurrency") is not None:
        row("Maximum request concurrency:", res["max_concurrency"])
    if res.get("request_rate") != "inf":
        row("Request rate configured (RPS):", float(res["request_rate"]), "{:<10.2f}")
    row("Benchmark duration (s):", res["duration"], "{:<10.2f}")
    row("Total input tokens:", res["total_input_tokens"])
    row("Total generated tokens:", res["total_output_tokens"])
    row("Request throughput (req/s):", res["request_throughput"], "{:<10.2f}")
    if res.get("request_goodput") is not None:
        row("Request goodput (req/s):", res["request_goodput"], "{:<10.2f}")
    row("Output token throughput (tok/s):", res["output_throughput"], "{:<10.2f}")
    row("Peak output token throughput (tok/s):", res["max_output_tokens_per_s"], "{:<10.2f}")
    row("Peak concurrent requests:", res["max_concurrent_requests"], "{:<10.2f}")
    row("Total token throughput (tok/s):", res["total_token_throughput"], "{:<10.2f}")
    for m in metrics:
        short, head = _HEAD[m]
        lines.append("{s:{c}^{n}}".format(s=head, n=50, c="-"))
        row(f"Mean {short} (ms):", res[f"mean_{m}_ms"], "{:<10.2f}")
        row(f"Median {short} (ms):", res[f"median_{m}_ms"], "{:<10.2f}")
        for p in percentiles:
            row(f"P{percentile_word(p)} {short} (ms):", res[f"p{percentile_word(p)}_{m}_ms"], "{:<10.2f}")
    reps = res["rksim"].get("per_replica")
    if reps:
        lines.append("{s:{c}^{n}}".format(s=f"Per replica ({res['rksim'].get('router')})", n=50, c="-"))
        p = percentile_word(percentiles[-1]) if percentiles else None
        for x in reps:
            good = "" if x["request_goodput"] is None else f", goodput {x['request_goodput']:.2f}"
            tail = f", P{p} E2EL {x[f'p{p}_e2el_ms']:.0f} ms" if p and f"p{p}_e2el_ms" in x else ""
            lines.append(f"replica {x['replica']}: {x['completed']} requests, {x['request_throughput']:.2f} req/s"
                         f"{good}{tail}")
    lines.append("=" * 50)
    lines.append(provenance(res["rksim"]))
    return "\n".join(lines)


def format_throughput(res: dict) -> str:
    """vLLM's offline throughput lines, then the provenance line."""
    e = res["elapsed_time"]
    tot_out = res["total_output_tokens"]
    return (f"Throughput: {res['num_requests'] / e:.2f} requests/s, {res['total_num_tokens'] / e:.2f} total tokens/s, "
            f"{tot_out / e:.2f} output tokens/s\n"
            f"Total num prompt tokens:  {res['total_num_tokens'] - tot_out}\n"
            f"Total num output tokens:  {tot_out}\n" + provenance(res["rksim"]))
