"""Readers of Vidur's published GPU profiles (``calibrate/data/vidur/``, MIT, see its SOURCE.md).

Vidur (Microsoft) profiles the per-layer non-attention operators of a model on
one GPU (``mlp.csv``: CUDA time of each operator, milliseconds, median over the
active steps, at ``num_tokens`` tokens per forward and ``num_tensor_parallel_workers``
per-rank shards) and NCCL collectives (``network/<topology>/<collective>.csv``:
milliseconds by message ``size`` in bytes and ``num_workers``). Its
``attention.csv`` files are not in the snapshot this project could read, so no
attention time comes from Vidur.

The operators of ``mlp.csv`` and what they run (vLLM-style fused kernels):
``attn_pre_proj`` (fused q, k, v GEMM), ``attn_post_proj`` (o), ``mlp_up_proj``
(fused gate and up), ``mlp_down_proj``, ``input_layernorm`` /
``post_attention_layernorm`` (RMSNorm), ``attn_rope``, ``mlp_act`` (SiLU(gate) *
up), ``add`` (residual add), ``emb`` (embedding gather).

The fits on these rows live in :mod:`calibrate.public_profiles`
(``python -m calibrate.public_profiles``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "vidur"
REPO = "github:microsoft/vidur"
SNAPSHOT = "7d47513363ec447a741ac5e47241580b47724fbf"
MLP_FILES = {  # (device, model) -> (file here, path upstream, commit that last changed it)
    ("a100", "llama-3-8b"): ("a100-meta-llama-3-8b-mlp.csv",
                             "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
                             "2bb7a086c74cd4639e86ff74ab07cd1fa0f9a97f"),
    ("a100", "llama-2-7b"): ("a100-llama-2-7b-mlp.csv",
                             "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
                             "bee57dafa1eb2dc422dcaec46a66975599a6a242"),
    ("h100", "llama-2-7b"): ("h100-llama-2-7b-mlp.csv",
                             "data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
                             "e26eb8f79fa9a6a7c38eac0f5291302402b20364"),
    ("h100", "codellama-34b"): ("h100-codellama-34b-mlp.csv",
                                "data/profiling/compute/h100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv",
                                "e26eb8f79fa9a6a7c38eac0f5291302402b20364"),
    ("h100", "internlm-20b"): ("h100-internlm-20b-mlp.csv",
                               "data/profiling/compute/h100/internlm/internlm-20b/mlp.csv",
                               "e26eb8f79fa9a6a7c38eac0f5291302402b20364"),
}
NETWORK_TOPOLOGIES = ("a100_dgx", "h100_dgx", "a100_pairwise_nvlink", "h100_pairwise_nvlink")
COLLECTIVES = ("all_reduce", "send_recv")
NETWORK_COMMIT = "60277c06b41e49483609bdab55f71fe0fb5fdd54"
OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm",
             "post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb")


def mlp_path(device: str, model: str) -> Path:
    try:
        return DATA / MLP_FILES[(device, model)][0]
    except KeyError:
        raise ValueError(f"no Vidur mlp profile shipped for device {device!r}, model {model!r}; shipped: "
                         + ", ".join(f"{d}/{m}" for d, m in MLP_FILES)) from None


def load_mlp(path: Path, tp: int = 1) -> pd.DataFrame:
    """Long table of one ``mlp.csv``: ``num_tokens, op, seconds`` (the median), tensor parallel ``tp`` rows.

    Sizes profiled twice keep both rows. The shape columns come back in ``df.attrs["shape"]``
    (``n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size``).
    """
    d = pd.read_csv(path)
    missing = [c for c in ("num_tokens", "num_tensor_parallel_workers") if c not in d.columns]
    if missing:
        raise ValueError(f"{path}: not a Vidur mlp profile (missing column(s) {', '.join(missing)})")
    d = d[d["num_tensor_parallel_workers"] == tp]
    if d.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    rows = [pd.DataFrame({"num_tokens": d["num_tokens"].to_numpy(np.int64), "op": op,
                          "seconds": d[f"time_stats.{op}.median"].to_numpy(np.float64) * 1e-3})
            for op in OPERATORS if f"time_stats.{op}.median" in d.columns]
    out = pd.concat(rows, ignore_index=True)
    out.attrs["shape"] = {k: int(d[k].iloc[0]) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd",
                                                         "vocab_size")}
    return out


def network_path(topology: str, collective: str) -> Path:
    if topology not in NETWORK_TOPOLOGIES or collective not in COLLECTIVES:
        raise ValueError(f"no Vidur network profile {topology}/{collective}; shipped: topologies "
                         f"{', '.join(NETWORK_TOPOLOGIES)}, collectives {', '.join(COLLECTIVES)}")
    return DATA / "network" / topology / f"{collective}.csv"


def load_network(topology: str, collective: str) -> pd.DataFrame:
    """``num_workers, devices_per_node, size_bytes, seconds`` (median) of one collective profile."""
    p = network_path(topology, collective)
    d = pd.read_csv(p)
    col = f"time_stats.{collective}.median"
    if col not in d.columns:
        raise ValueError(f"{p}: missing column {col!r}")
    return pd.DataFrame({"num_workers": d["num_workers"].to_numpy(np.int64),
                         "devices_per_node": d["devices_per_node"].to_numpy(np.int64),
                         "size_bytes": d["size"].to_numpy(np.int64),
                         "seconds": d[col].to_numpy(np.float64) * 1e-3})


def fit_collective(df: pd.DataFrame) -> list[dict]:
    """Latency-bandwidth line per ``(num_workers, devices_per_node)``: ``t = alpha + size / beta``.

    Ordinary least squares on the median times, relative residuals (each row weighted by
    ``1 / t``), so small and large messages count alike. Returns one dict per group with
    ``alpha_s``, ``beta_bytes_per_s`` (the algorithm bandwidth, bytes of the message per
    second), ``rows`` and the median ``|relative error|``.
    """
    out = []
    for (w, dpn), g in df.groupby(["num_workers", "devices_per_node"], sort=True):
        x = g["size_bytes"].to_numpy(np.float64)
        y = g["seconds"].to_numpy(np.float64)
        A = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
        alpha, inv_beta = float(max(coef[0], 0.0)), float(max(coef[1], 1e-30))
        pred = alpha + x * inv_beta
        out.append({"num_workers": int(w), "devices_per_node": int(dpn), "rows": int(len(g)),
                    "alpha_s": alpha, "beta_bytes_per_s": 1.0 / inv_beta,
                    "median_abs_rel_error": float(np.median(np.abs(pred / y - 1.0)))})
    return out
