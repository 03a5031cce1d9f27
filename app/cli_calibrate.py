"""``rksim calibrate ...``: run the policies on a real model, fit the hardware profile, report fidelity.

torch is imported only inside the command functions (through ``calibrate``).
"""
from __future__ import annotations

import json
from pathlib import Path


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=float))


def _cmd_run(args) -> int:
    from calibrate.runner import RealRunConfig, run_calibration

    cfg = RealRunConfig.from_args(args)
    summary = run_calibration(cfg, Path(args.out))
    par = summary.get("decision_parity")
    print(f"wrote {args.out}: {summary['n_problems']} problems x {len(summary['policies'])} policies, "
          f"{summary['n_phases']} timed phases, decision parity vs the simulator "
          f"{'n/a' if par is None else f'{par:.1%}'} {summary.get('parity_by_decision', '')}")
    return 0


def _cmd_fit(args) -> int:
    from calibrate.fit import fit_run_dirs

    res = fit_run_dirs([Path(d) for d in args.dir], name=args.name, out=Path(args.out) if args.out else None,
                       holdout=args.holdout, clock=args.clock, roofline=args.roofline, force=args.force)
    print(f"wrote {res['path']}: rms relative error {res['rel_rms']:.3%} on {res['n_phases']} phases "
          f"({res['n_fit_problems']} fit problems)")
    print(f"{res['clock_note']}; roofline {res['roofline']} (rms relative error: "
          + ", ".join(f"{k} {v['rel_rms']:.3%}" for k, v in res["by_roofline"].items()) + ")")
    return 0


def _cmd_report(args) -> int:
    from calibrate.report import fidelity_report

    rep = fidelity_report(Path(args.dir), hardware=args.hardware, clock=args.clock,
                          allow_other_host=args.allow_other_host)
    if args.json:
        _print_json(rep)
    else:
        from calibrate.report import format_report
        print(format_report(rep))
    return 0


def _cmd_quality(args) -> int:
    from calibrate.quality import QualityConfig, run_quality

    res = run_quality(QualityConfig.from_args(args), Path(args.out))
    if args.json:
        _print_json(res)
    else:
        from calibrate.quality import format_quality
        print(format_quality(res))
    return 0


def _cmd_speedup(args) -> int:
    from calibrate.speedup import SpeedupConfig, run_speedup

    res = run_speedup(SpeedupConfig.from_args(args), Path(args.out))
    if args.json:
        _print_json(res)
    else:
        from calibrate.speedup import format_speedup
        print(format_speedup(res))
    return 0


def _cmd_serve(args) -> int:
    from calibrate.serve import ServeConfig, format_serve, run_serve

    if args.rescore:
        from calibrate.serve import rescore
        res = rescore(Path(args.rescore), hardware=args.hardware, clock=args.clock,
                      allow_other_host=args.allow_other_host, allow_extrapolation=args.allow_extrapolation)
        if args.json:
            _print_json(res)
        else:
            print(f"{args.rescore} replayed on {res['hardware']}: parity {res['scheduling_parity']:.1%}, makespan "
                  f"{res['makespan_error']:+.1%}, throughput {res['throughput_error']:+.1%}, e2e median |error| "
                  f"{res['e2e_median_abs_pct_error']:.1f}% ({res['clock']} clock)")
        return 0
    for flag in ("capacity_tokens", "concurrency"):
        if getattr(args, flag) is None:
            raise ValueError(f"--{flag.replace('_', '-')}: required (unless --rescore DIR)")
    cfg = ServeConfig.from_args(args)
    res = run_serve(cfg, Path(args.out), progress=True)
    if getattr(args, "save_result", False):
        from calibrate.vllm_bench import serve_run_result
        from traces.store import atomic_write_text
        path = Path(args.result_dir or args.out) / args.result_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(serve_run_result(Path(args.out), cfg.clock)))
        print(f"wrote {path}")
    import sys
    for line in [res.get("host_note")] + list((res.get("sim") or {}).get("extrapolated") or []):
        if line:
            print(f"rksim: note: {line}", file=sys.stderr)
    if args.json:
        _print_json({k: v for k, v in res.items() if k not in ("config", "model", "versions")})
    else:
        print(format_serve(res))
    return 0


