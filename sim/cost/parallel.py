"""Tensor and pipeline parallelism in the cost model (the nodes whose interconnect prices it: :mod:`sim.cost.node`).

Names follow vLLM's flags: ``tensor_parallel_size`` (TP), ``pipeline_parallel_size`` (PP),
``data_parallel_size`` (replicas; routing is :mod:`sim.serving.router`).

Tensor parallelism (Megatron-LM's split, as vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear``
/ ``RowParallelLinear`` / ``VocabParallelEmbedding`` / ``ParallelLMHead`` implement it): each of the TP
ranks holds ``H / TP`` query heads, ``max(1, Hkv / TP)`` KV heads (when ``Hkv < TP`` each KV head is
*replicated* on ``TP / Hkv`` ranks, vLLM's ``num_kv_head_replicas``), ``F / TP`` of the MLP and ``V / TP``
of the embedding and LM head; norms are replicated. A rank therefore runs the model of
:func:`rank_model`, and every decoder layer adds two all-reduces of its activations (after the attention
output projection and after the MLP down projection; ``t`` tokens, ``d`` hidden, ``s`` bytes)::

    comm_layer = 2 * allreduce(t * d * s, TP)

plus one all-reduce of the embedding output (``VocabParallelEmbedding`` masks the rows of other ranks
and all-reduces) and the gather of the LM head's logits (``r`` rows of ``V``), priced as half an
all-reduce of ``r V s`` bytes (a ring all-reduce is a reduce-scatter plus an all-gather). vLLM runs
these collectives on the compute stream: they add to the iteration, they do not overlap it.

Pipeline parallelism: the ``L`` layers are split into PP stages as vLLM's ``get_pp_indices`` does
(``L // PP`` each, the remainder one more each on the stages before the last, from the second-to-last
backwards); the embedding is on the first stage, the final norm, LM head and sampling on the last.
Between stages the hidden states and the residual (vLLM's ``IntermediateTensors``) are sent::

    send_stage = sendrecv(2 * t * d * s)

One batch of one iteration goes through the stages in order, so its latency is the sum of the stages'
times (:meth:`ParallelCost.seconds`); vLLM keeps up to PP batches in flight, one per stage, and
:func:`pipeline_schedule` gives the start and end of each batch through each stage under that rule and
the bubbles (idle stage time) it leaves. The serving engine (:mod:`sim.serving.engine`) runs that schedule
(``schedule="overlapped"``, the default): the next batch is formed as soon as stage 0 is free, from
requests in no in-flight batch; ``schedule="serial"`` prices one batch through all stages at a time.

Collectives are priced from the node (:class:`NodeProfile`): ``t(N) = latency_s + N / bw`` per GPU
count, fitted on Vidur's measured NCCL profiles (:mod:`calibrate.collectives`), or for a node without a
measured profile (PCIe-only, e.g. L4) the ring model from the datasheet link bandwidth with a named
efficiency and latency. On a node whose preset has a ``custom_allreduce`` block (NVLink, all GPUs
connected), a tensor-parallel all-reduce smaller than vLLM's ``max_size`` is priced as vLLM's own
``CustomAllreduce`` runs it (one-shot or two-shot kernel, lines fitted on measurements inside CUDA graphs),
the NCCL lines beyond; ``--disable-custom-all-reduce`` (vLLM's flag) prices every one by NCCL.

At ``TP = PP = 1`` :class:`ParallelCost` *is* :class:`sim.cost.terms.ScalarCost` (it delegates), so a
single-GPU run is bit-for-bit today's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sim.cost.terms import ScalarCost
from sim.cost.model_shape import ModelShape
from sim.cost.node import NodeProfile, load_node  # noqa: F401  (re-exported: sim.cost.parallel.NodeProfile)

TP_SIZES = (1, 2, 4, 8)
MAX_PP = 64
MAX_DP = 4096
# "overlapped": up to PP batches in flight, one per stage (vLLM); "serial": one batch through all stages at a time
PIPELINE_SCHEDULES = ("overlapped", "serial")


class ParallelError(ValueError):
    """A parallel layout the model, node or GPU budget cannot take (the message names the flag)."""


# --------------------------------------------------------------------------- layout
def is_dp_attention(model: ModelShape, data_parallel_size: int, enable_expert_parallel: bool) -> bool:
    """vLLM's DP attention + EP: ``--enable-expert-parallel`` on an MoE model with ``--data-parallel-size > 1``."""
    return bool(enable_expert_parallel and model.num_experts and data_parallel_size > 1)


