"""Tensor and pipeline parallelism in the cost model, node presets, collective pricing, replica capacity."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sim import api
from sim.serving.capacity import CapacityError, check_fits, kv_capacity, smallest_fitting
from sim.cost.terms import ScalarCost
from sim.cost.parallel import (NodeProfile, ParallelConfig, ParallelCost, ParallelError, kv_heads_per_rank, load_node,
                          pipeline_schedule, rank_model, rank_weight_bytes, stage_layers)
from sim.base.errors import PresetError
from sim.cost.profiles import list_presets, load_hardware, load_model

BUNDLED = api.default_trace_path()
HAS_BUNDLED = (BUNDLED / "manifest.json").is_file()


def test_new_presets_load_with_their_source():
    for name in ("llama-3-70b", "qwen2.5-32b", "qwen2.5-72b", "qwen3-32b"):
        m = load_model(name)
        assert "config.json" in open(m.source).read().splitlines()[0]
    # parameter counts of the published models (bf16 weight bytes / 2), biases and q/k norms aside
    assert load_model("llama-3-70b").weight_bytes / 2 == pytest.approx(70.55e9, rel=2e-3)
    assert load_model("qwen2.5-72b").weight_bytes / 2 == pytest.approx(72.7e9, rel=3e-3)
    assert load_model("qwen3-32b").weight_bytes / 2 == pytest.approx(32.8e9, rel=5e-3)
    assert {"dgx-a100", "dgx-h100", "l4-pcie"} <= set(list_presets("nodes"))
    for n in ("dgx-a100", "dgx-h100"):
        node = load_node(n)
        assert node.gpus_per_node == 8 and node.interconnect == "nvlink" and node.measured
        load_hardware(node.gpu)
    assert not load_node("l4-pcie").measured
    with pytest.raises(PresetError, match="unknown node preset 'nope'"):
        load_node("nope")


def test_node_preset_errors_name_the_field(tmp_path):
    p = tmp_path / "n.yaml"
    p.write_text("name: x\ngpu: l4\ngpus_per_node: 0\ninterconnect: pcie\ntopology: t\nlink_bw_bytes_per_s: 1e9\n"
                 "inter_node_bw_bytes_per_s: 1e9\ncollectives: {model: ring}\n")
    with pytest.raises(PresetError, match="gpus_per_node"):
        load_node(str(p))
    p.write_text(p.read_text().replace("gpus_per_node: 0", "gpus_per_node: 2").replace("ring", "tree"))
    with pytest.raises(PresetError, match="collectives.model"):
        load_node(str(p))


def test_allreduce_zero_at_one_gpu_and_grows_with_size():
    for name in ("dgx-a100", "dgx-h100", "l4-pcie"):
        node = load_node(name)
        assert node.allreduce_seconds(1 << 20, 1) == 0.0
        assert node.allreduce_seconds(0, 8) == 0.0
        for g in (2, 4, 8):
            # decades apart (between neighbouring sizes the measured time can dip where NCCL switches protocol)
            t = [node.allreduce_seconds(s, g) for s in (1 << 12, 1 << 18, 1 << 22, 1 << 24, 1 << 26)]
            assert all(b > a for a, b in zip(t, t[1:])), (name, g, t)
    with pytest.raises(Exception, match="no measured all-reduce over 3 GPUs"):
        load_node("dgx-h100").allreduce_seconds(1 << 20, 3)


def test_fitted_lines_reproduce_the_measured_profile():
    """The node preset's line, priced at the measured sizes, against Vidur's medians (the residual file)."""
    from calibrate.collectives import load
    for name, prof in (("dgx-h100", "h100_dgx"), ("dgx-a100", "a100_dgx")):
        node = load_node(name)
        d = load(prof, "all_reduce")
        for g in (2, 4, 8):
            # every size range of at least 1 MiB priced by its own segment
            for lo, hi in ((1 << 20, 1 << 24), (1 << 24, 1 << 27)):
                s = d[(d.num_workers == g) & (d.devices_per_node == g) & (d["size"] >= lo) & (d["size"] < hi)]
                pred = np.array([node.allreduce_seconds(x, g) for x in s["size"]])
                rel = pred / s["seconds"].to_numpy() - 1
                assert np.median(np.abs(rel)) < 0.10, (name, g, lo)
    fit = json.loads(open("calibrate/data/vidur/network-fit.json").read())
    assert {"a100_dgx", "h100_dgx", "a100_pairwise_nvlink", "h100_pairwise_nvlink"} == set(fit["profiles"])


def test_stage_layers_follow_vllm_get_pp_indices():
    assert stage_layers(32, 4) == [8, 8, 8, 8]
    assert stage_layers(22, 4) == [5, 6, 6, 5]      # vLLM's test_pipeline_partition
    assert stage_layers(61, 4) == [15, 15, 16, 15]
    assert stage_layers(7, 3) == [2, 3, 2]
    assert stage_layers(80, 1) == [80]


def test_rank_shards_and_replicated_kv_heads():
    m = load_model("llama-3-70b")
    assert kv_heads_per_rank(8, 2) == 4 and kv_heads_per_rank(8, 8) == 1 and kv_heads_per_rank(4, 8) == 1
    r = rank_model(m, 4)
    assert (r.n_heads, r.n_kv_heads, r.intermediate_size) == (16, 2, 7168)
    assert rank_model(m, 1) is m
    # with Hkv >= TP every weight is split exactly once (norms replicated)
    w = rank_weight_bytes(m, 4, 1)
    assert w[0] * 4 == pytest.approx(m.weight_bytes, rel=1e-4)
    # PP splits the layers: the stages' weights sum to the model's
    assert sum(rank_weight_bytes(m, 1, 4)) == pytest.approx(m.weight_bytes, rel=1e-12)
    # 2 KV heads at TP 8: each held by 4 ranks, so the K/V projections (and the KV) are stored 4 times
    import dataclasses
    g = dataclasses.replace(m, n_kv_heads=2)
    r8 = rank_model(g, 8)
    assert r8.n_kv_heads == 1 and r8.kv_bytes_per_token * 8 == 4 * g.kv_bytes_per_token
    assert rank_weight_bytes(g, 8, 1)[0] * 8 > g.weight_bytes


@pytest.mark.parametrize("tp,pp,msg", [(3, 1, "--tensor-parallel-size"), (16, 1, "--tensor-parallel-size"),
                                       (1, 0, "--pipeline-parallel-size"), (1, 81, "--pipeline-parallel-size")])
def test_bad_layouts_name_the_flag(tp, pp, msg):
    with pytest.raises(ParallelError, match=msg):
        ParallelConfig(tp, pp).validate(load_model("llama-3-70b"))


def test_layout_checks_heads_node_and_gpus():
    with pytest.raises(ParallelError, match="does not divide qwen2.5-7b's 28 attention heads"):
        ParallelConfig(8, 1).validate(load_model("qwen2.5-7b"))
    q = load_model("qwen2.5-32b")            # 40 heads, 8 KV heads
    ParallelConfig(4, 2).validate(q, load_node("dgx-h100"), gpus=8)
    with pytest.raises(ParallelError, match="--data-parallel-size: 2 replicas x TP 4 x PP 2 = 16 GPUs"):
        ParallelConfig(4, 2, 2).validate(q, gpus=8)
    with pytest.raises(ParallelError, match="--data-parallel-size"):
        ParallelConfig(1, 1, 0)


def _bundled_items(monkeypatch):
    """Every iteration the engine priced in a serving run of the bundled trace (model and hardware too)."""
    import sim.serving.engine as eng
    seen = []

    class Recording(ScalarCost):
        def seconds(self, items):
            items = list(items)
            seen.append(items)
            return super().seconds(items)

    import sim.cost.parallel as par
    with monkeypatch.context() as mp:   # the engine's own cost, or the served replica's (sim.cost.parallel.replica_cost)
        mp.setattr(eng, "ScalarCost", Recording)
        mp.setattr(par, "ScalarCost", Recording)
        api.simulate(None, "rksc", {"tau": 0.8}, hardware="h100-sxm", mode="serving", baselines=False,
                     workload={"concurrency": 8, "n_requests": 8}, step_by_step=True)   # every iteration's items
    return seen


@pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace not present")
def test_tp1_pp1_reduces_bit_for_bit_on_the_bundled_trace(monkeypatch):
    items = _bundled_items(monkeypatch)
    assert len(items) > 100
    from sim.cost.profiles import model_from_manifest
    m = model_from_manifest(api.loaded(None).tf.manifest)
    hw = load_hardware("h100-sxm")
    ref = ScalarCost(m, hw)
    staged = ParallelCost(m, hw, None, ParallelConfig(), delegate_single=False)
    plain = ParallelCost(m, hw, None, ParallelConfig())
    for it in items:
        a = ref.seconds(it)
        assert staged.seconds(it) == a and plain.seconds(it) == a
        assert staged.stage_seconds(it) == [a]


def test_tp_splits_compute_and_adds_two_allreduces_per_layer():
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    dec = [(1.0, 2000.0, None, 0.0, 1.0, 0.0)] * 64
    t = {tp: ParallelCost(m, hw, node, ParallelConfig(tp, 1)).seconds(dec) for tp in (1, 2, 4, 8)}
    assert t[1] > t[2] > t[4] > t[8]
    # TP 2 = the rank's compute + 2 L all-reduces of 64 tokens + the embedding's + half a logits all-reduce
    rank = ScalarCost(rank_model(m, 2), hw, sample_vocab=m.vocab_size).seconds(dec)
    # (vLLM's custom all-reduce at 2 GPUs, eager: one more kernel; the logits gather by NCCL)
    ar = node.allreduce_seconds(64 * m.hidden_size * 2, 2, launch_s=hw.per_kernel_s)
    want = rank + (2 * m.n_layers + 1) * ar + 0.5 * node.allreduce_seconds(64 * m.vocab_size * 2, 2, custom=False)
    assert t[2] == pytest.approx(want, rel=1e-12)
    # the communication is real: without it TP 8 would be faster than it is
    rank8 = ScalarCost(rank_model(m, 8), hw, sample_vocab=m.vocab_size).seconds(dec)
    assert t[8] - rank8 > 2 * m.n_layers * node.allreduce_seconds(64 * m.hidden_size * 2, 8)


def test_pp_stages_sum_compute_and_sends():
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    pre = [(512.0, 0.0, None, 0.0, 1.0, 0.0)]
    pc = ParallelCost(m, hw, node, ParallelConfig(1, 4))
    st = pc.stage_seconds(pre)
    assert len(st) == 4
    send = node.sendrecv_seconds(2 * 512 * m.hidden_size * 2)
    first = ScalarCost(rank_model(m, 1, 20), hw, sample_vocab=m.vocab_size).seconds([(512.0, 0.0, 20, 0.0, 0.0, 0.0, 0.0)])
    assert st[0] == pytest.approx(first + send, rel=1e-12)
    assert st[3] > st[1] - send                # the last stage runs the LM head (and sends nothing)
    # an early exit at layer 30 stops in stage 1: nothing runs on stages 2 and 3
    ex = pc.stage_seconds([(16.0, 100.0, 30.0, 1.0, 1.0, 0.0, 0.0)])
    assert ex[2] == 0.0 and ex[3] == 0.0 and ex[1] > 0


def test_pipeline_schedule_hand_computed():
    # two stages, three batches of (1, 2) s: stage 1 is the bottleneck; stage 0 idles
    # (vLLM: at most PP = 2 batches in flight, so batch 2 enters when batch 0 has left, at t = 3)
    s = pipeline_schedule([[1, 2], [1, 2], [1, 2]])
    assert s["end"] == [[1, 3], [2, 5], [4, 7]]
    assert pipeline_schedule([[1, 2], [1, 2], [1, 2]], in_flight=3)["end"] == [[1, 3], [2, 5], [3, 7]]
    assert s["makespan"] == 7
    assert s["bubble_fraction"] == pytest.approx([1 - 3 / 7, 1 - 6 / 7])
    # one batch in flight at a time: no overlap at all
    assert pipeline_schedule([[1, 2], [1, 2]], in_flight=1)["end"] == [[1, 3], [4, 6]]
    with pytest.raises(ValueError):
        pipeline_schedule([[1, 2], [1]])


def test_replica_capacity_and_refusal_names_the_smallest_layout():
    m, hw = load_model("llama-3-70b"), load_hardware("h100-sxm")
    with pytest.raises(CapacityError, match="smallest that fits: --tensor-parallel-size 2 --pipeline-parallel-size 1"):
        check_fits(m, hw)
    c2 = check_fits(m, hw, parallel=ParallelConfig(2, 1))
    c4 = kv_capacity(m, hw, parallel=ParallelConfig(4, 1))
    assert 0 < c2["kv_capacity_bytes"] < c4["kv_capacity_bytes"]
    # per rank: usable - weight shard - reserve, in tokens of that rank's KV heads
    r = c4["per_rank"][0]
    assert r["kv_bytes"] == pytest.approx(c4["cuda_total_bytes"] * 0.9 - r["weight_bytes"] - c4["activation_reserve_bytes"])
    assert c4["num_gpu_blocks"] == int(r["kv_bytes"] // (16 * 2 * 80 * 2 * 128 * 2))   # whole blocks of the rank's heads
    assert c4["kv_tokens"] == 16 * c4["num_gpu_blocks"]
    assert c4["kv_capacity_bytes"] == pytest.approx(c4["kv_tokens"] * m.kv_bytes_per_token)
    # one GPU: the formula of today, unchanged
    s = load_model("llama-3-8b")
    assert kv_capacity(s, hw, parallel=ParallelConfig()) == kv_capacity(s, hw)
    assert smallest_fitting(s, hw) == ParallelConfig()
    assert smallest_fitting(load_model("qwen2.5-72b"), load_hardware("l4")) == ParallelConfig(8, 1)


def test_tp_prediction_against_vidur_measurement():
    """Fitted at TP 1 only, the shard of each rank predicts Vidur's TP 2/4/8 layer times within 10% (median)."""
    from calibrate.tp_vidur import table
    res = table()
    for tp in ("2", "4", "8"):
        r = res["by_tp"][tp]
        assert not r["in_fit"] and r["points"] > 400
        assert r["layer_sum"]["median_abs"] <= 0.10, (tp, r["layer_sum"])
    assert res["goal_met"]
