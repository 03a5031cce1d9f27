"""Element-wise kernels of a decoder layer under two kernel stacks, counted from their source code.

A per-operator profile times what its stack launches. vLLM (and Vidur, which profiles vLLM's
kernels) runs RMSNorm, RoPE and SiLU(gate)*up as one fused kernel each; Hugging Face
transformers in eager mode (LLMServingSim's profiler, ``transformers==4.57.3`` in its
``profiler/v0/docker.sh``; the timed regions are in its ``profiler/v0/models/llama.py``) runs
each as a chain of PyTorch element-wise kernels. The stack changes how many kernels one
operator launches and how many bytes they move; it does not change how fast one
element-wise kernel streams. So a stack is structural: kernel counts and bytes follow from
the model's shape (``n`` tokens, width ``d``, ``H`` / ``Hkv`` heads of ``Dh``, MLP width
``F``), and the coefficients that price them (``eff_elem``, ``per_kernel_s``) are the fit's.

``vllm`` (one kernel each, 2-byte activations, ``s = 2``)::

    RMSNorm       1 kernel    B = s (2 n d + d)
    RoPE          1 kernel    B = s 2 n (H + Hkv) Dh
    SiLU(g) * u   1 kernel    B = s 3 n F

``hf-eager`` (``LlamaRMSNorm.forward``, ``apply_rotary_pos_emb`` and ``rotate_half``,
``LlamaMLP``'s ``act_fn(gate) * up``; float32 is 4 bytes)::

    RMSNorm   8 kernels: x.to(float32) 6nd, pow(2) 8nd, mean(-1) 4nd + 4n, + eps 8n, rsqrt 8n,
              x * rsqrt 8nd + 4n, .to(float16) 6nd, weight * x 4nd + 2d
              B = 36 n d + 24 n + 2 d
    RoPE     10 kernels: per tensor t in (q, k) with E_t elements (n H Dh, n Hkv Dh):
              t * cos 4E + 2nDh, -x2 2E, cat 4E, rotate_half(t) * sin 4E + 2nDh, + 6E
              B = 20 n (H + Hkv) Dh + 8 n Dh
    SiLU(g) * u   2 kernels: silu(g) 4nF, * up 6nF          B = 10 n F

Element-wise kernels have no FLOP term, so a chain of ``k`` kernels costs
``B / (mem_bw eff_elem) + k per_kernel_s`` under the per-operator roofline whatever the
split of ``B`` between them.
"""
from __future__ import annotations

import numpy as np

STACKS = ("vllm", "hf-eager")
FAMILIES = ("norm", "rope", "act")


def elementwise(stack: str, family: str, n, d: int, H: int, Hkv: int, Dh: int, F: int):
    """``(kernels, bytes)`` of one element-wise operator of one layer at ``n`` tokens under ``stack``."""
    if stack not in STACKS:
        raise ValueError(f"unknown kernel stack {stack!r}; known: {', '.join(STACKS)}")
    n = np.asarray(n, dtype=np.float64)
    if family == "norm":
        return (1, 2.0 * (2 * n * d + d)) if stack == "vllm" else (8, 36.0 * n * d + 24.0 * n + 2.0 * d)
    if family == "rope":
        return ((1, 2.0 * 2 * n * (H + Hkv) * Dh) if stack == "vllm"
                else (10, 20.0 * n * (H + Hkv) * Dh + 8.0 * n * Dh))
    if family == "act":
        return (1, 2.0 * 3 * n * F) if stack == "vllm" else (2, 10.0 * n * F)
    raise ValueError(f"no element-wise operator family {family!r}; known: {', '.join(FAMILIES)}")
