"""``rksim bench serve|throughput`` (plain serving workloads with ``vllm bench``'s flags) and ``rksim validate``.

The workload flags, their defaults and the result files follow ``vllm bench serve`` and
``vllm bench throughput`` (:mod:`sim.bench.plain` cites the sources); the rest (target, scheduler,
capacity, policy) are rksim's. Nothing here imports torch.
"""
from __future__ import annotations

import math
from pathlib import Path

from .params import number, parse_sets
from .progress import PROGRESS_HELP

# sharing / token policies that apply to one plain request; the others are the reasoning workload's
_NO_POLICY = ("none", "full")


def _rate(text, flag):
    if str(text).strip().lower() == "inf":
        return math.inf
    return number(text, flag, lo=0, lo_open=True)


def _burst(text, flag):
    if str(text).strip().lower() == "inf":
        return math.inf
    return number(text, flag, lo=0, lo_open=True)


def _int(lo, hi=None):
    return lambda text, flag: number(text, flag, lo=lo, hi=hi, integer=True)


def _ratio(text, flag):
    return number(text, flag, lo=0, hi=1, hi_open=True)


def _pcts(text, flag):
    out = []
    for part in str(text).split(","):
        out.append(number(part, flag, lo=0, hi=100))
    return out


def _target_flags(p, offline: bool) -> None:
    p.add_argument("--model-preset", required=True, metavar="NAME", help="model preset (rksim presets) or YAML file")
    p.add_argument("--hardware", required=True, metavar="NAME", help="hardware preset or YAML file")
    which = "offline LLM class" if offline else "vllm serve"
    p.add_argument("--max-num-seqs", default=None, metavar="S",
                   help=f"running sequences cap (default: vLLM's {which} default for the device)")
    p.add_argument("--max-num-batched-tokens", default=None, metavar="M", help=f"tokens per iteration (default: vLLM's {which} default for the device)")
    p.add_argument("--scheduler", choices=["vllm-v1", "prefill-first"], default="vllm-v1",
                   help="scheduling rule (sim.serving.scheduler)")
    p.add_argument("--gpu-memory-utilization", default=0.9, metavar="U", help="share of device memory for weights + activations + KV")
    p.add_argument("--kv-capacity-bytes", default=None, metavar="B", help="KV capacity in bytes (default: memory x utilisation - weights - reserve)")
    p.add_argument("--block-size", default=16, metavar="T",
                   help="tokens per KV block")
    from app.cli_sim import add_declared
    from sim.serving.capacity import ServingConfig
    add_declared(p, ServingConfig, only=("memory_rules",))   # the KV sized as that vLLM generation sizes it
    from sim.replay.runconfig import RunConfig
    add_declared(p, RunConfig, only=("allow_extrapolation",))   # the run marks what lay outside the fit
    p.add_argument("--band", action="store_true",
                   help="also run with each public fit of the device, each with and without the cited model runner's "
                        "host time, and (FP8) with CUTLASS's FP8 rate (sim.cost.bands): every figure gains a "
                        "[low, high] band in the output and the JSON (one more run per profile)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vLLM's flag: no CUDA graphs (every kernel launched from the host, no padding to capture "
                        "sizes); default: vLLM's graphs on a GPU")
    import argparse
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's flag: the host work of a step (schedule, prepare inputs, apply the last output) "
                        "overlaps the GPU's step instead of adding to it (sim.overheads.step_seconds); default: on, "
                        "vLLM 0.33's default (vllm/config/vllm.py)")
    p.add_argument("--no-host-time", dest="host_time", action="store_false",
                   help="price the GPU's kernels only: no host time per engine step (the hardware preset's "
                        "host_step; default: priced where the preset has it)")
    if not offline:
        p.add_argument("--no-frontend", dest="frontend", action="store_false",
                       help="price an in-process LLM run: no API server time (HTTP, tokenisation, streaming) on "
                            "TTFT and ITL (default: priced where the preset has a frontend block, as vllm serve)")
    p.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false",
                   help="turn exact-prefix caching off (vLLM's flag; on by default as in vLLM V1)")
    p.add_argument("--policy", default="none", metavar="NAME",
                   help="none, exact-prefix (prefix caching on), no-kv (off), or a token eviction policy "
                        "(rksim policies --kind token) bounding each request's KV")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a parameter of --policy (repeatable), e.g. --set budget=256 (default: none)")
    p.add_argument("--seed", default=0,
                   help="simulator seed: vLLM's --seed (lengths and arrivals)")
    p.add_argument("--step-by-step", action="store_true",
                   help="schedule and price every engine iteration one at a time (the reference path); default: "
                        "quiet decode windows are advanced at once (sim.serving.fastforward), with identical results")
    from app.cli_sim import add_declared
    from sim.replay.target import TargetSpec
    add_declared(p, TargetSpec, only=("node", "tensor_parallel_size", "pipeline_parallel_size", "pipeline_schedule",
                                      "quantization", "kv_cache_dtype", "disable_custom_all_reduce",
                                      "enable_expert_parallel", "moe_routing"))   # bench seeds sampled routing by --seed


