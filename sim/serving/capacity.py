"""KV capacity of a target and the serving settings (scheduler limits, memory utilisation).

DESIGN §5: memory is what the policies buy, so it must become batch size. The KV cache is sized as
vLLM sizes it (``Worker.determine_available_memory``, vllm/v1/worker/gpu_worker.py, and
``memory_profiling``, vllm/utils/mem_utils.py)::

    requested         = total * gpu_memory_utilization
    available         = requested - (weights + activation_peak + non_torch + cudagraph)
    num_gpu_blocks    = floor(available / (16 * kv_bytes_per_token_of_one_rank))
    kv_capacity_bytes = num_gpu_blocks * 16 * kv_bytes_per_token

* ``total``: what ``cudaMemGetInfo`` reports (:data:`CUDA_TOTAL_BYTES` where a vLLM log or the device's
  reported total gives it), else
  the preset's ``mem_capacity`` (``nvidia-smi --query-gpu=memory.total``, set with its source).
* ``gpu_memory_utilization``: vLLM's default 0.90 (``--gpu-memory-utilization``).
* ``activation_peak``: the profiling run's peak PyTorch memory (:func:`activation_peak`: one forward of
  ``max_num_batched_tokens`` tokens, then the sampler on ``min(max_num_seqs, tokens)`` rows of logits).
* ``non_torch``, ``cudagraph``: per-GPU constants of the vLLM generation (:data:`VLLM_RULES`, each
  with the log it comes from). ``--activation-reserve-bytes`` replaces the three terms;
  ``--kv-capacity-bytes`` replaces the result.

Scheduler defaults per hardware follow vLLM V1's ``EngineArgs`` defaults for
``vllm serve`` (usage context OPENAI_API_SERVER, vllm/engine/arg_utils.py,
``_set_default_args_v1``, vLLM 0.8-0.10): GPUs with >= 70 GiB other than A100
get ``max_num_batched_tokens = 8192``, ``max_num_seqs = 1024``; others 2048 and
256. A user preset not listed gets the second pair.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sim.base.errors import ConfigError
from sim.serving.kvcache import KVCacheError, check_size
from sim.base.options import check_value, declared, option
from sim.serving.scheduler import POLICIES, SchedulerConfig

GIB = 1 << 30
DEFAULT_UTILIZATION = 0.90           # vLLM --gpu-memory-utilization default
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
    "rtx-pro-6000": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},   # 94.97 GiB: the large defaults
    "rtx-4090": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
    "local-cpu": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
}
GENERIC_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}


# Where each preset's mem_capacity comes from (also a comment in the preset file).
CAPACITY_SOURCES = {
    "h100-sxm": "nvidia-smi memory.total: 81,559 MiB (H100 80GB HBM3 SXM5)",
    "a100-80gb": "nvidia-smi memory.total: 81,920 MiB (A100-SXM4-80GB)",
    "h200": "nvidia-smi memory.total: 143,771 MiB (H200 SXM 141GB)",
    "l4": "nvidia-smi memory.total: 23,034 MiB (L4)",
    "rtx-pro-6000": "nvidia-smi memory.total: 97,887 MiB (RTX PRO 6000 Blackwell Server Edition)",
    "rtx-4090": "torch total_memory: 25,250,627,584 bytes (RTX 4090, LLMServingSim's bench meta.json)",
    "local-cpu": "the calibration machine's memory (calibrate fit)",
}


class CapacityError(KVCacheError):
    """A problem or request that cannot fit in the KV capacity (the message says by how much), or a bad serving
    setting. ``field`` names the :class:`ServingConfig` setting at fault (``"kv_capacity_bytes"`` for a
    capacity too small), as :class:`sim.base.errors.ConfigError`'s does; ``None`` when no single setting is."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class VllmMemoryRules:
    """How one vLLM generation sizes its KV cache (``Worker.determine_available_memory``).

    ``non_torch_tp1_bytes`` / ``non_torch_tpn_bytes``: memory allocated outside PyTorch between the
    baseline snapshot and the end of the profiling run (CUDA module loads, cuBLAS/NCCL/custom all-reduce
    buffers), per GPU, at TP 1 and TP > 1. ``sampler_bytes_per_logit``: bytes alive per element of the
    ``rows x V`` logits at the sampler's peak in ``_dummy_sampler_run``. ``cudagraph_bytes``: CUDA graph
    memory subtracted before the KV cache is sized (0 where the version does not). Each has a ``source``.
    """

    name: str
    non_torch_tp1_bytes: float
    non_torch_tpn_bytes: float
    sampler_bytes_per_logit: float
    cudagraph_bytes: float
    source: str


