"""Operator rows of the public per-operator profiles, with their cost-model terms.

Every measured row is one operator (``n`` tokens through a ``K x N`` weight, an element-wise kernel,
or attention over ``c`` cached tokens) with its flops ``F`` and bytes ``B`` as the cost model counts
them (the formulas: :mod:`calibrate.public_profiles`). Sources: Vidur (:mod:`calibrate.vidur`),
LLMServingSim (:mod:`calibrate.llmservingsim`), LLMCompass (:mod:`calibrate.llmcompass`), aiconfigurator
(:mod:`calibrate.aiconfigurator`); each
profile's repository, commit and license: :func:`source_of`.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from . import aiconfigurator, kernel_stacks, llmcompass, llmservingsim, llmservingsim_perf, vidur

S = 2.0  # every source profiles float16
LAYER_FAMILIES = ("qkv", "o", "gate_up", "down", "norm", "rope", "act", "add", "attention")
FAMILY_ORDER = LAYER_FAMILIES + ("attention_mixed", "lm_head", "matmul", "softmax", "layernorm", "gelu")


@dataclasses.dataclass(frozen=True)
class Shape:
    """The model dimensions the operator terms need."""

    name: str
    d: int
    H: int
    Hkv: int
    Dh: int
    F: int
    V: int


LLAMA_2_7B = Shape("llama-2-7b", 4096, 32, 32, 128, 11008, 32000)
LLAMA_3_8B = Shape("llama-3-8b", 4096, 32, 8, 128, 14336, 128256)  # Llama-3.1-8B has the same shape


def _shape_from_vidur(attrs: dict, name: str) -> Shape:
    s = attrs["shape"]
    d, H = s["n_embd"], s["n_head"]
    return Shape(name, d, H, s["n_kv_head"], d // H, s["n_expanded_embd"], s["vocab_size"])


def op_rows(profile: str, family: str, kind: str, n, seconds, F, B, c=0, op=None, in_layer=True,
          host_timed=False, kernels=1, K=0, N=0) -> pd.DataFrame:
    n = np.asarray(n, dtype=np.float64)
    bc = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), n.shape)  # noqa: E731
    return pd.DataFrame({"profile": profile, "op": op or family, "family": family, "kind": kind,
                         "n": n, "c": np.broadcast_to(np.asarray(c, dtype=np.float64), n.shape),
                         "seconds": np.asarray(seconds, dtype=np.float64),
                         "F": np.broadcast_to(np.asarray(F, dtype=np.float64), n.shape),
                         "B": np.broadcast_to(np.asarray(B, dtype=np.float64), n.shape), "in_layer": in_layer,
                         "host_timed": host_timed, "kernels": float(kernels), "K": bc(K), "N": bc(N)})


def gemm_rows(profile: str, family: str, n, seconds, K: int, N: int, **kw) -> pd.DataFrame:
    """Rows of ``n`` tokens through a ``K x N`` weight: ``F = 2 n K N``, ``B = s K N`` (the weight stream)."""
    n = np.asarray(n, dtype=np.float64)
    return op_rows(profile, family, "gemm", n, seconds, 2.0 * n * K * N, S * K * N + 0.0 * n, K=K, N=N, **kw)


def vidur_rows(device: str, model: str, tp: int = 1) -> pd.DataFrame:
    """Operator rows of one Vidur ``mlp.csv`` at tensor parallel ``tp`` (the embedding gather left out).

    At ``tp > 1`` each row times one rank's shard: the shape is the rank's, split as vLLM splits it
    (:func:`sim.cost.parallel.kv_heads_per_rank`: ``H / TP`` query heads, ``max(1, Hkv / TP)`` KV heads,
    ``F / TP`` MLP width; ``d`` whole).
    """
    prof = vidur.load_mlp(vidur.mlp_path(device, model), tp)
    m = _shape_from_vidur(prof.attrs, model)
    if tp > 1:
        from sim.cost.parallel import kv_heads_per_rank
        m = dataclasses.replace(m, H=m.H // tp, Hkv=kv_heads_per_rank(m.Hkv, tp), F=m.F // tp)
    key = f"vidur-{device}-{model}" + (f"-tp{tp}" if tp > 1 else "")
    d, H, Hkv, Dh, Fm = m.d, m.H, m.Hkv, m.Dh, m.F
    out = []
    for op, g in prof.groupby("op", sort=False):
        n = g["num_tokens"].to_numpy(np.float64)
        t = g["seconds"].to_numpy()
        z = 0.0 * n
        if op == "attn_pre_proj":
            out.append(gemm_rows(key, "qkv", n, t, d, (H + 2 * Hkv) * Dh, op=op))
        elif op == "attn_post_proj":
            out.append(gemm_rows(key, "o", n, t, H * Dh, d, op=op))
        elif op == "mlp_up_proj":
            out.append(gemm_rows(key, "gate_up", n, t, d, 2 * Fm, op=op))
        elif op == "mlp_down_proj":
            out.append(gemm_rows(key, "down", n, t, Fm, d, op=op))
        elif op in ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act"):
            fam = {"attn_rope": "rope", "mlp_act": "act"}.get(op, "norm")
            k, B = kernel_stacks.elementwise("vllm", fam, n, d, H, Hkv, Dh, Fm)
            out.append(op_rows(key, fam, "elem", n, t, z, B, op=op, kernels=k))
        elif op == "add":
            out.append(op_rows(key, "add", "elem", n, t, z, S * 3 * n * d, op=op))
    return pd.concat(out, ignore_index=True)


def llmservingsim_rows(tp: int = 1, stack: str = "vllm") -> pd.DataFrame:
    """Operator rows of LLMServingSim's H100 Llama-3.1-8B ``layers.csv`` (per-rank shapes at ``tp``).

    ``stack`` prices its RMSNorm, RoPE and SiLU*up rows (:mod:`calibrate.kernel_stacks`):
    ``"vllm"`` with one fused kernel's bytes each, kind ``elem_unfused`` (held out of the
    presets' fit: the stack those rows ran is not the one the presets follow); ``"hf-eager"``
    with the kernel count and bytes of the Hugging Face code that produced them, kind ``elem``
    (fit rows like any other element-wise kernel).
    """
    prof = llmservingsim.load_layers(llmservingsim.layers_path(tp))
    m = LLAMA_3_8B
    d, H, Hkv, Dh, Fm, V = m.d, m.H // tp, m.Hkv // tp, m.Dh, m.F // tp, m.V // tp
    key = "llmservingsim-h100-llama-3.1-8b" + ("" if tp == 1 else f"-tp{tp}") + ("" if stack == "vllm" else f"@{stack}")
    ekind = "elem_unfused" if stack == "vllm" else "elem"
    gem = {"q_proj": ("qkv", d, H * Dh), "k_proj": ("qkv", d, Hkv * Dh), "v_proj": ("qkv", d, Hkv * Dh),
           "o_proj": ("o", H * Dh, d), "gate_proj": ("gate_up", d, Fm), "up_proj": ("gate_up", d, Fm),
           "down_proj": ("down", Fm, d), "lm_head": ("lm_head", d, V)}
    out = []
    for op, g in prof.groupby("op", sort=False):
        n = g["num_tokens"].to_numpy(np.float64)
        c = g["kv_cache"].to_numpy(np.float64)
        t = g["seconds"].to_numpy()
        z = 0.0 * n
        if op in gem:
            fam, K, N = gem[op]
            out.append(gemm_rows(key, fam, n, t, K, N, op=op, in_layer=op != "lm_head"))
        elif op == "attn":
            out.append(op_rows(key, "attention", "attn", n, t, 4.0 * H * Dh * (n * c + n * (n + 1.0) / 2.0),
                             S * 2.0 * Hkv * Dh * (c + n), c=c, op=op))
        elif op in ("input_layernorm", "post_layernorm", "rope", "act_fn"):
            fam = {"rope": "rope", "act_fn": "act"}.get(op, "norm")
            k, B = kernel_stacks.elementwise(stack, fam, n, d, H, Hkv, Dh, Fm)
            out.append(op_rows(key, fam, ekind, n, t, z, B, op=op, kernels=k))
        # embedding and final_layernorm: outside the decoder layer, not priced as operators here
    return pd.concat(out, ignore_index=True)


def llmcompass_rows() -> pd.DataFrame:
    """LLMCompass's A100 matmul / softmax / LayerNorm / GELU rows (``M`` plays the tokens).

    Timed on the host (``time.time()`` around the call and ``torch.cuda.synchronize()``), so each
    row carries a launch-and-synchronise overhead the kernel-timed sources do not: the fit gives
    these rows their own intercept (``host_call_s``, reported, not a preset coefficient). A matmul
    here is a generic ``M x K`` by ``K x N`` product: its bytes are all three operands,
    ``s (M K + K N + M N)``, not a weight stream alone.
    """
    prof = llmcompass.load_operators()
    key = "llmcompass-a100"
    out = []
    for op, g in prof.groupby("op", sort=False):
        M = g["M"].to_numpy(np.float64)
        t = g["seconds"].to_numpy()
        if op == "matmul":
            N, K = g["N"].to_numpy(np.float64), g["K"].to_numpy(np.float64)
            out.append(op_rows(key, "matmul", "gemm", M, t, 2.0 * M * N * K, S * (M * K + K * N + M * N),
                             in_layer=False, host_timed=True, K=K, N=N))
        else:
            out.append(op_rows(key, op, "elem", M, t, 0.0 * M, S * 2.0 * g["elements"].to_numpy(), in_layer=False,
                             host_timed=True))
    return pd.concat(out, ignore_index=True)


def _shape_of_preset(name: str) -> Shape:
    from sim.cost.profiles import load_model
    m = load_model(name)
    return Shape(name, m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim, m.intermediate_size, m.vocab_size)


def perf_rows(device: str, model: str, part: str, tp: int = 1) -> pd.DataFrame:
    """Operator rows of one LLMServingSim vLLM profile (:mod:`calibrate.llmservingsim_perf`) at tensor parallel ``tp``.

    ``part`` ``"ops"``: the decoder layer's GEMMs and fused element-wise kernels (``dense.csv``) and the LM head
    (``per_sequence.csv``, one row per sampled sequence); ``"attention"``: ``attention.csv``, each row one batch
    whose flops and KV bytes are summed over its items, the prefill chunk (``n = prefill_chunk`` over
    ``c = kv_prefill``) and ``n_decode`` decodes (``n = 1`` over ``c = kv_decode``), as :mod:`sim.cost.terms`
    sums an iteration's. Batches of decodes alone or of a prefill chunk alone are kind ``attn``; batches mixing
    both are kind ``attn_mixed`` (family ``attention_mixed``), which a preset holds out of its fit and reports:
    one roofline over the summed flops and bytes misses them (docs/calibration.md). The two parts are two profiles
    of the fit (each weighted as one), so the 19,000 attention batches do not outweigh the 1,400 operator rows.
    Left out: ``embedding`` and ``final_layernorm``
    (outside the decoder layer), ``qk_norm`` (Qwen3's per-head RMSNorm, which the cost model does not charge) and
    ``sampler`` (sampling, priced with the host's time per step). At ``tp`` 2 the rows are one rank's shard,
    priced with the rank's shape as vLLM splits it (:func:`sim.cost.parallel.kv_heads_per_rank`: ``H / TP`` query
    heads, ``max(1, Hkv / TP)`` KV heads, ``F / TP`` MLP width, ``V / TP`` vocabulary; ``d`` whole).
    """
    folder, preset, _ = llmservingsim_perf.BUNDLES[(device, model)]
    m = _shape_of_preset(preset)
    if tp > 1:
        from sim.cost.parallel import kv_heads_per_rank
        m = dataclasses.replace(m, H=m.H // tp, Hkv=kv_heads_per_rank(m.Hkv, tp), F=m.F // tp, V=m.V // tp)
    key = (f"llmservingsim-{device}-{model}" + ("" if tp == 1 else f"-tp{tp}")
           + ("" if part == "ops" else f"-{part}"))
    d, H, Hkv, Dh, Fm, V = m.d, m.H, m.Hkv, m.Dh, m.F, m.V
    out = []
    if part == "attention":
        a = llmservingsim_perf.load(device, model, "attention", tp)
        npf, cp = a["prefill_chunk"].to_numpy(np.float64), a["kv_prefill"].to_numpy(np.float64)
        nd, cd = a["n_decode"].to_numpy(np.float64), a["kv_decode"].to_numpy(np.float64)
        F = 4.0 * H * Dh * ((npf * cp + npf * (npf + 1.0) / 2.0) + nd * (cd + 1.0))
        B = S * 2.0 * Hkv * Dh * ((cp + npf) * (npf > 0) + nd * (cd + 1.0))
        mixed = (npf > 0) & (nd > 0)
        return pd.concat([op_rows(key, fam, kind, (npf + nd)[sel], a["seconds"].to_numpy()[sel], F[sel], B[sel],
                                  c=((cp * npf + cd * nd) / np.maximum(npf + nd, 1.0))[sel], op=op,
                                  in_layer=False)   # a batch over cached tokens: no layer sum at n tokens
                          for op, fam, kind, sel in (("attention_decode", "attention", "attn", npf == 0),
                                                     ("attention_prefill", "attention", "attn", nd == 0),
                                                     ("attention_mixed", "attention_mixed", "attn_mixed", mixed))],
                         ignore_index=True)
    if part != "ops":
        raise ValueError(f"unknown part {part!r} of an LLMServingSim vLLM profile; known: ops, attention")
    gem = {"qkv_proj": ("qkv", d, (H + 2 * Hkv) * Dh), "o_proj": ("o", H * Dh, d),
           "gate_up_proj": ("gate_up", d, 2 * Fm), "down_proj": ("down", Fm, d)}
    dense = llmservingsim_perf.load(device, model, "dense", tp)
    for op, g in dense.groupby("layer", sort=False):
        n = g["tokens"].to_numpy(np.float64)
        t = g["seconds"].to_numpy()
        if op in gem:
            fam, K, N = gem[op]
            out.append(gemm_rows(key, fam, n, t, K, N, op=op))
        elif op in ("layernorm", "rotary_emb", "act_fn"):
            fam = {"rotary_emb": "rope", "act_fn": "act"}.get(op, "norm")
            k, B = kernel_stacks.elementwise("vllm", fam, n, d, H, Hkv, Dh, Fm)
            out.append(op_rows(key, fam, "elem", n, t, 0.0 * n, B, op=op, kernels=k))
    seq = llmservingsim_perf.load(device, model, "per_sequence", tp)
    g = seq[seq["layer"] == "lm_head"]
    out.append(gemm_rows(key, "lm_head", g["sequences"].to_numpy(np.float64), g["seconds"].to_numpy(), d, V,
                         op="lm_head", in_layer=False))
    return pd.concat(out, ignore_index=True)


def _aic_gemm_rows(device: str) -> pd.DataFrame:
    """aiconfigurator's bf16 GEMM table as operator rows (family ``matmul``, not in a layer)."""
    g = aiconfigurator.load(device, "gemm")
    parts = [gemm_rows(f"aiconfigurator-{device}-gemm", "matmul", s["m"].to_numpy(), s["seconds"].to_numpy(), int(k), int(n),
                  op="gemm", in_layer=False) for (k, n), s in g.groupby(["k", "n"], sort=True)]
    return pd.concat(parts, ignore_index=True)


def _aic_attention_rows(device: str, kv_dtype: str = "bfloat16") -> pd.DataFrame:
    """aiconfigurator's FlashAttention 3 decode and prefill batches as operator rows (family ``attention``; module docstring).

    ``n`` is the batch's new tokens, ``c`` the cached tokens each reads. Prefill is measured with a bf16 cache
    only; ``kv_dtype`` ``"fp8"`` gives the decode rows with 1-byte KV reads alone.
    """
    s_kv = {"bfloat16": S, "fp8": 1.0}[kv_dtype]
    key = f"aiconfigurator-{device}-attention" + ("" if kv_dtype == "bfloat16" else f"-kv-{kv_dtype}")
    g = aiconfigurator.load(device, "generation_attention")
    g = g[g["kv_cache_dtype"] == kv_dtype]
    b, c = g["batch_size"].to_numpy(np.float64), g["step"].to_numpy(np.float64)
    H, Hkv, Dh = (g[x].to_numpy(np.float64) for x in ("num_heads", "num_key_value_heads", "head_dim"))
    out = [op_rows(key, "attention", "attn", b, g["seconds"].to_numpy(), 4.0 * H * Dh * b * (c + 1.0),
                   s_kv * 2.0 * Hkv * Dh * b * (c + 1.0), c=c, op="attention_decode", in_layer=False)]
    if kv_dtype == "bfloat16":
        p = aiconfigurator.load(device, "context_attention")
        b, n = p["batch_size"].to_numpy(np.float64), p["isl"].to_numpy(np.float64)
        H, Hkv, Dh = (p[x].to_numpy(np.float64) for x in ("num_heads", "num_key_value_heads", "head_dim"))
        out.append(op_rows(key, "attention", "attn", b * n, p["seconds"].to_numpy(),
                           4.0 * H * Dh * b * n * (n + 1.0) / 2.0, S * 2.0 * Hkv * Dh * b * n, c=0.0,
                           op="attention_prefill", in_layer=False))
    return pd.concat(out, ignore_index=True)


def aiconfigurator_rows(device: str, part: str) -> pd.DataFrame:
    """One aiconfigurator profile: ``part`` ``"gemm"``, ``"attention"`` or ``"attention-kv-fp8"``."""
    if part == "gemm":
        return _aic_gemm_rows(device)
    if part not in ("attention", "attention-kv-fp8"):
        raise ValueError(f"unknown part {part!r} of an aiconfigurator profile; known: gemm, attention, attention-kv-fp8")
    return _aic_attention_rows(device, "fp8" if part.endswith("fp8") else "bfloat16")


# LLMServingSim's vLLM profiles (perf_rows): each model's operators and its attention, at TP 1 and, where shipped, 2
PERF_PROFILES = {
    **{f"llmservingsim-{dev}-{mod}" + ("" if part == "ops" else f"-{part}"):
       (lambda dev=dev, mod=mod, part=part: perf_rows(dev, mod, part))
       for dev, mod in llmservingsim_perf.BUNDLES for part in ("ops", "attention")},
    **{f"llmservingsim-{dev}-{mod}-tp2" + ("" if part == "ops" else f"-{part}"):
       (lambda dev=dev, mod=mod, part=part: perf_rows(dev, mod, part, 2))
       for dev, mod in llmservingsim_perf.TP2 for part in ("ops", "attention")},
}
PROFILES = {
    "vidur-h100-llama-2-7b": lambda: vidur_rows("h100", "llama-2-7b"),
    "llmservingsim-h100-llama-3.1-8b": lambda: llmservingsim_rows(1),
    "llmservingsim-h100-llama-3.1-8b@hf-eager": lambda: llmservingsim_rows(1, "hf-eager"),
    "vidur-h100-codellama-34b": lambda: vidur_rows("h100", "codellama-34b"),
    "vidur-h100-internlm-20b": lambda: vidur_rows("h100", "internlm-20b"),
    "vidur-a100-llama-2-7b": lambda: vidur_rows("a100", "llama-2-7b"),
    "vidur-a100-llama-3-8b": lambda: vidur_rows("a100", "llama-3-8b"),
    "llmcompass-a100": llmcompass_rows,
    **PERF_PROFILES,
    # vLLM 0.24's own kernels timed whole by NVIDIA's aiconfigurator (calibrate.aiconfigurator): cuBLAS bf16 GEMMs
    # on a grid of weights, FlashAttention 3 decode and prefill batches; decode over an fp8 cache reported apart
    **{f"aiconfigurator-{dev}-{part}": (lambda dev=dev, part=part: aiconfigurator_rows(dev, part))
       for dev in aiconfigurator.DEVICES for part in ("gemm", "attention", "attention-kv-fp8")},
}


def source_of(profile: str) -> dict:
    """Repository, path(s), commit and license of a profile (what a preset lists)."""
    if profile.startswith("vidur-"):
        _, dev, model = profile.split("-", 2)
        f, path, commit = vidur.MLP_FILES[(dev, model)]
        return {"repo": vidur.REPO, "path": path, "commit": commit, "license": "MIT",
                "shipped": f"calibrate/data/vidur/{f}"}
    for (dev, mod), (folder, _, commit) in llmservingsim_perf.BUNDLES.items():
        for tp in (1, 2):
            base = f"llmservingsim-{dev}-{mod}" + ("" if tp == 1 else f"-tp{tp}")
            if profile in (base, f"{base}-attention"):
                tables = "attention" if profile.endswith("-attention") else "{dense,per_sequence}"
                here = f"{dev}-{mod}" + ("" if tp == 1 else f"-tp{tp}")
                return {"repo": llmservingsim_perf.REPO, "path": f"{folder}/tp{tp}/{tables}.csv", "commit": commit,
                        "license": "MIT", "shipped": f"calibrate/data/llmservingsim-perf/{here}-{tables}.csv"}
    if profile.startswith("llmservingsim-"):
        f, path = llmservingsim.FILES[1]
        return {"repo": llmservingsim.REPO, "path": path, "commit": llmservingsim.COMMIT, "license": "MIT",
                "shipped": f"calibrate/data/llmservingsim/{f}"}
    if profile.startswith("aiconfigurator-"):
        return aiconfigurator.source_of(profile)
    if profile == "llmcompass-a100":
        return {"repo": llmcompass.REPO, "path": "ae/figure5/{ab,cf,de,g}/real_hardware/*_A100.csv",
                "commit": llmcompass.COMMIT, "license": "BSD-3-Clause", "shipped": "calibrate/data/llmcompass/"}
    raise KeyError(profile)
