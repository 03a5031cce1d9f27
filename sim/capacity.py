"""KV capacity of a target and the serving settings (scheduler limits, memory utilisation).

DESIGN §5: memory is what the policies buy, so it must become batch size::

    kv_capacity_bytes = mem_capacity * gpu_memory_utilization - weight_bytes - activation_reserve_bytes

* ``mem_capacity``: the device's byte count as the driver reports it
  (``nvidia-smi --query-gpu=memory.total``), set in each hardware preset with
  its source — an "80 GB" H100 SXM reports 81,559 MiB, not 80e9 bytes.
* ``gpu_memory_utilization``: vLLM's default 0.90 (``--gpu-memory-utilization``).
* ``activation_reserve_bytes``: what vLLM's profiling run finds besides the
  weights, estimated (:func:`activation_reserve`) as the peak activations of
  one forward of ``max_num_batched_tokens`` tokens plus the sampler's float32
  logits for ``max_num_seqs`` rows plus 1 GiB for the CUDA context, cuBLAS
  workspaces and CUDA graphs (vLLM logs "non-torch memory" and graph memory of
  roughly that size on H100s); settable.

Scheduler defaults per hardware follow vLLM V1's ``EngineArgs`` defaults for
``vllm serve`` (usage context OPENAI_API_SERVER, vllm/engine/arg_utils.py,
``_set_default_args_v1``, vLLM 0.8-0.10): GPUs with >= 70 GiB other than A100
get ``max_num_batched_tokens = 8192``, ``max_num_seqs = 1024``; others 2048 and
256. A user preset not listed gets the second pair.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import ConfigError
from .kvcache import KVCacheError, check_size
from .options import check_value, declared, option
from .scheduler import POLICIES, SchedulerConfig

GIB = 1 << 30
DEFAULT_UTILIZATION = 0.90           # vLLM --gpu-memory-utilization default
NON_TORCH_RESERVE = 1 * GIB          # CUDA context, cuBLAS/NCCL workspaces, CUDA graphs (estimate)
MAX_BLOCKS = 1 << 40                 # bound on any block count a user gives
MAX_BLOCK_SIZE = 4096                # bound on block_size (vLLM's CUDA kernels support up to 256)
MAX_FRAC = 1e6                       # bound on kv_budget_frac (above 1 it no longer binds)
MAX_DECODE_TOKENS = 1 << 20

# vLLM V1 `vllm serve` defaults by device (source in the module docstring).
SCHEDULER_DEFAULTS = {
    "h100-sxm": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},
    "h200": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},
    "a100-80gb": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},   # A100 is excluded from the large defaults
    "l4": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
    "local-cpu": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
}
GENERIC_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}


# Where each preset's mem_capacity comes from (also a comment in the preset file).
CAPACITY_SOURCES = {
    "h100-sxm": "nvidia-smi memory.total: 81,559 MiB (H100 80GB HBM3 SXM5)",
    "a100-80gb": "nvidia-smi memory.total: 81,920 MiB (A100-SXM4-80GB)",
    "h200": "nvidia-smi memory.total: 143,771 MiB (H200 SXM 141GB)",
    "l4": "nvidia-smi memory.total: 23,034 MiB (L4)",
    "local-cpu": "the calibration machine's memory (calibrate fit)",
}


class CapacityError(KVCacheError):
    """A problem or request that cannot fit in the KV capacity (the message says by how much), or a bad serving
    setting. ``field`` names the :class:`ServingConfig` setting at fault (``"kv_capacity_bytes"`` for a
    capacity too small), as :class:`sim.errors.ConfigError`'s does; ``None`` when no single setting is."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


SERVING_OPTIONS: list = []  # ServingConfig's option fields, filled once below the class


