"""CUDA graphs as vLLM V1 runs them (sim.cost.graphs): capture sizes, padding, full vs piecewise, eager launches."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cost import terms as C
from sim.cost.graphs import CudaGraphs, engine_graphs, vllm_capture_sizes
from sim.cost.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parents[1]
LLAMA = load_model("llama-3-8b")


def test_vllm_default_capture_sizes():
    s = vllm_capture_sizes(256)               # max size min(2 * 256, 512) = 512
    assert s[:4] == (1, 2, 4, 8) and s[-1] == 512
    assert [x for x in s if x < 256] == [1, 2, 4] + list(range(8, 256, 8))
    assert [x for x in s if x >= 256] == list(range(256, 513, 16))
    assert vllm_capture_sizes(8) == (1, 2, 4, 8, 16)
    assert vllm_capture_sizes(1024)[-1] == 512 and vllm_capture_sizes(100)[-1] == 200 - 200 % 8


@pytest.mark.parametrize("tokens,want", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (248, 248),
                                         (249, 256), (256, 256), (257, 272), (511, 512), (512, 512), (513, None),
                                         (0, None)])
def test_padding_is_exact_at_the_boundaries(tokens, want):
    assert CudaGraphs.vllm(1024).padded(tokens) == want


def test_engine_graphs_follow_the_device_and_enforce_eager():
    assert engine_graphs(load_hardware("h100-sxm"), 256) == CudaGraphs.vllm(256)
    assert engine_graphs(load_hardware("h100-sxm"), 256, enforce_eager=True) is None
    assert engine_graphs(load_hardware("local-cpu"), 256) is None
    with pytest.raises(ValueError, match="capture_sizes"):
        CudaGraphs((4, 2))


def _decode(k):
    return [(1.0, 100.0 + i, None, 0.0, 1.0, 0.0) for i in range(k)]


def test_padded_decode_prices_the_padding_rows_through_the_layers_only():
    hw = load_hardware("h100-sxm")
    g = CudaGraphs.vllm(1024)
    five = C.ScalarCost(LLAMA, hw, graphs=g).terms(_decode(5))
    eager5 = C.ScalarCost(LLAMA, hw).terms(_decode(5))
    eager8 = C.ScalarCost(LLAMA, hw).terms(_decode(8))
    assert five.f_lin == eager8.f_lin and five.rows == 8.0     # 5 tokens run as the graph of 8
    assert five.f_head == eager5.f_head and five.samples == eager5.samples   # logits and sampling: real rows
    assert five.f_att == eager5.f_att and five.b_att == eager5.b_att
    assert five.kernels == 0.0 and five.graph_kernels == eager5.kernels      # uniform decode: one full graph
    mixed = C.ScalarCost(LLAMA, hw, graphs=g).terms(_decode(3) + [(40.0, 0.0, None, 0.0, 1.0, 0.0)])
    assert mixed.rows == 48.0 and mixed.kernels == LLAMA.n_layers            # piecewise: attention launched
    big = C.ScalarCost(LLAMA, hw, graphs=g).terms([(600.0, 0.0, None, 0.0, 1.0, 0.0)])
    ref = C.ScalarCost(LLAMA, hw).terms([(600.0, 0.0, None, 0.0, 1.0, 0.0)])
    assert big == ref                                                          # above the largest: eager


def test_eager_launches_bound_an_iteration_from_below():
    hw = dataclasses.replace(load_hardware("h100-sxm"), eager_launch_s=1e-3)
    items = _decode(4)
    eager = C.ScalarCost(LLAMA, hw).seconds(items)
    k = C.ScalarCost(LLAMA, hw).terms(items).kernels
    assert eager == pytest.approx(k * 1e-3, rel=1e-12)
    graphed = C.ScalarCost(LLAMA, hw, graphs=CudaGraphs.vllm(256)).seconds(items)
    assert graphed < 0.1 * eager
    # without the bound the two differ by the padding only (none at 4 tokens)
    hw0 = dataclasses.replace(hw, eager_launch_s=0.0)
    assert C.ScalarCost(LLAMA, hw0, graphs=CudaGraphs.vllm(256)).seconds(items) == \
        pytest.approx(C.ScalarCost(LLAMA, hw0).seconds(items), rel=1e-12)


def _serve(tmp_path, hw_file, *extra):
    out = tmp_path / f"r{len(extra)}.json"
    r = subprocess.run([sys.executable, "-m", "app.cli", "bench", "serve", "--model-preset", "qwen3-4b",
                        "--hardware", str(hw_file), "--random-input-len", "64", "--random-output-len", "16",
                        "--num-prompts", "6", "--max-concurrency", "3", "--save-result", "--result-dir", str(tmp_path),
                        "--result-filename", out.name, *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_enforce_eager_end_to_end(tmp_path):
    """A GPU whose host launches are slow: --enforce-eager decodes slower than vLLM's graphs."""
    d = yaml.safe_load((ROOT / "sim" / "presets" / "hardware" / "h200.yaml").read_text())
    d.update(name="slow-host", eager_launch_s=2e-5)
    hw_file = tmp_path / "slow-host.yaml"
    hw_file.write_text(yaml.safe_dump(d))
    graphs = _serve(tmp_path, hw_file)
    eager = _serve(tmp_path, hw_file, "--enforce-eager")
    assert eager["mean_tpot_ms"] > 1.5 * graphs["mean_tpot_ms"]