def _cmd_host(args) -> int:
    from calibrate.host import HostConfig, format_host, run_host

    cfg = HostConfig(minutes=args.minutes, name=args.name, model=args.model, threads=args.threads,
                     max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     capacity_tokens=args.capacity_tokens, seed=args.seed)
    res = run_host(cfg, out=Path(args.out) if args.out else None, keep=Path(args.keep) if args.keep else None,
                   force=args.force)
    if args.json:
        _print_json(res)
    else:
        print(format_host(res))
    return 0


def _cmd_profiles(args) -> int:
    from sim.cost.catalog import profiles_table

    df = profiles_table()
    if args.json:
        _print_json(df.to_dict(orient="records"))
    else:
        import pandas as pd
        with pd.option_context("display.width", 220, "display.max_columns", 20, "display.max_colwidth", 60):
            print(df.drop(columns=["note"], errors="ignore").to_string(index=False))
            print(f"user profile directory: {df.attrs.get('user_profile_dir')} (fits go there; names resolve "
                  "there first, then in the package)")
    return 0


def _model_flags(p) -> None:
    p.add_argument("--model", default="smollm2-135m", help="model preset or local Hugging Face directory")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    from app.cli_sim import renamed_argument
    renamed_argument(p, "--sampling-seed", "--seed", dest="seed", type=int, default=0,
                     help="sampling seed of the real model's run")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: two threads oversubscribe a shared 2-core CPU)")


def register(sub) -> None:
    cal = sub.add_parser("calibrate", help="run the policies on a real model; fit and check the cost model")
    csub = cal.add_subparsers(dest="calibrate_command", metavar="VERB")
    csub.required = True

    _register_model_runs(csub)
    _register_serve(csub)
    _register_profile_fits(csub)

    p = sub.add_parser("profiles", help="hardware profiles: status, host, date, where they come from")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_profiles)