VLLM_RULES = {
    # vLLM V1 as the simulator models it (gpu_worker.py determine_available_memory at commit
    # 35d5cda123ec28581759b6d34cde8052314fb1e6: available = requested - (weights + torch_peak_increase +
    # non_torch_increase); CUDA graph memory estimated and subtracted by default since v0.21,
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS).
    "v1": VllmMemoryRules(
        "v1",
        # "non_torch_memory takes 0.03GiB", TP 1 (RTX 4060, vLLM 0.7): https://github.com/vllm-project/vllm/issues/13882
        non_torch_tp1_bytes=0.03 * GIB,
        # "non_torch_memory takes 0.43GiB", rank 0 of TP 4 (A100 40GB, vLLM 0.8.3):
        # https://github.com/vllm-project/vllm/issues/16570 (the baseline there precedes NCCL's init; V1's
        # snapshot follows it, so this was taken to bound V1's from above; vLLM 0.19 counts 2.07 GiB at TP 2 on an
        # H100, `v0.19` below, so it does not bound every V1 generation: docs/calibration.md, "KV capacity")
        non_torch_tpn_bytes=0.43 * GIB,
        # recent V1 sampler, bf16 logits (2 B, held by _dummy_sampler_run) + their float32 copy (4) +
        # apply_top_k_top_p_pytorch's logits_sort (4), logits_idx int64 (8), probs_sort (4) and top_p_mask (1)
        # alive together (vllm/v1/sample/ops/topk_topp_sampler.py; the dummy run sets top_k and top_p)
        sampler_bytes_per_logit=23.0,
        # "Estimated CUDA graph memory: 0.36 GiB total" (vLLM 0.27.1, TP 2): https://github.com/gpustack/runner/pull/251
        cudagraph_bytes=0.36 * GIB,
        source="vLLM V1 >= 0.21 (CUDA graph memory profiled before the KV cache)"),
    # vLLM 0.19.0 `vllm serve` on an H100 SXM (llm-d-planner's logs, docs/data/vllm-kv-capacity.yaml: `sets`), whose
    # "Memory profiling" line breaks each run down: Llama-3.1-8B "non-torch forward increase memory: 0.25GiB" (TP 1)
    # and "2.07GiB" (TP 2: NCCL and the custom all-reduce's buffers); its "torch peak memory increase: 1.89GiB" at
    # max_num_seqs 1024 sets the sampler's bytes per logit: (1.89 GiB - 8192 x 4096 x 2 B) / (1024 x 128256) = 14.94;
    # the CUDA graph estimate is logged but not subtracted (Available KV = requested - non-KV total, to the 0.01 GiB)
    "v0.19": VllmMemoryRules("v0.19", non_torch_tp1_bytes=0.25 * GIB, non_torch_tpn_bytes=2.07 * GIB,
                             sampler_bytes_per_logit=14.94, cudagraph_bytes=0.0,
                             source="vLLM 0.19.0 V1 (vllm serve, H100; CUDA graph memory not subtracted)"),
    # vLLM 0.11.0 `vllm serve` on an H100 (llm-d-benchmark's empirical table, docs/data/vllm-kv-capacity.yaml:
    # `sets`), each run's "Memory profiling" breakdown: non-torch 0.13 GiB for Llama-3.1-8B at TP 1 and 0.54 GiB
    # for Qwen3-32B at TP 2; Llama-3.1-8B's "torch peak memory increase" of 4.76 GiB at max_num_seqs 1024 sets the
    # sampler's bytes per logit, (4.76 GiB - 8192 x 4096 x 2 B) / (1024 x 128256) = 38.41; no CUDA graph term
    # (KV = requested - weights - peak - non-torch)
    "v0.11": VllmMemoryRules("v0.11", non_torch_tp1_bytes=0.13 * GIB, non_torch_tpn_bytes=0.54 * GIB,
                             sampler_bytes_per_logit=38.41, cudagraph_bytes=0.0,
                             source="vLLM 0.11.0 V1 (vllm serve, H100; no CUDA graph term)"),
    # vLLM 0.6.5 development build of https://github.com/vllm-project/vllm/pull/10511 (V0 worker,
    # memory_profiling): no CUDA graph term. Its per-run breakdown sets these constants:
    # Meta-Llama-3-8B on an H100, "non_torch_memory 1.79GiB" (TP 1) and "3.58GiB" (TP 2); "PyTorch activation
    # peak memory 1.26GiB" at both TP 1 and TP 2, so the sampler (whole vocabulary on rank 0), not the MLP
    # shard, sets the peak: (1.26 GiB - 8192 x 4096 x 2 B of hidden states) / (256 x 128256) = 39.1 B.
    "v0.6.5": VllmMemoryRules("v0.6.5", non_torch_tp1_bytes=1.79 * GIB, non_torch_tpn_bytes=3.58 * GIB,
                              sampler_bytes_per_logit=39.1, cudagraph_bytes=0.0,
                              source="vLLM 0.6.5-dev V0 worker (PR 10511)"),
}
DEFAULT_RULES = "v1"