def _dataset_flags(p, serve: bool) -> None:
    if serve:
        p.add_argument("--dataset-name", choices=["random", "lengths"], default=None,
                       help="random (vLLM's RandomDataset) or lengths (--dataset-path) (default: random, or "
                            "lengths when --dataset-path is given)")
        p.add_argument("--random-input-len", default=1024,
                       metavar="N", help="mean prompt length")
        p.add_argument("--random-output-len", default=128,
                       metavar="M", help="mean output length")
        p.add_argument("--random-prefix-len", default=0,
                       metavar="P", help="tokens of a prefix shared by every prompt")
        p.add_argument("--input-len", default=None, metavar="N",
                       help="vLLM's general input length: sets --random-input-len (default: unset)")
        p.add_argument("--output-len", default=None, metavar="M",
                       help="vLLM's general output length: sets --random-output-len (default: unset)")
    else:
        p.add_argument("--input-len", default=None, metavar="N",
                       help="prompt length (required without --dataset-path; default: unset)")
        p.add_argument("--output-len", default=None, metavar="M",
                       help="output length (required without --dataset-path; default: unset)")
        p.add_argument("--prefix-len", default=0, metavar="P",
                       help="tokens of a prefix shared by every prompt")
    p.add_argument("--random-range-ratio", default=0.0, metavar="R",
                   help="lengths uniform in [len (1 - R), len (1 + R)], R in [0, 1)")
    p.add_argument("--dataset-path", default=None, metavar="FILE",
                   help="(input, output) lengths: CSV input_len,output_len, JSON pairs or objects, JSON lines, or a "
                        "vllm bench --save-detailed result (default: none)")
    p.add_argument("--num-prompts", default=None, metavar="K",
                   help="requests (default 1000; with --dataset-path: every row)")


# numbers are read as text and checked here (one line naming the flag, no usage dump)
_CHECKS = {
    "--max-num-seqs": _int(1, 1 << 20),
    "--max-num-batched-tokens": _int(1, 1 << 24),
    "--block-size": _int(1, 4096),
    "--seed": _int(0, 2 ** 63 - 1),
    "--random-input-len": _int(0, 1 << 22),
    "--random-output-len": _int(1, 1 << 22),
    "--random-prefix-len": _int(0, 1 << 22),
    "--input-len": _int(0, 1 << 22),
    "--output-len": _int(1, 1 << 22),
    "--prefix-len": _int(0, 1 << 22),
    "--random-range-ratio": _ratio,
    "--num-prompts": _int(1, 10_000_000),
    "--request-rate": _rate,
    "--burstiness": _burst,
    "--max-concurrency": _int(1, 10_000_000),
    "--metric-percentiles": _pcts,
    "--gpu-memory-utilization": lambda t, f: number(t, f, lo=0, hi=1, lo_open=True),
    "--kv-capacity-bytes": lambda t, f: number(t, f, lo=0, hi=1e18),
    "--refine": _int(0, 20),
    "--saturation-tolerance": lambda t, f: number(t, f, lo=0, hi=1, lo_open=True, hi_open=True),
}


def _checked(args):
    """Convert and check every numeric flag (``ValueError`` naming the flag)."""
    for flag, fn in _CHECKS.items():
        dest = flag[2:].replace("-", "_")
        if flag == "--request-rate" and getattr(args, "bench_command", None) == "sweep":
            continue  # a list: sim.search.knee.parse_rates
        v = getattr(args, dest, None)
        if v is not None:
            setattr(args, dest, fn(v, flag))
    return args