def _register_model_runs(csub) -> None:
    """The verbs that run the policies on a real model and fit or check on its phases: run, fit, report,
    quality, speedup."""
    p = csub.add_parser("run", help="execute every policy end to end on a real model, timing each phase")
    _model_flags(p)
    p.add_argument("--problems", type=int, default=4, help="problems to run (default 4; half are held out)")
    p.add_argument("--branches", type=int, default=4, help="branches per problem")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens generated per branch")
    p.add_argument("--dataset", default="gsm8k", help="gsm8k | mmlu | arc:PATH")
    p.add_argument("--layout", default="persona-prefix", help="hint-suffix | persona-prefix | paraphrase")
    p.add_argument("--policies", default=None, help="comma list (default: all end-to-end policies)")
    p.add_argument("--repeats", type=int, default=2, help="passes over every (problem, policy) and the op sweep; each one's fastest is kept (default 2)")
    p.add_argument("--no-capture", action="store_true", help="skip the parity trace (DIR/trace)")
    p.add_argument("--no-sweep", action="store_true", help="skip the op sweep (prefill lengths, decode batches)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--tokenizer", default=None,
                   help="run only: --model random:<model preset> builds random weights in that shape; its "
                        "tokenizer folder (default: SmolLM2's)")
    p.add_argument("--sweep-prefill", default=None, help="comma list of prefill lengths of the op sweep (default 16,64,256,1024,2048)")
    p.add_argument("--sweep-decode-batch", default=None, help="comma list of decode batch sizes of the op sweep (default 1,2,4,8,16,32)")
    p.add_argument("--sweep-decode-ctx", default=None, help="comma list of decode contexts of the op sweep (default 64,512)")
    p.set_defaults(func=_cmd_run)

    p = csub.add_parser("fit", help="fit the hardware coefficients on a run's measured phases")
    p.add_argument("dir", nargs="+", help="directories written by 'calibrate run' (one device; several models)")
    p.add_argument("--name", default="local-cpu", help="preset name (default local-cpu)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="profile file (default: <user profile directory>/hardware/<name>.yaml, see `rksim profiles`)")
    p.add_argument("--force", action="store_true", help="allow --out to replace a shipped preset of the package")
    p.add_argument("--holdout", type=float, default=0.5, help="share of problems held out of the fit (default 0.5)")
    p.add_argument("--clock", default="auto", choices=["auto", "cpu", "wall"],
                   help="measured seconds to fit: auto = thread CPU time on CPU, wall time on CUDA")
    p.add_argument("--roofline", default="auto", choices=["auto", "iteration", "operator"],
                   help="auto: fit both the whole-iteration and the per-operator roofline, keep the better")
    p.set_defaults(func=_cmd_fit)

    p = csub.add_parser("report", help="simulated vs measured latency and speedups on held-out problems")
    p.add_argument("dir", help="a directory written by 'calibrate run' and fitted by 'calibrate fit'")
    p.add_argument("--hardware", default=None, help="preset name or file (default: the one 'fit' wrote)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--clock", default="auto", choices=["auto", "cpu", "wall"],
                   help="measured seconds to compare with: auto = thread CPU time on CPU, wall time on CUDA")
    p.add_argument("--allow-other-host", action="store_true",
                   help="compare with a profile fitted on another host (default: refused, naming the difference)")
    p.set_defaults(func=_cmd_report)

    p = csub.add_parser("quality", help="quality of token eviction: KL, agreement, repetition, accuracy")
    _model_flags(p)
    p.add_argument("--problems", type=int, default=2, help="problems to run")
    p.add_argument("--long-decode", type=int, default=128, help="tokens generated per sequence")
    p.add_argument("--policies", default=None,
                   help="comma list of token-eviction policies, each NAME or NAME:key=value[:key=value] (an "
                        "ablation, e.g. vase-attnv:value_frac=0) (default: all at their defaults)")
    p.add_argument("--compression", default="2,4,8", help="comma list of compression ratios")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_quality)

    p = csub.add_parser("speedup", help="measured speedups on the RKSC paper's workload shape")
    _model_flags(p)
    p.add_argument("--problems", type=int, default=1, help="problems to run")
    p.add_argument("--branches", type=int, default=8, help="branches per problem")
    p.add_argument("--prefix-tokens", type=int, default=1024, help="each branch prompt padded to about this many tokens")
    p.add_argument("--step-tokens", type=int, default=32, help="tokens generated per tree node")
    p.add_argument("--depth", type=int, default=3, help="tree search depth (calibrate.real_tree)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_speedup)


def _register_serve(csub) -> None:
    """``calibrate serve``: a real continuous-batching run, replayed by the simulator."""
    # conflict_handler="resolve": if the shared model flags gain a --clock too, this parser's own wins
    p = csub.add_parser("serve", help="a real continuous-batching run under a binding KV capacity, replayed by the simulator",
                        conflict_handler="resolve")
    _model_flags(p)
    # numbers are read as text and checked by calibrate.serve.ServeConfig (one line naming the flag)
    p.add_argument("--problems", default="3", metavar="N", help="problems to serve (default 3)")
    p.add_argument("--capacity-tokens", default=None, metavar="C", help="KV capacity in tokens (whole blocks); required (default: none)")
    p.add_argument("--concurrency", default=None, metavar="K", help="closed-loop users; required (default: none)")
    p.add_argument("--branches", default="2", metavar="B", help="requests (branches) per problem (default 2)")
    p.add_argument("--max-new-tokens", default="32", metavar="T", help="tokens generated per request at most (default 32)")
    p.add_argument("--block-size", default="16", metavar="T", help="tokens per KV block (default 16, vLLM's)")
    p.add_argument("--max-num-seqs", default="256", metavar="S", help="running sequences at most (default 256)")
    p.add_argument("--max-num-batched-tokens", default="2048", metavar="M", help="tokens per iteration (default 2048)")
    p.add_argument("--scheduler", default="vllm-v1", help="vllm-v1 (vLLM 0.33: chunked prefill, decodes first, admission needs room for the whole prompt), "
                   "vllm-v1-chunk-admit (admission needs room for the first chunk) or prefill-first")
    p.add_argument("--block-policy", default="lru", help="eviction order of cached blocks: lru, fifo, rsbcm")
    p.add_argument("--no-prefix-caching", action="store_true", help="no block is ever reused")
    p.add_argument("--hardware", default=None, help="hardware profile the replay prices iterations with (default local-cpu)")
    p.add_argument("--clock", default=None,
                   help="measured clock the errors use: cpu (thread CPU time; default with --threads 1 on cpu) or wall")
    p.add_argument("--dataset", default="gsm8k", help="benchmark of the served problems")
    p.add_argument("--layout", default="hint-suffix", help="prompt layout (hint-suffix shares most of the prompt, so the prefix cache has work)")
    p.add_argument("--out", default="runs/calibrate-serve", help="run folder, written atomically (default runs/calibrate-serve)")
    p.add_argument("--rescore", default=None, metavar="DIR",
                   help="replay a saved serve run again (e.g. with another --hardware) without the model (default: run the model)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--save-result", action="store_true",
                   help="also write the run as a vllm bench serve --save-detailed result (calibrate vllm-bench reads it, "
                        "with --no-async-scheduling: this loop schedules each step after the last)")
    p.add_argument("--result-dir", default=None, metavar="DIR", help="folder of that file (default: the run folder)")
    p.add_argument("--result-filename", default="vllm-bench.json", metavar="FILE", help="its name")
    p.add_argument("--allow-other-host", action="store_true",
                   help="replay with a profile fitted on another host (default: refused, naming the difference)")
    p.add_argument("--allow-extrapolation", action="store_true",
                   help="price iterations outside the profile's fitted range, marked (default: refused)")
    p.set_defaults(func=_cmd_serve)


def _register_profile_fits(csub) -> None:
    """The verbs that fit a hardware profile without a policy run: vllm-bench, public-profiles, host."""
    p = csub.add_parser("vllm-bench", help="fit a hardware profile on vllm bench serve --save-detailed result files")
    p.add_argument("files", nargs="+", metavar="FILE", help="result files (vllm bench serve --save-result --save-detailed)")
    p.add_argument("--model-preset", required=True, metavar="NAME", help="model preset the runs served")
    p.add_argument("--hardware", required=True, metavar="NAME", help="hardware preset to start from (its datasheet peaks)")
    p.add_argument("--out", default=None, metavar="FILE", help="write the fitted preset here (default: print only)")
    p.add_argument("--device", default=None, metavar="NAME", help="device name recorded in the preset (default: --hardware)")
    p.add_argument("--holdout", default="-1", metavar="I",
                   help="index of the file held out of the fit and predicted (default -1, the last; 'none': fit on all)")
    p.add_argument("--max-num-seqs", default=None, metavar="S", help="the server's max_num_seqs (default: vLLM's for the device)")
    p.add_argument("--max-num-batched-tokens", default=None, metavar="M",
                   help="the server's max_num_batched_tokens (default: vLLM's for the device)")
    p.add_argument("--block-size", default="16", metavar="T", help="the server's --block-size (default 16)")
    p.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false",
                   help="the server ran without prefix caching")
    p.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false",
                   help="the server ran without --async-scheduling: a sent request joins the next step, not the one "
                        "after (default: on, vLLM's default)")
    p.add_argument("--kv-capacity-bytes", default=None, metavar="B",
                   help="the server's KV capacity in bytes (default: the device's, docs/simulator.md)")
    p.add_argument("--dtype", default=None, metavar="NAME",
                   help="dtype the runs served if not the preset's: bfloat16, float16, float32 (default: the preset's)")
    p.add_argument("--cluster-tol-ms", default="0.1", metavar="MS",
                   help="token times closer than this are one iteration's (default 0.1)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_vllm_bench)

    p = csub.add_parser("public-profiles", help="fit the GPU presets (h100-sxm, a100-80gb) on the shipped public "
                        "per-operator profiles and cross-validate them across models")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the fitted presets and calibrate/data/public-profiles-fit.json")
    g.add_argument("--check", action="store_true", help="exit 1 if a shipped preset or the JSON differs from the fit")
    p.set_defaults(func=_cmd_public_profiles)

    p = csub.add_parser("host", help="fit the machine this runs on over the shapes serving uses (minutes of CPU)")
    p.add_argument("--minutes", type=float, default=3.0, help="CPU-time budget, fit included (default 3)")
    p.add_argument("--name", default=None, help="profile name (default host-<hostname>)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="profile file (default: <user profile directory>/hardware/<name>.yaml)")
    p.add_argument("--force", action="store_true", help="allow --out to replace a shipped preset of the package")
    p.add_argument("--keep", default=None, metavar="DIR", help="also keep the measured phases (phases.parquet, run.json) in DIR (default: not kept)")
    p.add_argument("--model", default="smollm2-135m", help="model preset (default smollm2-135m)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the token ids and sampling (default 0)")
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="largest decode batch measured (default 64: 8 users x 8 branches on a CPU host)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="largest prefill chunk (default 2048)")
    p.add_argument("--capacity-tokens", type=int, default=16384,
                   help="KV capacity that binds: b sequences hold at most this / b tokens each (default 16384)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_host)

def _cmd_vllm_bench(args) -> int:
    from app.params import number
    from calibrate.vllm_bench import fit_files, format_fit, write_fitted_preset
    from sim.cost.profiles import load_hardware, load_model

    model, hw = load_model(args.model_preset), load_hardware(args.hardware)
    if args.dtype is not None:
        import dataclasses

        from sim.cost.model_shape import CANON_DTYPE, DTYPE_BYTES
        name = CANON_DTYPE.get(args.dtype, args.dtype)
        if name not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"--dtype: {args.dtype!r} is not one of bfloat16, float16, float32 (others are not priced)")
        model = dataclasses.replace(model, dtype=name, dtype_bytes=DTYPE_BYTES[name])
    kvb = number(args.kv_capacity_bytes, "--kv-capacity-bytes", lo=0, hi=1e18, allow_none=True)
    ho = None if str(args.holdout).strip().lower() == "none" else number(args.holdout, "--holdout", integer=True)
    mns = number(args.max_num_seqs, "--max-num-seqs", lo=1, integer=True, allow_none=True)
    mnbt = number(args.max_num_batched_tokens, "--max-num-batched-tokens", lo=1, integer=True, allow_none=True)
    bs = number(args.block_size, "--block-size", lo=1, hi=4096, integer=True)
    tol = number(args.cluster_tol_ms, "--cluster-tol-ms", lo=0) / 1000.0
    out = fit_files(args.files, model, hw, max_num_seqs=mns, max_num_batched_tokens=mnbt, block_size=bs,
                    prefix_caching=args.prefix_caching, holdout=ho, cluster_tol_s=tol, kv_capacity_bytes=kvb,
                    async_scheduling=args.async_scheduling)
    if args.json:
        _print_json({k: v for k, v in out.items() if k not in ("profile", "fit_result")})
    else:
        print(format_fit(out))
    if args.out:
        write_fitted_preset(args.out, out, model, args.device or hw.name)
        print(f"wrote {args.out}")
    return 0


def _cmd_public_profiles(args) -> int:
    from calibrate.public_profiles import main

    return main(["--write"] if args.write else ["--check"] if args.check else [])
