"""DP attention + expert parallelism (vLLM's --data-parallel-size D --enable-expert-parallel): dispatch /
combine pricing from synthetic node lines, weights per GPU, and flag errors."""
import dataclasses

import pytest

from sim.cost.alltoall import a2a_bytes_leaving_rank, dispatch_bytes, dispatch_combine_seconds
from sim.cost.parallel import (ParallelConfig, ParallelCost, ParallelError, load_node, rank_model,
                               rank_weight_bytes)
from sim.cost.profiles import load_hardware, load_model


class LineNode:
    """A node whose every NCCL all-reduce is ``lat + N / bw`` (synthetic: known answers)."""
    def __init__(self, lat=10e-6, bw=100e9):
        self.lat, self.bw, self.calls = lat, bw, []

    def allreduce_seconds(self, nbytes, gpus, cuda_graph=False, custom=True, launch_s=0.0):
        self.calls.append((nbytes, gpus, custom))
        return 0.0 if gpus <= 1 or nbytes <= 0 else self.lat + nbytes / self.bw


def test_dispatch_combine_recovers_line():
    node = LineNode()
    # 4 DP ranks x 64 tokens x 7168 hidden x 2 bytes; k = 8 top-k (weight + id, 8 bytes each)
    t = dispatch_combine_seconds(node, 64, 7168, 2, 4, experts_per_token=8)
    d = 4 * 64 * (7168 * 2 + 8 * 8)
    c = 4 * 64 * 7168 * 2
    assert t == pytest.approx(0.5 * (10e-6 + d / 100e9) + 0.5 * (10e-6 + c / 100e9), rel=1e-12)
    assert all(g == 4 and custom is False for _, g, custom in node.calls)   # NCCL over the DP group
    assert dispatch_combine_seconds(node, 64, 7168, 2, 1) == 0.0
    with pytest.raises(ValueError, match="--all2all-backend"):
        dispatch_combine_seconds(node, 64, 7168, 2, 4, backend="deepep_low_latency")
    assert dispatch_bytes(10, 4, 2, 3, 1) == 3 * 10 * (8 + 8)


def test_a2a_bytes_dedup():
    # k = 1 over EP = 4: a token leaves with probability 3/4
    assert a2a_bytes_leaving_rank(100, 10, 2, 1, 4) == pytest.approx(100 * 20 * 0.75)
    # k = 2 over EP = 2: the other rank is hit with probability 1 - 1/4
    assert a2a_bytes_leaving_rank(1, 1, 1, 2, 2) == pytest.approx(0.75)
    assert a2a_bytes_leaving_rank(5, 5, 2, 8, 1) == 0.0


def test_ep_size_and_weights_per_gpu_exact():
    m = load_model("qwen3-30b-a3b")
    par = ParallelConfig(2, 1, 4, enable_expert_parallel=True)
    assert par.dp_attention(m) and par.expert_parallel_size(m) == 8
    assert ParallelConfig(2, 1, 4).expert_parallel_size(m) == 1
    r = rank_model(m, 2, ep=True, ep_size=8)
    assert r.expert_parallel_size == 8 and r.moe_intermediate_size == m.moe_intermediate_size
    # weights per GPU: the TP-2 rank's layers with 1/8 of the experts instead of 1/2
    full = rank_weight_bytes(m, 2, 1, ep=True)[0]
    dpa = rank_weight_bytes(m, 2, 1, ep=True, ep_size=8)[0]
    s = m.dtype_bytes
    moe_layers = m.n_layers - m.first_k_dense
    per_expert = 3 * m.hidden_size * m.moe_intermediate_size * s      # gate, up, down
    assert full - dpa == pytest.approx(moe_layers * per_expert * (m.num_experts / 2 - m.num_experts / 8), rel=1e-9)


def test_flag_errors_name_flags():
    m = load_model("qwen3-30b-a3b")     # 128 experts
    with pytest.raises(ParallelError, match="--data-parallel-size"):
        ParallelConfig(1, 1, 3, enable_expert_parallel=True).validate(m)
    with pytest.raises(ParallelError, match="--pipeline-parallel-size"):
        ParallelConfig(1, 2, 2, enable_expert_parallel=True).validate(m)
    ParallelConfig(1, 1, 3).validate(m)        # replicas: no EP constraint


