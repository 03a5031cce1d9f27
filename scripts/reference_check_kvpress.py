"""The kvpress half of ``make reference-check``: kvpress's own presses on captured Q/K/V.

Runs in the reference-check virtualenv (``kvpress==0.5.5`` with the transformers it pins,
CPU torch), never in the project's: it imports neither rksim nor anything the project
installs. ``scripts/reference_check.py`` calls it with the folder of captured ``.npy``
arrays and reads back, per press config, layer and KV head, the token indices kvpress keeps.

How the presses are driven (kvpress compresses once, after prefill, in a forward hook
on each attention layer): each press's own ``compress(module, hidden_states, keys,
values, attentions, kwargs)`` is called on the captured post-RoPE keys/values of the whole
prompt, ``(1, H_kv, T, D)``. ``attentions`` is what kvpress receives from a model loaded
with ``attn_implementation="eager"``: the causal attention matrix that transformers'
``eager_attention_forward`` returns, computed here with that very function from the
captured queries and keys. ``ObservedAttentionPress`` needs it; SnapKV slices its last
``window_size`` rows from it (the same rows its sdpa path recomputes from the hidden
states). ``compress`` returns the kept rows (kvpress's ``compute_n_kept`` and ``topk``);
their indices are recovered by matching each kept key row with the captured ones (the
rows of distinct positions differ, RoPE alone makes sure of it).

Usage: ``python scripts/reference_check_kvpress.py QKV_DIR OUT_JSON``
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


def presses(ratio: float) -> dict:
    from kvpress import CURPress, ObservedAttentionPress, SnapKVPress, StreamingLLMPress

    return {
        "snapkv-w32": SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=5),
        "snapkv-w64": SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5),
        "streamingllm": StreamingLLMPress(compression_ratio=ratio, n_sink=4),
        "cur-local16": CURPress(compression_ratio=ratio, use_local_approximation=True, local_window_size=16),
        "cur-defaults": CURPress(compression_ratio=ratio),
        "observed-attention": ObservedAttentionPress(compression_ratio=ratio),
    }


def eager_attentions(module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(1, H_q, T, T) causal attention probabilities, from transformers' eager attention."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    T = q.shape[2]
    mask = torch.full((T, T), torch.finfo(q.dtype).min, dtype=q.dtype).triu(1)[None, None]
    _, w = eager_attention_forward(module, q, k, k, mask, scaling=module.head_dim ** -0.5)
    return w


def kept_indices(keys: torch.Tensor, kept_keys: torch.Tensor) -> list[list[int]]:
    """Per KV head, the sorted positions of ``kept_keys``'s rows within ``keys``."""
    out = []
    for h in range(keys.shape[1]):
        where = {keys[0, h, j].numpy().tobytes(): j for j in range(keys.shape[2])}
        if len(where) != keys.shape[2]:
            raise SystemExit(f"reference-check: head {h}: duplicate key rows; indices are ambiguous")
        out.append(sorted(where[kept_keys[0, h, i].numpy().tobytes()] for i in range(kept_keys.shape[2])))
    return out


def main(qkv_dir: str, out_json: str) -> int:
    from importlib.metadata import version

    torch.set_num_threads(1)  # a shared CPU; the tensors are small
    torch.manual_seed(0)  # no press here draws; kept for any that would
    qkv = Path(qkv_dir)
    meta = json.loads((qkv / "meta.json").read_text())
    H, Hq, D = meta["n_kv_heads"], meta["n_heads"], meta["head_dim"]
    ratio = float(meta["compression"])
    result = {"kvpress_version": version("kvpress"), "transformers_version": version("transformers"),
              "torch_version": torch.__version__, "compression": ratio, "kept": {}}
    for name in presses(ratio):
        result["kept"][name] = {}
    for layer in meta["layers"]:
        ld = lambda x: torch.from_numpy(np.load(qkv / f"L{layer:02d}_{x}.npy", allow_pickle=False))  # noqa: E731
        # captured (T, H, D) -> kvpress's (1, H, T, D); float64 so the scores are not rounded
        Q, K, V = (ld(x).permute(1, 0, 2).unsqueeze(0).to(torch.float64).contiguous() for x in "QKV")
        T = K.shape[2]
        module = SimpleNamespace(config=SimpleNamespace(num_attention_heads=Hq, num_key_value_heads=H),
                                 head_dim=D, num_key_value_groups=Hq // H, training=False, layer_idx=layer - 1)
        attn = eager_attentions(module, Q, K)
        hidden = torch.zeros(1, T, 1, dtype=torch.float64)  # only its length is read (SnapKV's assert)
        for name, press in presses(ratio).items():
            with torch.no_grad():
                k2, _ = press.compress(module, hidden, K, V, attn, {})
            result["kept"][name][str(layer)] = kept_indices(K, k2)
    fd, tmp = tempfile.mkstemp(dir=str(Path(out_json).parent), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_json)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: reference_check_kvpress.py QKV_DIR OUT_JSON")
    sys.exit(main(sys.argv[1], sys.argv[2]))
