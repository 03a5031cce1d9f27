"""CUDA graphs as vLLM V1 runs them: which iterations replay a graph, and the padding that costs.

vLLM V1 (``cudagraph_mode`` FULL_AND_PIECEWISE, the default since 0.11; ``docs/design/cuda_graphs.md``)
captures graphs for a list of batch sizes in *tokens* and, per iteration of ``T`` scheduled tokens:

* ``T <= max(capture_sizes)``: pads the batch to the smallest capture size ``T' >= T`` and replays
  a graph of ``T'`` tokens. A *uniform decode* batch (every request one new token) replays a full
  graph, attention included; any other batch (prefill chunks, mixed) replays the piecewise graph,
  in which attention runs eagerly between the captured pieces (one launched kernel per layer);
* ``T > max(capture_sizes)``: runs eagerly, every kernel launched;
* ``--enforce-eager``: always eagerly.

The default capture sizes (``vllm/config/vllm.py``, ``VllmConfig._set_cudagraph_sizes``)::

    max_size = min(2 max_num_seqs, 512)
    sizes = [1, 2, 4] + [8, 16, ..., 248] + [256, 272, ..., <= max_size]

(the multiples of 8 below 256, then of 16 up to ``max_size``). Padding rows run the captured
linear layers, norms and activations like real tokens; the LM head and sampler run on the real rows
only (vLLM computes logits outside the graph, on the sampled positions). The padded tokens' cost
is priced by :class:`sim.cost.terms.ScalarCost` (``graphs``); graphed kernels cost ``per_kernel_graph_s``
(:class:`sim.cost.hardware.HardwareProfile`), launched ones ``per_kernel_s``, and an eager iteration's host
launches, ``eager_launch_s`` each, bound it from below (``sim.cost.roofline``).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

MAX_CAPTURE = 512          # vLLM's cap on the default largest capture size


def vllm_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM V1's default ``cudagraph_capture_sizes`` for ``max_num_seqs`` (formula in the module docstring)."""
    top = min(2 * int(max_num_seqs), MAX_CAPTURE)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return tuple(s for s in sizes if s <= top) or (1,)


@dataclass(frozen=True)
class CudaGraphs:
    """The captured batch sizes (tokens, ascending) of one engine; :meth:`padded` picks the graph."""

    capture_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        s = self.capture_sizes
        if not s or any(not isinstance(x, int) or x < 1 for x in s) or list(s) != sorted(set(s)):
            raise ValueError(f"capture_sizes: a non-empty ascending list of distinct positive integers, got {s!r}")

    @classmethod
    def vllm(cls, max_num_seqs: int) -> "CudaGraphs":
        return cls(vllm_capture_sizes(max_num_seqs))

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1]

    def padded(self, tokens: float) -> int | None:
        """The graph size an iteration of ``tokens`` scheduled tokens replays (>= tokens), or None: eager."""
        if tokens <= 0 or tokens > self.max_size:
            return None
        return self.capture_sizes[bisect.bisect_left(self.capture_sizes, tokens)]


def engine_graphs(hw, max_num_seqs: int, enforce_eager: bool = False) -> CudaGraphs | None:
    """The graphs a vLLM engine on ``hw`` captures: None on a device without CUDA graphs
    (``hw.cuda_graphs`` false: a CPU) or under ``--enforce-eager``."""
    if enforce_eager or not getattr(hw, "cuda_graphs", False):
        return None
    return CudaGraphs.vllm(max_num_seqs)
