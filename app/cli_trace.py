"""``rksim capture``, ``rksim trace validate|info|merge`` (torch only inside capture)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys


def _int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of layer numbers") from None


def register(sub) -> None:
    p = sub.add_parser("capture", help="capture a trace from a real model (resumable)",
                       description="Capture a multi-branch reasoning trace from a real model into DIR. "
                       "Re-running the same command resumes and skips complete shards.")
    p.add_argument("--model", default="smollm2-135m", help="preset name or local Hugging Face model folder")
    p.add_argument("--dataset", default="gsm8k", help="gsm8k | mmlu | arc:PATH (also gsm8k:PATH, mmlu:PATH)")
    p.add_argument("--problems", type=int, default=12, help="number of problems (one shard each)")
    p.add_argument("--problem-start", type=int, default=0, help="first dataset row (default 0)")
    p.add_argument("--branches", type=int, default=8, help="branches per problem (branch 0 is the root)")
    p.add_argument("--layout", default="persona-prefix", help="hint-suffix | persona-prefix | paraphrase")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per branch")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass")
    from app.cli_sim import renamed_argument
    renamed_argument(p, "--sampling-seed", "--seed", type=int, default=0, help="sampling seed of the capture")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU intra-op threads (default 1: robust on shared cores; 0 = torch default)")
    p.add_argument("--target-prefix-tokens", type=int, default=0,
                   help="pad the shared problem text with neutral text to this root prompt length (default 0 = off)")
    p.add_argument("--no-hidden-vectors", action="store_true", help="do not store the pooled hidden vectors")
    p.add_argument("--long-decode", type=int, default=0, metavar="T2",
                   help="tokens per long-decode sequence with raw K/V/Q recorded (default 0 = none)")
    p.add_argument("--long-decode-seqs", type=int, default=2, help="number of long-decode sequences")
    p.add_argument("--long-decode-layers", type=_int_list, default=None,
                   help="1-based layers, comma-separated (default: every 4th and the last; on a model with "
                        "sliding-window layers, the full-attention ones among them, where eviction applies)")
    p.add_argument("--tree-depth", type=int, default=0, help="tree search depth (default 0 = no tree)")
    p.add_argument("--tree-expand", type=int, default=2, help="best k nodes expanded per level")
    p.add_argument("--tree-branching", type=int, default=3, help="children per expanded node")
    p.add_argument("--tree-step", type=int, default=32, help="tokens generated per tree node")
    p.add_argument("--trees", type=int, default=1, help="number of trees (first problems)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", required=True, help="trace directory")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="capture part I of N (counting from 0): every N-th problem, long decode and tree from "
                   "position I; join the parts with `rksim trace merge` (default: the whole capture)")
    p.set_defaults(func=cmd_capture)

    t = sub.add_parser("trace", help="validate, describe or merge traces")
    tsub = t.add_subparsers(dest="trace_command", metavar="ACTION")
    tsub.required = True
    v = tsub.add_parser("validate", help="verify checksums, shapes, dtypes, finiteness, schema version")
    v.add_argument("path", help="trace directory")
    v.set_defaults(func=cmd_validate)
    i = tsub.add_parser("info", help="summary of a trace")
    i.add_argument("path", help="trace directory")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_info)
    mg = tsub.add_parser("merge", help="join the parts of a capture made with --shard I/N into one trace",
                         description="Check that the parts are of one capture (model, capture config, seeds), "
                         "complete and disjoint; write one trace equal to the unsharded capture (atomic).")
    mg.add_argument("parts", nargs="+", metavar="PART", help="part trace directories (any order)")
    mg.add_argument("--out", required=True, help="merged trace directory (must not exist or be empty)")
    mg.set_defaults(func=cmd_merge)


def capture_config(args):
    from traces.capture import CaptureConfig

    return CaptureConfig(
        model=args.model, dataset=args.dataset, problems=args.problems, problem_start=args.problem_start,
        branches=args.branches, layout=args.layout, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_p=args.top_p, seed=args.sampling_seed, device=args.device, dtype=args.dtype,
        threads=args.threads,
        target_prefix_tokens=args.target_prefix_tokens, hidden_vectors=not args.no_hidden_vectors,
        long_decode=args.long_decode, long_decode_seqs=args.long_decode_seqs,
        long_decode_layers=args.long_decode_layers, tree_depth=args.tree_depth, tree_step=args.tree_step,
        tree_expand=args.tree_expand, tree_branching=args.tree_branching, trees=args.trees, shard=args.shard,
    )


def _command(args) -> str:
    """The command line as typed, or (when called in-process) an equivalent one built from ``args``."""
    if sys.argv[1:2] == ["capture"]:
        return "rksim " + shlex.join(sys.argv[1:])
    parts = ["capture"]
    for k, v in vars(args).items():
        if k in ("func", "command") or v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            parts.append(flag)
        else:
            parts += [flag, ",".join(map(str, v)) if isinstance(v, list) else str(v)]
    return "rksim " + shlex.join(parts)


def cmd_capture(args) -> int:
    from traces.capture import run_capture
    from traces.store import load_trace

    cfg = capture_config(args)
    cfg.check()
    command = _command(args)
    m = run_capture(cfg, args.out, command=command, progress=not args.no_progress)
    tr = load_trace(args.out, verify=True)
    info = tr.info()
    print(f"wrote {args.out}: {info['n_problems']} problems x {info['n_branches']} branches, "
          f"{info['n_long_decodes']} long decodes, {info['n_trees']} trees, {info['bytes'] / 1e6:.1f} MB, "
          f"{len(m['files'])} files")
    return 0


def cmd_validate(args) -> int:
    from traces.store import load_trace

    tr = load_trace(args.path, verify=True)
    print(f"ok: {args.path} (schema {tr.manifest['schema_version']}, {len(tr.problems)} problems, "
          f"{len(tr.long_decodes)} long decodes, {len(tr.trees)} trees, {len(tr.manifest['files'])} files verified)")
    return 0


def cmd_info(args) -> int:
    from traces.store import load_trace

    info = load_trace(args.path, verify=False).info()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        w = max(map(len, info))
        for k, v in info.items():
            print(f"{k:<{w}}  {v}")
    return 0


def cmd_merge(args) -> int:
    from traces.merge import merge_traces
    from traces.store import load_trace

    command = "rksim " + shlex.join(sys.argv[1:]) if sys.argv[1:3] == ["trace", "merge"] else ""
    merge_traces(args.parts, args.out, command=command)
    tr = load_trace(args.out, verify=False)
    print(f"wrote {args.out}: {len(tr.problems)} problems, {len(tr.long_decodes)} long decodes, {len(tr.trees)} trees "
          f"from {len(args.parts)} parts, {len(tr.manifest['files'])} files")
    return 0
