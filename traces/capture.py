"""Capture a trace from a real model (DESIGN §3, docs/trace-schema.md).

:func:`run_capture` writes one shard per problem (then the long-decode and
tree shards) through :class:`~traces.store.TraceWriter`, so an interrupted
capture resumes where it stopped: complete shards (``shard.json`` present and
matching its files' checksums) are skipped, and because every random choice
is drawn from a generator seeded by (seed, problem, branch, stream) a resumed
capture equals an uninterrupted one shard for shard.

Per problem (B branches, L layers):

1. prefill of all branch prompts (batched, left-padded) with hidden states →
   ASKS pooled vectors of each variant span (mean / last token), cosine to the
   root raw and centered on the neutral reference means;
2. own generation: seeded sampling from each branch's own KV (batched);
3. counterfactual generation: the root's prompt KV (one prefill, expanded to
   B-1 rows) decoded with each branch's same seed — what ASKS sharing yields;
4. verification of own and counterfactual generations: recomputed sequences
   ``prompt + generation + verify suffix`` with the per-layer logit lens;
5. the ASKS gate's cost (a full-depth pass over the variant spans), timed.

Every phase is timed with ``LoadedModel.sync()`` around it.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from traces import capture_ops as ops
from traces.answers import extract_answer, is_correct
from traces.datasets import Problem, load_dataset
from traces.merge import parse_shard
from traces.models import DEFAULT_MODEL, LoadedModel, load_model, model_folder, resolve_device, torch_dtype
from traces.store import TraceWriter, long_dir, problem_dir, tree_dir
from traces.workload import (
    REFERENCE_DIR, VERIFY_PROMPT, TreeConfig, WorkloadConfig, build_prompts, neutral_texts,
    verification_ids, verify_suffix_ids, yes_no_ids, encode_text,
)

# seed_for(seed, problem_index, branch_or_node, STREAM)
STREAM_BRANCH, STREAM_LONG, STREAM_TREE = 1, 3, 4


@dataclass
class CaptureConfig:
    """Everything that determines a trace's content (stored as ``config.json``)."""

    model: str = DEFAULT_MODEL
    dataset: str = "gsm8k"
    problems: int = 12
    problem_start: int = 0
    branches: int = 8
    layout: str = "persona-prefix"
    max_new_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0
    device: str = "auto"
    dtype: str | None = None
    threads: int = 1                # CPU intra-op threads (0 = torch's default); see docs/traces.md
    target_prefix_tokens: int = 0
    hidden_vectors: bool = True
    verify_prompt: str = VERIFY_PROMPT
    long_decode: int = 0            # tokens generated per long-decode sequence (0 = none)
    long_decode_seqs: int = 2
    long_decode_layers: list[int] | None = None   # 1-based; None = every 4th and the last that evict (layers_for)
    tree_depth: int = 0             # 0 = no tree
    tree_step: int = 32
    tree_expand: int = 2
    tree_branching: int = 3
    trees: int = 1
    shard: str | None = None        # "I/N": every N-th problem from position I (rksim trace merge joins parts)

    def check(self) -> None:
        pos = {"problems": 1, "branches": 1, "max_new_tokens": 1, "long_decode": 0, "long_decode_seqs": 0,
               "tree_depth": 0, "tree_step": 1, "tree_expand": 1, "tree_branching": 1, "trees": 0,
               "problem_start": 0, "target_prefix_tokens": 0, "threads": 0}
        for k, lo in pos.items():
            if int(getattr(self, k)) < lo:
                raise ValueError(f"--{k.replace('_', '-')}: must be >= {lo}, got {getattr(self, k)}")
        if not 0 <= self.temperature <= 5:
            raise ValueError(f"--temperature: {self.temperature} outside [0, 5]")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p: {self.top_p} outside (0, 1]")
        WorkloadConfig(layout=self.layout, n_branches=self.branches)  # validates the layout
        if self.tree_depth:
            TreeConfig(self.tree_depth, self.tree_step, self.tree_expand, self.tree_branching)
        if self.shard is not None:
            i, n = parse_shard(self.shard)
            if i >= int(self.problems):
                raise ValueError(f"--shard: {self.shard} takes no problem of --problems {self.problems} "
                                 f"(positions {i}, {i + n}, ... are all past the last one)")

    def shard_parts(self) -> tuple[int, int]:
        """(I, N) of ``--shard I/N``; (0, 1) for an unsharded capture."""
        return parse_shard(self.shard) if self.shard is not None else (0, 1)

    def fingerprint_dict(self) -> dict:
        """``asdict`` without ``shard`` when unset, so unsharded configs read as before shards existed."""
        d = asdict(self)
        if d.get("shard") is None:
            d.pop("shard", None)
        return d

    def layers_for(self, L: int, layer_types=None) -> list[int]:
        """The 1-based layers whose long-decode K/V/Q are recorded: ``--long-decode-layers``, else every 4th and the
        last of those that evict (``layer_types``: a sliding-window layer keeps its window, so token eviction, and
        its quality, is measured on the full-attention layers; all of them where the default picks none)."""
        if not self.long_decode:
            return []
        if self.long_decode_layers is None:
            full = [x for x in range(1, L + 1) if not layer_types or layer_types[x - 1] != "sliding_attention"]
            return [x for x in sorted(set(list(range(4, L + 1, 4)) + [L])) if x in full] or full
        ls = sorted(set(int(x) for x in self.long_decode_layers))
        bad = [x for x in ls if not 1 <= x <= L]
        if bad:
            raise ValueError(f"--long-decode-layers: {bad} outside 1..{L} (the model has {L} layers)")
        return ls