def test_dp_attention_cost_adds_dispatch_combine():
    m = load_model("qwen3-30b-a3b")
    hw = load_hardware("h100-sxm")
    node = load_node("dgx-h100")
    items = [(256, 0, None, 1, 1, 0)]
    rep = ParallelCost(m, hw, node, ParallelConfig(1, 1, 4))                       # 4 replicas: single GPU each
    dpa = ParallelCost(m, hw, node, ParallelConfig(1, 1, 4, enable_expert_parallel=True))
    assert not rep.dpa and dpa.dpa and dpa.stages[0].m.expert_parallel_size == 4
    comm = (m.n_layers - m.first_k_dense) * dispatch_combine_seconds(node, 256, m.hidden_size, m.dtype_bytes, 4,
                                                                     m.experts_per_token)
    no_comm = ParallelCost(m, hw, node, ParallelConfig(1, 1, 4, enable_expert_parallel=True))
    assert dpa.seconds(items) == pytest.approx(no_comm.stages[0].seconds(items) + comm, rel=1e-12)
    assert comm > 0


def test_dp_attention_experts_run_over_the_gathered_rows():
    """Under DP attention each rank's E / (D TP) experts run over all D ranks' rows: the rank's distinct experts and
    expert GEMM rows at its own t rows are those of D t rows; the router and shared experts stay at t."""
    from sim.cost.gemm import variant_gemms
    from sim.cost.routing import SampledRouting, distinct_experts
    m = load_model("qwen3-30b-a3b")                  # E = 128, k = 8
    r = rank_model(m, 1, ep=True, ep_size=4)         # DP 4 x TP 1
    assert r.expert_rows_factor == 4 and r.local_experts == 32
    assert rank_model(m, 2, ep=True).expert_rows_factor == 1     # EP = TP: every rank sees every token already
    flat = dataclasses.replace(r, expert_rows_factor=1)
    # a batch of 1 on each rank: 4 gathered rows, 32 (1 - (1 - 8/128)^4) of this rank's experts hit
    assert distinct_experts(r, 1.0) == pytest.approx(32 * (1 - (1 - 8 / 128) ** 4), rel=1e-12)
    for t in (1.0, 7.0, 64.0, 512.0):
        assert distinct_experts(r, t) == distinct_experts(flat, 4 * t)
        g, g4 = variant_gemms(r, t), variant_gemms(flat, 4 * t)
        assert g[-2:] == g4[-2:]                     # the routed experts: groups and rows per group
        router = [x for x in g if x[1] == m.num_experts]
        assert router and all(x[4] == t for x in router)   # the router runs on the rank's own rows
    assert SampledRouting(3).distinct(r, 5.0) == SampledRouting(3).distinct(flat, 20.0)
    # the rank's expert work per own row is D k / EP = k / TP
    assert r.local_k == pytest.approx(m.experts_per_token / 1)
    hw, node = load_hardware("h100-sxm"), load_node("dgx-h100")
    dpa = ParallelCost(m, hw, node, ParallelConfig(1, 1, 4, enable_expert_parallel=True))
    items = [(1.0, 512.0, None, 0.0, 1.0, 0.0)] * 8       # a decode batch of 8 on this rank
    from sim.cost.terms import ScalarCost
    gathered = ScalarCost(dpa.stages[0].m, hw).seconds(items)
    own = ScalarCost(dataclasses.replace(dpa.stages[0].m, expert_rows_factor=1), hw).seconds(items)
    assert gathered > own                               # more experts read over 32 rows than over 8


