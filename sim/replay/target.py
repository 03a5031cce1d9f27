"""The :class:`Target`: the model, hardware and serving limits a simulation's costs come from.

Frozen and hashable (its key is the model, the hardware profile's cost terms and the serving
settings), so memo tables key on it directly. :meth:`Target.resolve` turns preset names or
files into profiles (memoised in the :class:`sim.replay.session.Session`, re-read when a preset file
changes); the target then answers the scheduler, the KV capacity and the fitted-range check
every mode uses, each in one place.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from sim.serving.capacity import CapacityError, ServingConfig, capacity_blocks, check_fits, kv_blocks, kv_capacity
from sim.base.errors import ConfigError
from sim.base.options import option, validate_options
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import ModelShape
from sim.base.errors import PresetError
from sim.cost.profiles import load_hardware, load_model, model_from_manifest
from sim.cost.parallel import MAX_DP, MAX_PP, PIPELINE_SCHEDULES, NodeProfile, ParallelConfig, ParallelCost, ParallelError, \
    load_node
from sim.cost.pricing import served_costs, served_overheads
from sim.cost.overheads import overheads_info
from sim.cost.routing import ROUTINGS, routing_for
from sim.cost.terms import ScalarCost
from sim.serving.scheduler import SchedulerConfig

# Isolated mode: one problem alone, every branch admitted at once, prefills first.
ISOLATED_SCHEDULER = SchedulerConfig(max_num_seqs=1 << 20, max_num_batched_tokens=1 << 24, policy="prefill-first")


def hw_key(hw: HardwareProfile) -> tuple:
    """The cost terms of a hardware profile (what two equal profiles share)."""
    return (hw.name, hw.source, hw.peak_flops, hw.mem_bw, hw.mem_capacity, hw.eff_c, hw.eff_m,
            hw.per_kernel_s, hw.per_layer_s)


def _preset(session, kind: str, name):
    """A model or hardware preset by name or file, memoised in the session per file modification time."""
    path = str(name)
    mtime = None
    if path.endswith((".yaml", ".yml", ".json")) or os.sep in path:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = None
    key = (kind, path)
    hit = session.presets.get(key)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        obj = load_model(name) if kind == "model" else load_hardware(name)
    except PresetError as exc:
        raise ConfigError(str(exc), field="model" if kind == "model" else "hardware") from None
    session.presets[key] = (mtime, obj)
    return obj


@dataclass(frozen=True)
class TargetSpec:
    """The target as a user names it (preset names or YAML/JSON files); :meth:`Target.resolve` reads them.

    One declaration per option: the CLI's target flags are built from these fields.
    """

    model: str | None = option(None, kind=str, flag="--model-preset", metavar="NAME",
                               help="cost target model: preset name or YAML/JSON file (default: the trace's own model)")
    hardware: str = option("local-cpu", kind=str, flag="--hardware", metavar="NAME",
                           help="hardware preset name or YAML/JSON file (default local-cpu)")
    node: str | None = option(None, kind=str, flag="--node", metavar="NAME",
                              help="node preset (a name in sim/presets/nodes or a YAML/JSON file) whose interconnect "
                                   "prices tensor/pipeline parallelism; its GPUs must be --hardware (default: one GPU "
                                   "of --hardware; with TP x PP > 1 the one node preset of that GPU)")
    tensor_parallel_size: int = option(1, kind=int, lo=1, hi=8, flag="--tensor-parallel-size", metavar="TP",
                                       help="GPUs a replica's layers are split over (1, 2, 4, 8; vLLM's flag; default 1)")
    pipeline_parallel_size: int = option(1, kind=int, lo=1, hi=MAX_PP, flag="--pipeline-parallel-size", metavar="PP",
                                         help="pipeline stages per replica (vLLM's flag; default 1)")
    data_parallel_size: int = option(1, kind=int, lo=1, hi=MAX_DP, flag="--data-parallel-size", metavar="DP",
                                     help="serving mode: replicas of TP x PP GPUs behind --router (default 1)")
    disable_custom_all_reduce: bool = option(False, kind=bool, flag="--disable-custom-all-reduce",
                                             help="price every tensor-parallel all-reduce by NCCL, as vLLM's flag of "
                                                  "that name runs it (default: vLLM's custom all-reduce where the "
                                                  "node preset has its lines)")
    pipeline_schedule: str = option("overlapped", kind=str, choices=PIPELINE_SCHEDULES, flag="--pipeline-schedule",
                                    metavar="S",
                                    help="with PP > 1: 'overlapped' keeps up to PP batches in flight, one per stage "
                                         "(vLLM's pipeline; default); 'serial' runs one batch through all stages "
                                         "at a time (the pessimistic bound)")

    quantization: str | None = option(None, kind=str, flag="--quantization", metavar="Q",
                                      help="weights as vLLM's --quantization serves them: fp8 (linear layers' "
                                           "weights one byte; GEMMs at the FP8 tensor-core peak where the GPU has "
                                           "one) or mxfp4 (MoE models: the routed experts at 4.25 bits, weight-only, "
                                           "as vLLM runs gpt-oss); none: 16-bit weights; default: the "
                                           "weights as released, as vllm serve loads them (gpt-oss: mxfp4, "
                                           "DeepSeek-V3: fp8; else the model's dtype)")
    kv_cache_dtype: str | None = option(None, kind=str, flag="--kv-cache-dtype", metavar="DTYPE",
                                        help="vLLM's --kv-cache-dtype: auto (the model's dtype; default) or fp8 / "
                                             "fp8_e4m3 / fp8_e5m2 (one byte per KV element: capacity and KV reads)")
    enable_expert_parallel: bool = option(False, kind=bool, flag="--enable-expert-parallel",
                                          help="vLLM's flag: each of the --tensor-parallel-size GPUs holds E / TP "
                                               "whole experts instead of every expert at 1 / TP of its width (MoE "
                                               "models; default off)")
    moe_routing: str = option("expected", kind=str, choices=ROUTINGS, flag="--moe-routing", metavar="R",
                              help="MoE models: the experts an iteration reads, by the expected distinct count under "
                                   "uniform routing (default) or sampled (seeded; the busiest expert-parallel rank)")

    def __post_init__(self) -> None:
        validate_options(self)


def with_precision(model: ModelShape, quantization=None, kv_cache_dtype=None) -> ModelShape:
    """``model`` under ``--quantization`` / ``--kv-cache-dtype`` (:meth:`ModelShape.with_precision`); a value
    no profile prices raises :class:`ConfigError` naming the flag's field."""
    try:
        return model.with_precision(quantization, kv_cache_dtype)
    except PresetError as exc:
        raise ConfigError(str(exc), field="kv_cache_dtype" if "--kv-cache-dtype" in str(exc)
                          else "quantization") from None


