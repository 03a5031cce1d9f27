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


def test_commands_refuse_dp_attention_naming_the_flags():
    """--data-parallel-size 4 --enable-expert-parallel on an MoE target is refused by the one resolver (every command:
    the trace commands and bench) until the engine runs DP ranks; without EP the four are replicas."""
    from sim.api import loaded
    from sim.replay.target import Target
    from sim.base.errors import ConfigError
    s = loaded()
    rep = Target.resolve(s, "qwen3-30b-a3b", "h100-sxm", None, node="dgx-h100", data_parallel_size=4)
    assert rep.single and rep.cost() is None
    with pytest.raises(ConfigError, match="--data-parallel-size 4 with --enable-expert-parallel"):
        Target.resolve(s, "qwen3-30b-a3b", "h100-sxm", None, node="dgx-h100", data_parallel_size=4,
                       enable_expert_parallel=True)
    from sim.bench import plain
    wl = plain.random_workload(4, 64, 8)
    with pytest.raises(ParallelError, match="--data-parallel-size 4 with --enable-expert-parallel"):
        plain.run(load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), wl, node="dgx-h100",
                  data_parallel_size=4, enable_expert_parallel=True)