def rules_for(name: str | VllmMemoryRules) -> VllmMemoryRules:
    if isinstance(name, VllmMemoryRules):
        return name
    try:
        return VLLM_RULES[name]
    except KeyError:
        raise CapacityError(f"vllm memory rules: unknown {name!r}; known: {', '.join(sorted(VLLM_RULES))}") from None


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
    memory_rules: str = option(DEFAULT_RULES, kind=str, choices=tuple(VLLM_RULES), flag="--vllm-memory-rules",
                               metavar="GEN",
                               help="how vLLM sizes the KV cache: the activation peak, non-torch and CUDA-graph terms of "
                                    "one vLLM generation, each from that generation's logs (v1: vLLM >= 0.21, default; "
                                    "v0.19; v0.11; v0.6.5; docs/calibration.md, \"KV capacity as vLLM sizes it\")")
    kv_capacity_bytes: float | None = option(None, kind=float, lo=0, hi=1e18, flag="--kv-capacity-bytes", metavar="B",
                                             help="KV capacity in bytes (default: memory x utilisation - weights - "
                                                  "activation reserve)")
    decode_tokens: int | None = option(None, lo=1, hi=MAX_DECODE_TOKENS, flag="--decode-tokens", metavar="T",
                                       help="token policies: extend the long decodes to T tokens (results say "
                                            "length_extrapolated; default: the recorded length)")
    prefix_caching: bool = option(True, kind=bool, help="prefix caching across problems and branches")
    enforce_eager: bool = option(False, kind=bool, flag="--enforce-eager",
                                 help="vLLM's flag: no CUDA graphs (every kernel launched from the host; no padding "
                                      "to capture sizes); default: graphs on a GPU whose profile has cuda_graphs")
    no_host_time: bool = option(False, kind=bool, flag="--no-host-time",
                                help="serving mode and plans: price the GPU's kernels only (default: each engine "
                                     "step's host time too, from the hardware profile's host_step where it has one)")
    no_async_scheduling: bool = option(False, kind=bool, flag="--no-async-scheduling",
                                       help="serving mode and plans: a step's host time adds to its GPU time, as "
                                            "vLLM runs without --async-scheduling (default: on, vLLM 0.33's default: "
                                            "the host work of one step overlaps the GPU work of the next)")

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


# ---------------------------------------------------------------------------- vLLM's KV sizing
VLLM_BLOCK_SIZE = 16   # vLLM's default --block-size on CUDA (vllm/config/cache.py)

