"""Reader of LLMServingSim's vLLM per-operator profiles (``calibrate/data/llmservingsim-perf/``, MIT: its SOURCE.md).

LLMServingSim's profiler (``profiler/``, version 1.0.0) runs one decoder layer of a model inside vLLM 0.19.0
(``--load-format dummy``, ``enforce_eager``) and reads vLLM's ``layerwise_profile()`` tree: the CUDA kernel time of
each vLLM module per call (``cuda_time_us / invocations`` over 3 timed forwards after one warm-up: a mean). So these
are vLLM's own kernels (fused q/k/v and gate/up GEMMs, fused RMSNorm, RoPE and SiLU*mul, its attention backend and
fused MoE), not a framework's reference modules. Files of one bundle (``<device>-<model>-<table>``):

* ``dense.csv`` ``layer, tokens, time_us``: token-parameterised modules (``qkv_proj``, ``o_proj``,
  ``gate_up_proj``, ``down_proj``, ``layernorm``, ``rotary_emb``, ``act_fn``, ``qk_norm``, ``embedding``,
  ``final_layernorm``) at 1..2,048 tokens;
* ``per_sequence.csv`` ``layer, sequences, time_us``: the logits processor (``lm_head``) and ``sampler`` at
  1..256 sequences (one row each sampled);
* ``attention.csv`` ``prefill_chunk, kv_prefill, n_decode, kv_decode, time_us``: vLLM's ``Attention`` over one
  batch: a prefill chunk of ``prefill_chunk`` new tokens over ``kv_prefill`` cached ones, beside ``n_decode``
  decodes each over ``kv_decode`` cached tokens (chunks 16..2,048, decodes 1..256, KV 16..16,384);
* ``moe.csv`` ``tokens, activated_experts, time_us`` (mixture-of-experts models): vLLM's whole sparse-MoE block
  (router gate and fused experts) with the routing forced so that exactly ``activated_experts`` distinct experts
  receive the ``tokens``' top-k picks (``profiler/core/hooks/moe_hook.py``).

At tensor parallel 2 (``tp2/``, :data:`TP2`) the same tables time one rank's shard (half the heads, the MLP width and
the vocabulary) on one GPU, without the all-reduces.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "llmservingsim-perf"
REPO = "github:casys-kaist/LLMServingSim"
SNAPSHOT = "5daddb21a545658d5150b535712d0494584b5278"
# (device, model) -> (upstream bundle folder, rksim model preset, commit that last changed the bundle's files)
BUNDLES = {
    ("rtxpro6000", "llama-3.1-8b"): ("profiler/perf/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16", "llama-3-8b",
                                     "3012eb1843305512415ac66dfef7743c9f1dea64"),
    ("rtxpro6000", "qwen3-32b"): ("profiler/perf/RTXPRO6000/Qwen/Qwen3-32B/bf16", "qwen3-32b",
                                  "3012eb1843305512415ac66dfef7743c9f1dea64"),
    ("rtxpro6000", "qwen3-30b-a3b"): ("profiler/perf/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
                                      "qwen3-30b-a3b", "3012eb1843305512415ac66dfef7743c9f1dea64"),
    ("rtx4090", "llama-3.1-8b"): ("profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16", "llama-3-8b",
                                  "856225aa912b821ab14f38dbe694cd3c3aebc73f"),
}
TABLES = {"dense": ("layer", "tokens", "time_us"), "per_sequence": ("layer", "sequences", "time_us"),
          "attention": ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"),
          "moe": ("tokens", "activated_experts", "time_us")}


# the bundles whose tensor-parallel-2 tables (each rank's shard, timed on one GPU) are shipped too
TP2 = (("rtxpro6000", "llama-3.1-8b"), ("rtxpro6000", "qwen3-32b"))


def path(device: str, model: str, table: str, tp: int = 1) -> Path:
    """The shipped copy of one table of one bundle at tensor parallel ``tp`` (1, or 2 for :data:`TP2`)."""
    if (device, model) not in BUNDLES:
        raise ValueError(f"no LLMServingSim vLLM profile for {device} {model}; shipped: "
                         + ", ".join(f"{d} {m}" for d, m in BUNDLES))
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; known: {', '.join(TABLES)}")
    if tp != 1 and not (tp == 2 and (device, model) in TP2):
        raise ValueError(f"no tensor-parallel-{tp} tables shipped for {device} {model}")
    return DATA / f"{device}-{model}{'' if tp == 1 else f'-tp{tp}'}-{table}.csv"


def upstream(device: str, model: str, table: str, tp: int = 1) -> str:
    """The table's path in LLMServingSim's repository."""
    return f"{BUNDLES[(device, model)][0]}/tp{tp}/{table}.csv"


def load(device: str, model: str, table: str, tp: int = 1) -> pd.DataFrame:
    """One table with its columns checked, ``time_us`` turned into ``seconds``."""
    p = path(device, model, table, tp)
    d = pd.read_csv(p)
    want = TABLES[table]
    if tuple(d.columns) != want:
        raise ValueError(f"{p}: columns must be {', '.join(want)}; got {', '.join(map(str, d.columns))}")
    t = d.pop("time_us").to_numpy(np.float64)
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(f"{p}: time_us must be positive numbers")
    return d.assign(seconds=t * 1e-6)
