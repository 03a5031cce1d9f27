"""The result dictionaries of a simulated ``vllm bench serve`` / ``vllm bench throughput`` run (vLLM's keys,
:mod:`sim.bench.plain`'s docstring, "metrics") and the one-line provenance of its target."""
from __future__ import annotations

import math

import numpy as np

from sim.bench.gap_counts import GapCounts
from sim.bench.plain_workload import PlainError
from sim.cost.overheads import overheads_words
from sim.serving.capacity import DEFAULT_RULES
from sim.serving.metrics import percentile_word

TOKEN_CHUNK = 4096   # requests whose token times are counted at once (serve_result's peak tokens per second)


class ITLs:
    """Per request, the gaps between consecutive tokens, computed from its token times when read
    (``numpy.diff``): a run holds its token-time windows (:class:`sim.serving.fastforward.TokenTimes`), not a
    list per token, until a result asks for the ITLs."""

    def __init__(self, times: list):
        self.times = times

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, i) -> list:
        return np.diff(np.asarray(self.times[i], np.float64)).tolist()

    def __iter__(self):
        for i in range(len(self.times)):
            yield self[i]

    def array(self, i: int) -> np.ndarray:
        """Request ``i``'s gaps as an array."""
        return np.diff(np.asarray(self.times[i], np.float64))

    def flat(self) -> np.ndarray:
        """Every request's gaps, in request order, as one array."""
        parts = [self.array(i) for i in range(len(self.times))]
        return np.concatenate(parts) if parts else np.zeros(0)


class Gaps(ITLs):
    """Every request's gaps in one float64 array (the front end's ITLs, :func:`sim.bench.plain._with_frontend`),
    request ``i``'s at ``values[offsets[i]:offsets[i + 1]]``: 8 bytes a token and no array per request, and
    :meth:`flat` is that array itself (a day of traffic's ITLs are held once, not twice); read as
    :class:`ITLs` is."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values = values
        self.offsets = offsets
        self.times = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def array(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def __getitem__(self, i) -> list:
        return self.array(i).tolist()

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def flat(self) -> np.ndarray:
        return self.values


def token_seconds(start, ttft, gaps, t0: float) -> np.ndarray:
    """Output tokens per whole second from ``t0`` of requests sent at ``start`` (their TTFTs ``ttft`` and gaps
    ``gaps``, one array each): token ``j`` of request ``i`` at ``start_i + ttft_i + cumsum(gaps_i)[j - 1]``, as
    ``calculate_metrics`` buckets them; counts by second, the last the latest token's."""
    if not len(gaps):
        return np.zeros(0, np.int64)
    tt = [s + t + np.concatenate([[0.0], np.cumsum(g)]) for s, t, g in zip(start.tolist(), ttft.tolist(), gaps)]
    return np.bincount(np.maximum((np.concatenate(tt) - t0).astype(np.int64), 0))


def fold_seconds(counts, nsec: int) -> np.ndarray:
    """``counts`` by second as ``nsec`` seconds: the ones past the last added to it (``calculate_metrics``'s clip)."""
    out = np.zeros(nsec, np.int64)
    k = min(len(counts), nsec)
    out[:k] = counts[:k]
    out[-1] += int(counts[nsec:].sum())
    return out


class Tally:
    """What a result reads of every request's gaps, added a chunk of requests at a time: the gaps counted
    (:class:`GapCounts`) and the output tokens per whole second from ``t0`` (:func:`token_seconds`, not yet
    clipped to the run's seconds: :meth:`per_second`)."""

    def __init__(self, t0: float):
        self.t0 = float(t0)
        self.gaps = GapCounts()
        self.tok = np.zeros(0, np.int64)

    def add(self, start, ttft, gaps: list, flat=None) -> None:
        """Requests sent at ``start`` with TTFTs ``ttft`` and gaps ``gaps`` (one array each; ``flat``: them joined,
        where the caller has it)."""
        self.gaps.add(flat if flat is not None else (np.concatenate(gaps) if gaps else np.zeros(0)))
        t = token_seconds(start, ttft, gaps, self.t0)
        if len(t) > len(self.tok):
            self.tok = np.pad(self.tok, (0, len(t) - len(self.tok)))
        self.tok[:len(t)] += t

    def per_second(self, nsec: int) -> np.ndarray:
        return fold_seconds(self.tok, nsec)


def _stats(x, percentiles) -> tuple:
    """Mean, median, standard deviation and ``percentiles`` of ``x`` (an array, or a :class:`GapCounts`), in ms."""
    if isinstance(x, GapCounts):
        if x.n:
            return (x.mean() * 1000, x.median() * 1000, x.std() * 1000,
                    [(p, x.percentile(p) * 1000) for p in percentiles])
        x = ()
    a = np.asarray(x, np.float64) if len(x) else np.zeros(1)
    return (float(np.mean(a)) * 1000, float(np.median(a)) * 1000, float(np.std(a)) * 1000,
            [(p, float(np.percentile(a, p)) * 1000) for p in percentiles])