# What cudaMemGetInfo reports as the device's total, the number vLLM multiplies by the utilisation
# (vllm/utils/mem_utils.py MemorySnapshot.measure: torch.cuda.mem_get_info). Logged by vLLM as
# total_gpu_memory; it is below nvidia-smi's memory.total. Devices not listed use the preset's mem_capacity.
CUDA_TOTAL_BYTES = {
    # "total_gpu_memory 79.22GiB", vllm serve meta-llama/Meta-Llama-3-8B on an H100 80GB,
    # https://github.com/vllm-project/vllm/pull/10511 (comment of 2024-12-14)
    "h100-sxm": 79.22 * GIB,
    # torch.cuda.get_device_properties().total_memory, which cudaMemGetInfo's total equals: 94.97 GiB on an RTX
    # PRO 6000 Blackwell Server Edition (LLMServingSim profiler/perf/RTXPRO6000/hardware.yaml, spec.memory_total_gib,
    # commit 1b2cc02d67a2647c9f0d67bf07debf240aba82b5); 25,250,627,584 bytes on an RTX 4090 (LLMServingSim
    # bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json, hardware.device_total_memory_bytes, snapshot 5daddb21)
    "rtx-pro-6000": 94.97 * GIB,
    "rtx-4090": 25250627584.0,
}


def activation_peak(model, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel_size: int = 1,
                    last_stage: bool = True, rules: str | VllmMemoryRules = DEFAULT_RULES) -> float:
    """Peak PyTorch memory of vLLM's profiling run above the weights, on one GPU (bytes).

    ``profile_run`` runs ``_dummy_run(max_num_batched_tokens)`` and then, on the last pipeline stage,
    ``_dummy_sampler_run`` on ``R = min(max_num_seqs, T)`` rows (the last token of each dummy request;
    vllm/v1/worker/gpu_model_runner.py). The peak is the larger of::

        forward = T * s * (2 d + max(3 F / TP, (2 H + 2 Hkv) Dh / TP))   # hidden + residual, and the
                                                                      # MLP's gate_up + act outputs or
                                                                      # q/k/v + attention output
        sampler = T * d * s + R * V * b                               # hidden states stay alive;
                                                                      # b: rules.sampler_bytes_per_logit

    with ``T = max_num_batched_tokens``; the logits are gathered whole on each rank.
    """
    r = rules_for(rules)
    d, F, V, s = model.hidden_size, model.intermediate_size, model.vocab_size, model.dtype_bytes
    tp = tensor_parallel_size
    T = int(max_num_batched_tokens)
    mlp = 3.0 * F / tp
    attn = (2.0 * model.n_heads + 2.0 * model.n_kv_heads) * model.head_dim / tp
    if not model.is_plain:
        if model.n_moe_layers:
            # fused MoE (TritonExperts.workspace_shapes, vllm/model_executor/layers/fused_moe/experts/triton_moe.py,
            # vLLM 0.33.0): workspaces (T, k, max(Fe/TP, d)) and (T, k, max(2 Fe/TP, d)) plus the (T, d) output
            Fe, k = model.moe_intermediate_size / tp, model.experts_per_token
            moe = k * (max(Fe, d) + max(2.0 * Fe, d)) + d
            mlp = max(mlp if model.first_k_dense else 0.0, moe)
        if model.is_mla:
            # MLA prefill: q, k expanded to heads (dn + dr), v (dv) and the output, per rank
            h = model.n_heads / tp
            attn = h * (2.0 * (model.qk_nope_head_dim + model.qk_rope_head_dim) + 2.0 * model.v_head_dim)
    forward = T * s * (2.0 * d + max(mlp, attn))
    if not last_stage:
        return float(forward)
    rows = min(int(max_num_seqs), T)
    sampler = T * d * s + rows * V * r.sampler_bytes_per_logit
    return float(max(forward, sampler))


def non_torch_bytes(tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                    rules: str | VllmMemoryRules = DEFAULT_RULES) -> float:
    """Non-torch memory vLLM counts per GPU: the TP 1 figure on a lone GPU, the TP > 1 one otherwise."""
    r = rules_for(rules)
    return float(r.non_torch_tp1_bytes if tensor_parallel_size * pipeline_parallel_size == 1
                 else r.non_torch_tpn_bytes)


def activation_reserve(model, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel_size: int = 1,
                       rules: str | VllmMemoryRules = DEFAULT_RULES) -> float:
    """Everything vLLM subtracts besides the weights, on one GPU (bytes)::

        reserve = activation_peak + non_torch + cudagraph

    (:func:`activation_peak`, :func:`non_torch_bytes`, ``rules.cudagraph_bytes``).
    """
    r = rules_for(rules)
    return float(activation_peak(model, max_num_batched_tokens, max_num_seqs, tensor_parallel_size, True, r)
                 + non_torch_bytes(tensor_parallel_size, 1, r) + r.cudagraph_bytes)


