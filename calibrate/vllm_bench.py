"""``rksim calibrate vllm-bench FILE...``: fit a hardware profile on ``vllm bench serve`` result files.

Input: files written by ``vllm bench serve --save-result --save-detailed`` (or by
``rksim bench serve`` / ``rksim calibrate serve --save-result``, the same schema): per request
``input_lens``, ``output_lens``, ``ttfts``, ``itls`` and ``start_times``.

From request timings to iteration timings
-----------------------------------------
A continuous-batching server emits one token for every request that samples in an iteration,
all at the iteration's end. So the measured token times
``start_i + ttft_i + cumsum(itl_i)`` of all requests, pooled and clustered (gaps above
``cluster_tol_s`` start a new cluster), are the ends of the iterations that sampled.
rksim's scheduler (:mod:`sim.serving.scheduler`, with :mod:`sim.serving.kvcache`'s block manager) is then
driven through the same requests, arriving at their send times: each iteration it schedules
is matched to the next measured cluster when it samples, and its duration is the time from
its start (the previous cluster, or the arrival that woke an idle server) to that cluster.
An iteration whose sampling requests differ from the cluster's is counted as a mismatch
and left out; iterations that sample nothing (a prefill chunk with nothing decoding) have
no measured end and are left out with the one that follows them.

The fit
-------
Each kept iteration's items ``(n new, c cached)`` give the cost model's terms
(:func:`sim.cost.terms.batch_terms`), and :func:`calibrate.fit.fit_profile` (the one fitter) fits
the coefficients to the measured durations. From end-to-end timings of one model, kernels,
layers and forward calls per iteration are in fixed proportion, so only their sum is
identifiable: it is fitted as ``per_kernel_s`` (``per_layer_s = host_per_iter_s = 0``, the
CUDA-graph and sampling terms off), i.e. ``per_iteration_s = per_kernel_s (11 L + 4)``.

Held out
--------
With two or more files, one (``holdout``, default the last) is left out of the fit, and
its benchmark is simulated with the fitted profile (:func:`sim.bench.plain.run`, its lengths, its
send schedule, its concurrency) and compared metric by metric (``pred / measured - 1``).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from sim.cost import terms as C

METRICS = ("request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
           "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
           "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms")
_ZERO_TERMS = ("layers", "iters", "graph_kernels", "samples")


class BenchFileError(ValueError):
    """A bad vLLM bench file (the message names it and the field)."""


@dataclasses.dataclass
class BenchFile:
    path: str
    input_lens: np.ndarray
    output_lens: np.ndarray
    start: np.ndarray          # send times, seconds from the first send
    scheduled: np.ndarray      # due times (send - client queue time)
    token_times: list          # per request, the time of each of its tokens
    max_concurrency: int | None
    request_rate: float
    data: dict


def load_bench_file(path) -> BenchFile:
    """Read and check one result file (``--save-detailed`` fields required)."""
    p = Path(path)
    if not p.is_file():
        raise BenchFileError(f"{p}: no such file")
    try:
        d = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchFileError(f"{p}: not valid JSON: {exc}") from None
    if not isinstance(d, dict):
        raise BenchFileError(f"{p}: expected a JSON object (a vllm bench serve result)")
    need = ("input_lens", "output_lens", "ttfts", "itls", "start_times")
    miss = [k for k in need if not isinstance(d.get(k), list)]
    if miss:
        raise BenchFileError(f"{p}: missing per-request field(s) {', '.join(miss)} "
                             "(run vllm bench serve with --save-result --save-detailed)")
    n = len(d["input_lens"])
    if n == 0 or any(len(d[k]) != n for k in need):
        raise BenchFileError(f"{p}: per-request fields {', '.join(need)} must be non-empty and of equal length")
    errs = d.get("errors") or [""] * n
    ok = [i for i in range(n) if not errs[i] and d["ttfts"][i] is not None and d["output_lens"][i]]
    if len(ok) < n:
        raise BenchFileError(f"{p}: {n - len(ok)} failed requests; a fit needs a run where every request succeeded")
    inp = np.asarray(d["input_lens"], np.int64)
    out = np.asarray(d["output_lens"], np.int64)
    st = np.asarray(d["start_times"], np.float64)
    t0 = float(st.min())
    start = st - t0
    q = d.get("queue_times")
    sched = start - np.asarray(q, np.float64) if isinstance(q, list) and len(q) == n and all(
        x is not None for x in q) else start.copy()
    toks = []
    for i in range(n):
        itl = d["itls"][i]
        if len(itl) != int(out[i]) - 1:
            raise BenchFileError(f"{p}: request {i}: {len(itl)} inter-token latencies for {int(out[i])} output tokens "
                                 "(tokens bundled in one chunk cannot be placed in iterations)")
        toks.append(start[i] + float(d["ttfts"][i]) + np.concatenate([[0.0], np.cumsum(np.asarray(itl, np.float64))]))
    rr = d.get("request_rate", "inf")
    rate = math.inf if rr in ("inf", None) else float(rr)
    mc = d.get("max_concurrency")
    return BenchFile(str(p), inp, out, start, sched, toks, None if mc is None else int(mc), rate, d)


def _clusters(times: np.ndarray, tol: float) -> np.ndarray:
    """Cluster index of every time (sorted order kept): a gap above ``tol`` starts a new cluster."""
    order = np.argsort(times, kind="stable")
    ts = times[order]
    cid = np.concatenate([[0], np.cumsum(np.diff(ts) > tol)])
    out = np.empty(len(times), np.int64)
    out[order] = cid
    return out


def _measured_iterations(bf: BenchFile, cluster_tol_s: float) -> tuple[np.ndarray, list]:
    """The measured iterations: each cluster's end time and the requests that sampled in it."""
    flat = np.concatenate(bf.token_times)
    owner = np.concatenate([np.full(len(t), i) for i, t in enumerate(bf.token_times)])
    cid = _clusters(flat, cluster_tol_s)
    ncl = int(cid.max()) + 1
    ctime = np.zeros(ncl)
    np.maximum.at(ctime, cid, flat)
    members = [set() for _ in range(ncl)]
    for i, c in zip(owner.tolist(), cid.tolist()):
        members[c].add(i)
    return ctime, members