def serve_result(r, *, percentiles=(99.0,), metrics=("ttft", "tpot", "itl", "e2el"),
                 request_rate: float = math.inf, burstiness: float = 1.0, max_concurrency: int | None = None,
                 model_id: str = "", num_prompts: int | None = None, detailed: bool = True,
                 extra: dict | None = None, slo=None) -> dict:
    """``vllm bench serve``'s result dictionary (its keys; module docstring) for a simulated run.

    ``slo`` (a :class:`sim.serving.goodput.SLO`): ``request_goodput`` = requests meeting every stated SLO per second
    of the run, vLLM's ``--goodput`` rule (TPOT ``(e2el - ttft) / (output_len - 1)``, 0 for one output token;
    a request is good when each stated latency is <= its SLO); None when no SLO is stated. With replicas,
    ``rksim.per_replica`` holds each replica's requests, throughput, goodput and latency percentiles.

    ``start_times`` are seconds from the benchmark's start (vLLM writes ``perf_counter`` values:
    only differences matter). ``extra`` keys (rksim's provenance) are added under ``"rksim"``.
    """
    wl = r.workload
    n = wl.n
    dur = r.duration
    out_lens = wl.output_lens.tolist()
    tot_in, tot_out = int(wl.input_lens.sum()), int(wl.output_lens.sum())
    tpots = [(e - t) / (o - 1) for e, t, o in zip(r.e2el, r.ttft, out_lens) if o > 1]
    queue = (r.start - r.scheduled).tolist()
    # peak output tokens per whole second and peak concurrency, as calculate_metrics buckets them
    t0 = float(r.start.min())
    nsec = int(np.ceil(float((r.start + r.e2el).max()) - t0)) + 1
    tally = r.tally   # the front end's pass made it as the gaps landed (sim.bench.plain._with_frontend)
    if tally is None:
        if r.itls is None:   # pragma: no cover - a run keeps its gaps or their tally
            raise PlainError("serve_result: the run kept neither its gaps nor their tally")
        gap = r.itls.array if isinstance(r.itls, ITLs) else (lambda i: np.asarray(r.itls[i], np.float64))
        tally = Tally(t0)
        for lo in range(0, n, TOKEN_CHUNK):   # counts add exactly: requests a chunk at a time bound the memory
            hi = min(n, lo + TOKEN_CHUNK)
            tally.add(r.start[lo:hi], r.ttft[lo:hi], [gap(i) for i in range(lo, hi)])
    allitl, tok = tally.gaps, tally.per_second(nsec)
    if detailed and r.itls is None:
        raise PlainError("serve_result: detailed results need the run's per-request gaps (plain.run(keep_gaps=True))")
    # to the nanosecond: a client slot freed at t and taken again at t (send = start + e2el, summed in floating
    # point in different orders) is one request after the other, not two at once
    ev = sorted([(round(float(s), 9), 1) for s in r.start] + [(round(float(s + e), 9), -1)
                                                              for s, e in zip(r.start, r.e2el)])
    cur = peak = 0
    for _, dlt in ev:
        cur += dlt
        peak = max(peak, cur)
    res = {
        "date": "simulated", "endpoint_type": "rksim", "backend": "rksim", "label": None, "model_id": model_id,
        "tokenizer_id": None, "num_prompts": int(num_prompts if num_prompts is not None else n),
        "request_rate": request_rate if request_rate < math.inf else "inf", "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": dur, "completed": n, "failed": 0, "total_input_tokens": tot_in, "total_output_tokens": tot_out,
        "request_throughput": n / dur, "request_goodput": None, "output_throughput": tot_out / dur,
        "total_token_throughput": (tot_in + tot_out) / dur,
        "input_lens": wl.input_lens.tolist(), "output_lens": out_lens, "ttfts": r.ttft.tolist(),
        "itls": [list(map(float, x)) for x in r.itls] if detailed else None, "latencies": r.e2el.tolist(), "start_times": r.start.tolist(),
        "queue_times": queue, "generated_texts": [""] * n, "errors": [""] * n,
        "max_output_tokens_per_s": float(tok.max()), "max_concurrent_requests": int(peak), "rtfx": 0.0,
    }
    series = {"ttft": r.ttft, "tpot": tpots, "itl": allitl, "e2el": r.e2el}
    for m in metrics:
        if m not in series:
            raise PlainError(f"--percentile-metrics: {m!r} is not one of {', '.join(series)}")
        mean, med, std, pcts = _stats(series[m], percentiles)
        res[f"mean_{m}_ms"], res[f"median_{m}_ms"], res[f"std_{m}_ms"] = mean, med, std
        for p, v in pcts:
            res[f"p{percentile_word(p)}_{m}_ms"] = v
    if not detailed:
        for k in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
            res.pop(k, None)
    from sim.serving.goodput import goodput, tpot
    all_tpot = tpot(r.ttft, r.e2el, out_lens)
    if slo is not None and slo.stated:
        res["request_goodput"] = goodput(slo, r.ttft, all_tpot, r.e2el, dur)["goodput_rps"]
    res["rksim"] = {**r.info, **(extra or {}), "slo": None if slo is None or not slo.stated else str(slo)}
    if r.replica is not None:
        res["rksim"]["per_replica"] = _per_replica(r, all_tpot, slo, percentiles)
    return res