@dataclass
class _Ctx:
    lm: LoadedModel
    cfg: CaptureConfig
    pad_id: int
    stop_ids: list[int]
    yes_ids: list[int]
    no_ids: list[int]
    suffix: list[int]
    ref_mean: np.ndarray
    ref_last: np.ndarray
    wcfg: WorkloadConfig = field(default=None)


def _versions() -> dict:
    import importlib.metadata as md

    v = {"python": platform.python_version(), "platform": platform.platform(), "torch_threads": torch.get_num_threads()}
    for pkg in ("rksim", "torch", "transformers", "numpy", "pandas", "pyarrow", "safetensors", "gguf", "tokenizers"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    if torch.cuda.is_available():
        v["cuda"] = torch.version.cuda
    return v


def _device_str(lm: LoadedModel) -> str:
    if lm.device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(lm.device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def stop_ids(tok) -> list[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"):  # ChatML, Llama 3, Gemma
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
            ids.add(i)
    return sorted(ids)


def reference_means(lm: LoadedModel, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer means (L, d) of mean- and last-token-pooled hidden states of the neutral texts.

    Each text is shown as a user message in the chat template (the context a
    variant span sits in) and pooled over its own tokens only.
    """
    tok = lm.tokenizer
    # A user message: the template around the problem slot, with the default system prompt.
    msgs_text = tok.apply_chat_template([{"role": "user", "content": "\u2063X\u2063"}], tokenize=False,
                                        add_generation_prompt=True) if tok.chat_template else "User: \u2063X\u2063\n"
    pre, post = msgs_text.split("\u2063X\u2063")
    seqs, spans = [], []
    for t in neutral_texts():
        a, b, c = encode_text(tok, pre), encode_text(tok, t), encode_text(tok, post)
        seqs.append(a + b + c)
        spans.append((len(a), len(a) + len(b)))
    # Pooled exactly as the ASKS gate pools a variant span: the text alone, one batch.
    mean, last = ops.gate_pool(lm, [sq[a:b] for sq, (a, b) in zip(seqs, spans)], pad_id)
    return mean.mean(0).astype(np.float32), last.mean(0).astype(np.float32)


def _texts(tok, gens: list[list[int]]) -> list[str]:
    return [tok.decode(g, skip_special_tokens=True) for g in gens]


def _answers(texts: list[str], prob: Problem) -> list[str]:
    return [extract_answer(t, prob.answer_kind, max(len(prob.choices), 1), prob.choices, prob.labels)
            for t in texts]


def _mean(xs: list[float], f=lambda x: x) -> float:
    return float(np.mean([f(x) for x in xs])) if xs else 0.0


def capture_problem(ctx: _Ctx, prob: Problem) -> tuple[dict, dict, dict]:
    """Capture one problem; returns (shard meta, tables, arrays)."""
    lm, cfg = ctx.lm, ctx.cfg
    tok = lm.tokenizer
    B, L = cfg.branches, lm.n_layers
    pp = build_prompts(tok, prob.prompt_text(), prob.answer_kind, ctx.wcfg, problem_index=prob.index)
    br = pp.branches
    timer = ops.Timer(lm)
    seqs = [b.prompt_ids for b in br]
    lens = [len(s) for s in seqs]

    # 1. ASKS signals: the gate's pass over the variant spans only (traces.capture_ops.gate_pool,
    # which the real runner's gate calls too), then the prompts' prefill
    span_ids = [b.prompt_ids[b.variant_start:b.variant_end] for b in br]
    with timer.phase("gate", n_new=sum(len(x) for x in span_ids), batch=B):
        mean, last = ops.gate_pool(lm, span_ids, ctx.pad_id)
    ids, mask, pos = ops.left_pad(seqs, ctx.pad_id, lm.device)
    with timer.phase("prefill", n_new=sum(lens), batch=B):
        logits, cache, _ = ops.prefill(lm, ids, mask, pos)
    cos = {
        "cos_mean_raw": ops.cosine(mean, mean[:1]),
        "cos_mean_centered": ops.cosine(mean - ctx.ref_mean, (mean - ctx.ref_mean)[:1]),
        "cos_last_raw": ops.cosine(last, last[:1]),
        "cos_last_centered": ops.cosine(last - ctx.ref_last, (last - ctx.ref_last)[:1]),
    }
    for v in cos.values():
        v[0] = 1.0  # the root against itself (exact, not 1 - 1e-16)

    # 2. own generation
    gens = [ops.make_generator(lm, ops.seed_for(cfg.seed, prob.index, b, STREAM_BRANCH)) for b in range(B)]
    next_pos = mask.sum(1)
    with timer.phase("decode", n_new=0, n_cached=sum(lens), batch=B):
        own = ops.sample_decode(lm, logits, cache, mask, next_pos, cfg.max_new_tokens, gens, cfg.temperature,
                                cfg.top_p, ctx.stop_ids)
    timer.rows[-1]["n_new"] = own.steps * B
    del cache, own.cache

    # 3. counterfactual: decode from the root's prompt KV with each branch's seed
    cf_ids, cf_lp = [own.gen_ids[0]], [own.logprobs[0]]
    if B > 1:
        root = torch.as_tensor([seqs[0]], device=lm.device)
        with timer.phase("cf_prefill", n_new=lens[0], batch=1, branch=0):
            l0, c0, _ = ops.prefill(lm, root)
        n = B - 1
        cache_n = ops.expand_cache(c0, n)
        gens = [ops.make_generator(lm, ops.seed_for(cfg.seed, prob.index, b, STREAM_BRANCH)) for b in range(1, B)]
        m_n = torch.ones((n, lens[0]), dtype=torch.long, device=lm.device)
        with timer.phase("cf_decode", n_new=0, n_cached=lens[0] * n, batch=n):
            cf = ops.sample_decode(lm, l0.expand(n, -1), cache_n, m_n, torch.full((n,), lens[0], device=lm.device),
                                   cfg.max_new_tokens, gens, cfg.temperature, cfg.top_p, ctx.stop_ids)
        timer.rows[-1]["n_new"] = cf.steps * n
        cf_ids += cf.gen_ids
        cf_lp += cf.logprobs
        del c0, cache_n, cf

    # 4. verification (recomputed sequences) with the logit lens
    vseq, vlen = zip(*[verification_ids(seqs[b], own.gen_ids[b], ctx.suffix, ctx.stop_ids) for b in range(B)])
    with timer.phase("verify", n_new=sum(len(s) for s in vseq), batch=B):
        lens_own = ops.logit_lens_last(lm, vseq, ctx.yes_ids, ctx.no_ids, ctx.pad_id)
    if B > 1:
        cseq = [verification_ids(seqs[b], cf_ids[b], ctx.suffix, ctx.stop_ids)[0] for b in range(1, B)]
        with timer.phase("cf_verify", n_new=sum(len(s) for s in cseq), batch=B - 1):
            lens_cf1 = ops.logit_lens_last(lm, cseq, ctx.yes_ids, ctx.no_ids, ctx.pad_id)
        lens_cf = ops.LensResult(*[np.concatenate([a[:1], b]) for a, b in
                                   zip(dataclasses.astuple(lens_own), dataclasses.astuple(lens_cf1))])
    else:
        lens_cf = lens_own

    # answers
    own_ans = _answers(_texts(tok, own.gen_ids), prob)
    cf_ans = _answers(_texts(tok, cf_ids), prob)
    own_ok = [is_correct(a, prob.truth, prob.answer_kind) for a in own_ans]
    cf_ok = [is_correct(a, prob.truth, prob.answer_kind) for a in cf_ans]
    vote = [own_ans.count(a) / B if a else 0.0 for a in own_ans]
    cf_vote = [(1 + sum(1 for j in range(B) if j != b and own_ans[j] == a)) / B if a else 0.0
               for b, a in enumerate(cf_ans)]

    branches = {
        "branch": list(range(B)), "variant_id": [b.variant_id for b in br], "variant_text": [b.variant_text for b in br],
        "prompt_ids": seqs, "prompt_len": lens, "seg_kinds": [b.seg_kinds for b in br],
        "seg_lens": [b.seg_lens for b in br], "variant_start": [b.variant_start for b in br],
        "variant_end": [b.variant_end for b in br],
        "gen_ids": own.gen_ids, "gen_len": [len(g) for g in own.gen_ids], "gen_logprobs": own.logprobs,
        "mean_logprob": [_mean(x) for x in own.logprobs], "mean_prob": [_mean(x, np.exp) for x in own.logprobs],
        "answer": own_ans, "correct": own_ok, "vote_share": vote,
        "cf_gen_ids": cf_ids, "cf_gen_len": [len(g) for g in cf_ids], "cf_gen_logprobs": cf_lp,
        "cf_mean_logprob": [_mean(x) for x in cf_lp], "cf_mean_prob": [_mean(x, np.exp) for x in cf_lp],
        "cf_answer": cf_ans, "cf_correct": cf_ok, "cf_vote_share": cf_vote,
        "verify_prompt_len": list(vlen), "verify_score": lens_own.score.tolist(),
        "cf_verify_score": lens_cf.score.tolist(),
    }
    asks = {"branch": np.repeat(np.arange(B), L), "layer": np.tile(np.arange(1, L + 1), B)}
    asks.update({k: v.reshape(-1) for k, v in cos.items()})
    verify: dict[str, list] = {"gen": ["own"] * (B * L) + ["cf"] * (B * L),
                               "branch": np.tile(np.repeat(np.arange(B), L), 2),
                               "layer": np.tile(np.arange(1, L + 1), 2 * B)}
    for k in ("entropy", "p_yes", "p_no", "top1", "entropy_nonorm", "p_yes_nonorm", "p_no_nonorm", "top1_nonorm"):
        verify[k] = np.concatenate([getattr(lens_own, k).reshape(-1), getattr(lens_cf, k).reshape(-1)])
    tables = {"branches.parquet": branches, "asks.parquet": asks, "verify.parquet": verify,
              "timings.parquet": timer.columns()}
    arrays = {}
    if cfg.hidden_vectors:
        arrays = {"hidden_mean.npy": mean.astype(np.float16), "hidden_last.npy": last.astype(np.float16)}
    meta = {"problem_index": prob.index, "question": prob.question, "truth": prob.truth,
            "answer_kind": prob.answer_kind, "n_branches": B, "shared_prefix_tokens": pp.shared_prefix_tokens,
            "choices": list(prob.choices), "pad_tokens": pp.pad_tokens,
            "majority_answer": _majority(own_ans), "selected_branch": int(np.argmax(lens_own.score)),
            "source": Path(prob.source).name, "source_line": prob.meta.get("line")}
    return meta, tables, arrays


def _majority(answers: list[str]) -> str:
    """Most frequent non-empty answer; ties go to the answer that appears first."""
    counts: dict[str, int] = {}
    for a in answers:
        if a:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return ""
    best = max(counts.values())
    return next(a for a in answers if a and counts[a] == best)


def capture_long(ctx: _Ctx, prob: Problem, seq_index: int, layers: list[int]) -> tuple[dict, dict, dict]:
    """One long decode of the root prompt, recording post-RoPE Q/K/V of ``layers``."""
    lm, cfg = ctx.lm, ctx.cfg
    tok = lm.tokenizer
    pp = build_prompts(tok, prob.prompt_text(), prob.answer_kind, ctx.wcfg, problem_index=prob.index)
    prompt = pp.branches[0].prompt_ids
    P, T2 = len(prompt), int(cfg.long_decode)
    timer = ops.Timer(lm)
    g = [ops.make_generator(lm, ops.seed_for(cfg.seed, prob.index, seq_index, STREAM_LONG))]
    with ops.QKVRecorder(lm, layers) as rec:
        ids = torch.as_tensor([prompt], device=lm.device)
        with timer.phase("long_prefill", n_new=P, batch=1):
            logits, cache, _ = ops.prefill(lm, ids)
        mask = torch.ones((1, P), dtype=torch.long, device=lm.device)
        # stop tokens are masked for the whole run: the sequence is exactly T2 tokens
        with timer.phase("long_decode", n_new=T2, n_cached=P, batch=1):
            res = ops.sample_decode(lm, logits, cache, mask, torch.tensor([P], device=lm.device), T2, g,
                                    cfg.temperature, cfg.top_p, ctx.stop_ids, min_new_tokens=T2)
            # feed the last token once so its K/V/Q are recorded too (T = P + T2 rows)
            kw = ops._cache_kw(lm)
            lm.model(input_ids=torch.tensor([[res.gen_ids[0][-1]]], device=lm.device),
                     attention_mask=torch.ones((1, P + T2), dtype=torch.long, device=lm.device),
                     position_ids=torch.tensor([[P + T2 - 1]], device=lm.device), use_cache=True,
                     logits_to_keep=1, **{kw: res.cache})
    K, V, Q = rec.arrays()
    gen = res.gen_ids[0]
    text = tok.decode(gen, skip_special_tokens=True)
    ans = _answers([text], prob)[0]
    arrays = {
        "K.npy": K.astype(np.float16), "V.npy": V.astype(np.float16), "Q.npy": Q.astype(np.float16),
        "value_range.npy": (V.max(-1) - V.min(-1)).astype(np.float32),
        "key_norm.npy": np.linalg.norm(K, axis=-1).astype(np.float32),
    }
    meta = {"seq_index": seq_index, "problem_index": prob.index, "prompt_len": P, "gen_len": len(gen),
            "layers": layers, "n_heads": lm.n_heads, "n_kv_heads": lm.n_kv_heads, "head_dim": lm.head_dim,
            "token_ids": prompt + gen, "answer": ans, "truth": prob.truth,
            "correct": is_correct(ans, prob.truth, prob.answer_kind),
            "gen_logprobs_mean": _mean(res.logprobs[0])}
    return meta, {"timings.parquet": timer.columns()}, arrays


def capture_tree(ctx: _Ctx, prob: Problem, tree_index: int) -> tuple[dict, dict]:
    """Tree search: each level expands the best ``tree_expand`` open nodes into ``tree_branching`` children."""
    lm, cfg = ctx.lm, ctx.cfg
    tok = lm.tokenizer
    pp = build_prompts(tok, prob.prompt_text(), prob.answer_kind, ctx.wcfg, problem_index=prob.index)
    prompt = pp.branches[0].prompt_ids
    timer = ops.Timer(lm)
    stop = set(ctx.stop_ids)
    nodes = [{"node": 0, "parent": -1, "depth": 0, "n_tokens": len(prompt), "context_len": 0,
              "token_ids": list(prompt), "expanded": False, "path": [], "done": False}]
    v0 = verification_ids(prompt, [], ctx.suffix, ctx.stop_ids)[0]
    nodes[0]["score"] = float(ops.logit_lens_last(lm, [v0], ctx.yes_ids, ctx.no_ids, ctx.pad_id).score[0])
    frontier = [0]
    for depth in range(1, cfg.tree_depth + 1):
        if not frontier:
            break
        parents = [p for p in frontier for _ in range(cfg.tree_branching)]
        ctxs = [prompt + nodes[p]["path"] for p in parents]
        new_ids = list(range(len(nodes), len(nodes) + len(parents)))
        ids, mask, pos = ops.left_pad(ctxs, ctx.pad_id, lm.device)
        with timer.phase("tree_prefill", n_new=sum(map(len, ctxs)), batch=len(ctxs)):
            logits, cache, _ = ops.prefill(lm, ids, mask, pos)
        gens = [ops.make_generator(lm, ops.seed_for(cfg.seed, prob.index, 1000 * tree_index + i, STREAM_TREE))
                for i in new_ids]
        with timer.phase("tree_decode", n_new=0, n_cached=sum(map(len, ctxs)), batch=len(ctxs)):
            res = ops.sample_decode(lm, logits, cache, mask, mask.sum(1), cfg.tree_step, gens, cfg.temperature,
                                    cfg.top_p, ctx.stop_ids)
        timer.rows[-1]["n_new"] = res.steps * len(ctxs)
        del cache
        vseqs = [verification_ids(prompt, nodes[p]["path"] + g, ctx.suffix, ctx.stop_ids)[0]
                 for p, g in zip(parents, res.gen_ids)]
        with timer.phase("tree_verify", n_new=sum(map(len, vseqs)), batch=len(vseqs)):
            scores = ops.logit_lens_last(lm, vseqs, ctx.yes_ids, ctx.no_ids, ctx.pad_id).score
        for nid, p, g, s in zip(new_ids, parents, res.gen_ids, scores):
            nodes[p]["expanded"] = True
            path = nodes[p]["path"] + g
            nodes.append({"node": nid, "parent": p, "depth": depth, "n_tokens": len(g),
                          "context_len": len(prompt) + len(nodes[p]["path"]), "token_ids": g, "expanded": False,
                          "path": path, "done": bool(g and g[-1] in stop), "score": float(s)})
        open_ = [n for n in new_ids if not nodes[n]["done"]]
        # best k by score; ties to the lower node id
        frontier = sorted(open_, key=lambda n: (-nodes[n]["score"], n))[:cfg.tree_expand]
    texts = _texts(tok, [n["path"] for n in nodes])
    ans = _answers(texts, prob)
    ans[0] = ""
    cols = {k: [n[k] for n in nodes] for k in ("node", "parent", "depth", "score", "n_tokens", "context_len",
                                                "token_ids", "expanded")}
    cols["answer"] = ans
    cols["correct"] = [is_correct(a, prob.truth, prob.answer_kind) for a in ans]
    meta = {"problem_index": prob.index, "depth": cfg.tree_depth, "step_tokens": cfg.tree_step,
            "expand_k": cfg.tree_expand, "branching": cfg.tree_branching, "truth": prob.truth,
            "n_nodes": len(nodes)}
    return meta, {"nodes.parquet": cols, "timings.parquet": timer.columns()}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_capture(cfg: CaptureConfig, out: str | Path, command: str = "", progress: bool = True,
                after_shard: Callable[[str], None] | None = None, lm: LoadedModel | None = None) -> dict:
    """Capture (or resume) a trace into ``out``; returns the manifest.

    ``after_shard(rel)`` is called after each shard is written (tests use it
    to interrupt a capture). ``lm`` may be passed to reuse a loaded model.
    """
    from tqdm.auto import tqdm

    cfg.check()
    probs_all = load_dataset(cfg.dataset, limit=cfg.problem_start + cfg.problems)
    probs = probs_all[cfg.problem_start:]
    if len(probs) < cfg.problems:
        raise ValueError(f"--problems: {cfg.dataset} has only {len(probs_all)} problems "
                         f"({len(probs)} after --problem-start {cfg.problem_start})")
    n_long = cfg.long_decode_seqs if cfg.long_decode else 0
    n_tree = cfg.trees if cfg.tree_depth else 0
    for flag, n in (("--long-decode-seqs", n_long), ("--trees", n_tree)):
        if n > cfg.problems:
            raise ValueError(f"{flag}: {n} needs at least {n} problems (they reuse the first problems); "
                             f"--problems is {cfg.problems}")
    if cfg.threads and cfg.device != "cuda":
        # On a shared CPU two intra-op threads oversubscribe the cores: measured 6.4 s vs
        # 0.27 s per decode step (batch 8) with 2 vs 1 threads under load.
        torch.set_num_threads(int(cfg.threads))
    # Resolve and check the config against DIR before the (slow) model load.
    if lm is None:
        folder, _, _ = model_folder(cfg.model)
        hf = json.loads((folder / "config.json").read_text())
        n_layers, types = int(hf["num_hidden_layers"]), hf.get("layer_types")
        dev = resolve_device(cfg.device)
        dtype = str(torch_dtype(cfg.dtype, dev)).replace("torch.", "")
    else:
        n_layers, dev, dtype = lm.n_layers, lm.device, str(lm.dtype).replace("torch.", "")
        types = lm.extra.get("layer_types")
    layers = cfg.layers_for(n_layers, types)
    resolved = {"device": dev.type, "dtype": dtype, "long_decode_layers": layers}
    fingerprint = {**cfg.fingerprint_dict(), "resolved": resolved}
    writer = TraceWriter(out, fingerprint)
    if lm is None:
        lm = load_model(cfg.model, cfg.device, cfg.dtype)
    tok = lm.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    yes, no = yes_no_ids(tok)
    rm, rl = reference_means(lm, pad_id)
    writer.write_arrays({"reference_mean.npy": rm, "reference_last.npy": rl})
    ctx = _Ctx(lm, cfg, pad_id, stop_ids(tok), yes, no, verify_suffix_ids(tok, cfg.verify_prompt), rm, rl,
               WorkloadConfig(layout=cfg.layout, n_branches=cfg.branches, seed=cfg.seed,
                              target_prefix_tokens=cfg.target_prefix_tokens, verify_prompt=cfg.verify_prompt))
    # --shard I/N: every N-th problem, long decode and tree from position I. A job keeps its
    # position (which problem, which seeds), so a part's shards equal the same shards of an
    # unsharded capture; its directories are numbered 0.. within the part (merge renumbers).
    si, sn = cfg.shard_parts()
    own = [("p", i) for i in range(si, cfg.problems, sn)]
    own += [("s", j) for j in range(si, n_long, sn)] + [("t", k) for k in range(si, n_tree, sn)]
    local = {"p": 0, "s": 0, "t": 0}
    jobs = []
    for kind, i in own:
        jobs.append((kind, i, local[kind]))
        local[kind] += 1
    shards = {"problems": [], "long": [], "trees": []}
    bar = tqdm(jobs, desc="capture" if sn == 1 else f"capture {cfg.shard}", unit="shard", disable=not progress,
               dynamic_ncols=True)
    for kind, i, li in bar:
        rel = {"p": problem_dir, "s": long_dir, "t": tree_dir}[kind](li)
        shards[{"p": "problems", "s": "long", "t": "trees"}[kind]].append(rel)
        if writer.shard_complete(rel):
            bar.set_postfix_str(f"{rel} done")
            continue
        bar.set_postfix_str(rel)
        if kind == "p":
            meta, tables, arrays = capture_problem(ctx, probs[i])
        elif kind == "s":
            meta, tables, arrays = capture_long(ctx, probs[i], i, layers)
        else:
            (meta, tables), arrays = capture_tree(ctx, probs[i], i), None
        writer.write_shard(rel, meta, tables, arrays)
        if after_shard is not None:
            after_shard(rel)
    bar.close()
    ref = REFERENCE_DIR / "neutral.json"
    capture = {**cfg.fingerprint_dict(), **{k: v for k, v in resolved.items() if k != "long_decode_layers"},
               "long_decode_layers": layers,
               "tokens": {"pad_id": pad_id, "stop_ids": ctx.stop_ids, "yes_ids": yes, "no_ids": no,
                          "verify_suffix_ids": ctx.suffix},
               "seeds": {"seed": cfg.seed, "derivation": "numpy SeedSequence([seed, problem_index, branch_or_node, "
                         "stream]) -> torch.Generator per row; stream 1 = own and counterfactual generation "
                         "(same seed), 3 = long decode, 4 = tree nodes (node + 1000 * tree)"},
               "reference": {"file": "traces/reference/neutral.json", "n_texts": len(neutral_texts()),
                             "sha256": _sha256(ref)},
               "verify_reuses_kv": False}
    manifest = {
        "rksim_version": _versions().get("rksim") or "0",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv),
        "model": lm.info(), "device": _device_str(lm), "dataset": cfg.dataset, "layout": cfg.layout,
        "n_problems": len(shards["problems"]), "n_branches": cfg.branches, "capture": capture,
        "versions": _versions(), "shards": shards, "long_decode_layers": layers,
        "has_hidden_vectors": bool(cfg.hidden_vectors), "has_counterfactual": True, "has_verification_lens": True,
        "has_tree": bool(shards["trees"]),
    }
    return writer.finalize(manifest)
