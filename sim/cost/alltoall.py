"""Expert-parallel dispatch and combine under data-parallel attention, priced on the node's links.

vLLM 0.33 (``--data-parallel-size D --enable-expert-parallel``, EP size ``D x TP``): attention is data
parallel (each DP rank its own batch and KV cache, TP inside it), the experts are sharded over all
``D x TP`` GPUs. Its default ``all2all_backend`` is ``"allgather_reducescatter"`` (vllm/config/parallel.py
of vLLM 0.33.0, commit 4ba787ec9: ``all2all_backend: All2AllBackend = "allgather_reducescatter"``; the
``naive`` and ``pplx`` backends were removed and fall back to it, same file ``__post_init__``).
``AgRsAll2AllManager`` (vllm/distributed/device_communicators/all2all.py, same commit) dispatches by
``all_gatherv`` of the hidden states (and top-k weights / ids) over the DP group, and combines by
``reduce_scatterv`` over it: every DP rank receives every other DP rank's tokens, whichever experts they
picked. Per MoE layer, ``t`` tokens on each DP rank (vLLM pads the DP ranks to a common count,
``DPMetadata``), ``d`` hidden, ``s`` bytes::

    dispatch = allgather(D t d s, D) = allreduce(D t d s, D) / 2
    combine  = reducescatter(D t d s, D) = allreduce(D t d s, D) / 2

priced by NCCL's measured all-reduce lines of the node (:meth:`sim.cost.node.NodeProfile.allreduce_seconds`,
``custom=False``: vLLM's custom all-reduce is not used for all_gatherv / reduce_scatterv), halved because a
ring all-reduce is a reduce-scatter followed by an all-gather of the same bytes (the convention the LM-head
logits gather already uses). The top-k weights and ids (``k (4 + 4)`` bytes a token) are folded into
:func:`dispatch_bytes`.

A true all-to-all backend (DeepEP / pplx-style) sends a token only to the ranks holding its experts:
:func:`a2a_bytes_leaving_rank` is that volume (a token with ``k`` experts uniform over ``EP`` ranks reaches,
in expectation, ``(EP - 1) (1 - (1 - 1/EP)^k)`` other ranks, each once: DeepEP dedups per rank). It is
stated for comparison and not priced: vLLM 0.33 does not run it by default and no per-size line of it is
in a node preset.
"""
from __future__ import annotations

ALL2ALL_BACKENDS = ("allgather_reducescatter",)
DEFAULT_ALL2ALL_BACKEND = "allgather_reducescatter"   # vLLM 0.33.0 ParallelConfig.all2all_backend default
TOPK_META_BYTES = 8   # one float32 top-k weight + one int32 top-k id per selected expert (all_gatherv'd with the rows)


def dispatch_bytes(tokens_per_rank: float, hidden: int, dtype_bytes: float, dp: int, experts_per_token: int = 0) -> float:
    """Bytes each DP rank ends up holding after the all-gather: ``D t (d s + 8 k)``."""
    if dp < 1 or tokens_per_rank < 0:
        raise ValueError(f"--data-parallel-size: dispatch needs dp >= 1 and tokens >= 0, got dp={dp}, "
                         f"tokens={tokens_per_rank}")
    return float(dp) * float(tokens_per_rank) * (hidden * dtype_bytes + TOPK_META_BYTES * experts_per_token)


def dispatch_combine_seconds(node, tokens_per_rank: float, hidden: int, dtype_bytes: float, dp: int,
                             experts_per_token: int = 0, backend: str = DEFAULT_ALL2ALL_BACKEND) -> float:
    """Seconds of one MoE layer's dispatch + combine under DP attention (module docstring)::

        t = allreduce(D t (d s + 8 k), D) / 2 + allreduce(D t d s, D) / 2

    0 for ``dp = 1`` or no tokens (vLLM then needs no DP collective: the TP all-reduce prices the layer)."""
    if backend not in ALL2ALL_BACKENDS:
        raise ValueError(f"--all2all-backend: {backend!r} is not priced (only {', '.join(ALL2ALL_BACKENDS)}, "
                         "vLLM 0.33's default)")
    if dp <= 1 or tokens_per_rank <= 0:
        return 0.0
    d_bytes = dispatch_bytes(tokens_per_rank, hidden, dtype_bytes, dp, experts_per_token)
    c_bytes = dispatch_bytes(tokens_per_rank, hidden, dtype_bytes, dp, 0)
    return 0.5 * node.allreduce_seconds(d_bytes, dp, custom=False) + \
        0.5 * node.allreduce_seconds(c_bytes, dp, custom=False)


def a2a_bytes_leaving_rank(tokens: float, hidden: int, dtype_bytes: float, experts_per_token: int, ep: int) -> float:
    """Bytes one rank sends in a deduplicating all-to-all dispatch (DeepEP-style), in expectation::

        B = t d s (EP - 1) (1 - (1 - 1 / EP)^k)

    ``k`` experts a token, chosen uniformly over ``EP`` ranks; a combine sends the same back."""
    if ep < 1 or experts_per_token < 0:
        raise ValueError(f"--enable-expert-parallel: ep={ep}, experts_per_token={experts_per_token}")
    if ep == 1:
        return 0.0
    reach = (ep - 1) * (1.0 - (1.0 - 1.0 / ep) ** experts_per_token)
    return float(tokens) * hidden * dtype_bytes * reach