@dataclass(frozen=True)
class ParallelConfig:
    """How one deployment lays a model over GPUs: ``TP x PP`` GPUs per replica, ``DP`` replicas."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    # vLLM's --disable-custom-all-reduce: every tensor-parallel all-reduce through NCCL (NodeProfile.allreduce_seconds)
    disable_custom_all_reduce: bool = False
    # vLLM's --enable-expert-parallel: each of the TP ranks holds E / TP whole experts instead of every expert
    # at 1 / TP of its width; with --data-parallel-size D > 1 on an MoE model it is vLLM's DP attention + EP:
    # EP size = D x TP, each DP rank its own batch and KV (sim.cost.alltoall prices dispatch / combine)
    enable_expert_parallel: bool = False

    def __post_init__(self) -> None:
        for flag, v in (("--disable-custom-all-reduce", self.disable_custom_all_reduce),
                        ("--enable-expert-parallel", self.enable_expert_parallel)):
            if not isinstance(v, bool):
                raise ParallelError(f"{flag}: must be true or false, got {v!r}")
        for flag, v, hi in (("--tensor-parallel-size", self.tensor_parallel_size, max(TP_SIZES)),
                            ("--pipeline-parallel-size", self.pipeline_parallel_size, MAX_PP),
                            ("--data-parallel-size", self.data_parallel_size, MAX_DP)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ParallelError(f"{flag}: must be an integer in 1..{hi}, got {v!r}")
        if self.tensor_parallel_size not in TP_SIZES:
            raise ParallelError(f"--tensor-parallel-size: must be one of {', '.join(map(str, TP_SIZES))}, "
                                f"got {self.tensor_parallel_size}")

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.data_parallel_size

    def dp_attention(self, model: ModelShape) -> bool:
        """vLLM's DP attention + EP (:func:`is_dp_attention`; otherwise ``data_parallel_size`` counts independent
        replicas)."""
        return is_dp_attention(model, self.data_parallel_size, self.enable_expert_parallel)

    def expert_parallel_size(self, model: ModelShape) -> int:
        """vLLM's EP size: ``DP x TP`` under DP attention, ``TP`` with EP alone, 1 without EP or experts."""
        if not (self.enable_expert_parallel and model.num_experts):
            return 1
        return self.tensor_parallel_size * (self.data_parallel_size if self.dp_attention(model) else 1)

    @property
    def is_single(self) -> bool:
        return self.tensor_parallel_size == 1 and self.pipeline_parallel_size == 1

    def one_gpu(self, model: ModelShape) -> bool:
        """A replica is one GPU priced alone (``ScalarCost``): TP = PP = 1 and no DP attention + EP (whose ranks
        gather each other's tokens for their experts, on a node's links)."""
        return self.is_single and not self.dp_attention(model)

    def gpu_shard(self, model: ModelShape) -> ModelShape:
        """The shard one GPU of the largest pipeline stage holds (:func:`rank_model` at this layout's TP, stage
        layers and EP size): what a profile's fitted range and the one-GPU weight check see."""
        if self.one_gpu(model):
            return model
        layers = max(stage_layers(model.n_layers, self.pipeline_parallel_size))
        return rank_model(model, self.tensor_parallel_size, layers, ep=self.enable_expert_parallel,
                          ep_size=self.expert_parallel_size(model))

    def validate(self, model: ModelShape, node: "NodeProfile | None" = None, gpus: int | None = None) -> None:
        """Refuse a layout the model or the hardware cannot take (vLLM's checks), naming the flag.

        TP must divide the query heads, and the KV heads must divide by TP or TP by them (vLLM's
        ``QKVParallelLinear``); TP must divide the MLP width and the vocabulary (sharded); PP cannot exceed
        the layers; TP must fit on one node (tensor parallel collectives are priced intra-node);
        ``TP x PP x DP`` must not exceed ``gpus``.
        """
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        H, Hkv = model.n_heads, model.n_kv_heads
        if H % tp:
            raise ParallelError(f"--tensor-parallel-size: {tp} does not divide {model.name}'s {H} attention heads")
        if Hkv % tp and tp % Hkv:
            raise ParallelError(f"--tensor-parallel-size: {tp} and {model.name}'s {Hkv} KV heads: neither divides "
                                "the other (vLLM shards or replicates whole KV heads)")
        if model.intermediate_size % tp:
            raise ParallelError(f"--tensor-parallel-size: {tp} does not divide {model.name}'s MLP width "
                                f"{model.intermediate_size}")
        if self.dp_attention(model):
            ep = self.expert_parallel_size(model)
            if model.num_experts % ep:
                raise ParallelError(f"--data-parallel-size: {self.data_parallel_size} x --tensor-parallel-size {tp} "
                                    f"= EP size {ep} does not divide {model.name}'s {model.num_experts} experts "
                                    "(--enable-expert-parallel)")
            if pp > 1:
                raise ParallelError("--data-parallel-size: DP attention with --enable-expert-parallel is priced "
                                    "for --pipeline-parallel-size 1 only")
            if node is not None and ep > node.gpus_per_node:
                raise ParallelError(f"--data-parallel-size: {self.data_parallel_size} x --tensor-parallel-size {tp} "
                                    f"= {ep} GPUs, more than one {node.name} node's {node.gpus_per_node} (DP "
                                    "attention's dispatch and combine are priced on one node's links)")
        if self.enable_expert_parallel and model.num_experts:
            if model.num_experts % tp:
                raise ParallelError(f"--enable-expert-parallel: --tensor-parallel-size {tp} does not divide "
                                    f"{model.name}'s {model.num_experts} experts (num_experts)")
            if model.shared_width % tp:
                raise ParallelError(f"--tensor-parallel-size: {tp} does not divide {model.name}'s shared-expert "
                                    f"width {model.shared_width}")
        elif model.moe_intermediate_size % tp:
            # vLLM's FusedMoE without expert parallelism shards every expert's width over the TP ranks
            raise ParallelError(f"--tensor-parallel-size: {tp} does not divide {model.name}'s expert width "
                                f"{model.moe_intermediate_size} (moe_intermediate_size)")
        if pp > model.n_layers:
            raise ParallelError(f"--pipeline-parallel-size: {pp} stages for {model.name}'s {model.n_layers} layers")
        if node is not None and tp > node.gpus_per_node:
            raise ParallelError(f"--tensor-parallel-size: {tp} exceeds the {node.gpus_per_node} GPUs of one "
                                f"{node.name} node (tensor parallelism runs inside a node)")
        if gpus is not None and self.gpus > gpus:
            raise ParallelError(f"--data-parallel-size: {self.data_parallel_size} replicas x TP {tp} x PP {pp} "
                                f"= {self.gpus} GPUs, more than the {gpus} available (--gpus)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def stage_layers(n_layers: int, pp: int) -> list[int]:
    """Layers of each pipeline stage, vLLM's ``get_pp_indices`` default partition.

    ``L // PP`` each; the ``L % PP`` extra layers go one each to the stages before the last,
    starting from the second-to-last (the last stage also runs the final norm and LM head).
    """
    if pp < 1 or pp > n_layers:
        raise ParallelError(f"--pipeline-parallel-size: {pp} stages for {n_layers} layers")
    parts = [n_layers // pp] * pp
    for i in range(2, n_layers % pp + 2):
        parts[-i] += 1
    return parts


def kv_heads_per_rank(n_kv_heads: int, tp: int) -> int:
    """``Hkv / TP`` when TP divides it, else 1 (the head replicated on ``TP / Hkv`` ranks), as vLLM."""
    return 1 if tp >= n_kv_heads else n_kv_heads // tp


def rank_model(m: ModelShape, tp: int = 1, layers: int | None = None, start: int = 0, ep: bool = False,
               ep_size: int | None = None) -> ModelShape:
    """The shard one TP rank holds (and runs), over ``layers`` layers from layer ``start`` (default all).

    ``n_heads / TP`` query heads, :func:`kv_heads_per_rank` KV heads, ``F / TP`` MLP width,
    ``V / TP`` vocabulary rows of the embedding and LM head; ``d`` and the norms whole.
    ``tp = 1`` and all layers return ``m`` itself.

    MoE (vLLM's ``FusedMoE`` without expert parallelism): every expert on every rank, ``Fe / TP`` wide; the
    router replicated. MLA (vLLM's ``DeepseekV2MLAAttention``): ``q_b``, ``kv_b`` and ``o`` split by heads,
    ``q_a`` and ``kv_a`` replicated, and the latent KV cache whole on every rank. A pipeline stage keeps its
    own layers' kinds (``first_k_dense`` and ``layer_types`` of layers ``start .. start + layers``).

    ``ep`` (vLLM's ``--enable-expert-parallel``, EP size = TP): each rank holds ``E / TP`` whole experts
    (``FusedMoE``'s ``expert_map``) and runs, in expectation, ``k / TP`` of each token's experts; the shared
    experts stay TP-sharded (``DeepseekV2MLP``). Without DP attention every rank sees every token and the
    experts' outputs are all-reduced as under TP (``FusedMoE`` output reduction), so the collectives are TP's.
    ``ep_size`` (with ``ep``): the EP size when it is not TP, ``D x TP`` under DP attention
    (:meth:`ParallelConfig.expert_parallel_size`): ``E / (D TP)`` experts a rank, which run over the ``D``
    ranks' all-gathered rows (``expert_rows_factor = D``: ``D t k / (D TP)`` expert rows for a rank's ``t``,
    its distinct experts among ``D t`` rows); router and shared experts run on the rank's own ``t``.
    """
    L = m.n_layers if layers is None else int(layers)
    eps = (ep_size or tp) if ep else 1
    if tp == 1 and L == m.n_layers and eps == 1:
        return m
    kinds = {}
    if not m.is_plain:
        fk = max(0, min(m.first_k_dense, start + L) - start)
        lt = tuple(m.layer_types[start:start + L])
        kinds = dict(first_k_dense=fk, layer_types=lt if "sliding_attention" in lt else (),
                     sliding_window=m.sliding_window if "sliding_attention" in lt else 0,
                     moe_intermediate_size=m.moe_intermediate_size // tp)
        if m.num_experts and eps > 1:
            # EP size D x TP (DP attention): the experts run over all D ranks' gathered rows (expert_rows_factor)
            kinds.update(moe_intermediate_size=m.moe_intermediate_size, expert_parallel_size=eps,
                         expert_rows_factor=max(1, eps // tp),
                         shared_expert_intermediate_size=m.shared_width // tp if m.shared_width else 0)
        if m.num_experts and fk >= L:   # a stage of dense layers only
            kinds.update(num_experts=0, experts_per_token=0, num_shared_experts=0, moe_intermediate_size=0,
                         first_k_dense=0, expert_parallel_size=1, shared_expert_intermediate_size=0,
                         expert_rows_factor=1)
    return dataclasses.replace(
        m, n_layers=L, n_heads=m.n_heads // tp, n_kv_heads=kv_heads_per_rank(m.n_kv_heads, tp),
        intermediate_size=m.intermediate_size // tp, vocab_size=-(-m.vocab_size // tp),
        source=f"{m.source or m.name} (one rank of tensor parallel {tp}, {L} layers)", **kinds)


def rank_weight_bytes(m: ModelShape, tp: int, pp: int, ep: bool = False, ep_size: int | None = None) -> list[float]:
    """Weight bytes one GPU of each stage holds: its layers' shards, the embedding shard on the first
    stage, the LM head shard (unless tied, then the embedding's) and the final norm on the last.
    ``ep_size``: as :func:`rank_model` (DP attention: attention, embedding and head TP-sharded inside the DP
    rank, ``E / (D TP)`` whole experts a GPU)."""
    parts = stage_layers(m.n_layers, pp)
    s = m.dtype_bytes
    out = []
    a = 0
    for i, ell in enumerate(parts):
        r = rank_model(m, tp, ell, a, ep, ep_size)
        a += ell
        b = ell * r.layer_weight_bytes   # linear weights at their (maybe fp8) size, norms at s
        emb = s * r.vocab_size * m.hidden_size
        if i == 0:
            b += emb
        if i == pp - 1:
            b += s * m.hidden_size + (emb if not m.tied_embeddings or pp > 1 else 0)
        out.append(float(b))
    return out


# --------------------------------------------------------------------------- pricing
class ParallelCost:
    """:class:`sim.cost.terms.ScalarCost`'s interface (``seconds(items)``) for one TP x PP replica.

    Per stage ``k`` (its ``ell_k`` layers), an item that runs ``l`` layers runs
    ``min(l, b_k) - a_k`` of them there (``[a_k, b_k)`` the stage's layers); its LM-head rows,
    probes and sampling are priced on the stage holding its last layer. Each stage's compute is a
    :class:`ScalarCost` of :func:`rank_model` (sampling over the whole vocabulary: vLLM gathers the
    logits), plus (module docstring)::

        comm_k = sum over the stage's layers j of 2 allreduce(t_j d s, TP)    # t_j: tokens running layer j
                 + [k = 0] allreduce(t d s, TP) + [logits here] allreduce_nccl(r V s, TP) / 2
                 + [k < PP - 1] sendrecv(2 t_{b_k} d s)

    ``allreduce`` is :meth:`NodeProfile.allreduce_seconds` with this cost's ``cuda_graph`` (eager: one more
    kernel, the hardware's ``per_kernel_s``, where vLLM's custom all-reduce runs) and vLLM's custom all-reduce
    unless ``par.disable_custom_all_reduce``; the logits gather is an NCCL all-gather in vLLM, never custom.
    ``seconds`` = the sum over stages (one batch through the pipeline); ``stage_seconds`` the list.
    """

    def __init__(self, m: ModelShape, hw, node: NodeProfile | None, par: ParallelConfig, cuda_graph: bool = False,
                 delegate_single: bool = True, schedule: str = "overlapped", graphs=None, routing=None):
        # graphs (sim.cost.graphs.CudaGraphs): vLLM's per-iteration graph choice; an iteration it replays runs its
        # all-reduces inside the graph
        # delegate_single=False runs the staged path even at TP = PP = 1 (the test that it reduces exactly)
        if schedule not in PIPELINE_SCHEDULES:
            raise ParallelError(f"--pipeline-schedule: {schedule!r} is not one of {', '.join(PIPELINE_SCHEDULES)}")
        self.m, self.par, self.node = m, par, node
        self.cuda_graph = bool(cuda_graph)
        self.graphs = graphs
        self.per_kernel_s = float(getattr(hw, "per_kernel_s", 0.0) or 0.0)
        self.custom_ar = not par.disable_custom_all_reduce
        # how the engine runs the stages (sim.serving.engine): up to PP batches in flight (vLLM) or one at a time
        self.pipeline_schedule = schedule
        self.pp = par.pipeline_parallel_size
        # vLLM's DP attention + EP (ParallelConfig.dp_attention): experts over D x TP, dispatch / combine per MoE layer
        self.dpa = par.dp_attention(m)
        self.single = par.is_single and delegate_single and not self.dpa
        if self.single:
            self._one = ScalarCost(m, hw, cuda_graph=cuda_graph, graphs=graphs, routing=routing)
            self.prices_shared = self._one.prices_shared
            return
        if node is None and (self.dpa or not par.is_single):
            raise ParallelError(f"--tensor-parallel-size {par.tensor_parallel_size} --pipeline-parallel-size "
                                f"{par.pipeline_parallel_size}: a node preset is needed to price the communication")
        if node is not None:
            par.validate(m, node)
        tp, pp = par.tensor_parallel_size, par.pipeline_parallel_size
        self.tp, self.pp = tp, pp
        self.parts = stage_layers(m.n_layers, pp)
        self.bounds = []
        a = 0
        for ell in self.parts:
            self.bounds.append((a, a + ell))
            a += ell
        self.stages = [ScalarCost(rank_model(m, tp, ell, a, par.enable_expert_parallel, par.expert_parallel_size(m)),
                                  hw, cuda_graph=cuda_graph,
                                  sample_vocab=m.vocab_size, graphs=graphs, routing=routing)
                       for ell, (a, _) in zip(self.parts, self.bounds)]
        self.prices_shared = self.stages[0].prices_shared
        self.act = float(m.hidden_size * m.dtype_bytes)      # bytes of one token's activations
        self.logit_row = float(m.vocab_size * m.dtype_bytes)
        self.inter_node = node is not None and tp * pp > node.gpus_per_node   # stages spill onto other nodes

    def stage_seconds(self, items) -> list[float]:
        """Seconds of each stage for one batch (compute, its collectives, and the send to the next stage)."""
        if self.single:
            return [self._one.seconds(items)]
        L = self.m.n_layers
        node, tp = self.node, self.tp
        out = []
        last = len(self.bounds) - 1
        graphed = self._graphed(sum(float(it[0]) for it in items if it[0] > 0))
        for k, ((a, b), sc) in enumerate(zip(self.bounds, self.stages)):
            sub = []
            runs = []        # (layers run here, tokens) of items with work here
            rows = 0.0
            for it in items:
                n, c, ell, p, g, copy = it[:6]
                ell = L if ell is None else ell
                here = min(ell, b) - a
                ends_here = a < ell <= b or (ell == 0 and k == last)
                if here <= 0 and not ends_here:
                    continue
                here = max(here, 0)
                if ends_here:
                    sub.append((n, c, here, p, g, copy) + tuple(it[6:8]))
                    if n > 0:
                        rows += g   # LM-head rows whose logits are gathered across the TP ranks
                else:
                    # passes through: no head, probes or sampling on this stage
                    sub.append((n, c, here, 0.0, 0.0, copy, 0.0) + tuple(it[7:8]))
                if n > 0 and here > 0:
                    runs.append((here, float(n)))
            t = sc.seconds(sub) if sub else 0.0
            if runs:
                # tokens still running each depth of the stage's layers
                levels = [(h, sum(nn for hh, nn in runs if hh >= h)) for h in sorted({h for h, _ in runs})]
                for x in self._collective_terms(k == 0, a, levels, rows, graphed):
                    t += x
            if k < last:
                tok_next = sum(float(it[0]) for it in items if it[0] > 0 and (L if it[2] is None else it[2]) > b)
                if tok_next > 0:
                    t += node.sendrecv_seconds(2.0 * tok_next * self.act, inter_node=self.inter_node)
            out.append(t)
        return out

    def _graphed(self, tokens: float) -> bool:
        """Whether an iteration of ``tokens`` runs its all-reduces inside a CUDA graph."""
        return self.cuda_graph or (self.graphs is not None and self.graphs.padded(tokens) is not None)

    def _collective_terms(self, first: bool, a: int, levels, rows: float, graphed: bool) -> list:
        """The seconds a stage's collectives add, in the order :meth:`stage_seconds` adds them (``a``: its first
        layer; ``levels``: ``(depth, tokens running at least that deep)``, depths ascending).

        Tensor parallel (TP > 1): two all-reduces per layer over the tokens still running that layer, the
        embedding's all-reduce on the first stage (every token: ``levels[0]``'s) and the gather of the ``rows``
        LM-head rows' logits::

            2 (h_j - h_{j-1}) allreduce(t_j d s, TP) ...,  [first] allreduce(t_1 d s, TP),  allreduce_nccl(r V s, TP) / 2

        DP attention + EP: all_gatherv dispatch and reduce_scatterv combine over the DP group, per MoE layer
        (:func:`sim.cost.alltoall.dispatch_combine_seconds`), the other DP ranks padded to this rank's token count
        (vLLM's ``DPMetadata``)::

            m_j dispatch_combine(t_j),  m_j = the MoE layers among a + h_{j-1} .. a + h_j
        """
        node, tp = self.node, self.tp
        out = []
        if tp > 1:
            ar = dict(cuda_graph=graphed, custom=self.custom_ar, launch_s=0.0 if graphed else self.per_kernel_s)
            prev = 0
            for h, tok in levels:
                out.append(2.0 * (h - prev) * node.allreduce_seconds(tok * self.act, tp, **ar))
                prev = h
            if first:
                out.append(node.allreduce_seconds(levels[0][1] * self.act, tp, **ar))
            if rows > 0:
                # tensor_model_parallel_gather: NCCL, not the custom all-reduce
                out.append(0.5 * node.allreduce_seconds(rows * self.logit_row, tp, custom=False))
        if self.dpa:
            from sim.cost.alltoall import dispatch_combine_seconds
            fk = self.m.first_k_dense
            prev = 0
            for h, tok in levels:
                moe_layers = max(0, (a + h) - max(a + prev, fk))
                if moe_layers:
                    out.append(moe_layers * dispatch_combine_seconds(node, tok, self.m.hidden_size, self.m.dtype_bytes,
                                                                     self.par.data_parallel_size,
                                                                     self.m.experts_per_token))
                prev = h
        return out

    def seconds(self, items) -> float:
        """One batch through every stage (bit-for-bit :class:`ScalarCost` at TP = PP = 1)."""
        if self.single:
            return self._one.seconds(items)
        return float(sum(self.stage_seconds(items)))

    # ------------------------------------------------------------------ the closed form (sim.serving.fastforward)
    def _one_stage(self) -> bool:
        """One pipeline stage (tensor parallel, DP attention or both): a uniform decode batch's seconds are the
        rank's closed form plus collectives that depend on its size alone."""
        return self.single or self.pp == 1

    def exact_integers(self) -> bool:
        """The rank's :meth:`ScalarCost.exact_integers` (one stage only: False otherwise)."""
        return self._one_stage() and (self._one if self.single else self.stages[0]).exact_integers()

    def closed_form(self) -> bool:
        """The rank's :meth:`ScalarCost.closed_form` (one stage only: False otherwise)."""
        return self._one_stage() and (self._one if self.single else self.stages[0]).closed_form()

    def sliding_window(self):
        """The rank's :meth:`ScalarCost.sliding_window` (one stage only: None otherwise)."""
        return (self._one if self.single else self.stages[0]).sliding_window() if self._one_stage() else None

    def _decode_comm(self, B: int) -> list:
        """:meth:`_collective_terms` of a decode step of ``B`` one-token requests (each samples one row)."""
        b = float(B)
        return self._collective_terms(True, 0, [(self.m.n_layers, b)], b, self._graphed(b))

    def decode_batch_seconds(self, B, S, cmax, Ssw=None):
        """:meth:`seconds` of uniform decode iterations (:meth:`ScalarCost.decode_batch_seconds`'s arguments): the
        rank's closed form, then each collective's seconds added in :meth:`stage_seconds`' order (the same floats:
        the stepped ``t += x``, element by element)."""
        if self.single:
            return self._one.decode_batch_seconds(B, S, cmax, Ssw)
        if not self._one_stage():
            raise ValueError("decode_batch_seconds: one pipeline stage only")
        t = self.stages[0].decode_batch_seconds(B, S, cmax, Ssw)
        if np.ndim(B) == 0:
            for x in self._decode_comm(int(B)):
                t += x
            return t
        Bb = np.broadcast_to(np.asarray(B, np.int64), t.shape)
        u, inv = np.unique(Bb, return_inverse=True)
        cols = np.array([self._decode_comm(int(b)) for b in u.tolist()], np.float64)   # (distinct B, terms)
        for j in range(cols.shape[1]):
            t += cols[inv.reshape(t.shape), j]
        return t

    def mixed_seconds(self, B: int, S: int, cmax: int, items, Ssw=None) -> float:
        """:meth:`seconds` of ``B`` one-token decodes (:meth:`ScalarCost.mixed_seconds`'s arguments) followed by
        ``items`` (each running every layer: one stage): the rank's closed form, then the collectives over the
        step's tokens and LM-head rows, in :meth:`stage_seconds`' order."""
        if self.single:
            return self._one.mixed_seconds(B, S, cmax, items, Ssw)
        if not self._one_stage():
            raise ValueError("mixed_seconds: one pipeline stage only")
        if any(it[2] is not None and it[2] != self.m.n_layers for it in items):
            raise ValueError("mixed_seconds: items that run every layer only")
        t = self.stages[0].mixed_seconds(B, S, cmax, items, Ssw)
        tok, rows = float(B), float(B)
        for it in items:
            if it[0] > 0:
                tok += float(it[0])
                rows += it[4]
        if tok > 0:
            for x in self._collective_terms(True, 0, [(self.m.n_layers, tok)], rows, self._graphed(tok)):
                t += x
        return t


def replica_cost(m: ModelShape, hw, node: NodeProfile | None, par: ParallelConfig, schedule: str = "overlapped",
                 graphs=None, routing=None):
    """The cost object of one replica, as an engine prices its steps: :class:`ScalarCost` on one GPU (TP = PP = 1,
    no DP attention + EP), else :class:`ParallelCost` of the layout on ``node``; ``graphs``: vLLM's CUDA graphs
    (:func:`sim.cost.graphs.engine_graphs`, None: eager kernels), ``routing``: the MoE routing (None: expected)."""
    if par.one_gpu(m):
        return ScalarCost(m, hw, graphs=graphs, routing=routing)
    return ParallelCost(m, hw, node, par, schedule=schedule, graphs=graphs, routing=routing)


def pipeline_schedule(stage_times, in_flight: int | None = None, release=None) -> dict:
    """Start/end of batches through PP stages, one batch per stage at a time (vLLM's pipeline).

    ``stage_times[j][k]``: seconds of batch ``j`` on stage ``k``; batches enter in order, at most
    ``in_flight`` (default PP, vLLM's one batch per stage) in the pipe at once, and not before
    ``release[j]`` (default 0: when the batch could be formed; the engine's batches wait for work)::

        start_j0 = max(end_{j-1,0}, end_{j-in_flight, PP-1}, release_j)
        end_jk   = max(end_{j,k-1}, end_{j-1,k}) + t_jk         (start_jk = end_jk - t_jk)

    Returns ``{"start": [[...]], "end": [[...]], "makespan", "busy" (per stage), "bubble_fraction"
    (per stage: idle share of the makespan)}``.
    """
    T = [list(map(float, row)) for row in stage_times]
    if not T:
        return {"start": [], "end": [], "makespan": 0.0, "busy": [], "bubble_fraction": []}
    S = len(T[0])
    if any(len(r) != S for r in T):
        raise ValueError("pipeline_schedule: every batch needs one time per stage")
    q = S if in_flight is None else int(in_flight)
    if q < 1:
        raise ValueError(f"pipeline_schedule: in_flight must be >= 1, got {q}")
    start = [[0.0] * S for _ in T]
    end = [[0.0] * S for _ in T]
    for j, row in enumerate(T):
        for k, t in enumerate(row):
            ready = end[j][k - 1] if k else max(end[j - q][S - 1] if j >= q else 0.0,
                                                 float(release[j]) if release is not None else 0.0)
            free = end[j - 1][k] if j else 0.0
            start[j][k] = max(ready, free)
            end[j][k] = start[j][k] + t
    span = end[-1][S - 1]
    busy = [sum(r[k] for r in T) for k in range(S)]
    return {"start": start, "end": end, "makespan": span, "busy": busy,
            "bubble_fraction": [1.0 - b / span if span > 0 else 0.0 for b in busy]}
