"""A small, seeded, schema-complete trace written through ``traces.store.TraceWriter``.

For the simulator's tests and benchmarks only where the bundled trace is not
what is being measured: token counts, similarities and lens values are drawn
from a seeded generator with the structure of a persona-prefix capture
(variant span at the start, shared problem text, per-layer entropies that fall
with depth). Never used to report a result.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def write_synthetic_trace(root, n_problems: int = 4, n_branches: int = 4, n_layers: int = 8, hidden: int = 16,
                          seed: int = 0, gen_range=(12, 40), long_T: int = 96, long_prompt: int = 32) -> Path:
    from traces.store import TraceWriter, long_dir, problem_dir

    rng = np.random.default_rng(seed)
    B, L, D = n_branches, n_layers, hidden
    HQ, HKV, HD = 4, 2, 8
    w = TraceWriter(root, {"synthetic": True, "seed": seed, "n_problems": n_problems, "n_branches": B})
    w.write_arrays({"reference_mean.npy": rng.standard_normal((L, D)).astype(np.float32),
                    "reference_last.npy": rng.standard_normal((L, D)).astype(np.float32)})
    shards = {"problems": [], "long": [], "trees": []}
    for i in range(n_problems):
        shared = list(rng.integers(100, 1000, size=int(rng.integers(30, 60))))
        head = [1, 2, 3, 4]
        prompts, seg_lens, spans = [], [], []
        for b in range(B):
            var = list(rng.integers(1000, 2000, size=int(rng.integers(5, 12)))) if b else [1500 + j for j in range(8)]
            if b == B - 1 and B > 2:
                var = [1500 + j for j in range(8)]  # one branch identical to the root (sigma = 1)
            p = head + var + shared
            prompts.append(p)
            seg_lens.append([len(head), len(var), len(shared)])
            spans.append((len(head), len(head) + len(var)))
        truth = str(int(rng.integers(1, 50)))
        own_len = rng.integers(gen_range[0], gen_range[1], size=B)
        cf_len = rng.integers(gen_range[0], gen_range[1], size=B)
        cf_len[0] = own_len[0]
        answers = [truth if rng.random() < 0.6 else str(int(rng.integers(1, 50))) for _ in range(B)]
        cf_answers = [a if rng.random() < 0.7 else str(int(rng.integers(1, 50))) for a in answers]
        cf_answers[0] = answers[0]
        gens = [list(rng.integers(0, 2000, size=int(n))) for n in own_len]
        cf_gens = [list(rng.integers(0, 2000, size=int(n))) for n in cf_len]
        cf_gens[0] = gens[0]
        lp = [list(np.log(rng.uniform(0.2, 1.0, size=len(g))).astype(np.float32)) for g in gens]
        cflp = [list(np.log(rng.uniform(0.2, 1.0, size=len(g))).astype(np.float32)) for g in cf_gens]
        cflp[0] = lp[0]

        def vote(ans):
            return [sum(x == a for x in ans) / B if a else 0.0 for a in ans]

        vs = rng.uniform(0.05, 0.95, size=B)
        cvs = rng.uniform(0.05, 0.95, size=B)
        cvs[0] = vs[0]
        branches = {
            "branch": list(range(B)), "variant_id": list(range(B)), "variant_text": [f"persona {b}" for b in range(B)],
            "prompt_ids": prompts, "prompt_len": [len(p) for p in prompts],
            "seg_kinds": [["shared", "variant", "shared"]] * B, "seg_lens": seg_lens,
            "variant_start": [s for s, _ in spans], "variant_end": [e for _, e in spans],
            "gen_ids": gens, "gen_len": [len(g) for g in gens], "gen_logprobs": lp,
            "mean_logprob": [float(np.mean(x)) for x in lp], "mean_prob": [float(np.mean(np.exp(x))) for x in lp],
            "answer": answers, "correct": [a == truth for a in answers], "vote_share": vote(answers),
            "cf_gen_ids": cf_gens, "cf_gen_len": [len(g) for g in cf_gens], "cf_gen_logprobs": cflp,
            "cf_mean_logprob": [float(np.mean(x)) for x in cflp],
            "cf_mean_prob": [float(np.mean(np.exp(x))) for x in cflp],
            "cf_answer": cf_answers, "cf_correct": [a == truth for a in cf_answers], "cf_vote_share": vote(cf_answers),
            "verify_prompt_len": [12] * B, "verify_score": list(vs), "cf_verify_score": list(cvs),
        }
        cos = np.clip(rng.uniform(0.5, 1.0, size=(B, 1)) + rng.normal(0, 0.03, size=(B, L)), -1, 1)
        cos[0] = 1.0
        if B > 2:
            cos[B - 1] = 1.0
        ccos = np.clip(cos * 2 - 1, -1, 1)
        asks = {"branch": np.repeat(np.arange(B), L), "layer": np.tile(np.arange(1, L + 1), B),
                "cos_mean_raw": cos.ravel(), "cos_mean_centered": ccos.ravel(),
                "cos_last_raw": np.clip(cos.ravel() - 0.05, -1, 1), "cos_last_centered": np.clip(ccos.ravel() - 0.1, -1, 1)}
        depth = np.linspace(1, 0, L)[None, :]
        rows = {k: [] for k in ("gen", "branch", "layer", "entropy", "p_yes", "p_no", "top1", "entropy_nonorm",
                                "p_yes_nonorm", "p_no_nonorm", "top1_nonorm")}
        for g, scores in (("own", vs), ("cf", cvs)):
            ent = np.maximum(0.0, 4.0 * depth + rng.normal(0, 0.05, size=(B, L)) - rng.uniform(0, 0.5, size=(B, 1)))
            ent[:, : L // 3] = 0.01  # early layers echo the input token
            py = np.clip(scores[:, None] * np.linspace(0.3, 1.0, L)[None, :], 0, 1) * 0.9
            pn = np.clip((1 - scores[:, None]) * np.linspace(0.3, 1.0, L)[None, :], 0, 1) * 0.9
            rows["gen"] += [g] * (B * L)
            rows["branch"] += list(np.repeat(np.arange(B), L))
            rows["layer"] += list(np.tile(np.arange(1, L + 1), B))
            rows["entropy"] += list(ent.ravel())
            rows["p_yes"] += list(py.ravel())
            rows["p_no"] += list(pn.ravel())
            rows["top1"] += list(rng.integers(0, 2000, size=B * L))
            rows["entropy_nonorm"] += list((ent * 1.1).ravel())
            rows["p_yes_nonorm"] += list((py * 0.9).ravel())
            rows["p_no_nonorm"] += list((pn * 0.9).ravel())
            rows["top1_nonorm"] += list(rng.integers(0, 2000, size=B * L))
        plen = np.array(branches["prompt_len"])
        timings = {"phase": ["prefill"] * B + ["decode"] * B, "branch": list(range(B)) * 2,
                   "n_new": list(plen) + list(own_len), "n_cached": [0] * B + list(plen),
                   "batch": [1] * (2 * B),
                   "seconds": list(1e-3 * plen * (1 + 0.05 * rng.random(B))) + list(2e-3 * own_len)}
        meta = {"problem_index": i, "question": f"synthetic question {i}", "truth": truth, "answer_kind": "number",
                "n_branches": B, "shared_prefix_tokens": len(head)}
        rel = problem_dir(i)
        w.write_shard(rel, meta, {"branches.parquet": branches, "asks.parquet": asks, "verify.parquet": rows,
                                  "timings.parquet": timings}, None)
        shards["problems"].append(rel)
    layers = [1, L]
    T = long_T
    K = rng.standard_normal((2, T, HKV, HD)).astype(np.float16)
    V = rng.standard_normal((2, T, HKV, HD)).astype(np.float16)
    Q = rng.standard_normal((2, T, HQ, HD)).astype(np.float16)
    V32 = V.astype(np.float32)
    w.write_shard(long_dir(0), {
        "seq_index": 0, "problem_index": 0, "prompt_len": long_prompt, "gen_len": T - long_prompt, "layers": layers,
        "n_heads": HQ, "n_kv_heads": HKV, "head_dim": HD, "token_ids": list(range(T)), "answer": "3", "truth": "3",
        "correct": True}, None, {
        "K.npy": K, "V.npy": V, "Q.npy": Q,
        "value_range.npy": (V32.max(-1) - V32.min(-1)).astype(np.float32),
        "key_norm.npy": np.linalg.norm(K.astype(np.float32), axis=-1).astype(np.float32)})
    shards["long"].append(long_dir(0))
    w.finalize({
        "rksim_version": "0.1.0", "created": "2026-01-01T00:00:00Z", "command": "tests.synthetic.write_synthetic_trace",
        "model": {"name": "synthetic-tiny", "source": "synthetic", "n_layers": L, "hidden_size": D, "n_heads": HQ,
                  "n_kv_heads": HKV, "head_dim": HD, "intermediate_size": 4 * D, "vocab_size": 2048,
                  "dtype": "float32"},
        "device": "cpu", "dataset": "synthetic", "layout": "persona-prefix", "n_problems": n_problems,
        "n_branches": B, "capture": {"max_new_tokens": gen_range[1], "seed": seed}, "versions": {}, "shards": shards,
        "long_decode_layers": layers, "has_hidden_vectors": False, "has_counterfactual": True,
        "has_verification_lens": True, "has_tree": False,
    })
    return Path(root)