@dataclass(frozen=True)
class ServingConfig:
    """Serving settings (CLI ``--scheduler``, ``--max-num-seqs``, ...); None = the hardware default."""

    scheduler: str = option("vllm-v1", kind=str, choices=POLICIES, flag="--scheduler", metavar="NAME",
                            aliases=("--batch-scheduler",),
                            help="vllm-v1 (default: vLLM 0.33's V1 rules: running decodes first, chunked prefill, a waiting "
                                 "request admitted only if its whole prompt fits), vllm-v1-chunk-admit (admits on its first "
                                 "chunk: scheduler_reserve_full_isl=False) or prefill-first")
    max_num_seqs: int | None = option(None, lo=1, hi=1 << 20, flag="--max-num-seqs", metavar="S",
                                      help="running sequences cap (default: the hardware's)")
    max_num_batched_tokens: int | None = option(None, lo=1, hi=1 << 24, flag="--max-num-batched-tokens", metavar="M",
                                                help="tokens per iteration (default: the hardware's vLLM default)")
    gpu_memory_utilization: float = option(DEFAULT_UTILIZATION, kind=float, gt=0, hi=1,
                                           flag="--gpu-memory-utilization", metavar="U",
                                           help="share of device memory for weights + activations + KV, in (0, 1] "
                                                "(default 0.90)")
    activation_reserve_bytes: float | None = option(None, kind=float, lo=0, hi=1e18, flag="--activation-reserve-bytes",
                                                    metavar="B",
                                                    help="activation reserve in bytes (default: estimated, "
                                                         "docs/simulator.md)")
    kv_capacity_bytes: float | None = option(None, kind=float, lo=0, hi=1e18, flag="--kv-capacity-bytes", metavar="B",
                                             help="KV capacity in bytes (default: memory x utilisation - weights - "
                                                  "activation reserve)")
    decode_tokens: int | None = option(None, lo=1, hi=MAX_DECODE_TOKENS, flag="--decode-tokens", metavar="T",
                                       help="token policies: extend the long decodes to T tokens (results say "
                                            "length_extrapolated; default: the recorded length)")
    prefix_caching: bool = option(True, kind=bool, help="prefix caching across problems and branches")

    def __post_init__(self) -> None:
        # The declarations above are the bounds; errors name the flag (the CLI's and the dashboard's name).
        for f, opt in SERVING_OPTIONS or declared(self):
            try:
                check_value(opt.flag or f.name, opt, getattr(self, f.name))
            except ConfigError as exc:
                raise CapacityError(str(exc), field=f.name) from None

    @classmethod
    def from_any(cls, x) -> "ServingConfig":
        if x is None:
            return DEFAULT_SERVING
        if isinstance(x, cls):
            return x
        if not isinstance(x, dict):
            raise CapacityError(f"serving: expected a dict of serving settings, got {type(x).__name__}")
        names = set(cls.__dataclass_fields__)
        bad = set(x) - names
        if bad:
            raise CapacityError(f"serving: unknown setting(s) {', '.join(sorted(bad))}; valid: {', '.join(sorted(names))}")
        return cls(**{k: v for k, v in x.items() if v is not None or k in ("max_num_seqs",)})

    def scheduler_config(self, hw_name: str) -> SchedulerConfig:
        d = SCHEDULER_DEFAULTS.get(hw_name, GENERIC_DEFAULTS)
        return SchedulerConfig(max_num_seqs=int(self.max_num_seqs or d["max_num_seqs"]),
                               max_num_batched_tokens=int(self.max_num_batched_tokens or d["max_num_batched_tokens"]),
                               policy=self.scheduler)

    def to_dict(self) -> dict:
        return asdict(self)


SERVING_OPTIONS.extend(declared(ServingConfig))  # its option fields, once
DEFAULT_SERVING = ServingConfig()          # frozen: every default run shares it


def activation_reserve(model, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel_size: int = 1) -> float:
    """Estimated non-KV memory of a forward besides the weights (bytes), on one GPU.

    ``tokens * s * (4 d + 2 F / TP) + seqs * V * 4 + 1 GiB``: the residual stream, the
    q/k/v/o activations and the MLP's gate and up projections of one layer at a
    time for ``max_num_batched_tokens`` tokens (``s`` bytes each; a tensor-parallel
    rank holds ``F / TP`` of the MLP's), the sampler's float32 logits for
    ``max_num_seqs`` rows (the whole vocabulary on every rank: vLLM gathers the
    logits), and :data:`NON_TORCH_RESERVE`.
    """
    d, F, V, s = model.hidden_size, model.intermediate_size, model.vocab_size, model.dtype_bytes
    f = F if tensor_parallel_size == 1 else F / tensor_parallel_size
    return float(max_num_batched_tokens * s * (4 * d + 2 * f) + max_num_seqs * V * 4 + NON_TORCH_RESERVE)


