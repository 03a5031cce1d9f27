"""Reader of LLMServingSim's H100 layer profiles (``calibrate/data/llmservingsim/``, MIT, see its SOURCE.md).

``layers.csv`` rows: ``layer_name, input, kv_cache, tp_size, latency(ns)``, the median
CUDA kernel time of one layer type of Llama-3.1-8B for one sequence of ``input`` new
tokens over ``kv_cache`` cached ones (0 on every shipped row), measured under Hugging
Face transformers + the PyTorch profiler in float16 (not vLLM's kernels: q, k, v and
gate, up are separate GEMMs; RMSNorm, RoPE and SiLU*mul are unfused; residual adds are
not timed).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "llmservingsim"
REPO = "github:casys-kaist/LLMServingSim"
SNAPSHOT = "5daddb21a545658d5150b535712d0494584b5278"
COMMIT = "3012eb1843305512415ac66dfef7743c9f1dea64"
FILES = {1: ("h100-llama-3.1-8b-tp1-layers.csv", "profiler/v0/perf_models/H100/meta-llama/Llama-3.1-8B/tp1/layers.csv"),
         2: ("h100-llama-3.1-8b-tp2-layers.csv", "profiler/v0/perf_models/H100/meta-llama/Llama-3.1-8B/tp2/layers.csv")}
COLUMNS = ("layer_name", "input", "kv_cache", "tp_size", "latency(ns)")


def layers_path(tp: int = 1) -> Path:
    if tp not in FILES:
        raise ValueError(f"no LLMServingSim H100 Llama-3.1-8B profile for tp {tp}; shipped: {sorted(FILES)}")
    return DATA / FILES[tp][0]


def load_layers(path: Path) -> pd.DataFrame:
    """Long table ``num_tokens, kv_cache, op, seconds`` of one ``layers.csv``."""
    d = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in d.columns]
    if missing:
        raise ValueError(f"{path}: not an LLMServingSim layers.csv (missing column(s) {', '.join(missing)})")
    return pd.DataFrame({"num_tokens": d["input"].to_numpy(np.int64), "kv_cache": d["kv_cache"].to_numpy(np.int64),
                         "op": d["layer_name"].astype(str).to_numpy(),
                         "seconds": d["latency(ns)"].to_numpy(np.float64) * 1e-9})
