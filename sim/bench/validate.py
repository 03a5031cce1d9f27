"""``rksim validate FILE.yaml``: rksim's prediction beside each published serving figure, with the ratio.

A figure file (``docs/validation/published-figures.yaml`` is the shipped one) holds::

    figures:
      - id: lambda-h100-llama3-8b-median-tpot
        model: llama-3-8b                 # model preset
        hardware: h100-sxm                # hardware preset
        dtype: bfloat16                   # the activations / unquantized weights (int4, ... refused by name)
        quantization: fp8                 # optional: the checkpoint's weight quantization (vLLM --quantization;
                                          #   none/absent: dtype's weights); fp8 is listed as "fp8 not priced"
        kv_cache_dtype: fp8               # optional: vLLM --kv-cache-dtype (auto/absent: dtype); fp8 likewise
        parallelism: {tp: 1, pp: 1, dp: 1}   # tp, pp priced (sim.cost.parallel); dp > 1 refused by name
        serving: {scheduler: prefill-first, max_num_seqs: 1024, max_num_batched_tokens: 2048,
                  gpu_memory_utilization: 0.95, prefix_caching: false,   # optional: the run's server;
                  async_scheduling: false,        # what the run's engine did (absent: vLLM 0.33's default, on)
                  frontend: false,                # false: an in-process LLM run (absent: through vllm serve)
                  host_time: false,               # false: another engine's runtime (the preset's host_step is vLLM's)
                  memory_rules: v0.11}            # the run's vLLM generation's KV sizing (a key of
                                                  #   sim.serving.capacity.VLLM_RULES; absent: the default, v1)
        workload:                         # vllm bench serve's workload
          input_len: 1024                 #   random dataset: input_len, output_len, num_prompts,
          output_len: 128                 #   range_ratio, prefix_len, seed
          num_prompts: 1000               #   or input_lens / output_lens per request
          request_rate: inf               #   rate (inf: all at t = 0; a number: Poisson arrivals drawn with
                                          #   seed, as vllm bench serve --seed; burstiness 1 = Poisson),
                                          #   max_concurrency; or arrival_times_ns: the run's own send times
                                          #   (sim.bench.plain.arrival_times is serve.py @009e6d4a's draw, which
                                          #   rescales the last send to K / R; older benchmark_serving.py
                                          #   did not: give such a run's own times)
        metric: median_tpot_ms            # a key of vllm bench serve's result
        value: 7.56
        source: {url: ..., where: ...}    # the exact place the figure was read
        note: ...

Figures check the fits: no coefficient is chosen by looking at them (``tests/test_fit_isolation.py``
fails if fit code reads this file). A figure rksim cannot price (an unpriced dtype or quantization,
dp > 1, a target outside a fitted range) is listed with the reason and no ratio. Requests a run
reports with 0 output tokens are simulated with 1 (their prefill).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

# dtypes the presets price (2-byte weights and KV); anything else is refused by name
PRICED_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                 "half": "float16"}
METRIC_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "duration")
# weight quantizations and KV-cache dtypes the cost model prices: none (the checkpoint's dtype) and fp8
# (sim.cost.model_shape.ModelShape.with_precision: 1-byte linear weights at the FP8 rate, 1-byte KV)
from sim.cost.model_shape import KV_CACHE_DTYPES, QUANTIZATIONS  # the one list of what ModelShape.with_precision prices
from sim.serving.capacity import VLLM_RULES  # the vLLM generations a figure's serving.memory_rules may name

PRICED_QUANT = {None, "none", "auto"} | {q for q in QUANTIZATIONS if q}
PRICED_KV = {None, "auto"} | set(PRICED_DTYPES) | {k for k in KV_CACHE_DTYPES if k}
_FIELDS = {"id", "model", "hardware", "dtype", "quantization", "kv_cache_dtype", "parallelism", "serving",
           "workload", "metric", "value", "source", "note", "engine"}
_SERVING = {"scheduler", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "prefix_caching",
            "block_size", "kv_capacity_bytes", "async_scheduling", "frontend", "host_time", "memory_rules"}
# serving keys that are not ServingConfig's: how sim.bench.plain.run prices host and front-end time (sim.cost.overheads)
_OVERHEAD_KEYS = ("async_scheduling", "frontend", "host_time")
_WORKLOAD = {"input_len", "output_len", "num_prompts", "range_ratio", "prefix_len", "seed", "input_lens",
             "output_lens", "request_rate", "burstiness", "max_concurrency", "arrival_times_ns"}


class FigureError(ValueError):
    """A malformed figure file (the message names the file, entry and field)."""


def _metric_ok(m: str) -> bool:
    if m in METRIC_KEYS:
        return True
    parts = m.split("_")
    return (len(parts) == 3 and parts[2] == "ms" and parts[1] in ("ttft", "tpot", "itl", "e2el")
            and (parts[0] in ("mean", "median", "std") or (parts[0][:1] == "p" and parts[0][1:].replace(".", "", 1).isdigit())))


def metric_family(m: str) -> str:
    """``ttft``, ``tpot`` (TPOT and ITL: both per-token decode time), ``e2el`` or ``throughput``."""
    if m in METRIC_KEYS:
        return "duration" if m == "duration" else "throughput"
    fam = m.split("_")[1]
    return "tpot" if fam in ("tpot", "itl") else fam


def summary(df) -> list[dict]:
    """Per metric family: figures, priced figures, median and max of ``|ratio - 1|`` over the priced ones; with
    bands (``validate --band``), how many priced figures have one (``banded``: priced on at least one profile
    beside the central) and how many of those the published value lies inside (``in_band``)."""
    out = []
    for fam in ("ttft", "tpot", "e2el", "throughput", "duration"):
        g = df[df["family"] == fam]
        if not len(g):
            continue
        r = g["ratio"].dropna().astype(float)
        dev = (r - 1).abs()
        row = {"family": fam, "figures": int(len(g)), "priced": int(len(r)),
               "median_abs_dev": float(dev.median()) if len(r) else None,
               "max_abs_dev": float(dev.max()) if len(r) else None}
        if "in_band" in g:
            ib = g.loc[g["ratio"].notna() & (g["band_fits"].fillna(0) > 0), "in_band"]
            row.update(banded=int(len(ib)), in_band=int((ib == True).sum()))   # noqa: E712 - object column
        out.append(row)
    return out


def source_of(url: str) -> str:
    """The publisher a figure's source URL names: ``host/owner/repo`` (the first two path segments), so each
    repository or pipeline is one source (LLMServingSim's artifact and bench examples share one)."""
    from urllib.parse import urlparse
    u = urlparse(str(url))
    return "/".join([u.netloc, *[x for x in u.path.split("/") if x][:2]])


def by_source(df) -> list[dict]:
    """Per source (:func:`source_of`), most figures first: figures, priced figures, the median *speed ratio* and
    the median ``|ratio - 1|`` of the priced ones. The speed ratio is rksim's speed over the measured one: the
    ratio of a throughput, the inverse ratio of a latency or duration, so above 1 means rksim is faster than the
    source measured, whichever metric. A source whose figures all sit on one side is a finding about that source
    or the terms its runs exercise, not a coefficient to move."""
    out = []
    src = df["source"].map(source_of)
    for name in sorted(set(src), key=lambda n: (-int((src == n).sum()), n)):
        g = df.loc[(src == name) & df["ratio"].notna()]
        r = g["ratio"].astype(float)
        speed = r.where(g["family"] == "throughput", 1.0 / r)
        out.append({"source": name, "figures": int((src == name).sum()), "priced": int(len(r)),
                    "median_speed_ratio": float(speed.median()) if len(r) else None,
                    "median_abs_dev": float((r - 1).abs().median()) if len(r) else None})
    return out


def load_figures(path) -> list[dict]:
    """Read and check a figure file; returns its entries."""
    import yaml

    from sim.base.yamlio import safe_load
    p = Path(path)
    if not p.is_file():
        raise FigureError(f"{p}: no such file")
    try:
        data = safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise FigureError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    figs = data.get("figures") if isinstance(data, dict) else None
    if not isinstance(figs, list) or not figs:
        raise FigureError(f"{p}: expected a top-level 'figures:' list")
    seen = set()
    for i, f in enumerate(figs):
        where = f"{p}: figures[{i}]"
        if not isinstance(f, dict):
            raise FigureError(f"{where}: expected a mapping")
        bad = set(f) - _FIELDS
        if bad:
            raise FigureError(f"{where}: unknown field(s) {', '.join(sorted(bad))}")
        for k in ("id", "model", "hardware", "dtype", "workload", "metric", "value", "source"):
            if k not in f:
                raise FigureError(f"{where}: missing field {k!r}")
        where = f"{p}: figure {f['id']!r}"
        if f["id"] in seen:
            raise FigureError(f"{where}: duplicate id")
        seen.add(f["id"])
        if not _metric_ok(str(f["metric"])):
            raise FigureError(f"{where}: metric {f['metric']!r} is not a vllm bench serve result key "
                              f"({', '.join(METRIC_KEYS)}, mean/median/pNN of ttft/tpot/itl/e2el in ms)")
        v = f["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise FigureError(f"{where}: value must be a number > 0, got {v!r}")
        if not isinstance(f["workload"], dict) or set(f["workload"]) - _WORKLOAD:
            raise FigureError(f"{where}: workload: unknown or malformed keys "
                              f"{sorted(set(f['workload']) - _WORKLOAD) if isinstance(f['workload'], dict) else ''}")
        if "serving" in f and (not isinstance(f["serving"], dict) or set(f["serving"]) - _SERVING):
            raise FigureError(f"{where}: serving: unknown keys; valid: {', '.join(sorted(_SERVING))}")
        rules = (f.get("serving") or {}).get("memory_rules")
        if rules is not None and rules not in VLLM_RULES:   # a typo refused with the file, not the figure skipped
            raise FigureError(f"{where}: serving: memory_rules {rules!r} unknown; known: {', '.join(sorted(VLLM_RULES))}")
        _check_arrivals(f["workload"], where)
        for k in ("quantization", "kv_cache_dtype"):
            if k in f and not (f[k] is None or (isinstance(f[k], str) and f[k].strip())):
                raise FigureError(f"{where}: {k} must be a name such as fp8 (or none), got {f[k]!r}")
        src = f["source"]
        if not (isinstance(src, dict) and src.get("url")) and not (isinstance(src, str) and src.strip()):
            raise FigureError(f"{where}: source must name where the figure was read (url)")
    return figs


def _check_arrivals(w: dict, where: str) -> None:
    """``request_rate`` (inf or a number > 0), ``burstiness`` > 0, ``seed`` an integer >= 0, and
    ``arrival_times_ns`` (the run's own send times) non-negative, non-decreasing, one per request."""
    if not isinstance(w, dict):
        return
    r = w.get("request_rate")
    if r is not None and not (str(r).strip().lower() == "inf" or
                              (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and r > 0)):
        raise FigureError(f"{where}: workload: request_rate must be inf or a number > 0, got {r!r}")
    b = w.get("burstiness", 1.0)
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
        raise FigureError(f"{where}: workload: burstiness must be a number > 0 (1 = Poisson), got {b!r}")
    sd = w.get("seed", 0)
    if isinstance(sd, bool) or not isinstance(sd, int) or sd < 0:
        raise FigureError(f"{where}: workload: seed must be an integer >= 0, got {sd!r}")
    if "arrival_times_ns" in w:
        a = w["arrival_times_ns"]
        n = len(w.get("input_lens") or []) if "input_lens" in w else w.get("num_prompts")
        if (not isinstance(a, list) or not a or
                any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in a)
                or any(a[i] > a[i + 1] for i in range(len(a) - 1))):
            raise FigureError(f"{where}: workload: arrival_times_ns must be a non-decreasing list of times >= 0 (ns)")
        if n is not None and len(a) != n:
            raise FigureError(f"{where}: workload: arrival_times_ns has {len(a)} times for {n} requests")


def refusal(f: dict) -> str | None:
    """Why rksim cannot price this figure (None: it can)."""
    kv_names = ", ".join(k for k in KV_CACHE_DTYPES if k)
    for field, priced, why in (
            ("dtype", PRICED_DTYPES, "the cost model prices 2-byte bf16/fp16 weights and KV; pricing {v} as bf16 "
                                     "would be wrong"),
            ("quantization", PRICED_QUANT, "no preset prices {v} weights or their GEMMs; pricing them as {dtype} "
                                           "would be wrong"),
            ("kv_cache_dtype", PRICED_KV, "the cost model prices a KV cache in the model's dtype or " + kv_names)):
        v = f.get(field)
        key = None if v is None else str(v).strip().lower()
        if key not in priced:
            what = "fp8 not priced" if key is not None and key.startswith("fp8") else "not priced"
            return f"{field} {v}: {what} ({why.format(v=v, dtype=f['dtype'])})"
    par = f.get("parallelism") or {}
    if not isinstance(par, dict):
        raise FigureError(f"figure {f['id']!r}: parallelism must be a mapping such as {{tp: 1}}")
    bad = set(par) - {"tp", "pp", "dp", "ep"}
    if bad:
        raise FigureError(f"figure {f['id']!r}: parallelism: unknown keys {sorted(bad)}; valid: dp, ep, pp, tp")
    if "ep" in par and not isinstance(par["ep"], bool):
        raise FigureError(f"figure {f['id']!r}: parallelism: ep must be true or false (vLLM's "
                          f"--enable-expert-parallel), got {par['ep']!r}")
    # tp and pp are priced (sim.cost.parallel); replicas behind a router are not a single benchmark's figure, but
    # vLLM's DP attention + EP is one engine (dp ranks sharing the experts): priced, requests spread as vLLM's
    # DP load balancer spreads them (router vllm-dp)
    if isinstance(par.get("dp"), (int, float)) and par["dp"] > 1 and not _dp_attention(f, par):
        return f"parallelism dp={par['dp']}: a figure is one replica's (replicas: rksim serve --data-parallel-size)"
    return None


def _dp_attention(f: dict, par: dict) -> bool:
    """The figure's layout is vLLM's DP attention + EP (:func:`sim.cost.parallel.is_dp_attention`: ``dp > 1`` with
    ``ep: true`` on a mixture-of-experts model); the model is read only where ``dp`` and ``ep`` ask."""
    from sim.cost.parallel import is_dp_attention
    from sim.cost.profiles import load_model
    dp, ep = int(par.get("dp", 1)), bool(par.get("ep", False))
    return dp > 1 and ep and is_dp_attention(load_model(f["model"]), dp, ep)


def _workload(f: dict):
    from sim.bench import plain
    w = f["workload"]
    if "input_lens" in w or "output_lens" in w:
        inp = np.asarray(w.get("input_lens") or [], np.int64)
        out = np.maximum(np.asarray(w.get("output_lens") or [], np.int64), 1)
        if inp.size == 0 or inp.size != out.size or (inp < 1).any():
            raise FigureError(f"figure {f['id']!r}: workload: input_lens and output_lens must be equal-length "
                              "lists of positive integers")
        return plain.PlainWorkload(inp, out, 0, f"figure {f['id']}")
    try:
        return plain.random_workload(w["num_prompts"], w["input_len"], w["output_len"], w.get("range_ratio", 0.0),
                                     w.get("prefix_len", 0), w.get("seed", 0))
    except KeyError as exc:
        raise FigureError(f"figure {f['id']!r}: workload: missing {exc.args[0]!r} "
                          "(give input_len, output_len, num_prompts or input_lens/output_lens)") from None


def _rate(v) -> float:
    if v is None or str(v).strip().lower() == "inf":
        return math.inf
    return float(v)


def predict(f: dict, hardware: str | None = None, profile=None, host_time: bool = True,
            frontend: bool = True, custom_all_reduce: bool = True, allow_extrapolation: bool = False) -> dict:
    """Simulate one figure's benchmark; returns the vllm bench serve result dictionary. ``profile``: a
    :class:`sim.cost.hardware.HardwareProfile` to price it with instead of the named one (a band's fit).

    The figure's ``serving.async_scheduling`` / ``frontend`` / ``host_time`` say how its run was made;
    ``host_time`` / ``frontend`` False here turn those terms off for every figure (a before/after table).
    ``allow_extrapolation``: price a figure whose run lies outside its profile's fitted range (the result's
    ``rksim.extrapolated`` says which dimension); default: refused.
    """
    from sim.bench import plain
    from sim.serving.capacity import ServingConfig
    from sim.cost.profiles import load_hardware, load_model
    model = load_model(f["model"])
    hw = profile if profile is not None else load_hardware(hardware or f["hardware"])
    q, kv = f.get("quantization"), f.get("kv_cache_dtype")
    kv = None if kv is None or str(kv).lower() in PRICED_DTYPES else kv      # a 16-bit name is the model's own
    model = model.with_precision(None if q in (None, "auto") else q, kv)   # none: 16-bit weights
    sv = dict(f.get("serving") or {})
    bs = int(sv.pop("block_size", plain.BLOCK_SIZE))
    over = {k: sv.pop(k) for k in _OVERHEAD_KEYS if k in sv}
    for k, v in over.items():
        if not isinstance(v, bool):
            raise FigureError(f"figure {f['id']!r}: serving: {k} must be true or false, got {v!r}")
    over["host_time"] = bool(over.get("host_time", True)) and host_time
    if not frontend:
        over["frontend"] = False
    if not custom_all_reduce:   # every tensor-parallel all-reduce by NCCL (the before/after table)
        over["disable_custom_all_reduce"] = True
    serving = ServingConfig(**sv)   # memory_rules: the run's KV sized as its vLLM generation sized it
    wl = _workload(f)
    w = f["workload"]
    rate, burst = _rate(w.get("request_rate")), float(w.get("burstiness", 1.0))
    conc = w.get("max_concurrency")
    par = f.get("parallelism") or {}
    # the run's own send times, when it published them; else vllm bench serve's draw (Poisson at burstiness 1,
    # from numpy's RandomState(seed), as benchmark_serving.py seeds it with --seed)
    arr = None if "arrival_times_ns" not in w else np.asarray(w["arrival_times_ns"], np.float64) * 1e-9
    if arr is not None and arr.size != wl.n:
        raise FigureError(f"figure {f['id']!r}: workload: arrival_times_ns has {arr.size} times for {wl.n} requests")
    r = plain.run(model, hw, wl, request_rate=rate, burstiness=burst, max_concurrency=conc,
                  seed=int(w.get("seed", 0)), serving=serving, block_size=bs, arrivals=arr,
                  tensor_parallel_size=int(par.get("tp", 1)), pipeline_parallel_size=int(par.get("pp", 1)),
                  enable_expert_parallel=bool(par.get("ep", False)), keep_gaps=False,
                  allow_extrapolation=allow_extrapolation,
                  **({"data_parallel_size": int(par["dp"]), "router": "vllm-dp"} if _dp_attention(f, par) else {}),
                  **over)
    pcts = [float(m.split("_")[0][1:]) for m in [f["metric"]] if m.split("_")[0].startswith("p")]
    return plain.serve_result(r, percentiles=pcts or (99.0,), request_rate=rate, burstiness=burst,
                              max_concurrency=conc, model_id=model.name, detailed=False)


def run_figures(figs: list, hardware: str | None = None, band: bool = False, host_time: bool = True,
                frontend: bool = True, custom_all_reduce: bool = True, progress=None,
                allow_extrapolation: bool = False):
    """One row per figure: published value, prediction, ratio (prediction / published), or why refused.

    ``band``: each priced figure is priced again with every public fit of its device
    (:func:`sim.cost.bands.band_profiles`); ``predicted_lo`` / ``predicted_hi`` is ``[min, max]`` over
    those and the central prediction, and ``in_band`` says whether the published value lies inside.
    ``host_time`` / ``frontend`` / ``custom_all_reduce`` / ``allow_extrapolation``: :func:`predict`; a figure
    priced beyond its profile's fitted range has its status marked ``(extrapolated: ...)``. ``progress``: called
    with no argument once per figure, priced or refused (a progress bar's ``update``).
    """
    import pandas as pd
    from sim.bench import plain
    from sim.cost.bands import band_of, band_options, band_profiles
    from sim.base.errors import OutOfCalibrationError
    from sim.cost.profiles import load_hardware
    rows = []
    for f in figs:
        src = f["source"]
        url = src.get("url") if isinstance(src, dict) else str(src)
        par = f.get("parallelism") or {}
        row = {"id": f["id"], "model": f["model"], "hardware": hardware or f["hardware"], "dtype": f["dtype"],
               "quantization": f.get("quantization"), "kv_cache_dtype": f.get("kv_cache_dtype"),
               "tp": int(par.get("tp", 1)) if isinstance(par, dict) else 1,
               "request_rate": str((f["workload"] or {}).get("request_rate", "inf")),
               "metric": f["metric"], "family": metric_family(f["metric"]), "published": float(f["value"]),
               "predicted": None, "ratio": None, "status": "", "source": url}
        why = refusal(f)
        if why is None:
            try:
                res = predict(f, hardware, host_time=host_time, frontend=frontend,
                              custom_all_reduce=custom_all_reduce, allow_extrapolation=allow_extrapolation)
                row["predicted"] = float(res[f["metric"]])
                row["ratio"] = row["predicted"] / row["published"]
                row["status"] = "ok" if abs(row["ratio"] - 1) <= 0.25 else "off by more than 25%"
                if res["rksim"].get("extrapolated"):   # priced beyond the fit (--allow-extrapolation): said so
                    row["status"] += " (" + "; ".join(res["rksim"]["extrapolated"]) + ")"
                row["calibration"] = res["rksim"]["calibration"]
                row["overheads"] = plain.overheads_words(res["rksim"]).lstrip("; ")
                if band:   # the host-time range only where this figure's run prices host time
                    others = [float(predict(f, profile=p, host_time=host_time, frontend=frontend,
                                            custom_all_reduce=custom_all_reduce,
                                            allow_extrapolation=allow_extrapolation)[f["metric"]])
                              for _, p in band_profiles(load_hardware(hardware or f["hardware"]),
                                                        **band_options(res["rksim"]))]
                    lo, hi = band_of([row["predicted"], *others])
                    row.update(predicted_lo=lo, predicted_hi=hi, band_fits=len(others),
                               in_band=bool(lo <= row["published"] <= hi) if others else None)
            except (OutOfCalibrationError, ValueError) as exc:
                why = str(exc)
        if why is not None:
            row["status"] = "refused: " + why
        rows.append(row)
        if progress is not None:
            progress()
    return pd.DataFrame(rows)