@dataclass(frozen=True, eq=False)
class Target:
    """Where the costs come from: ``model`` on ``hardware`` under ``serving`` limits.

    ``trace_model`` is the shape of the model the trace was captured on (the decisions' model).
    """

    model: ModelShape
    hardware: HardwareProfile
    serving: ServingConfig
    trace_model: ModelShape
    node: NodeProfile | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    pipeline_schedule: str = "overlapped"
    disable_custom_all_reduce: bool = False
    enable_expert_parallel: bool = False     # vLLM's --enable-expert-parallel (MoE models only; else False)
    moe_routing: str = "expected"            # sim.cost.routing.ROUTINGS (MoE models only; else "expected")

    @classmethod
    def resolve(cls, session, model=None, hardware="local-cpu", serving=None, node=None, tensor_parallel_size=1,
                pipeline_parallel_size=1, data_parallel_size=1, pipeline_schedule="overlapped", quantization=None,
                kv_cache_dtype=None, disable_custom_all_reduce=False, enable_expert_parallel=False,
                moe_routing="expected") -> "Target":
        """A target from preset names, files or profiles (``model=None``: the trace's own model).

        ``quantization`` / ``kv_cache_dtype``: vLLM's ``--quantization`` / ``--kv-cache-dtype``
        (:func:`with_precision`; the hardware refuses what it cannot price when queried).
        ``node`` (a node preset or :class:`sim.cost.node.NodeProfile`) prices the collectives of a
        ``tensor_parallel_size`` x ``pipeline_parallel_size`` replica; ``None`` with TP x PP > 1: the one
        shipped node preset whose GPU is ``hardware``. The layout is checked against the model and the
        node (:meth:`sim.cost.parallel.ParallelConfig.validate`), and the replica's weights against its GPUs
        (:func:`sim.serving.capacity.check_fits`, which names the smallest TP x PP that fits).
        ``enable_expert_parallel`` / ``moe_routing``: vLLM's ``--enable-expert-parallel`` and the experts an
        iteration reads (``expected`` or ``sampled``, :func:`sim.cost.routing.routing_for`, seed 0); both leave a
        dense model's prices as they are.
        """
        with session.lock:  # the session's preset memo is shared by its threads
            if session.trace_model is None:
                session.trace_model = model_from_manifest(session.tf.manifest)
            if model is None:
                m = session.trace_model
            else:
                m = model if isinstance(model, ModelShape) else _preset(session, "model", model)
            m = with_precision(m, quantization, kv_cache_dtype)
            hw = hardware if isinstance(hardware, HardwareProfile) else _preset(session, "hardware", hardware)
            sv = ServingConfig.from_any(serving)
            spec = TargetSpec(model=None, hardware="-", node=None if node is None or isinstance(node, NodeProfile)
                              else str(node), tensor_parallel_size=tensor_parallel_size,
                              pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size,
                              pipeline_schedule=pipeline_schedule, disable_custom_all_reduce=disable_custom_all_reduce,
                              enable_expert_parallel=enable_expert_parallel, moe_routing=moe_routing)
            try:
                par = ParallelConfig(spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.data_parallel_size,
                                     spec.disable_custom_all_reduce, spec.enable_expert_parallel)
            except ParallelError as exc:
                raise ConfigError(str(exc), field=_flag_field(str(exc))) from None
            try:
                nd = resolve_layout(m, hw, sv, par, node, session.presets, node_gpus=True)
            except CapacityError as exc:
                raise ConfigError(str(exc), field="tensor_parallel_size") from None
            except ParallelError as exc:
                raise ConfigError(str(exc), field=_flag_field(str(exc))) from None
            return cls(model=m, hardware=hw, serving=sv, trace_model=session.trace_model, node=nd,
                       tensor_parallel_size=par.tensor_parallel_size, pipeline_parallel_size=par.pipeline_parallel_size,
                       data_parallel_size=par.data_parallel_size, pipeline_schedule=spec.pipeline_schedule,
                       disable_custom_all_reduce=par.disable_custom_all_reduce,
                       enable_expert_parallel=bool(par.enable_expert_parallel and m.num_experts),
                       moe_routing=spec.moe_routing if m.num_experts else "expected")

    key: tuple = field(init=False, repr=False)  # (model, hardware cost terms): what a job's costs depend on

    def __post_init__(self) -> None:
        key = (self.model, hw_key(self.hardware))
        if not self.single:  # one GPU keeps today's key; a layout prices differently
            key += (("parallel", self.tensor_parallel_size, self.pipeline_parallel_size,
                     self.node.name if self.node is not None else None),)
            if self.pipeline_parallel_size > 1:
                key += (("pipeline_schedule", self.pipeline_schedule),)
            if self.disable_custom_all_reduce:
                key += (("disable_custom_all_reduce", True),)
            if self.enable_expert_parallel:
                key += (("enable_expert_parallel", True),)
        # a dense target (and the default routing) keeps its key: these only price MoE layers
        if self.moe_routing != "expected":
            key += (("moe_routing", self.moe_routing),)
        object.__setattr__(self, "key", key)

    def __hash__(self) -> int:
        return hash((self.key, self.serving, self.data_parallel_size))

    def __eq__(self, other) -> bool:
        return isinstance(other, Target) and (self.key, self.serving, self.data_parallel_size) == \
            (other.key, other.serving, other.data_parallel_size)

    # ------------------------------------------------------------------ the layout
    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size,
                              self.disable_custom_all_reduce, self.enable_expert_parallel)

    @property
    def single(self) -> bool:
        """One GPU per replica (TP = PP = 1, no DP attention + EP): priced by ``sim.cost.terms.ScalarCost`` as ever."""
        return self.parallel.one_gpu(self.model)

    def routing(self):
        """The MoE routing the costs read experts by: None (the expectation) or a seeded
        :class:`sim.cost.routing.SampledRouting` (seed 0)."""
        return routing_for(self.moe_routing, 0) if self.moe_routing != "expected" else None

    def cost(self):
        """The cost object of one replica: None (the engine's own ``ScalarCost``) at TP = PP = 1 with the expected
        routing, a ``ScalarCost`` with the sampled routing, else a :class:`sim.cost.parallel.ParallelCost` of the
        layout on the node."""
        routing = self.routing()
        if self.single:
            return None if routing is None else ScalarCost(self.model, self.hardware, routing=routing)
        return ParallelCost(self.model, self.hardware, self.node, self.parallel, schedule=self.pipeline_schedule,
                            routing=routing)

    def serving_costs(self, sched) -> dict:
        """The engine keywords of a served run (serving mode; the isolated fast path and engine price eager kernels
        alone): the replica's cost with vLLM's CUDA graphs (:func:`sim.cost.graphs.engine_graphs`: the profile's
        ``cuda_graphs``, ``sched.max_num_seqs``, ``--enforce-eager``) and each step's host time (the profile's
        ``host_step`` unless ``--no-host-time``; vLLM's async scheduling unless ``--no-async-scheduling``), as
        ``rksim bench`` prices a plain workload (:func:`sim.cost.parallel.replica_cost`)."""
        sv = self.serving
        return served_costs(self.model, self.hardware, self.node, self.parallel, sched.max_num_seqs,
                            enforce_eager=sv.enforce_eager, host_time=not sv.no_host_time,
                            async_scheduling=not sv.no_async_scheduling, schedule=self.pipeline_schedule,
                            routing=self.routing())

    def kernels_only(self) -> dict:
        """``info["overheads"]`` of an isolated run: one problem's (or one long decode's) GPU work alone, no host time
        per step and no API server (:func:`sim.cost.overheads.overheads_info`)."""
        return overheads_info(self.hardware, None, None, False, False, False, [],
                              fe_why="isolated mode prices no API server",
                              host_why="isolated mode prices one problem's GPU work alone; serving mode prices it")

    def overheads(self, costs: dict, results) -> dict:
        """``info["overheads"]`` of a served run (:func:`sim.cost.pricing.served_overheads`; no API server: the
        policies' replay sends its requests to the engine)."""
        return served_overheads(self.hardware, costs, results, not self.serving.no_host_time,
                                "the policies' replay prices no API server")

    @property
    def rank_model(self) -> ModelShape:
        """The shard one GPU of the largest stage holds (``sim.cost.parallel.rank_model``): what the fitted range
        and the one-GPU weight check see."""
        return self.parallel.gpu_shard(self.model)

    def layout(self) -> str:
        """``TP 2 x PP 1 x DP 4 on dgx-h100`` (empty for one GPU, one replica)."""
        if self.single and self.data_parallel_size == 1:
            return ""
        where = f" on {self.node.name}" if self.node is not None else f" ({self.hardware.name} per GPU)"
        return (f"TP {self.tensor_parallel_size} x PP {self.pipeline_parallel_size} x DP "
                f"{self.data_parallel_size}{where}")

    # ------------------------------------------------------------------ what the target answers
    @property
    def max_batch(self) -> int | None:
        """The largest batch the hardware profile was fitted on (None: analytical)."""
        return (self.hardware.fitted_range or {}).get("max_batch")

    @property
    def calibrated(self) -> bool:
        hw = self.hardware
        return bool(getattr(hw, "calibrated", hw.fitted_range is not None))

    def scheduler(self, mode: str) -> SchedulerConfig:
        """The scheduler a mode runs under: isolated admits everything; serving is the hardware's
        vLLM defaults (or the user's), its running-sequence cap no larger than the fitted batch
        (larger batches wait in the queue, never fail)."""
        groups = self.model.kv_cache_groups   # a hybrid (full + sliding) model: every group's blocks per request
        hybrid = {} if groups == (1, 0, 0) else {"kv_groups": groups}
        if mode != "serving":
            return dataclasses.replace(ISOLATED_SCHEDULER, **hybrid) if hybrid else ISOLATED_SCHEDULER
        cfg = self.serving.scheduler_config(self.hardware.name)
        fb = self.max_batch
        if fb is not None and cfg.max_num_seqs > int(fb):
            cfg = dataclasses.replace(cfg, max_num_seqs=int(fb))
        return dataclasses.replace(cfg, **hybrid) if hybrid else cfg

    def capacity(self, mode: str, block_size: int) -> dict:
        """KV capacity (``sim.serving.capacity.kv_capacity``) plus its blocks, block size and the mode's scheduler."""
        sched = self.scheduler(mode)
        par = None if self.single else self.parallel
        if mode == "serving":   # a served replica: no block of KV left is refused naming the layout (kv_blocks)
            cap, blocks = kv_blocks(self.model, self.hardware, self.serving, par, block_size, self.node)
            cap["kv_capacity_blocks"] = blocks
        else:
            cap = kv_capacity(self.model, self.hardware, self.serving, par)
            cap["kv_capacity_blocks"] = capacity_blocks(cap["kv_capacity_bytes"], block_size,
                                                        self.model.kv_bytes_per_token)
        cap["block_size"] = int(block_size)
        cap["scheduler"] = sched.to_dict()
        if not self.model.is_plain:   # MoE / MLA / sliding-window targets state their KV per token and kinds
            cap["kv_bytes_per_token"] = int(self.model.kv_bytes_per_token)
            cap["model_kinds"] = self.model.layer_kinds()
        return cap

    def check_query(self, max_context: int, max_new: int, max_batch: int, tokens: int = 0, mixed: bool = False,
                    allow_extrapolation: bool = False) -> list:
        """Refuse a query outside the hardware profile's fitted range (``HardwareProfile.check_query``,
        :mod:`sim.cost.ranges`) on the shard one GPU holds; with ``allow_extrapolation`` the notes of what
        was extrapolated instead."""
        return self.hardware.check_query(self.rank_model, max_context=max_context, max_new=max_new, max_batch=max_batch,
                                         tokens=tokens, mixed=mixed, allow_extrapolation=allow_extrapolation)

    def note(self, decisions_model: str) -> str:
        m, hw = self.model.priced_name, self.hardware.name
        if self.layout():
            hw = f"{hw}, {self.layout()}"
        return (f"decisions from the trace's model {decisions_model}; costs from {m} on {hw}"
                if self.model.name != decisions_model else f"decisions and costs from {m} on {hw}")


