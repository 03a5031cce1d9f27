"""rksim's KV sizing against vLLM's own start-up logs (docs/data/vllm-kv-capacity.yaml).

Every point held out as a check must come within 5% of the KV size vLLM logged; the points that set
constants must reproduce the breakdown they set; the table in docs/calibration.md is rendered from
the same rows.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.serving.capacity import GIB, VLLM_RULES, activation_peak, vllm_kv_budget
from sim.cost.parallel import rank_weight_bytes
from sim.cost.model_shape import ModelShape
from sim.cost.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data" / "vllm-kv-capacity.yaml"
DOC = ROOT / "docs" / "calibration.md"
TOL = 0.05


def points() -> list[dict]:
    return yaml.safe_load(DATA.read_text())["points"]


def model_of(p: dict) -> ModelShape:
    if "shape" in p:
        return ModelShape(name=p["model"], source=str(DATA), **p["shape"])
    m = load_model(p["model"])
    if p.get("quantization") or p.get("kv_cache_dtype"):
        m = m.with_precision(p.get("quantization"), p.get("kv_cache_dtype"))
    return m


def budget(p: dict) -> dict:
    # a logged total is the device's memory; only without one is the hardware preset read (a point may name a
    # device no preset prices yet: its KV sizing needs only the memory)
    m = model_of(p)
    total = p["total_gib"] * GIB if p.get("total_gib") else load_hardware(p["hardware"]).mem_capacity
    return vllm_kv_budget(m, total, p["gpu_memory_utilization"], p["max_num_batched_tokens"], p["max_num_seqs"],
                          p["tensor_parallel_size"], 1, p["rules"])


def predicted(p: dict) -> tuple[str, float, float] | None:
    """(what, logged, rksim) for a point with a KV figure, else None."""
    lg = p["logged"]
    if "model" not in p or not ({"num_gpu_blocks", "available_kv_gib"} & set(lg)):
        return None
    b = budget(p)
    if "num_gpu_blocks" in lg:
        return "blocks", float(lg["num_gpu_blocks"]), float(b["num_gpu_blocks"])
    return "KV GiB", float(lg["available_kv_gib"]), b["available_kv_bytes_per_gpu"] / GIB


def table() -> str:
    rows = ["| point | shape | vLLM | logged | rksim | ratio | use |", "|---|---|---|---|---|---|---|"]
    for p in points():
        got = predicted(p)
        if got is None:
            continue
        what, lg, rk = got
        shape = f"{p['model']} TP{p['tensor_parallel_size']} {p['hardware']} x{p['gpu_memory_utilization']:g}"
        fmt = (lambda v: f"{v:,.0f}") if what == "blocks" else (lambda v: f"{v:.2f}")
        rows.append(f"| [{p['id']}]({p['url']}) | {shape} | {p['vllm'].split(' ')[0]} | {fmt(lg)} {what} | "
                    f"{fmt(rk)} {what} | {rk / lg:.3f} | {p['use']} |")
    return "\n".join(rows)


def test_data_file_is_well_formed():
    ps = points()
    assert len({p["id"] for p in ps}) == len(ps)
    for p in ps:
        assert p["url"].startswith("https://github.com/"), p["id"]
        assert p["use"] in ("sets", "check", "excluded", "finding"), p["id"]
        if p["use"] in ("excluded", "finding"):
            assert p.get("why"), p["id"]
        for s in p.get("sets", []):
            rules = next(r for r in VLLM_RULES if s.startswith(r + "."))   # rules names hold dots (v0.6.5)
            assert hasattr(VLLM_RULES[rules], s[len(rules) + 1:]), s
    assert sum(p["use"] == "check" for p in ps) >= 1


@pytest.mark.parametrize("p", [p for p in points() if p["use"] == "check"], ids=lambda p: p["id"])
def test_held_out_kv_within_5_percent(p):
    what, lg, rk = predicted(p)
    assert abs(rk / lg - 1) <= TOL, f"{p['id']}: rksim {rk:.1f} {what} vs vLLM's {lg:.1f} ({rk / lg:.3f})"


@pytest.mark.parametrize("p", [p for p in points() if p["use"] == "finding"], ids=lambda p: p["id"])
def test_a_finding_is_a_miss_its_why_accounts_for(p):
    """A finding is held out and missed by more than 5% (within 5% it would be a check); its ``why`` puts the miss
    on the logged terms: with the non-torch memory vLLM logged there, the KV lands within 10%."""
    what, lg, rk = predicted(p)
    assert abs(rk / lg - 1) > TOL, f"{p['id']}: within 5% ({rk / lg:.3f}): make it a check"
    b = budget(p)
    r = VLLM_RULES[p["rules"]]
    kv = b["available_kv_bytes_per_gpu"] + (r.non_torch_tp1_bytes - p["logged"]["non_torch_gib"] * GIB)
    m = model_of(p)
    act = activation_peak(m, p["max_num_batched_tokens"], p["max_num_seqs"], 1, rules=r) / GIB
    assert act == pytest.approx(p["logged"]["activation_peak_gib"], rel=0.10)
    logged_kv = lg * 16 * 2 * m.n_layers * m.n_kv_heads * m.head_dim * m.dtype_bytes
    assert abs(kv / logged_kv - 1) <= 0.10, (kv / GIB, logged_kv / GIB)


def test_constants_reproduce_the_breakdowns_that_set_them():
    by = {p["id"]: p for p in points()}
    tp1, tp2 = by["pr10511-llama3-8b-h100-tp1"], by["pr10511-llama3-8b-h100-tp2"]
    m = model_of(tp1)
    r = VLLM_RULES["v0.6.5"]
    # weights from the shape (not from any log) against what vLLM measured loading them
    for p in (tp1, tp2):
        w = rank_weight_bytes(m, p["tensor_parallel_size"], 1)[0] / GIB
        assert w == pytest.approx(p["logged"]["weights_gib"], abs=0.01), p["id"]
    assert r.non_torch_tp1_bytes / GIB == tp1["logged"]["non_torch_gib"]
    assert r.non_torch_tpn_bytes / GIB == tp2["logged"]["non_torch_gib"]
    # the sampler constant gives TP 1's peak; TP 2's (held out) follows: the whole-vocabulary logits set it
    for p in (tp1, tp2):
        a = activation_peak(m, p["max_num_batched_tokens"], p["max_num_seqs"], p["tensor_parallel_size"],
                            rules=r) / GIB
        assert a == pytest.approx(p["logged"]["activation_peak_gib"], rel=0.01), p["id"]
    # the fit point's KV, from its own breakdown
    what, lg, rk = predicted(tp1)
    assert abs(rk / lg - 1) <= 0.01
    v19 = VLLM_RULES["v0.19"]
    a1, a2 = by["planner-v019-llama31-8b-h100-tp1"], by["planner-v019-llama31-8b-h100-tp2"]
    assert v19.non_torch_tp1_bytes / GIB == a1["logged"]["non_torch_gib"]
    assert v19.non_torch_tpn_bytes / GIB == a2["logged"]["non_torch_gib"]
    for p in (a1, a2):   # the sampler constant gives both peaks (TP 2's held out), and the shape both weights
        a = activation_peak(m, p["max_num_batched_tokens"], p["max_num_seqs"], p["tensor_parallel_size"],
                            rules=v19) / GIB
        assert a == pytest.approx(p["logged"]["activation_peak_gib"], abs=0.005), p["id"]
        w = rank_weight_bytes(m, p["tensor_parallel_size"], 1)[0] / GIB
        assert w == pytest.approx(p["logged"]["weights_gib"], abs=0.04), p["id"]
        what, lg, rk = predicted(p)
        assert abs(rk / lg - 1) <= 0.001, p["id"]
    v11 = VLLM_RULES["v0.11"]
    b1, b2 = by["llmdbench-v011-llama31-8b-h100-tp1"], by["llmdbench-v011-qwen3-32b-h100-tp2"]
    assert v11.non_torch_tp1_bytes / GIB == b1["logged"]["non_torch_gib"]
    assert v11.non_torch_tpn_bytes / GIB == b2["logged"]["non_torch_gib"]
    for p in (b1, b2):   # the sampler constant from Llama's peak gives Qwen3-32B's (another vocabulary, held out)
        mp = model_of(p)
        a = activation_peak(mp, p["max_num_batched_tokens"], p["max_num_seqs"], p["tensor_parallel_size"],
                            rules=v11) / GIB
        assert a == pytest.approx(p["logged"]["activation_peak_gib"], abs=0.01), p["id"]
        what, lg, rk = predicted(p)
        assert abs(rk / lg - 1) <= 0.005, p["id"]
    v1 = VLLM_RULES["v1"]
    assert v1.non_torch_tp1_bytes / GIB == by["issue13882-non-torch-tp1"]["logged"]["non_torch_gib"]
    assert v1.non_torch_tpn_bytes / GIB == by["issue16570-non-torch-tp4"]["logged"]["non_torch_gib"]
    assert v1.cudagraph_bytes / GIB == by["gpustack251-cudagraph"]["logged"]["cudagraph_gib"]


def test_blocks_are_whole_and_per_layer():
    """vLLM's arithmetic: floor(available / (16 * 2 * layers * Hkv_r * Dh * s)), the fewest over stages."""
    m = load_model("llama-3-70b")
    b = vllm_kv_budget(m, 80 * GIB, 0.9, 2048, 256, 2, 2)
    for r in b["per_rank"]:
        assert r["num_gpu_blocks"] == int(r["kv_bytes"] // (16 * 2 * r["layers"] * 4 * 128 * 2))
    assert b["num_gpu_blocks"] == min(r["num_gpu_blocks"] for r in b["per_rank"])
    # the first stage holds no sampler logits: its peak is the forward's
    assert b["per_rank"][0]["activation_peak_bytes"] < b["per_rank"][1]["activation_peak_bytes"]


def test_calibration_doc_table_is_rendered_from_the_data():
    text = DOC.read_text()
    start, end = "<!-- generated: tests/test_capacity_vllm.py -->", "<!-- /generated -->"
    assert start in text, f"{DOC}: missing the block {start}"
    block = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert block == table(), "docs/calibration.md: KV table out of date; paste:\n" + table()
