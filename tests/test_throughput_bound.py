"""``scripts/throughput_bound.py``: the datasheet bound on a maximum-load run's throughput, and what it says about
the KV dtype the TensorRT-LLM FP8 figures declare."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("throughput_bound", ROOT / "scripts" / "throughput_bound.py")
tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb)


def test_bound_by_hand_llama_3_8b_h100():
    """The formula in the module docstring, written out for one case: 1000/1000 on one H100, 2-byte KV."""
    from sim.cost.profiles import load_model
    m = load_model("llama-3-8b")
    h = yaml.safe_load((ROOT / "sim/presets/hardware/h100-sxm.yaml").read_text())   # the preset file, read apart
    lin, head = float(m.layers_params), float(m.lm_head_params)
    kv = 2 * 32 * 8 * 128 * 2                     # bytes a token, K and V, 32 layers, 8 heads of 128
    assert m.n_layers * m.n_kv_heads * m.head_dim * 2 * 2 == kv
    ctx = (999 * (1000 + 1998) / 2) / 1000        # mean KV tokens read per output token (999 decode steps)
    w = lin + 2 * head
    batch = (float(h["mem_capacity"]) - w) / kv / 2000
    t = ctx * kv / float(h["mem_bw"]) + 2 * (lin + head) / float(h["peak_flops_fp8"]) + w / batch / float(h["mem_bw"])
    got = tb.bound("llama-3-8b", "h100-sxm", 1, 2)
    assert got["bound_tok_s"] == pytest.approx(1 / t, rel=1e-12)
    assert got["batch"] == pytest.approx(batch, rel=1e-12)


def test_a_smaller_kv_element_raises_the_bound_and_tp_scales_it():
    two, one = tb.bound("llama-3-70b", "h100-sxm", 2, 2), tb.bound("llama-3-70b", "h100-sxm", 2, 1)
    assert one["bound_tok_s"] > two["bound_tok_s"] and one["batch"] == pytest.approx(2 * two["batch"], rel=0.02)
    assert tb.bound("llama-3-70b", "h100-sxm", 4, 2)["bound_tok_s"] > two["bound_tok_s"]


def test_figures_above_the_two_byte_bound_declare_an_fp8_kv_cache():
    """A published figure above what a 2-byte KV cache allows at every peak cannot have used one: the figure file
    must say fp8; and none may exceed even the 1-byte bound (that would be a wrong value or a wrong shape)."""
    figs = {f["id"]: f for f in yaml.safe_load(tb.FIGURES.read_text())["figures"]}
    above = 0
    for fid in tb.IDS:
        f = figs[fid]
        tp = int((f.get("parallelism") or {}).get("tp", 1))
        two = tb.bound(f["model"], f["hardware"], tp, 2)["bound_tok_s"]
        one = tb.bound(f["model"], f["hardware"], tp, 1)["bound_tok_s"]
        assert f["value"] < one, fid
        if f["value"] > two:
            above += 1
            assert str(f.get("kv_cache_dtype", "")).lower().startswith("fp8"), fid
    assert above >= 1   # the H100 Llama-3.1-8B run: the reason the file says fp8


def test_cli_prints_every_run(capsys):
    assert tb.main([]) == 0
    out = capsys.readouterr().out
    assert all(fid in out for fid in tb.IDS) and "2-byte KV bound" in out