_FLAG_FIELDS = {"--tensor-parallel-size": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
                "--data-parallel-size": "data_parallel_size", "--node": "node"}


def _flag_field(msg: str) -> str:
    """The target field a ``sim.cost.parallel`` message names by its flag."""
    return next((f for flag, f in _FLAG_FIELDS.items() if msg.startswith(flag)), "tensor_parallel_size")


def shipped_nodes(gpu: str) -> list[str]:
    """Names of the shipped node presets whose GPUs are the hardware preset ``gpu``."""
    from sim.cost.profiles import list_presets
    names = []
    for name in list_presets("nodes"):
        try:
            if load_node(name).gpu == gpu:
                names.append(name)
        except (PresetError, OSError, ValueError):
            continue
    return names


def node_for(hardware: str, node: str | None = None) -> NodeProfile:
    """The node a multi-GPU command (``rksim plan``) prices: ``--node`` when given (its GPUs must be
    ``--hardware``'s), else ``--hardware`` itself when it names a node preset or file, else the one
    shipped node of ``--hardware``'s GPU (:func:`resolve_node` with no layout). Errors name the flag."""
    from sim.cost.profiles import list_presets
    if node is None and str(hardware) in list_presets("nodes"):
        return load_node(hardware)
    try:
        hw = load_hardware(hardware)
    except (PresetError, OSError, ValueError) as exc_hw:
        if node is not None:
            raise ConfigError(f"--hardware: {exc_hw}", field="hardware") from None
        try:  # a node file
            return load_node(hardware)
        except (PresetError, OSError, ValueError):
            raise ConfigError(f"--hardware: {exc_hw} (nor a node preset: {', '.join(list_presets('nodes'))})",
                              field="hardware") from None
    return resolve_node(node, hw, None)