def register(sub) -> None:
    b = sub.add_parser("bench", help="plain serving workloads with vllm bench's flags and result files")
    bsub = b.add_subparsers(dest="bench_command", metavar="VERB")
    bsub.required = True

    _register_serve(bsub)
    _register_sweep(bsub)
    _register_throughput(bsub)


def _register_serve(bsub) -> None:
    """``bench serve``: vllm bench serve's flags, online serving of plain requests."""
    p = bsub.add_parser("serve", help="simulated vllm bench serve: online serving of plain requests")
    _target_flags(p, offline=False)
    _dataset_flags(p, serve=True)
    p.add_argument("--request-rate", default=math.inf, metavar="R",
                   help="requests per second; inf sends all at t = 0 (default inf)")
    p.add_argument("--burstiness", default=1.0, metavar="B",
                   help="gamma shape of the inter-arrival times (1 = Poisson)")
    p.add_argument("--max-concurrency", default=None,
                   metavar="C", help="requests outstanding at once (default: unlimited)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly the requested lengths (rksim always does: it has no model to stop early; "
                        "vLLM sets it for the random dataset)")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl", metavar="NAME,NAME",
                   help="metrics to report percentiles of: ttft, tpot, itl, e2el")
    p.add_argument("--metric-percentiles", default="99",
                   metavar="P,P", help="percentiles of the selected metrics")
    from app.cli_sim import add_declared
    from sim.replay.runconfig import RunConfig
    from sim.replay.target import TargetSpec
    add_declared(p, TargetSpec, only=("data_parallel_size",))
    add_declared(p, RunConfig, only=("router", "slo"))
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY_MS",
                   help="vLLM's spelling of the SLOs: KEY:VALUE in milliseconds, KEY one of ttft, tpot, e2el "
                        "(e.g. --goodput ttft:500 tpot:50); the same rule as --slo, which is in seconds (default: none)")
    p.add_argument("--save-result", action="store_true", help="write the result JSON (vLLM's schema)")
    p.add_argument("--save-detailed", action="store_true",
                   help="keep the per-request fields (input_lens, output_lens, ttfts, itls, start_times)")
    p.add_argument("--result-dir", default=None, metavar="DIR", help="folder of the result file (default: .)")
    p.add_argument("--result-filename", default=None, metavar="FILE",
                   help="result file name (default rksim-{rate}qps[-concurrency{C}]-{model}-{hardware}.json)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help=PROGRESS_HELP)
    p.set_defaults(func=_cmd_serve)


def _register_sweep(bsub) -> None:
    """``bench sweep``: bench serve's workload over a list of rates (the latency-rate curve and its knee)."""
    p = bsub.add_parser("sweep", help="one bench serve workload over a list of request rates: the latency-rate "
                                      "curve, its knee under an SLO and the rate where queues grow without bound",
                        description="Serve one `bench serve` workload (same flags, same seed) at each --request-rate; "
                                    "print TTFT / TPOT / E2EL against the offered rate, the knee (the highest rate up "
                                    "to which every rate meets --slo and is not saturated) and the saturation rate "
                                    "(sim.search.knee; docs/sweeps.md).")
    _target_flags(p, offline=False)
    _dataset_flags(p, serve=True)
    p.add_argument("--request-rate", required=True, metavar="R,R",
                   help="offered rates in requests/s: a comma list (1,2,4,8) and/or START:STOP:STEP ranges, STOP "
                        "included (0.5:4:0.5); each rate finite")
    p.add_argument("--burstiness", default=1.0, metavar="B",
                   help="gamma shape of the inter-arrival times (1 = Poisson)")
    p.add_argument("--max-concurrency", default=None,
                   metavar="C", help="requests outstanding at once (default: unlimited)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly the requested lengths (rksim always does)")
    from app.cli_sim import add_declared
    from sim.replay.runconfig import RunConfig
    from sim.replay.target import TargetSpec
    add_declared(p, TargetSpec, only=("data_parallel_size",))
    add_declared(p, RunConfig, only=("router",))
    from sim.search.knee import DEFAULT_SLO, DEFAULT_TOLERANCE
    p.add_argument("--slo", default=DEFAULT_SLO, metavar="KEY=MS,KEY=MS",
                   help="the knee's SLO on each run's aggregate figures, in ms, KEY one of vllm bench serve's "
                        "{mean,median,pNN}_{ttft,tpot,itl,e2el}_ms (not bench serve's per-request --slo in seconds)")
    p.add_argument("--refine", default=0, metavar="N",
                   help="bisection steps between the knee and the first failing rate (each one more run)")
    p.add_argument("--saturation-tolerance", default=DEFAULT_TOLERANCE, metavar="G",
                   help="saturated when the wait to first token grows faster than G seconds per second over the "
                        "second half of the sends (rho > 1 + G; sim.search.knee)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write DIR/latency-rate.json (the curve) and DIR/latency-rate.html (the figure) atomically "
                        "(default: none)")
    from app.dask_flags import backend_flags
    backend_flags(p, "the rates' runs in this process (the --refine steps always run here, each after the last)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    p.set_defaults(func=_cmd_sweep, slo_key=None)


def _register_throughput(bsub) -> None:
    """``bench throughput``: vllm bench throughput's flags, offline."""
    p = bsub.add_parser("throughput", help="simulated vllm bench throughput: offline, every request at t = 0")
    _target_flags(p, offline=True)
    _dataset_flags(p, serve=False)
    p.add_argument("--output-json", default=None, metavar="FILE", help="write vLLM's throughput JSON (default: none)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help=PROGRESS_HELP)
    p.set_defaults(func=_cmd_throughput)


def _policy(args):
    """``(prefix_caching, token policy object or None)`` from --policy / --set / --no-enable-prefix-caching."""
    from policies.registry import POLICY_NAMES, get_policy
    name = args.policy
    params = parse_sets(args.set, "--set") if args.set else {}
    caching = bool(args.prefix_caching)
    if name in _NO_POLICY:
        if params:
            raise ValueError(f"--set: policy {name!r} takes no parameters")
        return caching, None
    if name == "exact-prefix":
        return True, None
    if name == "no-kv":
        return False, None
    if name not in POLICY_NAMES:
        raise ValueError(f"--policy: {name!r} is not a policy (rksim policies)")
    pol = get_policy(name, **params)
    if pol.kind != "token":
        raise ValueError(f"--policy: {name!r} is a {pol.kind} policy of the multi-branch reasoning workload; a plain "
                         "request has one branch (use none, exact-prefix, no-kv or a token policy)")
    return caching, pol


def _target(args):
    from sim.serving.capacity import ServingConfig
    from sim.cost.profiles import load_hardware, load_model
    from sim.base.errors import PresetError
    try:
        model = load_model(args.model_preset)
    except (PresetError, FileNotFoundError) as exc:
        raise ValueError(f"--model-preset: {exc}") from None
    try:
        hw = load_hardware(args.hardware)
    except (PresetError, FileNotFoundError) as exc:
        raise ValueError(f"--hardware: {exc}") from None
    try:
        model = model.with_precision(args.quantization, args.kv_cache_dtype)
    except PresetError as exc:
        raise ValueError(str(exc)) from None
    caching, pol = _policy(args)
    sv = ServingConfig(scheduler=args.scheduler, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       gpu_memory_utilization=args.gpu_memory_utilization, kv_capacity_bytes=args.kv_capacity_bytes,
                       prefix_caching=caching, enforce_eager=bool(args.enforce_eager),
                       memory_rules=args.vllm_memory_rules)
    return model, hw, sv, pol


def _slo(args):
    """The SLO of ``--slo ttft=S,...`` (seconds) or vLLM's ``--goodput ttft:MS ...`` (milliseconds; ``e2el``)."""
    from sim.serving.goodput import SLO
    if args.goodput is not None and args.slo is not None:
        raise ValueError("--goodput: give the SLOs once, as --slo (seconds) or --goodput (milliseconds)")
    if args.goodput is None:
        return SLO.parse(args.slo)
    parts = []
    for item in args.goodput:
        key, sep, val = str(item).partition(":")
        key = {"e2el": "e2e"}.get(key.strip(), key.strip() if key.strip() in ("ttft", "tpot") else None)
        if not sep or key is None:
            raise ValueError(f"--goodput: {item!r} is not KEY:MILLISECONDS with KEY one of ttft, tpot, e2el")
        ms = number(val, f"--goodput {item.partition(':')[0].strip()}", lo=0, lo_open=True)
        parts.append(f"{key}={ms / 1000.0!r}")
    return SLO.parse(",".join(parts).replace("--slo", "--goodput"))


def _layout(args) -> dict:
    """The replica layout flags (declared on ``sim.replay.target.TargetSpec``), the host / front-end switches and
    ``--allow-extrapolation`` as ``sim.bench.plain.run`` keywords."""
    return {"tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
            "node": args.node, "pipeline_schedule": args.pipeline_schedule,
            "disable_custom_all_reduce": args.disable_custom_all_reduce,
            "enable_expert_parallel": args.enable_expert_parallel, "moe_routing": args.moe_routing,
            "async_scheduling": args.async_scheduling, "host_time": args.host_time,
            "frontend": getattr(args, "frontend", None), "allow_extrapolation": args.allow_extrapolation}


def write_json(path: Path, obj) -> None:
    import json

    from traces.store import atomic_write_text
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj))


def _workload(args):
    """``(PlainWorkload, dataset name)`` of bench serve's dataset flags."""
    from sim.bench import plain
    name = args.dataset_name or ("lengths" if args.dataset_path else "random")
    if name == "random":
        if args.dataset_path is not None:
            raise ValueError("--dataset-path: cannot be used with --dataset-name random (use --dataset-name lengths)")
        il = args.input_len if args.input_len is not None else args.random_input_len
        ol = args.output_len if args.output_len is not None else args.random_output_len
        wl = plain.random_workload(args.num_prompts or 1000, il, ol, args.random_range_ratio, args.random_prefix_len,
                                   args.seed)
    else:
        if args.dataset_path is None:
            raise ValueError("--dataset-path: required with --dataset-name lengths")
        wl = plain.file_workload(args.dataset_path, args.num_prompts)
    return wl, name


def _progress(args, n: int):
    """A bar of the requests answered so far (:func:`app.progress.bar`): its ``update``, called once per answered
    request (``plain.run(progress=...)``), or None."""
    from app.progress import bar
    return bar(getattr(args, "progress", True), n, "requests answered", "req")


def _serve_once(args, target, wl, name, rate, percentiles, metrics, slo, progress=None):
    """One simulated ``vllm bench serve`` at ``rate``: ``(PlainRun, result dict)`` (bench serve and sweep);
    ``progress``: :func:`_progress`'s."""
    from sim.bench import plain
    model, hw, sv, pol = target
    r = plain.run(model, hw, wl, request_rate=rate, burstiness=args.burstiness,
                  max_concurrency=args.max_concurrency, seed=args.seed, serving=sv, token_policy=pol,
                  block_size=args.block_size, data_parallel_size=args.data_parallel_size, router=args.router,
                  step_by_step=getattr(args, "step_by_step", False),
                  keep_gaps=getattr(args, "save_detailed", False), progress=progress, **_layout(args))
    res = plain.serve_result(r, percentiles=percentiles, metrics=metrics, request_rate=rate,
                             burstiness=args.burstiness, max_concurrency=args.max_concurrency,
                             model_id=model.name, num_prompts=wl.n, detailed=getattr(args, "save_detailed", False),
                             extra={"dataset_name": name, "ignore_eos": True}, slo=slo)
    return r, res


def _band(res: dict, hw, run) -> dict:
    """The band of every number in ``res``: ``run(profile)`` (the same run on each public fit of ``hw``,
    :func:`sim.cost.bands.band_profiles`) and ``res`` itself, ``[min, max]`` per key; printed, and
    returned for the JSON (``fits``: what each run was priced with)."""
    from sim.cost.bands import band_of, band_options, band_profiles
    fits = band_profiles(hw, **band_options(res.get("rksim")))
    if not fits:
        print(f"band: none ({hw.name} has one fit: no public fit of another source to price it with)")
        return {"fits": [], "metrics": {}}
    runs = [res] + [run(p) for _, p in fits]
    keys = [k for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and (k.endswith("_ms") or "throughput" in k or "per_second" in k)]
    metrics = {k: band_of([r.get(k) for r in runs]) for k in keys}
    print(f"band over {len(runs)} fits of {hw.name} (central; {'; '.join(l for l, _ in fits)}):")
    for k, b in metrics.items():
        if b is not None:
            print(f"  {k:<32} [{b[0]:.4g}, {b[1]:.4g}]")
    return {"fits": ["central"] + [l for l, _ in fits], "metrics": metrics}


def _cmd_serve(args) -> int:
    from app.bench_text import format_serve
    from sim.bench import plain
    _checked(args)
    target = _target(args)
    model, hw = target[0], target[1]
    wl, name = _workload(args)
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    for m in metrics:
        if m not in ("ttft", "tpot", "itl", "e2el"):
            raise ValueError(f"--percentile-metrics: {m!r} is not one of ttft, tpot, itl, e2el")
    slo = _slo(args)
    with _progress(args, wl.n) as bar:
        _, res = _serve_once(args, target, wl, name, args.request_rate, args.metric_percentiles, metrics, slo, bar)
    print(format_serve(res, metrics, args.metric_percentiles))
    if args.band:
        res["band"] = _band(res, hw, lambda p: _serve_once(args, (model, p, *target[2:]), wl, name, args.request_rate,
                                                           args.metric_percentiles, metrics, slo)[1])
    if args.save_result:
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
        rate = args.request_rate if args.request_rate < math.inf else "inf"
        fname = args.result_filename or f"rksim-{rate}qps{conc}-{model.name}-{hw.name}.json"
        path = Path(args.result_dir or ".") / fname
        write_json(path, res)
        print(f"wrote {path}")
    return 0


def _cmd_throughput(args) -> int:
    from app.bench_text import format_throughput
    from sim.bench import plain
    _checked(args)
    model, hw, sv, pol = _target(args)
    if args.dataset_path is not None:
        wl = plain.file_workload(args.dataset_path, args.num_prompts)
    else:
        if args.input_len is None or args.output_len is None:
            raise ValueError("--input-len: --input-len and --output-len are required without --dataset-path")
        wl = plain.random_workload(args.num_prompts or 1000, args.input_len, args.output_len,
                                   args.random_range_ratio, args.prefix_len, args.seed)
    with _progress(args, wl.n) as bar:
        r = plain.run(model, hw, wl, seed=args.seed, serving=sv, offline=True, token_policy=pol,
                      block_size=args.block_size, step_by_step=args.step_by_step, progress=bar, **_layout(args))
    res = plain.throughput_result(r)
    print(format_throughput(res))
    if args.band:
        res["band"] = _band(res, hw, lambda p: plain.throughput_result(plain.run(
            model, p, wl, seed=args.seed, serving=sv, offline=True, token_policy=pol, block_size=args.block_size,
            **_layout(args))))
    if args.output_json:
        write_json(Path(args.output_json), res)
        print(f"wrote {args.output_json}")
    return 0


SWEEP_FILES = ("latency-rate.json", "latency-rate.html")


def check_out_dir(path, flag: str = "--out") -> Path:
    """A folder the files can be written to, checked before any work: not a file, and its nearest existing
    ancestor a writable folder; ``ValueError`` naming ``flag``."""
    import os
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise ValueError(f"{flag}: {d} is a file, not a folder")
    for name in SWEEP_FILES:
        if (d / name).is_dir():
            raise ValueError(f"{flag}: {d / name} is a folder; the curve is written there")
    up = d
    while not up.exists():
        up = up.parent
    if not up.is_dir() or not os.access(up, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: {up} is not a writable folder")
    return d


def sweep_table(curve: dict):
    """The printed table: one row per evaluated rate (pandas)."""
    import pandas as pd
    cols = {"rate": "rate", "request_throughput": "req/s", "output_throughput": "out tok/s",
            "median_ttft_ms": "TTFT p50", "p99_ttft_ms": "TTFT p99", "mean_tpot_ms": "TPOT mean",
            "median_tpot_ms": "TPOT p50", "p99_tpot_ms": "TPOT p99", "median_e2el_ms": "E2E p50",
            "p99_e2el_ms": "E2E p99", "growth_s_per_s": "wait growth", "preemptions": "preempt"}
    rows = []
    for p in curve["points"]:
        row = {v: p.get(k) for k, v in cols.items()}
        row["stable"] = {True: "no", False: "yes", None: "?"}[p.get("saturated")]
        row["SLO"] = "ok" if p["meets_slo"] else "fail"
        row["rate"] = f"{p['rate']:.4g}" + (" (bisect)" if p["refined"] else "")
        rows.append(row)
    return pd.DataFrame(rows)


def _rate_point(args, target, wl, name, rate, pcts) -> dict:
    """One rate of ``bench sweep``: its serve keys, its queue growth (:func:`sim.search.knee.queue_growth`) and
    the run's provenance info, as plain data (what a Dask worker returns)."""
    from sim.search import knee
    r, res = _serve_once(args, target, wl, name, rate, pcts, ("ttft", "tpot", "itl", "e2el"), None)
    keep = ("request_throughput", "output_throughput", "total_token_throughput", "duration")
    m = {k: v for k, v in res.items() if k.endswith("_ms") or k in keep}
    m["preemptions"] = res["rksim"]["preemptions"]
    m["max_running_seqs"] = res["rksim"]["max_running_seqs"]
    wait = (r.start - r.scheduled) + r.ttft
    return {"metrics": m, "growth": knee.queue_growth(r.scheduled, wait, args.saturation_tolerance),
            "info": res["rksim"]}


def _rate_chunk(_evaluate, _trace, _label, items, options) -> list:
    """The Dask task of ``bench sweep --backend dask`` (:func:`sim.search.dist.run_dask`'s shape): rebuild the
    target and workload from the parsed flags (plain data) and run each rate of ``items``."""
    import argparse

    from sim.search.sweep import single_thread_blas
    from sim.search import knee
    args = argparse.Namespace(**options)
    slo = knee.KneeSLO.parse(args.slo, "--slo")
    pcts = sorted({50.0, 99.0, *slo.percentiles})
    target = _target(args)
    wl, name = _workload(args)
    with single_thread_blas():
        return [(cid, _rate_point(args, target, wl, name, float(p["rate"]), pcts)) for cid, p in items]


def _cmd_sweep(args) -> int:
    import json

    from tqdm.auto import tqdm

    from sim.search import knee
    from sim.bench import plain
    from traces.store import atomic_write_json, atomic_write_text
    _checked(args)
    rates = knee.parse_rates(args.request_rate, "--request-rate")
    slo = knee.KneeSLO.parse(args.slo, "--slo")
    out = check_out_dir(args.out) if args.out is not None else None
    target = _target(args)
    wl, name = _workload(args)
    pcts = sorted({50.0, 99.0, *slo.percentiles})
    metrics = ("ttft", "tpot", "itl", "e2el")
    infos = []

    def evaluate(rate):
        out = _rate_point(args, target, wl, name, rate, pcts)
        infos.append(out["info"])
        return out["metrics"], out["growth"]

    from app.dask_flags import check_backend
    check_backend(args)
    many = None
    if args.backend == "dask":
        def many(rs):
            from sim.search import dist
            opts = {k: v for k, v in vars(args).items() if not callable(v)}
            items = [(f"rate-{r!r}", {"rate": r}) for r in rs]
            res = dist.run_dask(_rate_chunk, None, None, "bench sweep", items, opts, workers=args.workers,
                                scheduler=args.dask_scheduler, progress=args.progress)
            infos.extend(res[cid]["info"] for cid, _ in items)
            return [(res[cid]["metrics"], res[cid]["growth"]) for cid, _ in items]
    curve = knee.sweep(evaluate, rates, slo, refine=args.refine, evaluate_many=many,
                       progress=lambda it, **kw: tqdm(it, disable=not args.progress, leave=False, **kw))
    info = {k: v for k, v in infos[0].items() if k not in ("preemptions", "max_running_seqs", "iterations",
                                                           "prefix_hit_tokens", "per_replica")}
    prov = plain.provenance(info, run_stats=False)
    cap = knee.caption({"provenance": prov}, curve)
    doc = {"command": "bench sweep", "model": info["model"], "hardware": info["hardware"],
           "workload": {"dataset_name": name, "num_prompts": wl.n, "input_lens_mean": float(wl.input_lens.mean()),
                        "output_lens_mean": float(wl.output_lens.mean()), "prefix_len": wl.prefix_len,
                        "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, "seed": args.seed},
           "saturation_tolerance": args.saturation_tolerance, "rates": rates, "info": info, "provenance": prov,
           "caption": cap, "curve": curve}
    pd_table = sweep_table(curve)
    import pandas as pd
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(pd_table.to_string(index=False))
    print(cap)
    if out is not None:
        from app.knee_plot import curve_figure
        import plotly.io as pio
        atomic_write_json(out / SWEEP_FILES[0], json.loads(json.dumps(doc)))
        fig = curve_figure(curve, cap, unit="req/s")
        atomic_write_text(out / SWEEP_FILES[1], pio.to_html(fig, full_html=True, include_plotlyjs="inline"))
        print(f"wrote {out / SWEEP_FILES[0]}, {out / SWEEP_FILES[1]}")
    return 0