def kv_capacity(model, hw, serving: ServingConfig | None = None, parallel=None) -> dict:
    """``{kv_capacity_bytes, capacity_source, mem_capacity_bytes, gpu_memory_utilization,
    weight_bytes, activation_reserve_bytes}`` for a target (module docstring).

    ``parallel`` (a :class:`sim.parallel.ParallelConfig`; None or TP = PP = 1: one GPU, the formula
    above) gives the capacity of one replica of TP x PP GPUs: :func:`replica_kv_capacity`.
    """
    if parallel is not None and not parallel.is_single:
        return replica_kv_capacity(model, hw, serving, parallel)
    sv = serving or ServingConfig()
    sc = sv.scheduler_config(hw.name)
    if sv.activation_reserve_bytes is not None:
        reserve, rsrc = float(sv.activation_reserve_bytes), "given"
    else:
        reserve, rsrc = activation_reserve(model, sc.max_num_batched_tokens, sc.max_num_seqs), "estimated"
    mem_src = CAPACITY_SOURCES.get(hw.name)
    out = {"mem_capacity_bytes": float(hw.mem_capacity), "gpu_memory_utilization": float(sv.gpu_memory_utilization),
           "weight_bytes": float(model.weight_bytes), "activation_reserve_bytes": reserve,
           "activation_reserve_source": rsrc}
    if sv.kv_capacity_bytes is not None:
        out["kv_capacity_bytes"] = float(sv.kv_capacity_bytes)
        out["capacity_source"] = "given (--kv-capacity-bytes)"
    else:
        out["kv_capacity_bytes"] = max(0.0, hw.mem_capacity * sv.gpu_memory_utilization - model.weight_bytes - reserve)
        out["capacity_source"] = (f"{hw.name}: mem_capacity {hw.mem_capacity:.6g} B ({mem_src or hw.source or 'preset'})"
                                  f" x {sv.gpu_memory_utilization:g} - weights - activation reserve ({rsrc})")
    return out


def replica_kv_capacity(model, hw, serving: ServingConfig | None, parallel) -> dict:
    """KV capacity of one TP x PP replica, per GPU and in total.

    Each GPU of stage ``k`` (``ell_k`` layers, :func:`sim.parallel.stage_layers`) holds its weight
    shard ``W_k`` (:func:`sim.parallel.rank_weight_bytes`) and its activation reserve ``A``
    (:func:`activation_reserve` at TP), and keeps KV for ``Hkv_r`` heads of its layers
    (``Hkv_r`` = :func:`sim.parallel.kv_heads_per_rank`: replicated KV heads cost memory on every rank)::

        kv_rank_k   = mem_capacity * gpu_memory_utilization - W_k - A
        tokens_k    = kv_rank_k / (2 ell_k Hkv_r Dh s)
        tokens      = min_k tokens_k                      # every stage must hold every token's KV
        kv_capacity_bytes = tokens * 2 L Hkv Dh s         # in the whole model's bytes per token

    so the engine's block arithmetic (``bytes / (block_size * model.kv_bytes_per_token)``) gives the
    replica's block count unchanged.
    """
    from .parallel import kv_heads_per_rank, rank_weight_bytes, stage_layers

    sv = serving or ServingConfig()
    sc = sv.scheduler_config(hw.name)
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if sv.activation_reserve_bytes is not None:
        reserve, rsrc = float(sv.activation_reserve_bytes), "given"
    else:
        reserve, rsrc = activation_reserve(model, sc.max_num_batched_tokens, sc.max_num_seqs, tp), "estimated"
    usable = hw.mem_capacity * sv.gpu_memory_utilization
    w = rank_weight_bytes(model, tp, pp)
    hkv = kv_heads_per_rank(model.n_kv_heads, tp)
    ranks = []
    for ell, wk in zip(stage_layers(model.n_layers, pp), w):
        per_tok = 2.0 * ell * hkv * model.head_dim * model.dtype_bytes
        kvb = max(0.0, usable - wk - reserve)
        ranks.append({"layers": ell, "weight_bytes": wk, "kv_bytes": kvb, "kv_bytes_per_token": per_tok,
                      "kv_tokens": kvb / per_tok})
    tokens = min(r["kv_tokens"] for r in ranks)
    out = {"mem_capacity_bytes": float(hw.mem_capacity), "gpu_memory_utilization": float(sv.gpu_memory_utilization),
           "weight_bytes": float(max(w)), "activation_reserve_bytes": reserve, "activation_reserve_source": rsrc,
           "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "per_rank": ranks,
           "kv_tokens": tokens, "kv_heads_per_rank": hkv}
    if sv.kv_capacity_bytes is not None:
        out["kv_capacity_bytes"] = float(sv.kv_capacity_bytes)
        out["capacity_source"] = "given (--kv-capacity-bytes)"
    else:
        out["kv_capacity_bytes"] = float(tokens * model.kv_bytes_per_token)
        out["capacity_source"] = (f"{hw.name} x {tp * pp} (TP {tp} x PP {pp}): per GPU mem_capacity "
                                  f"{hw.mem_capacity:.6g} B x {sv.gpu_memory_utilization:g} - weight shard - "
                                  f"activation reserve ({rsrc}); the replica holds the fewest tokens of any stage")
    return out