def resolve_node(node, hw: HardwareProfile, par: ParallelConfig | None,
                 memo: dict | None = None) -> NodeProfile | None:
    """Every command's one node resolver: the node named (a :class:`NodeProfile`, a preset name or a file; its
    GPUs must be ``hw``), else the one shipped node preset of ``hw``'s GPU where a node is needed (``par`` is
    None, as ``rksim plan`` asks, or TP x PP > 1), else None (one GPU of ``hw``). ``memo``: the caller's preset
    memo. Errors name the flag (:class:`ConfigError`)."""
    memo = {} if memo is None else memo
    if isinstance(node, NodeProfile):
        nd = node
    elif node is not None:
        key = ("node", str(node))
        nd = memo.get(key)
        if nd is None:
            try:
                nd = memo[key] = load_node(node)
            except (PresetError, OSError, ValueError) as exc:
                raise ConfigError(f"--node: {exc}", field="node") from None
    elif par is not None and par.is_single:
        return None
    else:
        nd = _shipped_node(hw, par)
    if nd.gpu != hw.name:
        raise ConfigError(f"--node {nd.name}: its GPUs are {nd.gpu}, not --hardware {hw.name}", field="node")
    return nd


def _shipped_node(hw: HardwareProfile, par: ParallelConfig | None) -> NodeProfile:
    """The one shipped node preset of ``hw``'s GPU; the refusal names why a node is needed (``par``: the layout,
    None: a multi-GPU command) and the flag that names one."""
    from sim.cost.profiles import list_presets
    names = shipped_nodes(hw.name)
    if len(names) == 1:
        return load_node(names[0])
    if par is None:
        raise ConfigError(f"--hardware {hw.name}: {'no' if not names else len(names)} shipped node preset(s) of "
                          f"{hw.name}'s GPUs{'' if not names else ' (' + ', '.join(names) + ')'}; name one with --node "
                          f"(node presets: {', '.join(list_presets('nodes'))}, or a node file)", field="hardware")
    raise ConfigError(f"--node: --tensor-parallel-size {par.tensor_parallel_size} --pipeline-parallel-size "
                      f"{par.pipeline_parallel_size} needs a node preset to price the communication; "
                      + (f"no node preset of {hw.name} is shipped" if not names
                         else f"{len(names)} node presets of {hw.name} match ({', '.join(names)})")
                      + f": name one with --node, a node file whose gpu is {hw.name} (the shipped node presets, "
                      "sim/presets/nodes/*.yaml, show the form)", field="node")


