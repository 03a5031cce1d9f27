"""LLMServingSim's measured vLLM 0.19.0 bench runs (``calibrate/llmservingsim_bench.py``,
``calibrate/data/llmservingsim-bench/``): the shipped files are the upstream ones, the figures are the artifact's
own definitions (its summary.txt agrees to 0.1 ms), and the published-figure file holds exactly those figures,
workloads and engine settings -- a changed value is caught."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from calibrate import llmservingsim_bench as b
from sim.bench.validate import load_figures, refusal

ROOT = Path(__file__).resolve().parents[1]
FIGS = ROOT / "docs" / "validation" / "published-figures.yaml"
KV = ROOT / "docs" / "data" / "vllm-kv-capacity.yaml"


@pytest.fixture(scope="module")
def figs():
    return load_figures(FIGS)


def _mine(figs) -> dict:
    return {f["id"]: f for f in figs if f["id"].startswith("llmservingsim-rtx")}


def test_shipped_files_are_the_ones_source_md_names():
    """Every file SOURCE.md lists is here with its sha256, and every run file is listed."""
    rows, name = [], None
    for line in (b.DATA / "SOURCE.md").read_text().splitlines():
        if line.startswith("- `"):
            name = line.split("`")[1]
        elif line.startswith("  sha256 ") and name:
            rows.append((name, line.split()[1]))
            name = None
    assert len(rows) == 3 * len(b.RUNS) + 1
    for name, sha in rows:
        assert hashlib.sha256((b.DATA / name).read_bytes()).hexdigest() == sha, name
    listed = {n for n, _ in rows}
    for run in b.RUNS:
        assert {f"{run}-requests.jsonl", f"{run}-meta.json", f"{run}-summary.txt"} <= listed
    assert (b.DATA / "LICENSE").read_text().startswith("MIT License")


def test_figures_are_the_artifacts_own():
    """The artifact's validation/summary.txt (column vLLM, 0.1 ms) gives the same means and medians; every request
    is timed, on the engine's clock (queued_ts), with its trace lengths."""
    labels = {"mean_ttft_ms": "TTFT Mean", "median_ttft_ms": "TTFT Median", "mean_tpot_ms": "TPOT Mean",
              "median_tpot_ms": "TPOT Median", "mean_e2el_ms": "Latency Mean", "median_e2el_ms": "Latency Median"}
    for run in b.RUNS:
        f = b.figures(run)
        assert f["requests"] == f["timed"] == 300 and f["anchor"] == "queued_ts", run
        summary = {ln[:25].strip(): ln.split()[2] for ln in (b.DATA / f"{run}-summary.txt").read_text().splitlines()
                   if ln[:4] in ("TTFT", "TPOT", "Late")}
        for m, label in labels.items():
            assert f"{f[m]:.1f}" == summary[label], (run, m, f[m], summary[label])
        reqs = b.load_requests(run)
        span = max(r["last_token_ts"] for r in reqs) - min(r["queued_ts"] for r in reqs)
        assert f["output_throughput"] == pytest.approx(sum(r["output_toks"] for r in reqs) / span, rel=1e-12)


def test_workloads_are_the_traces_and_the_sends_kept_their_spacing():
    """Each run's lengths are its trace's (the runner pins them); the front end's arrival_time of requests 1..299
    keeps the trace's arrival_time_ns spacing within 20 ms (request 0 within 50 ms)."""
    arr = b.load_arrivals()
    assert set(arr) == {spec[2] for spec in b.RUNS.values()} and all(len(v["input_toks"]) == 300 for v in arr.values())
    for run, spec in b.RUNS.items():
        trace, reqs = arr[spec[2]], b.load_requests(run)
        assert [r["request_id"] for r in reqs] == [f"bench-{i}" for i in range(300)]
        assert [r["input_toks"] for r in reqs] == trace["input_toks"]
        assert [r["output_toks"] for r in reqs] == trace["output_toks"]
        t = trace["arrival_time_ns"]
        d = [(reqs[i]["arrival_time"] - reqs[1]["arrival_time"]) - (t[i] - t[1]) * 1e-9 for i in range(300)]
        assert max(abs(x) for x in d[1:]) < 0.020 and abs(d[0]) < 0.050, run
        meta = json.loads(b.meta_path(run).read_text())
        assert meta["vllm_version"] == "0.19.0" and meta["num_requests"] == 300
        assert meta["dataset_path"] == f"workloads/{spec[2]}.jsonl"


def test_the_figure_file_holds_exactly_these_figures(figs):
    """--check's comparison: every run's figures, values rounded as written and workloads, and nothing else."""
    assert b.check(figs) == []
    mine = _mine(figs)
    assert len(mine) == len(b.RUNS) * len(b.METRICS)
    for run in b.RUNS:
        v = b.rounded(run)
        for m in b.METRICS:
            f = mine[b.figure_id(run, m)]
            assert f["metric"] == m and f["value"] == v[m]
    assert b.main(["--check", str(FIGS)]) == 0


