"""Quality of token eviction on a real model (``rksim calibrate quality``).

For each problem: a full-cache greedy generation of up to ``long_decode``
tokens is the reference. For each eviction policy and compression ratio
``r`` (the budget is ``K = round((P + T) / r) - buffer`` with ``P + T`` the
full sequence length, at least ``sinks + 1``):

- **KL(full || evicted)**, teacher-forced: the evicted cache
  (:class:`calibrate.evicting_cache.EvictingCache`, deciding with the policy
  object) is fed the full-cache generation token by token; at every position
  ``KL = sum_v p_full(v) (log p_full(v) - log p_evicted(v))`` of the next-token
  distributions, averaged over positions;
- **answer agreement**: the evicted cache generates freely (greedy); its
  extracted answer equals the full cache's;
- **repetition rate**: ``1 - distinct 4-grams / 4-grams`` of that generation;
- **accuracy**: its answer is the ground truth.

The simulator's proxy for the same (policy, budget) is the attention-output
relative error (``policies.attention_metrics``) of ``run_token_eviction``
replayed on the full-cache K/V/Q of the recorded layers; the Spearman rank
correlation of proxy and measured KL across all (policy, budget) pairs says
whether the simulator ranks configurations the way the model feels them.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

EVICTION_POLICIES = ("streamingllm", "h2o", "snapkv", "rkv", "curdkv", "random", "vase-attnv", "vase-dkv")


@dataclass
class QualityConfig:
    model: str = "smollm2-135m"
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None
    problems: int = 2
    long_decode: int = 128
    policies: tuple = EVICTION_POLICIES
    compression: tuple = (2, 4, 8)
    buffer: int = 16
    proxy_layers: tuple = (4, 8, 12, 16, 20, 24, 28, 30)   # 1-based, every 4th and the last (DESIGN §3)
    free_generation: bool = True

    @classmethod
    def from_args(cls, a) -> "QualityConfig":
        pols = tuple(p.strip() for p in a.policies.split(",")) if a.policies else EVICTION_POLICIES
        for p in pols:
            if _make_policy(p).kind != "token":
                raise ValueError(f"--policies: {p!r} is not a token-eviction policy")
        try:
            comp = tuple(float(x) for x in a.compression.split(","))
        except ValueError:
            raise ValueError(f"--compression: {a.compression!r} is not a comma list of numbers") from None
        if any(c <= 1 for c in comp):
            raise ValueError("--compression: ratios must be > 1")
        if a.long_decode < 32:
            raise ValueError("--long-decode: must be >= 32 tokens")
        return cls(model=a.model, device=a.device, seed=a.seed, threads=a.threads, problems=a.problems,
                   long_decode=a.long_decode, policies=pols, compression=comp)


def _make_policy(spec: str, **overrides):
    from policies.registry import PolicyError, policy_from_spec
    try:
        return policy_from_spec(spec, **overrides)
    except PolicyError as exc:
        raise ValueError(f"--policies: {exc}") from None


def repetition_rate(ids: list[int], n: int = 4) -> float:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 0.0 if not grams else 1.0 - len(set(grams)) / len(grams)


def _budget(total: int, ratio: float, buffer: int, sinks: int) -> int:
    return max(sinks + 1, int(round(total / ratio)) - buffer)


def _decode(lm, prompt: list[int], cache, T: int, stop: set[int], forced: list[int] | None = None):
    """Greedy (or teacher-forced) decode; returns generated ids and per-step log-softmax rows (T', V)."""
    import torch
    m = lm.model
    P = len(prompt)
    dev = lm.device
    out = m(input_ids=torch.tensor([prompt], device=dev), cache=cache, use_cache=True, logits_to_keep=1)
    logps, gen = [], []
    steps = len(forced) if forced is not None else T
    for i in range(steps):
        lp = torch.log_softmax(out.logits[0, -1].float(), -1)
        logps.append(lp)
        tok = int(forced[i]) if forced is not None else int(lp.argmax())
        gen.append(tok)
        if (forced is None and tok in stop) or i == steps - 1:
            break
        out = m(input_ids=torch.tensor([[tok]], device=dev), cache=cache, use_cache=True,
                position_ids=torch.tensor([[P + i]], device=dev), logits_to_keep=1)
    return gen, torch.stack(logps)


def run_quality(cfg: QualityConfig, out: Path, progress: bool = True) -> dict:
    """``rksim calibrate quality``: every (policy, compression) on every problem against the full cache.

    Writes ``quality.parquet`` (a row per problem, policy and ratio, :func:`_eviction_row`, and each
    problem's full-cache row, :func:`_problem_rows`) and ``quality.json`` (:func:`_quality_summary`).
    """
    import torch
    from tqdm import tqdm
    from traces.datasets import load_dataset
    from traces.models import load_model
    from calibrate.evicting_cache import window_layers
    from traces.store import atomic_write_json
    from traces.workload import WorkloadConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    lm = load_model(cfg.model, device=cfg.device)
    L = lm.n_layers
    tok = lm.tokenizer
    stop = {int(tok.eos_token_id)}
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end >= 0:
        stop.add(im_end)
    # the proxy reads the layers that evict: a model's window layers keep their window (EvictingCache keep_layers)
    evicting = [l for l in range(1, L + 1) if l - 1 not in window_layers(lm.model)]
    layers = [l for l in cfg.proxy_layers if l in evicting] or evicting[-1:]
    rows = []
    problems = load_dataset("gsm8k", limit=cfg.problems)
    jobs = [(p, pol, r) for p in problems for pol in cfg.policies for r in cfg.compression]
    bar = tqdm(total=len(jobs), desc="calibrate quality", disable=not progress)
    wcfg = WorkloadConfig(layout="persona-prefix", n_branches=1, seed=cfg.seed, shuffle_variants=False)
    with torch.inference_mode():
        for p in problems:
            rows += _problem_rows(lm, p, cfg, wcfg, layers, stop, bar)
    bar.close()
    df = pd.DataFrame(rows)
    from calibrate.runner import write_parquet
    write_parquet(out / "quality.parquet", df)
    res = _quality_summary(df, cfg, len(problems))
    atomic_write_json(out / "quality.json", res)
    return res


@dataclass
class _Reference:
    """One problem's full-cache greedy generation and what the evicted runs are measured against."""
    prompt: list
    ids: list            # the generated tokens
    logp: object         # (T, V) log-softmax of each step's next-token distribution
    p: object            # (T, V) the same, as probabilities
    answer: str
    total: int           # prompt + generation
    kvq: dict            # proxy layer (1-based) -> its recorded full-cache K, V, Q
    fulls: dict          # proxy layer -> its FullAttention over the first total - 1 tokens


def _problem_rows(lm, p, cfg: QualityConfig, wcfg, layers, stop, bar) -> list[dict]:
    """One problem: the full-cache reference, a row per (policy, ratio), then the full cache's own row."""
    from policies import FullAttention, get_policy
    from traces.answers import extract_answer, is_correct
    from traces.workload import build_prompts

    from calibrate.evicting_cache import EvictingCache

    L, tok = lm.n_layers, lm.tokenizer
    prompt = build_prompts(tok, p.prompt_text(), p.answer_kind, wcfg, p.index).branches[0].prompt_ids
    P = len(prompt)
    full_cache = EvictingCache(L, get_policy("full"), P, lm.n_kv_heads).attach(lm.model)
    with full_cache:
        t0 = time.perf_counter()
        ref_ids, ref_lp = _decode(lm, prompt, full_cache, cfg.long_decode, stop)
        full_s = time.perf_counter() - t0
    ref_ans = extract_answer(tok.decode(ref_ids, skip_special_tokens=True), p.answer_kind)
    total = P + len(ref_ids)
    # the recorded full-cache K/V/Q of the proxy layers (what a trace's long/ shard holds)
    kvq = {l: full_cache.ev[l - 1].arrays() for l in layers}
    fulls = {l: FullAttention(*[x[: total - 1] for x in kvq[l]], P) for l in layers}
    ref = _Reference(prompt, ref_ids, ref_lp, ref_lp.exp(), ref_ans, total, kvq, fulls)
    rows = []
    for name in cfg.policies:
        for ratio in cfg.compression:
            rows.append(_eviction_row(lm, p, name, ratio, cfg, ref, layers, stop))
            bar.update(1)
    rows.append({"problem": int(p.index), "policy": "full", "compression": 1.0, "budget": total,
                 "buffer": cfg.buffer, "prompt_len": P, "gen_len": len(ref_ids), "kl_mean": 0.0,
                 "kl_max": 0.0, "evictions": 0, "answer": ref_ans, "agree": True,
                 "repetition": repetition_rate(ref_ids),
                 "correct": bool(is_correct(ref_ans, p.truth, p.answer_kind)), "seconds": full_s,
                 "proxy_attn_err": 0.0})
    return rows


def _eviction_row(lm, p, name: str, ratio: float, cfg: QualityConfig, ref: _Reference, layers, stop) -> dict:
    """One (policy, ratio) on one problem: teacher-forced KL, the free generation's measures, the proxy.

    ``KL = sum_v p_full(v) (log p_full(v) - log p_evicted(v))`` at every position of the full-cache
    generation, clamped at 0 (rounding), its mean and max; ``proxy_attn_err`` the mean over the proxy
    layers of ``run_token_eviction``'s attention-output relative error.
    """
    from policies import attention_metrics, run_token_eviction
    from traces.answers import extract_answer, is_correct

    from calibrate.evicting_cache import EvictingCache, window_layers

    L, tok, P, total = lm.n_layers, lm.tokenizer, len(ref.prompt), ref.total
    base = _make_policy(name)
    K = _budget(total, ratio, cfg.buffer, base.sinks)
    pol = _make_policy(name, budget=K, buffer=cfg.buffer)
    rngs = lambda: [np.random.default_rng([cfg.seed, p.index, l]) for l in range(L)]  # noqa: E731
    keep = window_layers(lm.model)
    c = EvictingCache(L, pol, P, lm.n_kv_heads, rngs(), keep_layers=keep).attach(lm.model)
    with c:
        _, lp = _decode(lm, ref.prompt, c, len(ref.ids), stop, forced=ref.ids)
    kl = (ref.p * (ref.logp - lp)).sum(-1).clamp(min=0)
    rec = {"problem": int(p.index), "policy": name, "compression": float(ratio), "budget": K,
           "buffer": cfg.buffer, "prompt_len": P, "gen_len": len(ref.ids),
           "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
           "evictions": int(c.n_events // (L - len(keep)))}
    if cfg.free_generation:
        c2 = EvictingCache(L, pol, P, lm.n_kv_heads, rngs(), keep_layers=keep).attach(lm.model)
        with c2:
            t0 = time.perf_counter()
            g, _ = _decode(lm, ref.prompt, c2, cfg.long_decode, stop)
            rec["seconds"] = time.perf_counter() - t0
        ans = extract_answer(tok.decode(g, skip_special_tokens=True), p.answer_kind)
        rec.update(answer=ans, agree=bool(ans == ref.answer), repetition=repetition_rate(g),
                   correct=bool(is_correct(ans, p.truth, p.answer_kind)), gen_len_free=len(g))
    # the simulator's proxy on the full-cache K/V/Q of the recorded layers
    errs = []
    for l in layers:
        Kx, Vx, Qx = (x[: total - 1] for x in ref.kvq[l])
        res = run_token_eviction(pol, Kx, Vx, Qx, P, np.random.default_rng([cfg.seed, p.index, l - 1]))
        errs.append(attention_metrics(res, full=ref.fulls[l])["attn_output_rel_error"])
    rec["proxy_attn_err"] = float(np.mean(errs))
    return rec


def _quality_summary(df: pd.DataFrame, cfg: QualityConfig, n_problems: int) -> dict:
    """``quality.json``: the mean measures per (policy, ratio) and the Spearman rank correlation of proxy and KL."""
    from scipy.stats import spearmanr

    ev = df[df["policy"] != "full"]
    agg = ev.groupby(["policy", "compression"], as_index=False).agg(
        kl=("kl_mean", "mean"), proxy=("proxy_attn_err", "mean"),
        **({"agreement": ("agree", "mean"), "repetition": ("repetition", "mean"), "accuracy": ("correct", "mean")}
           if cfg.free_generation else {}))
    rho = spearmanr(agg["proxy"], agg["kl"]) if len(agg) > 2 else None
    return {"n_problems": n_problems, "long_decode": cfg.long_decode,
            "full_accuracy": float(df[df["policy"] == "full"]["correct"].mean()),
            "spearman_proxy_vs_kl": None if rho is None else float(rho.statistic),
            "spearman_pvalue": None if rho is None else float(rho.pvalue),
            "table": agg.to_dict("records"), "config": {**dataclasses.asdict(cfg)}}


def format_quality(res: dict) -> str:
    lines = [f"{'policy':<14}{'ratio':>6}{'KL':>9}{'proxy':>8}{'agree':>7}{'rep':>6}{'acc':>6}"]
    for r in res["table"]:
        lines.append(f"{r['policy']:<14}{r['compression']:>6.0f}{r['kl']:>9.4f}{r['proxy']:>8.3f}"
                     f"{r.get('agreement', float('nan')):>7.2f}{r.get('repetition', float('nan')):>6.2f}"
                     f"{r.get('accuracy', float('nan')):>6.2f}")
    lines.append(f"Spearman(proxy, KL) = {res['spearman_proxy_vs_kl']}; full-cache accuracy {res['full_accuracy']:.2f}")
    return "\n".join(lines)