def _per_replica(r, all_tpot, slo, percentiles) -> list:
    """Each replica's requests, request throughput and goodput over the whole run's duration, TTFT / TPOT /
    E2EL mean and percentiles in ms."""
    from sim.serving.goodput import goodput
    out = []
    for k in range(int(r.info["data_parallel_size"])):
        m = r.replica == k
        row = {"replica": k, "completed": int(m.sum()),
               "request_throughput": float(m.sum()) / r.duration if r.duration > 0 else None,
               "request_goodput": (goodput(slo, r.ttft[m], all_tpot[m], r.e2el[m], r.duration)["goodput_rps"]
                                   if slo is not None and slo.stated else None),
               "output_throughput": float(r.workload.output_lens[m].sum()) / r.duration if r.duration > 0 else None}
        for name, x in (("ttft", r.ttft[m]), ("tpot", all_tpot[m][r.workload.output_lens[m] > 1]), ("e2el", r.e2el[m])):
            if m.any():
                mean, med, _, pcts = _stats(x, percentiles)
                row[f"mean_{name}_ms"], row[f"median_{name}_ms"] = mean, med
                for p, v in pcts:
                    row[f"p{percentile_word(p)}_{name}_ms"] = v
        out.append(row)
    return out


def provenance(info: dict, run_stats: bool = True) -> str:
    """One line: which target's costs, under what scheduler, batch and capacity (``run_stats``: and the run's
    preemptions and most sequences running; off for a line that covers several runs)."""
    s = info["scheduler"]
    pol = info.get("token_policy")
    lay = (f" x TP {info['tensor_parallel_size']} x PP {info['pipeline_parallel_size']}"
           + (f" (experts: EP {info['tensor_parallel_size']})"   # DP attention's EP: its own note
              if info.get("enable_expert_parallel") and "dp_attention" not in info else "") + f" on {info['node']}"
           if "tensor_parallel_size" in info else "")
    from sim.cost.model_shape import precision_words
    prec = precision_words(info.get("quantization"), info.get("kv_cache_dtype"))
    return (f"simulated: model {info['model']}{f' ({prec})' if prec else ''} on {info['hardware']}{lay} "
            f"({info['calibration']}); scheduler "
            f"{s['scheduler']}, max_num_seqs {s['max_num_seqs']}, max_num_batched_tokens "
            f"{s['max_num_batched_tokens']}, KV capacity {info['kv_capacity_blocks']} blocks of "
            f"{info['block_size']} tokens ({info['kv_capacity_bytes'] / 1e9:.2f} GB"
            + (f", sized as vLLM {info['memory_rules']} sizes it"
               if info.get("memory_rules") not in (None, DEFAULT_RULES) else "") + "), prefix caching "
            f"{'on' if info['prefix_caching'] else 'off'}" + (f", token policy {pol}" if pol else "")
            + (f"; {info['moe_experts']}" if info.get("moe_experts") else "")
            + (f"; {info['data_parallel_size']} replicas behind {info['router']}, each with that capacity"
               if "data_parallel_size" in info and "dp_attention" not in info else "")
            + (f"; {info['dp_attention']['note']}, behind {info['router']}, each rank with that capacity"
               if "dp_attention" in info else "")
            + overheads_words(info)
            + "".join(f"; {x}" for x in info.get("extrapolated") or ())   # each 'extrapolated: <dimension>'
            + (f"; SLO {info['slo']}" if info.get("slo") else "")
            + ((f"; {info['preemptions']} preemptions, at most {info['max_running_seqs']} running"
                + (" on one replica" if "data_parallel_size" in info else "")) if run_stats else ""))


def throughput_result(r) -> dict:
    """``vllm bench throughput --output-json``'s keys for a simulated offline run."""
    wl = r.workload
    tot_out = int(wl.output_lens.sum())
    tot = int(wl.input_lens.sum()) + tot_out
    return {"elapsed_time": r.duration, "num_requests": wl.n, "total_num_tokens": tot,
            "requests_per_second": wl.n / r.duration, "tokens_per_second": tot / r.duration,
            "output_tokens_per_second": tot_out / r.duration, "total_output_tokens": tot_out,
            "rksim": dict(r.info)}
