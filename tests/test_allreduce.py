"""vLLM's custom all-reduce on NVLink nodes: fitted lines, vLLM's size rules, the PCIe rule and the flag."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.cost.terms import ScalarCost
from sim.cost.parallel import NodeProfile, ParallelConfig, ParallelCost, load_node
from sim.base.errors import PresetError
from sim.cost.profiles import load_hardware, load_model

MiB = 1 << 20


def test_preset_holds_what_the_fit_writes_and_recovers_the_measurements():
    """The dgx-h100 block is calibrate.collectives' fit of the data file, and its lines price the measured sizes."""
    from calibrate.collectives import custom_block, fit_custom_ar
    node = load_node("dgx-h100")
    res = fit_custom_ar()
    assert node.custom_allreduce == custom_block(res, "dgx-h100")
    for g, kinds in res["nodes"]["dgx-h100"].items():
        for kind, r in kinds.items():
            rel = []
            for p in r["points"]:
                # the size's kernel under vLLM's rule is the line that was fitted on it, where vLLM runs it
                line = node.custom_allreduce_line(p["bytes"], int(g))
                if line is not None and line[0] == kind:
                    assert node.allreduce_seconds(p["bytes"], int(g), cuda_graph=True) == pytest.approx(
                        line[1] + p["bytes"] / line[2], rel=1e-12)
                lat, bw = (float(node.custom_allreduce["lines"][g][kind][f]) for f in ("latency_s", "bw_bytes_per_s"))
                rel.append((lat + p["bytes"] / bw) / p["seconds"] - 1)
            rel = np.abs(rel)
            assert np.median(rel) < 0.08 and rel.max() < 0.25, (g, kind, rel)
    # the two-shot points timed in an eager loop agree with the graph table where both exist (4 GPUs)
    assert all(0.85 < v < 1.2 for v in res["eager_vs_graph"].values())


def test_dgx_h200_takes_the_dgx_h100_lines_as_the_fit_writes_them():
    """The DGX H200's fabric is the DGX H100's (the same collectives.profile: calibrate.collectives.fabric_twin): the
    same custom lines and rules, written by the same fit, and the same price of every size at every GPU count."""
    from calibrate.collectives import custom_block, fabric_twin, fit_custom_ar
    assert fabric_twin("dgx-h200") == fabric_twin("dgx-h100") == "dgx-h100"
    assert fabric_twin("dgx-a100") is None and fabric_twin("rtx-pro-6000-pcie") is None   # no measured lines
    h100, h200 = load_node("dgx-h100"), load_node("dgx-h200")
    assert h200.custom_allreduce == custom_block(fit_custom_ar(), "dgx-h200")
    assert {k: v for k, v in h200.custom_allreduce.items() if k != "source"} == \
        {k: v for k, v in h100.custom_allreduce.items() if k != "source"}
    assert "dgx-h100" in h200.custom_allreduce["source"]
    for g in (2, 4, 8):
        for n in (4096, 57344, 512 * 1024, 4 * MiB):
            assert h200.allreduce_seconds(n, g, cuda_graph=True) == h100.allreduce_seconds(n, g, cuda_graph=True)


def test_kernel_and_path_switch_exactly_at_vllms_limits():
    node = load_node("dgx-h100")
    ca = node.custom_allreduce
    for g in (2, 4):
        mx = ca["max_size_bytes"][str(g)]
        below, at = mx - 16, mx
        assert node.custom_allreduce_line(below, g) is not None
        assert node.custom_allreduce_line(at, g) is None          # should_custom_ar: inp_size < max_size
        assert node.allreduce_seconds(at, g, cuda_graph=True) == node.allreduce_seconds(at, g, custom=False)
        kind, lat, bw = node.custom_allreduce_line(below, g)
        assert node.allreduce_seconds(below, g, cuda_graph=True) == lat + below / bw
        # at decode sizes the custom kernel is the cheaper one (at 8 MiB it need not be: it is the limit vLLM set)
        assert node.allreduce_seconds(256 * 1024, g, cuda_graph=True) < node.allreduce_seconds(256 * 1024, g,
                                                                                                custom=False)
    # 2 GPUs: one-shot at every size; 4 GPUs fully connected: one-shot below 512 KiB, two-shot from it
    assert node.custom_allreduce_line(mx - 16, 2)[0] == "one_shot"
    assert node.custom_allreduce_line(512 * 1024 - 16, 4)[0] == "one_shot"
    assert node.custom_allreduce_line(512 * 1024, 4)[0] == "two_shot"
    # 8 GPUs: vLLM's limit is there (256 KiB with the symmetric-memory communicator on Hopper) but no line is
    # measured: NCCL prices it
    assert ca["max_size_bytes"]["8"] == 256 * 1024 and "8" not in ca["lines"]
    assert node.allreduce_seconds(64 * 1024, 8, cuda_graph=True) == node.allreduce_seconds(64 * 1024, 8, custom=False)