def iteration_table(bf: BenchFile, model, sched_cfg, kv_blocks: int, block_size: int = 16,
                    prefix_caching: bool = True, cluster_tol_s: float = 1e-4,
                    async_scheduling: bool = True) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(terms (len(TERM_NAMES), N), seconds (N,), info)`` of the measured iterations rksim's scheduler places.

    ``async_scheduling`` (vLLM's default): a request sent while an iteration runs is scheduled a step later (the
    engine's rule, :class:`sim.serving.intake.AsyncIntake`)."""
    from sim.serving.intake import AsyncIntake
    from sim.serving.kvcache import BlockManager
    from sim.serving.scheduler import Request, Scheduler

    n = len(bf.input_lens)
    ctime, members = _measured_iterations(bf, cluster_tol_s)
    ncl = len(ctime)
    sched = Scheduler(sched_cfg, BlockManager(int(kv_blocks), int(block_size), caching=prefix_caching))
    order = np.argsort(bf.start, kind="stable")
    nxt = k = max_batch = matched = mismatched = unmeasured = 0
    t, skip_next = 0.0, False
    cols, secs = [], []
    intake = AsyncIntake() if async_scheduling else None

    def admit(now):
        nonlocal nxt
        while nxt < n and bf.start[order[nxt]] <= now + 1e-12:
            i = int(order[nxt])
            req = Request(i, int(bf.input_lens[i]), int(bf.output_lens[i]), data=i)
            sched.add(req) if intake is None else intake.hold(req, float(bf.start[i]))
            nxt += 1
        if intake is not None:
            intake.release(now, sched)

    admit(t)
    while k < ncl:
        if not sched.has_unfinished():
            if nxt >= n:
                break
            t = max(t, float(bf.start[order[nxt]]))
            admit(t)
            continue
        out = sched.schedule()
        if not out.items:
            raise BenchFileError(f"{bf.path}: rksim's scheduler scheduled nothing at t = {t:.3f} s "
                                 "(a request does not fit in the KV capacity given)")
        sampled = {it.req.data for it in out.items if it.samples}
        ns = np.array([float(it.num_new) for it in out.items])
        cs = np.array([float(it.num_cached) for it in out.items])
        smp = np.array([1.0 if it.samples else 0.0 for it in out.items])
        sched.update(out)
        max_batch = max(max_batch, len(out.items))
        if not sampled:
            unmeasured += 1
            skip_next = True    # its time lands in the next measured interval
            continue
        end = float(ctime[k])
        if sampled == members[k] and not skip_next and end > t:
            tm = C.batch_terms(model, ns, cs, logits=smp, sampled=smp).as_full_array().reshape(len(C.TERM_NAMES))
            cols.append(tm)
            secs.append(end - t)
            matched += 1
        elif sampled != members[k]:
            mismatched += 1
        skip_next = False
        if intake is not None:
            intake.began(t, end)
        t = end
        k += 1
        admit(t)
    info = {"file": bf.path, "requests": n, "measured_iterations": ncl, "matched": matched,
            "mismatched": mismatched, "unmeasured": unmeasured, "max_batch": int(max_batch),
            "max_context_tokens": int((bf.input_lens + bf.output_lens).max()),
            "max_new_tokens": int(min(int(bf.input_lens.max()), sched_cfg.max_num_batched_tokens))}
    if not cols:
        raise BenchFileError(f"{bf.path}: no iteration of rksim's scheduler matched the measured token times "
                             f"({mismatched} mismatched); check --max-num-seqs / --max-num-batched-tokens")
    A = np.stack(cols, axis=1)
    for name in _ZERO_TERMS:
        A[C.TERM_NAMES.index(name)] = 0.0
    return A, np.asarray(secs), info


def _base(hw):
    """The profile the fit starts from, with the terms end-to-end timings cannot separate switched off.

    The measured token times hold the host time per step and the API server's time, so the fitted
    coefficients absorb them: the base's ``host_step`` / ``frontend`` (sim.cost.overheads) are dropped, or they
    would be counted twice (as ``local-cpu``, fitted end to end, carries neither)."""
    return dataclasses.replace(hw, per_layer_s=0.0, host_per_iter_s=0.0, per_kernel_graph_s=None,
                               sample_s_per_vocab=0.0, host_step=None, frontend=None)


def fit_files(files: list, model, hw, *, max_num_seqs=None, max_num_batched_tokens=None, block_size: int = 16,
              prefix_caching: bool = True, holdout: int | None = -1, cluster_tol_s: float = 1e-4,
              scheduler: str = "vllm-v1", gpu_memory_utilization: float = 0.9, kv_capacity_bytes=None,
              roofline: str = "auto", async_scheduling: bool = True) -> dict:
    """Fit ``hw``'s coefficients on ``files`` (all but ``holdout``), predict the held-out one (``async_scheduling``:
    the servers', vLLM's default on: when a sent request is first scheduled, :func:`iteration_table`).

    Returns ``{"profile", "fit", "per_file", "holdout", "errors", "coefficients"}``.
    """
    from sim.bench import plain
    from sim.serving.capacity import ServingConfig, capacity_blocks, kv_capacity
    from sim.serving.scheduler import SchedulerConfig

    from calibrate.fit import fit_profile

    bfs = [load_bench_file(f) for f in files]
    d = plain.scheduler_defaults(hw.name, offline=False)
    sc = SchedulerConfig(max_num_seqs=int(max_num_seqs or d["max_num_seqs"]),
                         max_num_batched_tokens=int(max_num_batched_tokens or d["max_num_batched_tokens"]),
                         policy=scheduler)
    sv = ServingConfig(scheduler=scheduler, max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
                       gpu_memory_utilization=gpu_memory_utilization, kv_capacity_bytes=kv_capacity_bytes,
                       prefix_caching=prefix_caching, no_async_scheduling=not async_scheduling)
    blocks = capacity_blocks(kv_capacity(model, hw, sv)["kv_capacity_bytes"], block_size, model.kv_bytes_per_token)
    ho = None
    if holdout is not None and len(bfs) >= 2:
        ho = holdout % len(bfs)
    fit_idx = [i for i in range(len(bfs)) if i != ho]
    tabs = [iteration_table(bfs[i], model, sc, blocks, block_size, prefix_caching, cluster_tol_s, async_scheduling)
            for i in fit_idx]
    A = np.concatenate([t[0] for t in tabs], axis=1)
    y = np.concatenate([t[1] for t in tabs])
    res = fit_profile(_base(hw), A, y, roofline=roofline)
    # the fitted profile answers only inside what the files measured (and for this model)
    frange = {"max_context_tokens": max(t[2]["max_context_tokens"] for t in tabs),
              "max_new_tokens": max(t[2]["max_new_tokens"] for t in tabs),
              "max_batch": max(t[2]["max_batch"] for t in tabs), "models": [model.name],
              "dtypes": [model.dtype_name]}
    prof = dataclasses.replace(res.profile, name=hw.name, calibrated=True, calibration_status="end-to-end",
                               fitted_range=frange)
    per_iter = prof.per_kernel_s * (C.K_LAYER * model.n_layers + C.K_FWD)
    coeffs = {p: getattr(prof, p) for p in res.fitted if p not in ("per_layer_s", "host_per_iter_s",
                                                                   "sample_s_per_vocab", "per_kernel_graph_s")}
    coeffs["per_iteration_s"] = per_iter
    out = {"profile": prof, "fit": {"params": list(res.fitted), "roofline": res.roofline, "n_iterations": res.n,
                                    "rel_rms": res.rel_rms, "rel_median_abs": res.rel_median_abs},
           "per_file": [t[2] for t in tabs], "coefficients": coeffs, "scheduler": sc.to_dict(),
           "kv_capacity_blocks": int(blocks), "holdout": None, "errors": {},
           "fit_result": dataclasses.replace(res, profile=prof),
           "fitted_range": frange}
    target = bfs[ho] if ho is not None else bfs[0]
    # the held-out run may reach past what the fit measured (a longer context, a larger batch): it is
    # predicted anyway, and the output says so
    pred = predict_file(target, model, dataclasses.replace(prof, fitted_range=None), sv, block_size)
    beyond = [f"{k} {v} > fitted {frange[k]}" for k, v in pred.pop("_range").items() if v > frange[k]]
    out["holdout_beyond_fitted_range"] = beyond
    meas = _measured(target)
    out["holdout"] = target.path if ho is not None else None
    out["errors"] = {m: (pred[m] / meas[m] - 1.0) if meas.get(m) else None for m in METRICS if m in pred}
    out["predicted"], out["measured"] = pred, meas
    return out


def _lead_in(bf: BenchFile) -> float:
    """Seconds from the benchmark's start to its first send (its ``duration`` minus the span of its requests)."""
    span = max(float(t[-1]) for t in bf.token_times)
    dur = bf.data.get("duration")
    return max(float(dur) - span, 0.0) if isinstance(dur, (int, float)) else 0.0


def _measured(bf: BenchFile) -> dict:
    """The file's metrics, recomputed from its per-request fields (vLLM's definitions, sim.bench.plain)."""
    from sim.bench import plain
    ttft = np.array([t[0] - s for t, s in zip(bf.token_times, bf.start)])
    e2el = np.array([t[-1] - s for t, s in zip(bf.token_times, bf.start)])
    itls = [np.diff(t).tolist() for t in bf.token_times]
    dur = max(float(t[-1]) for t in bf.token_times) + _lead_in(bf)
    wl = plain.PlainWorkload(bf.input_lens, bf.output_lens, 0, bf.path)
    r = plain.PlainRun(wl, bf.scheduled, bf.start, ttft, e2el, itls, dur, {})
    res = plain.serve_result(r, request_rate=bf.request_rate, max_concurrency=bf.max_concurrency)
    return {m: res[m] for m in METRICS}


def predict_file(bf: BenchFile, model, hw, serving, block_size: int = 16) -> dict:
    """Simulate the benchmark of ``bf`` (its lengths, due times and concurrency) on ``hw``."""
    from sim.bench import plain
    from sim.cost.overheads import HostStepCost
    if not serving.no_async_scheduling and hw.host_step is None:
        # an async server's engine core scheduled one step ahead (sim.serving.intake, which runs where a host_step
        # is): the fitted profile holds its host time, so the steps gain nothing (max(g + 0, 0) = g)
        hw = dataclasses.replace(hw, host_step=HostStepCost(base_s=0.0, source="in the end-to-end fit"))
    wl = plain.PlainWorkload(bf.input_lens, bf.output_lens, 0, bf.path)
    r = plain.run(model, hw, wl, serving=serving, block_size=block_size, arrivals=bf.scheduled,
                  max_concurrency=bf.max_concurrency)
    # send times are relative to the first send; the benchmark's duration also counts the wait before it
    r.duration += _lead_in(bf)
    res = plain.serve_result(r, request_rate=bf.request_rate, max_concurrency=bf.max_concurrency)
    out = {m: res[m] for m in METRICS}
    out["_range"] = {"max_context_tokens": int((bf.input_lens + bf.output_lens).max()),
                     "max_batch": int(r.info["max_running_seqs"])}
    return out


def format_fit(out: dict) -> str:
    import pandas as pd
    lines = [f"fitted {out['profile'].name} on {out['fit']['n_iterations']} measured iterations "
             f"({out['fit']['roofline']} roofline; relative residual rms {out['fit']['rel_rms']:.3f}); scheduler "
             f"{out['scheduler']['scheduler']}, max_num_seqs {out['scheduler']['max_num_seqs']}, "
             f"max_num_batched_tokens {out['scheduler']['max_num_batched_tokens']}, "
             f"KV {out['kv_capacity_blocks']} blocks"]
    for f in out["per_file"]:
        lines.append(f"  {f['file']}: {f['matched']} of {f['measured_iterations']} measured iterations matched "
                     f"({f['mismatched']} mismatched, {f['unmeasured']} without a token)")
    lines.append("coefficients: " + ", ".join(f"{k} {v:.4g}" for k, v in out["coefficients"].items()
                                               if v is not None))
    what = f"held-out file {out['holdout']}" if out["holdout"] else "the fitted file itself (no file held out)"
    lines.append(f"prediction of {what}:" + (f" (beyond the fitted range: {'; '.join(out['holdout_beyond_fitted_range'])})"
                                              if out.get("holdout_beyond_fitted_range") else ""))
    df = pd.DataFrame({"measured": out["measured"], "predicted": out["predicted"],
                       "error": {k: v for k, v in out["errors"].items()}})
    df["error"] = df["error"].map(lambda v: "" if v is None or v != v else f"{v:+.1%}")
    lines.append(df.to_string(float_format=lambda v: f"{v:.3f}"))
    return "\n".join(lines)


def serve_run_result(run_dir, clock: str | None = None) -> dict:
    """A ``calibrate serve`` run folder as a ``vllm bench serve --save-detailed`` result (:func:`serve_frames_result`)."""
    import pandas as pd
    d = Path(run_dir)
    summ = json.loads((d / "serve.json").read_text())
    it = pd.read_parquet(d / "iterations.parquet")
    rq = pd.read_parquet(d / "requests.parquet")
    cfg = summ.get("config", {})
    return serve_frames_result(it, rq, clock or summ.get("clock", "wall"), concurrency=cfg.get("concurrency"),
                               model_id=str(cfg.get("model", "")), source=str(d))


def serve_frames_result(it, rq, clock: str = "wall", concurrency=None, model_id: str = "", source: str = "") -> dict:
    """The real serving loop's iterations (``seqs``, ``sample``, clocks) and requests (``rid``, ``prompt_len``,
    ``arrival_iter``) as a ``vllm bench serve --save-detailed`` result.

    Iteration ``k`` ends at the cumulative sum of the measured iteration times (scheduling +
    forward + sampling, on ``clock``); a request is sent at the start of the iteration before which
    it was submitted, and each of its tokens comes out at the end of the iteration that sampled it.
    The run's users were closed-loop over *problems* (each of several requests), which vLLM's
    ``max_concurrency`` (over requests) cannot say: the file has ``max_concurrency: null`` and the
    sends as they happened (a prediction replays them), the users under ``rksim.closed_loop_users``.
    """
    from sim.bench import plain
    it = it.sort_values("iteration")
    rq = rq.sort_values("rid")
    dt = it[f"{clock}_s"].to_numpy(np.float64) + it[f"sched_{clock}_s"].to_numpy(np.float64)
    T = np.concatenate([[0.0], np.cumsum(dt)])
    toks = {int(r): [] for r in rq["rid"]}
    for k, (seqs, samp) in enumerate(zip(it["seqs"], it["sample"])):
        for s_, sm in zip(seqs, samp):
            if sm:
                toks[int(s_)].append(T[k + 1])
    starts, ttfts, itls, outs = [], [], [], []
    for r in rq.itertuples(index=False):
        st = float(T[int(r.arrival_iter)])
        tt = np.asarray(toks[int(r.rid)])
        starts.append(st)
        ttfts.append(float(tt[0] - st))
        itls.append(np.diff(tt).tolist())
        outs.append(int(len(tt)))
    wl = plain.PlainWorkload(rq["prompt_len"].to_numpy(np.int64), np.asarray(outs, np.int64), 0, source)
    st = np.asarray(starts)
    e2el = np.array([t + sum(i) for t, i in zip(ttfts, itls)])
    r = plain.PlainRun(wl, st, st, np.asarray(ttfts), e2el, itls, float(T[-1]),
                       {"source": "rksim calibrate serve", "run_dir": source, "clock": clock,
                        "closed_loop_users": concurrency})
    res = plain.serve_result(r, max_concurrency=None, model_id=model_id)
    res["backend"] = res["endpoint_type"] = "rksim-calibrate-serve"
    return res


def write_fitted_preset(path, out: dict, model, device: str) -> dict:
    """The fitted profile as a hardware preset (:func:`calibrate.fit.write_preset`)."""
    from calibrate.fit import write_preset
    files = [f["file"] for f in out["per_file"]]
    fr = dict(out["fitted_range"], device=device)
    note = (f"fitted end to end on {device} from vllm bench serve timings ({len(files)} file(s), "
            f"{model.name} {model.dtype_name})")
    notes = ("Fitted by `rksim calibrate vllm-bench` (calibrate/vllm_bench.py): iteration times recovered from "
             "per-request token times, composition from rksim's scheduler; per_kernel_s carries the whole "
             "per-iteration overhead (kernels, layers and forward calls are not separable end to end).")
    return write_preset(Path(path), out["fit_result"], fr, device,
                        {"model": model.name, "dtype": model.dtype_name, "files": files}, notes,
                        clock="wall", calibration_note=note)