def test_dp_attention_capacity_holds_a_gpus_share_of_the_experts():
    """KV per GPU under DP attention + EP: each GPU holds E / (D TP) experts, so more room than a whole-model replica
    (the capacity check and the run read the same numbers)."""
    from sim.serving.capacity import kv_capacity
    m, hw = load_model("qwen3-30b-a3b"), load_hardware("h100-sxm")
    dpa = kv_capacity(m, hw, None, ParallelConfig(1, 1, 4, enable_expert_parallel=True))
    rep = kv_capacity(m, hw, None, ParallelConfig(1, 1, 4))
    assert dpa["weight_bytes"] == pytest.approx(rank_weight_bytes(m, 1, 1, ep=True, ep_size=4)[0], rel=1e-12)
    assert rep["weight_bytes"] == pytest.approx(m.weight_bytes, rel=1e-3)
    assert dpa["num_gpu_blocks"] > rep["num_gpu_blocks"]
    assert "E / 4 experts a GPU" in dpa["capacity_source"]


def test_commands_run_dp_attention_and_refuse_what_they_cannot_price():
    """--data-parallel-size 4 --enable-expert-parallel on an MoE target runs as DP ranks (the trace commands and bench)
    on the node's links; more DP x TP GPUs than one node holds is refused naming the flag."""
    from sim.api import loaded
    from sim.replay.target import Target
    from sim.base.errors import ConfigError
    s = loaded()
    rep = Target.resolve(s, "qwen3-30b-a3b", "h100-sxm", None, node="dgx-h100", data_parallel_size=4)
    assert rep.single and rep.cost() is None
    t = Target.resolve(s, "qwen3-30b-a3b", "h100-sxm", None, data_parallel_size=4, enable_expert_parallel=True)
    assert not t.single and t.node.name == "dgx-h100" and t.cost().dpa
    with pytest.raises(ConfigError, match="--data-parallel-size: 8 x --tensor-parallel-size 2 = 16 GPUs"):
        Target.resolve(s, "qwen3-30b-a3b", "h100-sxm", None, data_parallel_size=8, tensor_parallel_size=2,
                       enable_expert_parallel=True)
    from sim.bench import plain
    wl = plain.random_workload(16, 64, 8)
    run = plain.run(load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), wl, data_parallel_size=4,
                    enable_expert_parallel=True)
    assert run.info["dp_attention"]["expert_parallel_size"] == 4 and run.info["node"] == "dgx-h100"
    assert "lockstep" in run.info["dp_attention"]["note"]
    alone = plain.run(load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), wl, data_parallel_size=4)
    assert "dp_attention" not in alone.info
    with pytest.raises(ParallelError, match="--data-parallel-size: 8 x --tensor-parallel-size 2 = 16 GPUs"):
        plain.run(load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), wl, data_parallel_size=8,
                  tensor_parallel_size=2, enable_expert_parallel=True)


def test_dp_attention_range_check_sees_a_gpus_share_of_the_experts():
    """A model no one GPU holds whole runs under DP attention + EP where its experts, spread over the ranks, fit:
    DeepSeek-V3 (FP8 as released, 673 GB) over 8 H200s, each with 1/8 of the routed experts. bench and the trace
    commands check the fitted range on one shard (ParallelConfig.gpu_shard), the one the capacity prices."""
    from sim.bench import plain
    from sim.replay.target import Target
    from sim.api import loaded
    m, h200 = load_model("deepseek-v3"), load_hardware("h200")
    par = ParallelConfig(1, 1, 8, False, True)
    shard = par.gpu_shard(m)
    assert shard.expert_parallel_size == 8 and m.weight_bytes > h200.mem_capacity > 1.3 * shard.weight_bytes
    t = Target.resolve(loaded(), m, h200, None, data_parallel_size=8, enable_expert_parallel=True)
    assert t.rank_model == shard
    assert ParallelConfig(1, 1, 8).gpu_shard(m) is m                      # replicas: each a whole model
    assert ParallelConfig(8, 1, 1).gpu_shard(m) == rank_model(m, 8, m.n_layers)
    run = plain.run(m, h200, plain.random_workload(8, 64, 8), data_parallel_size=8, enable_expert_parallel=True)
    assert run.info["dp_attention"]["expert_parallel_size"] == 8