def resolve_layout(model: ModelShape, hw: HardwareProfile, serving: ServingConfig, par: ParallelConfig, node=None,
                   memo: dict | None = None, node_gpus: bool = False) -> NodeProfile | None:
    """The node a ``par`` replica of ``model`` runs on, once the layout is checked: every command's one resolver of
    a layout (:meth:`Target.resolve` and :func:`sim.bench.plain.run` call it; tests/test_structure.py checks
    that no other command module builds a :class:`ParallelConfig` from the target flags).

    ``node``: :func:`resolve_node` (``memo``: the caller's preset memo). The layout is checked against the model
    and the node (:meth:`sim.cost.parallel.ParallelConfig.validate`; ``node_gpus``: TP x PP x DP must fit on one
    node, a refusal naming ``--node``), then, for TP x PP > 1 or where one GPU cannot hold the weights anyway,
    the replica's weights against its GPUs (:func:`sim.serving.capacity.check_fits`, which names the smallest
    TP x PP that fits). Raises :class:`ParallelError` / :class:`CapacityError` (naming the flag) or
    :class:`ConfigError` (the node).
    """
    # DP attention + EP needs a node even at TP 1: its ranks gather each other's tokens over the node's links
    nd = resolve_node(node, hw, None if par.dp_attention(model) else par, memo)
    try:
        par.validate(model, nd, nd.gpus_per_node if node_gpus and nd is not None else None)
    except ParallelError as exc:
        if node_gpus and nd is not None:
            raise ParallelError(str(exc).replace("(--gpus)", f"on one {nd.name} node (--node)")) from None
        raise
    # one GPU: only where today's weight check refuses anyway, so its refusal names the layout that fits
    if not par.one_gpu(model) or model.weight_bytes > hw.mem_capacity:
        check_fits(model, hw, serving, par, nd)
    return nd


__all__ = ["Target", "TargetSpec", "resolve_layout", "resolve_node", "node_for", "shipped_nodes", "ISOLATED_SCHEDULER", "hw_key"]