def test_engine_settings_match_meta_json(figs):
    """serving and parallelism as each run's meta.json states them; the RTX 4090's resolved defaults as written."""
    for f in _mine(figs).values():
        run = next(r for r, spec in b.RUNS.items() if f["id"].startswith(f"llmservingsim-{spec[1]}-"))
        kw = json.loads(b.meta_path(run).read_text())["engine_kwargs"]
        sv, par = f["serving"], f["parallelism"]
        assert sv["max_num_seqs"] == kw["max_num_seqs"] and sv["max_num_batched_tokens"] == kw["max_num_batched_tokens"]
        assert par.get("tp", 1) == kw["tensor_parallel_size"] and par.get("dp", 1) == kw["data_parallel_size"]
        assert par.get("ep", False) is kw["enable_expert_parallel"]
        assert kw["dtype"] == f["dtype"] == "bfloat16" and kw["kv_cache_dtype"] == "auto"
        assert sv["frontend"] is False and sv["host_time"] is True and f["workload"]["request_rate"] == 10
    meta = json.loads(b.meta_path("rtx4090-llama-3.1-8b").read_text())
    kv, sched = meta["kv_cache"], meta["resolved_config"]["scheduler_config"]
    sv = _mine(figs)[b.figure_id("rtx4090-llama-3.1-8b", "mean_ttft_ms")]["serving"]
    assert (kv["block_size"], kv["gpu_memory_utilization"], kv["enable_prefix_caching"]) == \
        (sv["block_size"], sv["gpu_memory_utilization"], sv["prefix_caching"])
    assert sched["async_scheduling"] is sv["async_scheduling"] is True
    assert meta["resolved_config"]["model_config"]["enforce_eager"] is False
    point = next(p for p in yaml.safe_load(KV.read_text())["points"] if p["id"] == "llmservingsim-rtx4090-llama3.1-8b")
    assert point["logged"]["num_gpu_blocks"] == kv["num_gpu_blocks"] == 2588
    assert point["total_gib"] == round(meta["hardware"]["device_total_memory_bytes"] / 2 ** 30, 2)


def test_data_parallel_expert_parallel_run_is_priced_as_dp_attention(figs):
    """The DP 2 + expert-parallel run is written as its meta.json says (dp 2, ep true), which validate prices as
    vLLM's DP attention + EP; without ep the same entry would be refused as replicas."""
    for m in b.METRICS:
        f = _mine(figs)[b.figure_id("rtxpro6000-qwen3-30b-a3b-instruct-2507", m)]
        assert f["parallelism"] == {"tp": 1, "dp": 2, "ep": True} and refusal(f) is None
        assert "dp=2" in refusal({**f, "parallelism": {"tp": 1, "dp": 2}})


def test_a_changed_value_or_workload_is_caught(figs, tmp_path):
    bad = copy.deepcopy(figs)
    f = next(x for x in bad if x["id"] == b.figure_id("rtxpro6000-qwen3-32b", "median_tpot_ms"))
    f["value"] = round(f["value"] + 0.01, 2)
    problems = b.check(bad)
    assert len(problems) == 1 and "median-tpot" in problems[0] and "value" in problems[0]
    bad = copy.deepcopy(figs)
    f = next(x for x in bad if x["id"] == b.figure_id("rtx4090-llama-3.1-8b", "output_throughput"))
    f["workload"] = {**f["workload"], "output_lens": [*f["workload"]["output_lens"][:-1], 1]}
    assert any("output_lens" in p for p in b.check(bad))
    bad = [x for x in copy.deepcopy(figs) if x["id"] != b.figure_id("rtx4090-llama-3.1-8b", "mean_e2el_ms")]
    assert any("missing" in p for p in b.check(bad))
    # the command line, on an edited copy of the file: one value changed in the text
    text = FIGS.read_text()
    one = "    value: 1249.5\n"
    assert text.count(one) == 1
    edited = tmp_path / "figures.yaml"
    edited.write_text(text.replace(one, "    value: 1249.6\n"))
    assert b.main(["--check", str(edited)]) == 1


def test_derive_arrivals_round_trip(tmp_path):
    rows = [{"input_toks": 5, "output_toks": 2, "arrival_time_ns": 10, "input_tok_ids": [1, 2, 3, 4, 5]},
            {"input_toks": 3, "output_toks": 4, "arrival_time_ns": 20, "input_tok_ids": [1, 2, 3]}]
    p = tmp_path / "sharegpt-x-2-sps10.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "a.csv"
    out.write_text(b.derive_arrivals([p]))
    assert b.load_arrivals(out) == {"sharegpt-x-2-sps10": {"input_toks": [5, 3], "output_toks": [2, 4],
                                                           "arrival_time_ns": [10, 20]}}
    assert out.read_text().splitlines()[0] == ",".join(b.ARRIVAL_COLUMNS)


def test_a_missing_file_is_named_not_a_traceback(tmp_path, capsys):
    for argv in (["--check", str(tmp_path / "none.yaml")], ["--derive-arrivals", str(tmp_path / "none.jsonl")]):
        with pytest.raises(SystemExit) as e:
            b.main(argv)
        assert e.value.code == 2 and "none." in capsys.readouterr().err
    assert not (tmp_path / "none.yaml").exists()
