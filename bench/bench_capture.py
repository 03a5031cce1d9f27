"""Capture benchmark: throughput, overhead over a plain ``generate``, peak RSS.

1. Throughput: a capture of a few GSM8K problems (8 branches, persona-prefix)
   with the loaded model reused; tokens/s counts generated tokens (own and
   counterfactual).
2. Overhead: the same work done plainly. ``generate``: per problem the 8
   branch prompts batched and left-padded through ``model.generate`` and the
   root prompt for the 7 counterfactual rows (same ``max_new_tokens``,
   sampling on); ``verify``: one plain batched forward over each
   ``prompt + generation + verification suffix`` (the workload's verification
   pass, without the logit lens). Ratios, per generated token:
   capture / (generate + verify) = ``overhead_ratio`` (goal <= 1.5);
   capture / generate alone = ``overhead_ratio_vs_generate_only``; the
   capture's generation phases (prefill, decode, cf_prefill, cf_decode) /
   generate = ``overhead_ratio_generation_phases``.
3. Peak RSS of a 20-problem capture in a fresh process (goal <= 4 GB).

Writes ``OUT/capture.json`` and prints a short table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--problems", type=int, default=3)
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rss-problems", type=int, default=20)
    ap.add_argument("--rss-max-new-tokens", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    from traces import capture_ops as ops
    from traces.capture import CaptureConfig, run_capture
    from traces.datasets import load_dataset
    from traces.models import load_model
    from traces.store import atomic_write_json, load_trace
    from traces.workload import WorkloadConfig, build_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device=args.device)
    cfg = CaptureConfig(problems=args.problems, branches=args.branches, max_new_tokens=args.max_new_tokens,
                        device=args.device, threads=args.threads, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_capture(cfg, Path(tmp) / "t", command="bench", progress=False, lm=lm)
        cap_s = time.perf_counter() - t0
        tr = load_trace(Path(tmp) / "t")
        gen_tokens = int(sum(p.branches["gen_len"].sum() + p.branches["cf_gen_len"][1:].sum() for p in tr.problems))
        phases = {}
        for p in tr.problems:
            for ph, s in p.timings.groupby("phase")["seconds"].sum().items():
                phases[ph] = phases.get(ph, 0.0) + float(s)

    # the same generation work with model.generate
    tok = lm.tokenizer
    probs = load_dataset("gsm8k", limit=args.problems)
    wcfg = WorkloadConfig(layout=cfg.layout, n_branches=cfg.branches, seed=cfg.seed)
    pad = tok.pad_token_id
    from traces.workload import verification_ids, verify_suffix_ids

    suffix = verify_suffix_ids(tok)
    stop = [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]
    gen_s, ver_s, plain_tokens = 0.0, 0.0, 0
    torch.manual_seed(0)
    for prob in probs:
        pp = build_prompts(tok, prob.prompt_text(), prob.answer_kind, wcfg, prob.index)
        seqs = [b.prompt_ids for b in pp.branches]
        for batch in (seqs, [seqs[0]] * (len(seqs) - 1)):
            ids, mask, _ = ops.left_pad(batch, pad, lm.device)
            lm.sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                        do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p,
                                        top_k=0, pad_token_id=pad)
            lm.sync()
            gen_s += time.perf_counter() - t0
            gens = []
            for row in out[:, ids.shape[1]:].tolist():
                g = []
                for t in row:
                    g.append(t)
                    if t in stop:
                        break
                gens.append(g)
            plain_tokens += sum(map(len, gens))
            vseqs = [verification_ids(p_, g, suffix, stop)[0] for p_, g in zip(batch, gens)]
            lm.sync()
            t0 = time.perf_counter()
            ops.forward_tokens(lm, vseqs, pad)
            lm.sync()
            ver_s += time.perf_counter() - t0
    gen_phase_s = sum(phases.get(k, 0.0) for k in ("prefill", "decode", "cf_prefill", "cf_decode"))

    # peak RSS of a 20-problem capture, in its own process
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "app.cli", "capture", "--problems", str(args.rss_problems), "--branches",
               str(args.branches), "--max-new-tokens", str(args.rss_max_new_tokens), "--device", args.device,
               "--threads", str(args.threads), "--long-decode", "256", "--long-decode-seqs", "1",
               "--no-progress", "--out", str(Path(tmp) / "rss")]
        t0 = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rss_s = time.perf_counter() - t0
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if peak_kb < before:
            peak_kb = before

    res = {
        "device": str(lm.device), "threads": torch.get_num_threads(), "problems": args.problems,
        "branches": args.branches, "max_new_tokens": args.max_new_tokens,
        "capture_seconds": round(cap_s, 3), "capture_generated_tokens": gen_tokens,
        "capture_tokens_per_s": round(gen_tokens / cap_s, 2),
        "generate_seconds": round(gen_s, 3), "generate_tokens": plain_tokens,
        "generate_tokens_per_s": round(plain_tokens / gen_s, 2),
        "plain_verify_seconds": round(ver_s, 3),
        # per generated token, so different sampled lengths do not bias the ratios
        "overhead_ratio": round((cap_s / gen_tokens) / ((gen_s + ver_s) / plain_tokens), 3),
        "overhead_ratio_vs_generate_only": round((cap_s / gen_tokens) / (gen_s / plain_tokens), 3),
        "overhead_ratio_generation_phases": round((gen_phase_s / gen_tokens) / (gen_s / plain_tokens), 3),
        "overhead_goal": 1.5,
        "phase_seconds": {k: round(v, 3) for k, v in sorted(phases.items())},
        "rss_problems": args.rss_problems, "rss_max_new_tokens": args.rss_max_new_tokens,
        "rss_capture_seconds": round(rss_s, 1), "peak_rss_gb": round(peak_kb / 1024 / 1024, 3),
        "peak_rss_goal_gb": 4.0,
    }
    atomic_write_json(args.out / "capture.json", res)
    w = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{w}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