def vllm_kv_budget(model, total_bytes: float, gpu_memory_utilization: float, max_num_batched_tokens: int,
                   max_num_seqs: int, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                   rules: str | VllmMemoryRules = DEFAULT_RULES, block_size: int = VLLM_BLOCK_SIZE,
                   reserve_bytes: float | None = None, expert_parallel: bool = False,
                   ep_size: int | None = None) -> dict:
    """vLLM's KV cache size for a model on TP x PP GPUs of ``total_bytes`` each (``expert_parallel``: vLLM's
    ``--enable-expert-parallel``, the weight shards of :func:`sim.cost.parallel.rank_model` with ``ep``;
    ``ep_size``: the EP size when it is not TP, ``D x TP`` under DP attention: ``E / (D TP)`` experts a GPU).

    Per GPU of stage ``k`` (``ell_k`` layers, weight shard ``W_k``)::

        requested  = total_bytes * gpu_memory_utilization          # gpu_worker.py init_device
        available  = requested - (W_k + activation_peak_k + non_torch + cudagraph)
        page_k     = block_size * 2 * Hkv_r * Dh * s               # one layer's block (FullAttentionSpec)
        blocks_k   = floor(available / (page_k * ell_k))           # kv_cache_utils.get_kv_cache_config
        num_gpu_blocks = min_k blocks_k                            # every stage holds every block

    ``reserve_bytes`` (a user's activation reserve) replaces ``activation_peak + non_torch + cudagraph``.
    """
    from sim.cost.parallel import kv_heads_per_rank, rank_model, rank_weight_bytes, stage_layers

    r = rules_for(rules)
    tp, pp = int(tensor_parallel_size), int(pipeline_parallel_size)
    requested = float(total_bytes) * float(gpu_memory_utilization)
    hkv = kv_heads_per_rank(model.n_kv_heads, tp)
    nt = non_torch_bytes(tp, pp, r)
    parts = stage_layers(model.n_layers, pp)
    ranks = []
    start = 0
    for k, (ell, wk) in enumerate(zip(parts, rank_weight_bytes(model, tp, pp, expert_parallel, ep_size))):
        act = activation_peak(model, max_num_batched_tokens, max_num_seqs, tp, k == pp - 1, r)
        reserve = float(reserve_bytes) if reserve_bytes is not None else act + nt + r.cudagraph_bytes
        avail = max(0.0, requested - wk - reserve)
        per_tok = 2.0 * ell * hkv * model.head_dim * model.kv_elem_bytes   # --kv-cache-dtype fp8: 1 byte
        if not model.is_plain:
            # MLA: the latent, whole on every TP rank; sliding layers: one slot of the hybrid pool's block,
            # the largest group's pages (ModelShape.kv_bytes_per_token; kv_cache_planning.py, vLLM 0.33.0)
            per_tok = float(rank_model(model, tp, ell, start).kv_bytes_per_token)
        start += ell
        blocks = int(avail // (block_size * per_tok))
        ranks.append({"layers": ell, "weight_bytes": float(wk), "activation_peak_bytes": act,
                      "reserve_bytes": reserve, "kv_bytes": avail, "kv_bytes_per_token": per_tok,
                      "kv_tokens": avail / per_tok, "num_gpu_blocks": blocks})
    blocks = min(x["num_gpu_blocks"] for x in ranks)
    last = ranks[-1]
    return {"requested_bytes": requested, "non_torch_bytes": nt if reserve_bytes is None else 0.0,
            "activation_peak_bytes": max(x["activation_peak_bytes"] for x in ranks) if reserve_bytes is None else 0.0,
            "cudagraph_bytes": r.cudagraph_bytes if reserve_bytes is None else 0.0,
            "reserve_bytes": max(x["reserve_bytes"] for x in ranks), "num_gpu_blocks": blocks,
            "block_size": int(block_size), "kv_tokens": float(blocks * block_size),
            "available_kv_bytes_per_gpu": last["kv_bytes"], "per_rank": ranks, "memory_rules": r.name}


def _capacity(model, hw, serving: ServingConfig | None, tp: int, pp: int, ep: bool = False,
              ep_size: int | None = None) -> dict:
    sv = serving or ServingConfig()
    sc = sv.scheduler_config(hw.name)
    total = float(CUDA_TOTAL_BYTES.get(hw.name, hw.mem_capacity))
    given = sv.activation_reserve_bytes
    b = vllm_kv_budget(model, total, sv.gpu_memory_utilization, sc.max_num_batched_tokens, sc.max_num_seqs,
                       tp, pp, sv.memory_rules, reserve_bytes=given, expert_parallel=ep, ep_size=ep_size)
    rsrc = "given" if given is not None else "estimated"
    mem_src = CAPACITY_SOURCES.get(hw.name)
    out = {"mem_capacity_bytes": float(hw.mem_capacity), "cuda_total_bytes": total,
           "gpu_memory_utilization": float(sv.gpu_memory_utilization),
           "weight_bytes": float(max(x["weight_bytes"] for x in b["per_rank"])),
           "activation_reserve_bytes": b["reserve_bytes"], "activation_reserve_source": rsrc,
           "activation_peak_bytes": b["activation_peak_bytes"], "non_torch_bytes": b["non_torch_bytes"],
           "cudagraph_bytes": b["cudagraph_bytes"], "num_gpu_blocks": b["num_gpu_blocks"],
           "vllm_block_size": b["block_size"], "memory_rules": b["memory_rules"]}
    if sv.kv_capacity_bytes is not None:
        out["kv_capacity_bytes"] = float(sv.kv_capacity_bytes)
        out["capacity_source"] = "given (--kv-capacity-bytes)"
    else:
        # whole-model bytes of the blocks vLLM allocates: the engine's block arithmetic gives the same count
        out["kv_capacity_bytes"] = float(b["kv_tokens"] * model.kv_bytes_per_token)
        tot_src = "cudaMemGetInfo total" if hw.name in CUDA_TOTAL_BYTES else f"mem_capacity ({mem_src or hw.source or 'preset'})"
        out["capacity_source"] = (f"{hw.name}" + (f" x {tp * pp} (TP {tp} x PP {pp})" if tp * pp > 1 else "")
                                  + (f", E / {ep_size} experts a GPU (DP attention + EP)"
                                     if ep_size and ep_size > tp else "")
                                  + f": {tot_src} {total:.6g} B x {sv.gpu_memory_utilization:g} - weights - "
                                  f"activation peak - non-torch - CUDA graphs ({rsrc}), in whole "
                                  f"{b['block_size']}-token blocks (vLLM's determine_available_memory)")
    return out, b


def kv_capacity(model, hw, serving: ServingConfig | None = None, parallel=None) -> dict:
    """``{kv_capacity_bytes, capacity_source, mem_capacity_bytes, gpu_memory_utilization, weight_bytes,
    activation_reserve_bytes, activation_peak_bytes, non_torch_bytes, cudagraph_bytes, num_gpu_blocks, ...}``
    for a target: :func:`vllm_kv_budget` on one GPU (module docstring).

    ``parallel`` (a :class:`sim.cost.parallel.ParallelConfig`; None or TP = PP = 1: one GPU) gives the capacity
    of one replica of TP x PP GPUs: :func:`replica_kv_capacity`.
    """
    if parallel is not None and not parallel.one_gpu(model):
        return replica_kv_capacity(model, hw, serving, parallel)
    out, _ = _capacity(model, hw, serving, 1, 1)
    return out


def replica_kv_capacity(model, hw, serving: ServingConfig | None, parallel) -> dict:
    """KV capacity of one TP x PP replica, per GPU and in total (:func:`vllm_kv_budget` per stage).

    Each GPU of stage ``k`` (``ell_k`` layers, :func:`sim.cost.parallel.stage_layers`) holds its weight
    shard ``W_k`` (:func:`sim.cost.parallel.rank_weight_bytes`) and its reserve (activation peak of its
    stage at TP, non-torch memory at TP > 1, CUDA graphs), and keeps KV for ``Hkv_r`` heads of its
    layers (:func:`sim.cost.parallel.kv_heads_per_rank`: replicated KV heads cost memory on every rank)::

        blocks_k          = floor((total * util - W_k - reserve_k) / (16 * 2 ell_k Hkv_r Dh s))
        num_gpu_blocks    = min_k blocks_k
        kv_capacity_bytes = num_gpu_blocks * 16 * 2 L Hkv Dh s   # in the whole model's bytes per token

    so the engine's block arithmetic (``bytes / (block_size * model.kv_bytes_per_token)``) gives the
    replica's block count unchanged.
    """
    from sim.cost.parallel import kv_heads_per_rank

    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    ep = bool(getattr(parallel, "enable_expert_parallel", False))
    # DP attention + EP: each GPU holds E / (D TP) experts (ParallelConfig.expert_parallel_size)
    eps = parallel.expert_parallel_size(model) if ep else None
    out, b = _capacity(model, hw, serving, tp, pp, ep, eps)
    out.update({"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "per_rank": b["per_rank"],
                "kv_tokens": b["kv_tokens"], "kv_heads_per_rank": kv_heads_per_rank(model.n_kv_heads, tp)})
    return out


def fits(model, hw, serving: ServingConfig | None = None, parallel=None, min_kv_tokens: int = 16) -> bool:
    """True when every GPU of the layout keeps room for ``min_kv_tokens`` tokens of KV (one block)."""
    cap = kv_capacity(model, hw, serving, parallel)
    tokens = cap.get("kv_tokens", cap["kv_capacity_bytes"] / model.kv_bytes_per_token)
    return tokens >= min_kv_tokens


def smallest_fitting(model, hw, serving: ServingConfig | None = None, max_gpus: int = 64, node=None,
                     min_kv_tokens: int = 16):
    """The smallest TP x PP (fewest GPUs; then the larger TP, kept inside a node) that fits, or None.

    Candidates are the layouts :meth:`sim.cost.parallel.ParallelConfig.validate` accepts for the model
    (and the node: TP within one node).
    """
    from sim.cost.parallel import TP_SIZES, ParallelConfig, ParallelError

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
    if serving is not None and serving.kv_capacity_bytes is not None:   # the user's capacity, not the weights'
        raise CapacityError(f"--kv-capacity-bytes: {serving.kv_capacity_bytes:g} B holds {tokens:.3g} tokens of "
                            f"{model.priced_name}'s KV ({model.kv_bytes_per_token:g} B each), fewer than one block "
                            f"of {min_kv_tokens}", field="kv_capacity_bytes")
    tp = parallel.tensor_parallel_size if parallel is not None else 1
    pp = parallel.pipeline_parallel_size if parallel is not None else 1
    best = smallest_fitting(model, hw, serving, node=node, min_kv_tokens=min_kv_tokens)
    hint = ("no layout of up to 64 GPUs fits" if best is None else
            f"the smallest that fits: --tensor-parallel-size {best.tensor_parallel_size} "
            f"--pipeline-parallel-size {best.pipeline_parallel_size} ({best.gpus_per_replica} GPUs)")
    raise CapacityError(
        f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp}: {model.priced_name} does not fit on {hw.name}: "
        f"{cap['weight_bytes'] / 1e9:.1f} GB of weights + {cap['activation_reserve_bytes'] / 1e9:.1f} GB activation "
        f"reserve per GPU against {hw.mem_capacity * cap['gpu_memory_utilization'] / 1e9:.1f} GB usable "
        f"(x {cap['gpu_memory_utilization']:g}), no room for {min_kv_tokens} tokens of KV; {hint}")


def capacity_blocks(kv_bytes: float, block_size: int, kv_bytes_per_token: float) -> int:
    """Whole blocks of ``block_size`` tokens that fit in ``kv_bytes``."""
    return int(kv_bytes // (block_size * kv_bytes_per_token))


def kv_blocks(model, hw, serving: ServingConfig | None, parallel, block_size: int, node=None) -> tuple[dict, int]:
    """A served replica's KV capacity (:func:`kv_capacity`) and its whole blocks of ``block_size`` tokens. A capacity
    of no block is refused as :func:`check_fits` refuses a layout, naming the layout, the memory fraction and the
    smallest layout that fits (or ``--kv-capacity-bytes`` where the user gave the capacity), not later by a request
    the engine cannot place."""
    cap = kv_capacity(model, hw, serving, parallel)
    blocks = capacity_blocks(cap["kv_capacity_bytes"], block_size, model.kv_bytes_per_token)
    if blocks < 1:
        check_fits(model, hw, serving, parallel, node, min_kv_tokens=int(block_size))
    return cap, blocks


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