def fits(model, hw, serving: ServingConfig | None = None, parallel=None, min_kv_tokens: int = 16) -> bool:
    """True when every GPU of the layout keeps room for ``min_kv_tokens`` tokens of KV (one block)."""
    cap = kv_capacity(model, hw, serving, parallel)
    tokens = cap.get("kv_tokens", cap["kv_capacity_bytes"] / model.kv_bytes_per_token)
    return tokens >= min_kv_tokens


def smallest_fitting(model, hw, serving: ServingConfig | None = None, max_gpus: int = 64, node=None,
                     min_kv_tokens: int = 16):
    """The smallest TP x PP (fewest GPUs; then the larger TP, kept inside a node) that fits, or None.

    Candidates are the layouts :meth:`sim.parallel.ParallelConfig.validate` accepts for the model
    (and the node: TP within one node).
    """
    from .parallel import TP_SIZES, ParallelConfig, ParallelError

    cands = []
    for tp in TP_SIZES:
        for pp in range(1, min(model.n_layers, max_gpus // tp) + 1):
            par = ParallelConfig(tp, pp)
            try:
                par.validate(model, node)
            except ParallelError:
                continue
            cands.append(par)
    for par in sorted(cands, key=lambda p: (p.gpus_per_replica, -p.tensor_parallel_size)):
        if fits(model, hw, serving, par, min_kv_tokens):
            return par
    return None


def check_fits(model, hw, serving: ServingConfig | None = None, parallel=None, node=None,
               min_kv_tokens: int = 16) -> dict:
    """The capacity of the layout, or :class:`CapacityError` naming the smallest TP x PP that would fit."""
    cap = kv_capacity(model, hw, serving, parallel)
    tokens = cap.get("kv_tokens", cap["kv_capacity_bytes"] / model.kv_bytes_per_token)
    if tokens >= min_kv_tokens:
        return cap
    tp = parallel.tensor_parallel_size if parallel is not None else 1
    pp = parallel.pipeline_parallel_size if parallel is not None else 1
    best = smallest_fitting(model, hw, serving, node=node, min_kv_tokens=min_kv_tokens)
    hint = ("no layout of up to 64 GPUs fits" if best is None else
            f"the smallest that fits: --tensor-parallel-size {best.tensor_parallel_size} "
            f"--pipeline-parallel-size {best.pipeline_parallel_size} ({best.gpus_per_replica} GPUs)")
    raise CapacityError(
        f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp}: {model.name} does not fit on {hw.name}: "
        f"{cap['weight_bytes'] / 1e9:.1f} GB of weights + {cap['activation_reserve_bytes'] / 1e9:.1f} GB activation "
        f"reserve per GPU against {hw.mem_capacity * cap['gpu_memory_utilization'] / 1e9:.1f} GB usable "
        f"(x {cap['gpu_memory_utilization']:g}), no room for {min_kv_tokens} tokens of KV; {hint}")


def capacity_blocks(kv_bytes: float, block_size: int, kv_bytes_per_token: float) -> int:
    """Whole blocks of ``block_size`` tokens that fit in ``kv_bytes``."""
    return int(kv_bytes // (block_size * kv_bytes_per_token))


def check_block_budget(name: str, value, allow_none: bool = True):
    """A block budget (count) in ``0..MAX_BLOCKS``."""
    return check_size(name, value, 0, MAX_BLOCKS, allow_none=allow_none)


def check_budget_frac(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_FRAC:
        raise CapacityError(f"{name}: must be a number in (0, {MAX_FRAC:g}], got {value!r}")
    return float(value)


def check_block_size(name: str, value) -> int:
    return check_size(name, value, 1, MAX_BLOCK_SIZE)