def test_eager_adds_one_kernel_launch_and_graph_none():
    node = load_node("dgx-h100")
    b = 256 * 1024
    assert node.allreduce_seconds(b, 4, cuda_graph=False, launch_s=2e-6) - \
        node.allreduce_seconds(b, 4, cuda_graph=True, launch_s=2e-6) == pytest.approx(2e-6, rel=1e-9)
    # NCCL sizes: as measured, graph or not
    assert node.allreduce_seconds(16 * MiB, 4, cuda_graph=False, launch_s=2e-6) == \
        node.allreduce_seconds(16 * MiB, 4, cuda_graph=True)


def test_pcie_node_never_uses_the_custom_all_reduce(tmp_path):
    node = load_node("l4-pcie")
    assert not node.custom_allreduce
    for g in (2, 4, 8):
        for b in (4096, 512 * 1024, 4 * MiB):
            assert node.custom_allreduce_line(b, g) is None
            assert node.allreduce_seconds(b, g, cuda_graph=True) == node.allreduce_seconds(b, g, custom=False)
    # vLLM's rule: more than two GPUs need full NVLink; a PCIe preset with 4-GPU lines is refused, naming the field
    h = load_node("dgx-h100")
    with pytest.raises(PresetError, match=r"custom_allreduce\.lines\.4: vLLM disables"):
        dataclasses.replace(h, interconnect="pcie")
    with pytest.raises(PresetError, match=r"custom_allreduce\.lines\.2\.one_shot\.bw_bytes_per_s"):
        bad = {**h.custom_allreduce, "lines": {"2": {"one_shot": {"latency_s": 1e-6, "bw_bytes_per_s": 0}}}}
        dataclasses.replace(h, custom_allreduce=bad)
    # a preset file without the block loads (the block is optional)
    p = tmp_path / "n.yaml"
    p.write_text("name: x\ngpu: l4\ngpus_per_node: 2\ninterconnect: pcie\ntopology: t\nlink_bw_bytes_per_s: 1e9\n"
                 "inter_node_bw_bytes_per_s: 1e9\ncollectives: {model: ring}\n")
    assert load_node(str(p)).custom_allreduce == {}


def _decode(n=32, ctx=1152.0):
    return [(1.0, ctx, None, 0.0, 1.0, 0.0)] * n


def test_disable_custom_all_reduce_gives_the_nccl_price():
    m, hw, node = load_model("llama-3-70b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    dec = _decode()
    on = ParallelCost(m, hw, node, ParallelConfig(4, 1))
    off = ParallelCost(m, hw, node, ParallelConfig(4, 1, disable_custom_all_reduce=True))
    # the NCCL price, by hand: the rank's compute + 2 L + 1 all-reduces of 32 tokens + half a logits all-reduce
    rank = on.stages[0].seconds(dec)
    act, logits = 32 * m.hidden_size * 2, 32 * m.vocab_size * 2
    nccl = rank + (2 * m.n_layers + 1) * node.allreduce_seconds(act, 4, custom=False) \
        + 0.5 * node.allreduce_seconds(logits, 4, custom=False)
    assert off.seconds(dec) == pytest.approx(nccl, rel=1e-12)
    custom = rank + (2 * m.n_layers + 1) * node.allreduce_seconds(act, 4, launch_s=hw.per_kernel_s) \
        + 0.5 * node.allreduce_seconds(logits, 4, custom=False)
    assert on.seconds(dec) == pytest.approx(custom, rel=1e-12)
    assert on.seconds(dec) < off.seconds(dec)
    # the flag is vLLM's, declared once where the CLI's target flags come from
    from sim.base.options import declared
    from sim.replay.target import TargetSpec
    flags = {f.name: opt.flag for f, opt in declared(TargetSpec)}
    assert flags["disable_custom_all_reduce"] == "--disable-custom-all-reduce"
    with pytest.raises(ValueError, match="--disable-custom-all-reduce"):
        ParallelConfig(2, 1, disable_custom_all_reduce="yes")


def test_tp1_is_unchanged_bit_for_bit():
    m, hw, node = load_model("llama-3-8b"), load_hardware("h100-sxm"), load_node("dgx-h100")
    ref = ScalarCost(m, hw)
    for items in (_decode(8), [(512.0, 0.0, None, 0.0, 1.0, 0.0)], _decode(3) + [(128.0, 64.0, None, 0.0, 1.0, 0.0)]):
        a = ref.seconds(items)
        for par in (ParallelConfig(), ParallelConfig(disable_custom_all_reduce=True)):
            assert ParallelCost(m, hw, node, par).seconds(items) == a
            assert ParallelCost(m, hw, node, par, delegate_single=False).seconds(items) == a
    assert node.allreduce_seconds(1 << 20, 1, cuda_graph=True) == 0.0
