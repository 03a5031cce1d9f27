"""The Streamlit dashboard in-process (streamlit's AppTest): every page, the numbers against the simulator,
bad values as one readable line (a fuzz over every widget of every page), and paths only from the roots.

The real-browser test is tests/test_dashboard_browser.py.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app" / "dashboard.py"
from trace_files import BUNDLED  # noqa: E402
PAGES = ["whatif", "serving", "explorer", "sweeps", "deployment", "calibration", "compare"]
TIMEOUT = 240


# ----------------------------------------------------------------------------- fixtures
def _calibration_run(d: Path) -> Path:
    """A `calibrate run` folder (phases, decisions, run.json) with synthetic timings, fitted for real."""
    from calibrate.fit import fit_run_dir
    from calibrate.timing import PhaseRow, phases_frame

    rows, recs = [], []
    rng = np.random.default_rng(0)
    for prob in range(4):
        for pol, scale in (("no-kv", 1.0), ("exact-prefix", 0.8), ("rksc", 0.4)):
            t = 0.0
            for n in (100 * scale, 40):
                r = PhaseRow("prefill", problem=prob, policy=pol).items([int(n)], [0])
                r.seconds = 2e-3 * n * (1 + 0.01 * rng.normal())
                rows.append(r)
                t += r.seconds
            for s in range(5):
                r = PhaseRow("decode", problem=prob, policy=pol).items([1, 1], [120 + s, 110 + s])
                r.seconds = 0.05 * (1 + 0.01 * rng.normal())
                rows.append(r)
                t += r.seconds
            recs.append({"problem": prob, "policy": pol, "seconds": t * 1.02})
    for n in (16, 64, 256):
        r = PhaseRow("sweep-prefill", problem=-1, policy="sweep").items([n], [0])
        r.seconds = 2e-3 * n
        rows.append(r)
    d.mkdir(parents=True)
    phases_frame(rows).to_parquet(d / "phases.parquet")
    pd.DataFrame(recs).to_parquet(d / "decisions.parquet")
    model = {"name": "smollm2-135m", "n_layers": 30, "hidden_size": 576, "n_heads": 9, "n_kv_heads": 3,
             "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "dtype": "float32", "source": "x"}
    (d / "run.json").write_text(json.dumps({"model": model, "device": "cpu", "threads": 1, "problems": [0, 1, 2, 3],
                                            "decision_parity": 1.0, "created": "now"}))
    fit_run_dir(d, name="dash-test-cpu", out=d.parent / "dash-test-cpu.yaml", holdout=0.5)
    return d


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A trace root: a real sweep of the bundled trace, a fitted calibration run, a serve summary,
    a symlink that leads out of the root (must never be listed)."""
    from app.cli import main

    r = tmp_path_factory.mktemp("root")
    assert main(["sweep", "--trace", str(BUNDLED), "--policy", "asks", "--grid", "tau=0.96:0.99:0.005",
                 "--quiet", "--out", str(r / "sweep-asks.parquet")]) == 0
    assert main(["plan", "--model-preset", "qwen2.5-32b", "--hardware", "dgx-h100", "--gpus", "2", "--policies",
                 "exact-prefix,asks", "--tensor-parallel-size", "1,2", "--requests", "12", "--concurrency", "4",
                 "--slo", "e2e=5", "--json", "--out", str(r / "plan-32b.parquet")]) == 0
    _calibration_run(r / "cal-run")
    # a `calibrate serve` folder as calibrate/serve.py writes it: serve.json (errors: parity a share,
    # makespan/throughput signed fractions, the e2e median in percent), iterations.parquet, and a run.json +
    # phases.parquet for `calibrate fit` (which must not make it look like a `calibrate run` folder)
    sv = r / "cal-serve"
    sv.mkdir()
    (sv / "serve.json").write_text(json.dumps(
        {"scheduling_parity": 0.97, "makespan_error": -0.031, "throughput_error": 0.028,
         "e2e_median_abs_pct_error": 4.4, "n_iterations": 3, "preemptions": 1, "clock": "cpu",
         "comparison": {"e2e_real_s": [1.0, 2.0], "e2e_sim_s": [1.1, 1.9]}}))
    pd.DataFrame({"iteration": [0, 1, 2], "cpu_s": [0.1, 0.2, 0.3], "wall_s": [0.11, 0.21, 0.31],
                  "sim_s": [0.1, 0.19, 0.33]}).to_parquet(sv / "iterations.parquet")
    (sv / "run.json").write_text(json.dumps({"kind": "calibrate serve", "problems": []}))
    (sv / "phases.parquet").write_bytes((r / "cal-run" / "phases.parquet").read_bytes())
    import shutil

    shutil.copytree(BUNDLED, r / "damaged-trace")
    f = r / "damaged-trace" / "problems" / "p00003" / "asks.parquet"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    outside = tmp_path_factory.mktemp("outside")
    (outside / "manifest.json").write_text("{}")
    os.symlink(outside, r / "escape")
    return r


@pytest.fixture()
def env(root, monkeypatch):
    monkeypatch.setenv("RKSIM_TRACE_ROOT", f"{ROOT / 'examples'}{os.pathsep}{root}")
    return root


def _app(page: str | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    if page and page != "whatif":
        at.switch_page(f"ui_pages/{page}.py").run()
    return at


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]


def _metric(at, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r} in {[m.label for m in at.metric]}")


# ----------------------------------------------------------------------------- What-if
def test_whatif_shows_what_the_simulator_computes_for_several_policies(env):
    from app import ui_backend as B
    from sim.api import evaluate

    at = _app()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    for pol in ("asks", "cgee", "rksc"):
        params = {w.key.split(".")[-1]: w.value for w in at.slider if w.key.startswith(f"whatif.p.{pol}.")}
        ref = evaluate(str(BUNDLED), policy=pol, params=params, hardware="local-cpu")
        assert _metric(at, f"{pol} · {B.label('speedup_vs_exact_prefix')}") == B.fmt("speedup_vs_exact_prefix",
                                                                                     ref["speedup_vs_exact_prefix"])
        assert _metric(at, f"{pol} · {B.label('latency_mean_s')}") == B.fmt("latency_mean_s", ref["latency_mean_s"])
    # tau's slider spans the observed sigmas: at its top no branch shares, so ASKS pays the gate and saves nothing
    s = at.slider(key="whatif.p.asks.tau")
    sig = B.observed_sigmas(str(BUNDLED), {})
    assert s.min <= sig.min() and s.max >= sig.max() and s.max - s.min < 0.1
    s.set_value(s.max).run()
    _ok(at)
    ref = evaluate(str(BUNDLED), policy="asks", params={"tau": s.max}, hardware="local-cpu")
    assert _metric(at, f"asks · {B.label('speedup_vs_exact_prefix')}") == B.fmt("speedup_vs_exact_prefix",
                                                                              ref["speedup_vs_exact_prefix"])
    assert any("none: exact prefix's reuse plus the gate's cost" in c.value for c in at.caption)
    at.text_input(key="whatif.p.asks.exact").set_value("tau=-0.5").run()  # typed: the note says what it does
    assert any("tau -0.500 shares 100%" in c.value for c in at.caption), [c.value for c in at.caption]
    at.text_input(key="whatif.p.asks.exact").set_value("").run()
    # ... and a policy that loses says why, from the phase breakdown
    assert any(i.value.startswith("asks is ") and "gate" in i.value for i in at.info), [i.value for i in at.info]


def test_whatif_explains_a_model_the_hardware_was_not_fitted_for_in_place(env):
    at = _app()
    at.sidebar.selectbox(key="whatif.model").set_value("qwen2.5-7b").run()
    _ok(at)
    assert any("refusing to extrapolate" in e.value for e in at.error), [e.value for e in at.error]
    assert any("would serve it" in i.value and "h100-sxm" in i.value for i in at.info), [i.value for i in at.info]
    # the page is still there: controls and title, not a replaced page
    assert at.title[0].value == "What-if" and at.multiselect(key="whatif.policies").value
    at.sidebar.selectbox(key="whatif.hardware").set_value("h100-sxm").run()
    _ok(at)
    assert not at.error
    # ASKS loses on qwen2.5-7b / h100 (0.96x exact prefix): the sentence names the phase
    assert any(i.value.startswith("asks is ") and "decod" in i.value for i in at.info), [i.value for i in at.info]


def test_whatif_token_eviction_view(env):
    from app import ui_backend as B
    from sim.api import evaluate

    at = _app()
    at.multiselect(key="whatif.policies").set_value(["asks", "h2o"]).run()
    _ok(at)
    K = at.slider(key="whatif.p.h2o.budget").value
    ref = evaluate(str(BUNDLED), policy="h2o", params={"budget": K}, hardware="local-cpu")
    for k in ("attn_output_rel_error", "attn_mass_recall", "peak_kv_bytes", "speedup_vs_full"):
        assert _metric(at, f"h2o · {B.label(k)}") == B.fmt(k, ref[k])
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert any("against budget" in (f.get("layout", {}).get("title", {}).get("text") or "") for f in figs)


def test_whatif_serving_controls_validate_like_the_cli(env, capsys):
    from app.cli import main

    at = _app()
    at.sidebar.radio(key="whatif.mode").set_value("serving").run()
    _ok(at)
    at.text_input(key="whatif.srv.arrival_rate").set_value("abc").run()
    _ok(at)
    assert [e.value for e in at.error] == ["--problem-rate: 'abc' is not a number"]
    at.text_input(key="whatif.srv.arrival_rate").set_value("0.5").run()
    _ok(at)
    if at.error:  # a simulator that refuses a batch past local-cpu's calibrated one says so in place (one that
        # queues it instead, as serving at capacity does, shows results)
        assert any("max_batch" in e.value for e in at.error) and any("lower the arrival" in i.value for i in at.info)
    at.text_input(key="whatif.srv.arrival_rate").set_value("0.02").run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    assert any("throughput (generated tokens/s)" in m.label for m in at.metric)
    at.text_input(key="whatif.srv.gpu_memory_utilization").set_value("1.5").run()
    assert [e.value for e in at.error] == ["--gpu-memory-utilization: must be <= 1, got 1.5"]
    # an exact value the CLI refuses gets the CLI's own line
    at.text_input(key="whatif.srv.gpu_memory_utilization").set_value("").run()
    at.text_input(key="whatif.p.asks.exact").set_value("tau=abc").run()
    _ok(at)
    assert main(["simulate", "--policy", "asks", "--set", "tau=abc"]) == 2
    cli = capsys.readouterr().err.strip().splitlines()[-1].removeprefix("rksim: error: ").removeprefix("--set: ")
    assert any(e.value == cli for e in at.error), ([e.value for e in at.error], cli)


# ----------------------------------------------------------------------------- other pages
def test_serving_page(env):
    at = _app("serving")
    _ok(at)
    assert at.title[0].value == "Serving"
    assert any(m.label.startswith("asks · throughput") for m in at.metric)
    at.select_slider(key="serving.srv.concurrency").set_value(16).run()
    _ok(at)


def test_serving_page_prices_each_step_as_its_boxes_say(env):
    """The step toggles (host time per step, async scheduling, CUDA graphs; checked: vLLM's serve) set the
    ServingConfig switches the CLI's flags set: unchecking async scheduling on an H100 gives the figures of
    ``sim.api`` with ``no_async_scheduling``, slower than the default's; a plan's switches come back checked or
    not when one of its deployments is loaded."""
    from app import ui_backend as B

    at = _app("serving")
    at.selectbox(key="serving.hardware").set_value("h100-sxm").run()
    at.multiselect(key="serving.policies").set_value(["asks"]).run()
    _ok(at)
    assert all(at.checkbox(key=f"serving.srv.{k}").value for k in ("no_host_time", "no_async_scheduling",
                                                                  "enforce_eager"))
    conc = int(at.select_slider(key="serving.srv.concurrency").value)
    label = f"asks · {B.label('throughput_tokens_per_s')}"
    served = _metric(at, label)
    at.checkbox(key="serving.srv.no_async_scheduling").uncheck().run()
    _ok(at)
    sync = B.run(str(BUNDLED), "asks", {}, None, "h100-sxm", "serving", {}, 0,
                 {"concurrency": conc, "no_async_scheduling": True})
    assert _metric(at, label) == B.fmt("throughput_tokens_per_s", sync["summary"]["throughput_tokens_per_s"])
    assert "async scheduling off" in sync["info"]["note"] and _metric(at, label) != served
    load = B.serving_load({"policy": "asks", "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                           "data_parallel_size": 1, "max_num_seqs": 256, "max_num_batched_tokens": 2048},
                          {"model_preset": "llama-3-8b", "hardware": "h100-sxm", "node_preset": "dgx-h100",
                           "target_options": {"host_time": False, "enforce_eager": True}})
    assert {k: load["serving"][k] for k in ("no_host_time", "no_async_scheduling", "enforce_eager")} == \
        {"no_host_time": True, "no_async_scheduling": False, "enforce_eager": True}


def test_serving_page_sizes_the_kv_as_the_chosen_vllm_generation(env):
    """The "vLLM memory rules" box is ``--vllm-memory-rules`` (``ServingConfig.memory_rules``): each policy's
    capacity line under it is the one ``sim.api`` gives with that generation (vLLM 0.6.5's 1.79 GiB of non-torch
    memory leaves less KV than the default's), and the default is vLLM >= 0.21's ``v1``."""
    from app import ui_backend as B

    at = _app("serving")
    at.selectbox(key="serving.hardware").set_value("h100-sxm").run()
    at.multiselect(key="serving.policies").set_value(["asks"]).run()
    _ok(at)
    assert at.selectbox(key="serving.srv.memory_rules").value == "v1"
    conc = int(at.select_slider(key="serving.srv.concurrency").value)

    def caption(rules):
        r = B.run(str(BUNDLED), "asks", {}, None, "h100-sxm", "serving", {}, 0,
                  {"concurrency": conc, "memory_rules": rules})
        assert r["info"]["capacity"]["memory_rules"] == rules
        return B.capacity_note(r["info"], r["summary"])

    caps = [c.value for c in at.caption]
    assert caption("v1") in caps, caps
    at.selectbox(key="serving.srv.memory_rules").set_value("v0.6.5").run()
    _ok(at)
    old = caption("v0.6.5")
    assert old in [c.value for c in at.caption] and old != caption("v1")


def test_trace_explorer_page(env):
    at = _app("explorer")
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    from app import ui_backend as B

    br = B.problem_branches(str(BUNDLED), 0)
    assert _metric(at, "own answer") == f"{br.iloc[0]['answer'] or '(none)'} ({'correct' if br.iloc[0]['correct'] else 'wrong'})"
    titles = [json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text") or ""
              for c in at.get("plotly_chart")]
    assert any("sigma per branch" in t for t in titles) and any("exit layer" in t for t in titles)
    assert any("head dimension" in t for t in titles)
    at.selectbox(key="explorer.problem").set_value(3).run()
    at.slider(key="explorer.l_min").set_value(5).run()
    _ok(at)


def test_sweeps_page_frontier_and_load_into_whatif(env):
    from app import ui_backend as B
    from sim.api import evaluate

    at = _app("sweeps")
    _ok(at)
    assert any("sweep-asks.parquet" in o for o in at.selectbox(key="sweeps.file").options)
    assert len(at.dataframe) >= 1  # the frontier table
    # a click on a point sends its configuration to What-if (the button's session message)
    at.session_state["whatif.load"] = {"policy": "asks", "params": {"tau": 0.975}, "trace_label": None}
    at.switch_page("ui_pages/whatif.py").run()
    _ok(at)
    assert at.text_input(key="whatif.p.asks.exact").value == "tau=0.975"
    ref = evaluate(str(BUNDLED), policy="asks", params={"tau": 0.975}, hardware="local-cpu")
    assert _metric(at, f"asks · {B.label('speedup_vs_exact_prefix')}") == B.fmt("speedup_vs_exact_prefix",
                                                                              ref["speedup_vs_exact_prefix"])


def test_sweeps_page_runs_a_small_sweep_with_the_cli_grid_checks(env):
    at = _app("sweeps")
    at.radio(key="sweeps.source").set_value("run a small sweep here").run()
    at.text_area(key="sweeps.grid.asks").set_value("tau=abc").run()
    at.button(key="sweeps.run").click().run()
    _ok(at)
    assert len(at.error) == 1 and "--grid" in at.error[0].value
    at.text_area(key="sweeps.grid.asks").set_value("tau=0.96:0.99:0.01").run()
    at.button(key="sweeps.run").click().run()
    _ok(at)
    assert not at.error
    assert any("4 configurations" in c.value for c in at.caption), [c.value for c in at.caption]


# ----------------------------------------------------------------------------- Deployment
DEPLOY = dict(model_preset="qwen2.5-32b", hardware="h100-sxm", mode="serving", tensor_parallel_size=2,
              data_parallel_size=2, slo="ttft=1,e2e=20")


def _block_with(at, kind: str, key: str):
    """The innermost column holding the widget ``key`` (where its error slot is)."""
    for col in at.columns:
        if any(w.key == key for w in getattr(col, kind)):
            inner = [c for c in col.columns if any(w.key == key for w in getattr(c, kind))] if hasattr(col, "columns") \
                else []
            return inner[0] if inner else col
    raise AssertionError(f"no column holds {key}")


def test_deployment_page_shows_goodput_per_replica_and_routing_losses(env):
    from app import ui_backend as B
    from sim.api import simulate

    at = _app("deployment")
    _ok(at)
    assert at.title[0].value == "Deployment" and not at.error, [e.value for e in at.error]
    for router in ("prefix-affinity", "round-robin"):
        if router != "prefix-affinity":
            at.selectbox(key="deploy.dep.router").set_value(router).run()
            _ok(at)
        for pol in ("exact-prefix", "asks"):
            ref = simulate(str(BUNDLED), policy=pol, router=router, **DEPLOY).summary
            for k in ("goodput_problems_per_s", "throughput_problems_per_s", "e2e_p99_s", "lost_asks_shares"):
                assert _metric(at, f"{pol} · {B.label(k)}") == B.fmt(k, ref[k]), (router, pol, k)
        table = next(t for t in at.tabs if t.label == "asks: per replica").dataframe[0].value
        assert list(table.index) == ["0", "1", "total"]
        ref = simulate(str(BUNDLED), policy="asks", router=router, **DEPLOY).summary
        np.testing.assert_allclose(table[B.label("goodput_problems_per_s")].astype(float).to_numpy(),
                                   [r["goodput_problems_per_s"] for r in ref["per_replica"]]
                                   + [ref["goodput_problems_per_s"]])
    assert ref["lost_asks_shares"] > 0  # round-robin splits problems: ASKS's forks lost
    titles = [json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text") or ""
              for c in at.get("plotly_chart")]
    assert any("latency percentiles per replica" in t for t in titles)
    assert any(t.startswith("Deployments: goodput_problems_per_s against gpus") and "dgx-h100" in t for t in titles)
    assert any("TP 2 x PP 1 x DP 2 on dgx-h100" in c.value for c in at.caption), [c.value for c in at.caption]


def test_deployment_page_says_a_refusal_beside_its_widget(env):
    at = _app("deployment")
    at.sidebar.selectbox(key="deploy.model").set_value("llama-3-70b").run()
    at.selectbox(key="deploy.dep.tp").set_value(1).run()
    _ok(at)
    tp_col = _block_with(at, "selectbox", "deploy.dep.tp")
    errs = [e.value for e in tp_col.error]
    assert len(errs) == 1 and "llama-3-70b does not fit on h100-sxm" in errs[0] and \
        "--tensor-parallel-size 2" in errs[0], [e.value for e in at.error]
    assert at.title[0].value == "Deployment" and at.selectbox(key="deploy.dep.router")  # the page is still there
    at.selectbox(key="deploy.dep.tp").set_value(2).run()
    at.text_input(key="deploy.dep.dp").set_value("0").run()
    _ok(at)
    dp_col = _block_with(at, "text_input", "deploy.dep.dp")
    assert [e.value for e in dp_col.error] == ["--data-parallel-size: must be >= 1, got 0"]
    at.text_input(key="deploy.dep.dp").set_value("9").run()   # 9 replicas of TP 2: more GPUs than one node has
    _ok(at)
    assert any("--data-parallel-size" in e.value or "--node" in e.value for e in at.error), [e.value for e in at.error]
    at.text_input(key="deploy.dep.dp").set_value("2").run()
    at.text_input(key="deploy.dep.slo.ttft").set_value("-1").run()
    _ok(at)
    assert any(e.value.startswith("--slo ttft:") for e in at.error), [e.value for e in at.error]


def test_deployment_weights_kv_and_experts_widgets_price_as_the_cli_does(env):
    """The deployment's weights, KV cache, expert-parallel and MoE routing widgets are sim.api.simulate's
    --quantization, --kv-cache-dtype, --enable-expert-parallel and --moe-routing: the caption says what the
    costs were priced at, the figures are the CLI's, and a refusal is said beside the widget of its flag."""
    from app import ui_backend as B
    from sim.api import simulate

    at = _app("deployment")
    at.sidebar.selectbox(key="deploy.model").set_value("gpt-oss-20b").run()
    _ok(at)
    assert any("costs from gpt-oss-20b (mxfp4 experts) on h100-sxm" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    at.selectbox(key="deploy.dep.quant").set_value("none").run()
    at.selectbox(key="deploy.dep.kv_dtype").set_value("fp8").run()
    at.checkbox(key="deploy.dep.ep").check().run()
    _ok(at)
    assert any("costs from gpt-oss-20b (fp8 KV cache) on h100-sxm" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    ref = simulate(str(BUNDLED), policy="asks", **{**DEPLOY, "model_preset": "gpt-oss-20b"}, quantization="none",
                   kv_cache_dtype="fp8", enable_expert_parallel=True).summary
    assert _metric(at, f"asks · {B.label('goodput_problems_per_s')}") == \
        B.fmt("goodput_problems_per_s", ref["goodput_problems_per_s"])
    at.selectbox(key="deploy.dep.routing").set_value("sampled").run()   # --moe-routing sampled
    _ok(at)
    sampled = simulate(str(BUNDLED), policy="asks", **{**DEPLOY, "model_preset": "gpt-oss-20b"}, quantization="none",
                       kv_cache_dtype="fp8", enable_expert_parallel=True, moe_routing="sampled").summary
    assert _metric(at, f"asks · {B.label('goodput_problems_per_s')}") == \
        B.fmt("goodput_problems_per_s", sampled["goodput_problems_per_s"]) != \
        B.fmt("goodput_problems_per_s", ref["goodput_problems_per_s"])
    at.selectbox(key="deploy.dep.routing").set_value("expected").run()
    at.sidebar.selectbox(key="deploy.model").set_value("qwen2.5-32b").run()
    at.selectbox(key="deploy.dep.quant").set_value("mxfp4").run()
    _ok(at)
    errs = [e.value for e in _block_with(at, "selectbox", "deploy.dep.quant").error]
    assert len(errs) == 1 and "--quantization mxfp4: qwen2.5-32b has no MoE experts" in errs[0], \
        [e.value for e in at.error]


def test_a_plan_s_target_flags_go_with_its_deployment_to_the_serving_page():
    from app import ui_backend as B
    row = {"policy": "no-kv", "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 2,
           "max_num_seqs": 256, "max_num_batched_tokens": 2048}
    meta = {"model_preset": "qwen3-30b-a3b", "node_preset": "dgx-h100", "hardware": "h100-sxm",
            "target_options": {"enable_expert_parallel": True, "moe_routing": "sampled", "kv_cache_dtype": "fp8"}}
    load = B.serving_load(row, meta)
    assert {k: load["deployment"].get(k) for k in B.PLAN_TARGET_OPTIONS} == \
        {"quantization": None, "kv_cache_dtype": "fp8", "enable_expert_parallel": True, "moe_routing": "sampled"}
    assert "note" not in load   # every flag the plan ran with is a widget of the Serving page


def test_deployment_frontier_loads_a_deployment_into_serving(env):
    import pandas as pd

    from app import ui_backend as B

    at = _app("deployment")
    _ok(at)
    assert any("plan-32b.parquet" in o for o in at.selectbox(key="deploy.plan.file").options)
    df = pd.read_parquet(env / "plan-32b.parquet")
    row = at.selectbox(key="deploy.front.row")
    assert len(row.options) == len(df) and sum(o.startswith("frontier · ") for o in row.options) == df["on_frontier"].sum()
    pick = int(df[(df["policy"] == "exact-prefix") & (df["tensor_parallel_size"] == 2)].index[0])
    row.set_value(pick).run()
    at.button(key="deploy.open").click().run()
    _ok(at)
    assert at.title[0].value == "Serving" and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="serving.dep.tp").value == 2 and at.text_input(key="serving.dep.dp").value == "1"
    assert at.text_input(key="serving.dep.slo.e2e").value == "5" and at.multiselect(key="serving.policies").value \
        == ["exact-prefix"]
    # the Serving page re-runs the deployment through sim.api.simulate: the plan's own figures
    r = df.loc[pick]
    assert _metric(at, f"exact-prefix · {B.label('goodput_problems_per_s')}") == \
        B.fmt("goodput_problems_per_s", r["goodput_problems_per_s"])
    assert _metric(at, f"exact-prefix · {B.label('throughput_tokens_per_s')}") == \
        B.fmt("throughput_tokens_per_s", r["throughput_tokens_per_s"])


def test_deployment_page_shows_the_knee_of_the_chosen_deployment(env):
    """The frontier's selected deployment: its latency-rate curve and knee, by ``rksim plan --knee``'s function."""
    from app import ui_backend as B
    from sim.search.planner import read_plan

    at = _app("deployment")
    _ok(at)
    df, meta = read_plan(env / "plan-32b.parquet")
    pick = int(df[(df["policy"] == "exact-prefix") & (df["tensor_parallel_size"] == 2)].index[0])
    at.selectbox(key="deploy.front.row").set_value(pick).run()
    at.text_input(key="deploy.knee.rates").set_value("0.5,64").run()
    at.text_input(key="deploy.knee.refine").set_value("0").run()
    at.button(key="deploy.knee.run").click().run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    _, want = B.deployment_knee(df.loc[pick].to_dict(), meta, "0.5,64", "p99_ttft_ms=1000,mean_tpot_ms=50")
    assert any(c.value == want for c in at.caption), [c.value for c in at.caption]
    assert "max_num_seqs" in want and "TP 2" in want
    at.text_input(key="deploy.knee.rates").set_value("0.5,x").run()
    at.button(key="deploy.knee.run").click().run()
    assert any("--knee:" in e.value for e in at.error)


def test_deployment_page_runs_a_small_plan(env):
    at = _app("deployment")
    at.radio(key="deploy.plan.source").set_value("run a small plan here").run()
    at.text_input(key="deploy.plan.gpus").set_value("2").run()
    at.multiselect(key="deploy.plan.tp").set_value([1, 2]).run()
    at.multiselect(key="deploy.plan.policies").set_value(["exact-prefix"]).run()
    at.text_input(key="deploy.plan.requests").set_value("4").run()
    at.button(key="deploy.plan.run").click().run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    assert any("of 3 deployments on the frontier" in c.value for c in at.caption), [c.value for c in at.caption]
    at.text_input(key="deploy.plan.gpus").set_value("64").run()
    at.multiselect(key="deploy.plan.tp").set_value([1, 2, 4, 8]).run()
    at.button(key="deploy.plan.run").click().run()
    _ok(at)
    assert any("more than the 24 a plan run on this page may have" in e.value for e in at.error)


def test_a_small_plan_takes_the_deployment_s_target_flags(env):
    """The page's small plan runs under the deployment controls' weights / KV cache / EP / routing, as
    `rksim plan` takes those flags (sim.search.planner.target_options), and its meta says so."""
    from app import ui_backend as B
    at = _app("deployment")
    at.selectbox(key="deploy.dep.kv_dtype").set_value("fp8").run()
    at.radio(key="deploy.plan.source").set_value("run a small plan here").run()
    at.text_input(key="deploy.plan.gpus").set_value("1").run()
    at.multiselect(key="deploy.plan.tp").set_value([1]).run()
    at.multiselect(key="deploy.plan.policies").set_value(["exact-prefix"]).run()
    at.text_input(key="deploy.plan.requests").set_value("4").run()
    at.button(key="deploy.plan.run").click().run()
    _ok(at)
    df, meta = at.session_state["deploy.plan.ran"]
    assert meta["target_options"] == {"kv_cache_dtype": "fp8"} and meta["kv_cache_dtype"] == "fp8"
    args = (meta["trace"], meta["model_preset"], meta["node_preset"], 1, ("exact-prefix",), (1,), (1,),
            meta["router"], None if meta["slo"] == "none" else meta["slo"], None, 8, 4, 0)
    ref, _ = B.run_small_plan(*args, {"kv_cache_dtype": "fp8"})
    auto, _ = B.run_small_plan(*args)
    assert df["e2e_p99_s"].tolist() == ref["e2e_p99_s"].tolist() != auto["e2e_p99_s"].tolist()
    # the "vLLM memory rules" box is --vllm-memory-rules: each deployment's KV sized as that vLLM generation
    at.selectbox(key="deploy.plan.memory_rules").set_value("v0.6.5").run()
    at.button(key="deploy.plan.run").click().run()
    _ok(at)
    df, meta = at.session_state["deploy.plan.ran"]
    assert meta["target_options"] == {"kv_cache_dtype": "fp8", "memory_rules": "v0.6.5"}
    old, _ = B.run_small_plan(*args, {"kv_cache_dtype": "fp8", "memory_rules": "v0.6.5"})
    assert df["kv_capacity_blocks_per_replica"].tolist() == old["kv_capacity_blocks_per_replica"].tolist()
    assert all(a < b for a, b in zip(df["kv_capacity_blocks_per_replica"], ref["kv_capacity_blocks_per_replica"]))


def test_calibration_page_run_and_serve_folders(env):
    from calibrate.report import fidelity_report

    at = _app("calibration")
    _ok(at)
    sb = at.selectbox(key="cal.folder")
    run = next(o for o in sb.options if o.endswith("cal-run"))
    sb.set_value(run).run()
    _ok(at)
    rep = fidelity_report(env / "cal-run")  # no trace in the folder: its numbers are the cost-model replay
    assert _metric(at, "mean |error| of mean latency (held out)") == f"{100 * rep['mean_abs_pct_error']:.2f}%"
    assert _metric(at, "decision parity vs the simulator") == "100.00%"
    at.selectbox(key="cal.folder").set_value(next(o for o in sb.options if o.endswith("cal-serve"))).run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    assert _metric(at, "scheduling parity") == "97.00%"
    assert _metric(at, "makespan error (sim vs real)") == "-3.10%"
    assert _metric(at, "median |error| end to end") == "4.40%"
    titles = [json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text") or ""
              for c in at.get("plotly_chart")]
    assert any(t.startswith("per iteration") for t in titles) and any(t.startswith("per problem") for t in titles)


def test_calibration_page_without_folders(monkeypatch):
    monkeypatch.setenv("RKSIM_TRACE_ROOT", str(ROOT / "examples"))
    at = _app("calibration")
    _ok(at)
    assert any("No calibration" in i.value for i in at.info)


def test_compare_page_table_and_csv(env):
    from app import ui_backend as B

    at = _app("compare")
    _ok(at)
    df = at.dataframe[0].value
    ref = B.compare(str(BUNDLED), None, "local-cpu")
    assert list(df.index) == list(ref.index)
    np.testing.assert_allclose(df["latency_mean_s"].astype(float), ref["latency_mean_s"].astype(float))
    assert at.get("download_button")


def test_whatif_compare_and_sweeps_price_the_weights_and_kv_cache_pickers(env):
    """The sidebar's weights and KV-cache pickers are the CLI's --quantization / --kv-cache-dtype on every run of
    the What-if, Compare and small-sweep pages: the caption says what was priced, the figures are the CLI's, and
    a refusal is said under its picker."""
    from app import ui_backend as B
    from sim.api import evaluate

    at = _app()
    at.sidebar.selectbox(key="whatif.hardware").set_value("h100-sxm").run()
    at.sidebar.selectbox(key="whatif.model").set_value("gpt-oss-20b").run()
    _ok(at)
    assert any("costs from gpt-oss-20b (mxfp4 experts) on h100-sxm" in c.value for c in at.caption)
    at.sidebar.selectbox(key="whatif.quant").set_value("none").run()
    at.sidebar.selectbox(key="whatif.kv_dtype").set_value("fp8").run()
    _ok(at)
    assert any("costs from gpt-oss-20b (fp8 KV cache) on h100-sxm" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    params = {w.key.split(".")[-1]: w.value for w in at.slider if w.key.startswith("whatif.p.asks.")}
    kw = dict(model_preset="gpt-oss-20b", hardware="h100-sxm")
    ref = evaluate(str(BUNDLED), policy="asks", params=params, **kw, quantization="none", kv_cache_dtype="fp8")
    released = evaluate(str(BUNDLED), policy="asks", params=params, **kw)
    shown = _metric(at, f"asks · {B.label('latency_mean_s')}")
    assert shown == B.fmt("latency_mean_s", ref["latency_mean_s"]) != B.fmt("latency_mean_s",
                                                                             released["latency_mean_s"])
    at.sidebar.selectbox(key="whatif.model").set_value("qwen2.5-32b").run()
    at.sidebar.selectbox(key="whatif.quant").set_value("mxfp4").run()
    _ok(at)
    under = _errors_under(at.sidebar, "whatif.quant")
    assert under and all("--quantization mxfp4: qwen2.5-32b has no MoE experts" in e for e in under), \
        (under, [e.value for e in at.error])

    at = _app("compare")
    at.sidebar.selectbox(key="compare.hardware").set_value("h100-sxm").run()
    at.sidebar.selectbox(key="compare.model").set_value("llama-3-8b").run()
    at.sidebar.selectbox(key="compare.kv_dtype").set_value("fp8").run()
    _ok(at)
    df = at.dataframe[0].value
    ref = B.compare(str(BUNDLED), "llama-3-8b", "h100-sxm", target={"kv_cache_dtype": "fp8"})
    auto = B.compare(str(BUNDLED), "llama-3-8b", "h100-sxm")
    np.testing.assert_allclose(df["latency_mean_s"].astype(float), ref["latency_mean_s"].astype(float))
    assert not np.allclose(ref["latency_mean_s"].astype(float), auto["latency_mean_s"].astype(float))

    at = _app("sweeps")
    at.radio(key="sweeps.source").set_value("run a small sweep here").run()
    at.text_area(key="sweeps.grid.asks").set_value("tau=0.96:0.99:0.01").run()
    at.sidebar.selectbox(key="sweeps.hardware").set_value("h100-sxm").run()
    at.sidebar.selectbox(key="sweeps.model").set_value("llama-3-8b").run()
    at.sidebar.selectbox(key="sweeps.kv_dtype").set_value("fp8").run()
    at.button(key="sweeps.run").click().run()
    _ok(at)
    got = at.session_state["sweeps.ran"][0]
    ref = B.run_small_sweep(str(BUNDLED), "asks", ["tau=0.96:0.99:0.01"], 400, "llama-3-8b", "h100-sxm", 0,
                            {"kv_cache_dtype": "fp8"})
    auto = B.run_small_sweep(str(BUNDLED), "asks", ["tau=0.96:0.99:0.01"], 400, "llama-3-8b", "h100-sxm", 0)
    np.testing.assert_allclose(got["latency_mean_s"], ref["latency_mean_s"])
    assert not np.allclose(ref["latency_mean_s"], auto["latency_mean_s"])


def test_target_options_are_only_the_precision_pickers():
    from app import ui_backend as B

    assert B.target_kwargs({"quantization": None, "kv_cache_dtype": "fp8"}) == {"kv_cache_dtype": "fp8"}
    assert B.target_kwargs(None) == {}
    with pytest.raises(ValueError, match="tensor_parallel_size not one of"):
        B.target_kwargs({"tensor_parallel_size": 2})


# ----------------------------------------------------------------------------- safety
def test_paths_only_from_the_roots(env):
    from app import ui_paths

    roots = ui_paths.roots_from()
    traces = ui_paths.listing("trace", roots)
    assert str(BUNDLED) in traces.values()
    assert not any("escape" in k for k in traces), traces  # a symlink out of the root is not listed
    for bad in ("../../etc", "/etc", str(env / "escape"), "examples/../../etc", str(BUNDLED / "..")):
        with pytest.raises(ui_paths.PathRefused, match="not a trace under the trace roots"):
            ui_paths.resolve("trace", bad, roots)
    assert ui_paths.resolve("trace", "examples/trace-gsm8k-persona", roots) == str(BUNDLED)


def test_a_traversal_in_the_url_is_refused_in_one_line(env):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.query_params["trace"] = "../../../etc"
    at.run()
    _ok(at)
    assert any("'../../../etc': not a trace under the trace roots" in e.value for e in at.error)
    assert at.sidebar.selectbox(key="trace").value.endswith("trace-gsm8k-persona")  # default kept, page works
    assert at.metric


@pytest.mark.parametrize("page", ["whatif", "serving", "explorer", "deployment", "compare"])
def test_a_damaged_trace_is_one_line_naming_the_file(env, page):
    at = _app(page)
    sb = at.sidebar.selectbox(key="trace")
    sb.set_value(next(o for o in sb.options if o.endswith("damaged-trace"))).run()
    _ok(at)
    assert any("problems/p00003/asks.parquet" in e.value and "\n" not in e.value for e in at.error), \
        [e.value for e in at.error]


def test_roots_from_the_command_line():
    from app import ui_paths

    assert ui_paths.roots_from(["--trace-root", "/tmp"], {}) == [Path("/tmp").resolve()]
    assert ui_paths.roots_from(["--trace-root=/tmp", "--trace-root", "/tmp"], {}) == [Path("/tmp").resolve()]
    assert ui_paths.roots_from([], {"RKSIM_TRACE_ROOT": "/tmp"}) == [Path("/tmp").resolve()]
    assert ui_paths.roots_from([], {})[0] == ROOT / "examples"


# ----------------------------------------------------------------------------- fuzz
BAD_TEXT = ["", "abc", "-1", "1e309", "nan", "99999999999999999999"]
BAD_NUM = [-1e18, float("nan"), 1e18]


def _widgets(at, kinds):
    return [(kind, w.key) for kind in kinds for w in getattr(at, kind) if w.key]


def _check(at, what):
    assert not at.exception, (what, [e.value for e in at.exception])
    for e in at.error:  # one readable line, never a traceback
        assert "\n" not in e.value.strip() and "Traceback" not in e.value, (what, e.value)


def _fuzz_page(page: str, setup=None) -> int:
    """Every text box of the page, one at a time, with each bad text (then restored); every slider and
    number box at once with each bad number (the browser cannot send those, AppTest can)."""
    at = _app(page)
    if setup:
        setup(at)
    _ok(at)
    n = 0
    for kind, key in _widgets(at, ("text_input", "text_area")):
        try:
            orig = getattr(at, kind)(key=key).value
        except KeyError:  # gone after an earlier value (a section that needs a valid one)
            continue
        for v in BAD_TEXT:
            getattr(at, kind)(key=key).set_value(v).run()
            n += 1
            _check(at, (page, key, v))
        getattr(at, kind)(key=key).set_value(orig).run()
    numeric = _widgets(at, ("slider", "number_input", "select_slider"))
    for v in BAD_NUM:
        for kind, key in numeric:
            try:
                getattr(at, kind)(key=key).set_value(v)
            except (KeyError, TypeError, ValueError):  # the harness itself refuses it
                continue
            n += 1
        at.run()
        _check(at, (page, "every slider", v))
    return n


@pytest.mark.parametrize("page", PAGES)
def test_fuzz_every_widget_with_bad_values(env, page):
    setups = {"sweeps": lambda at: at.radio(key="sweeps.source").set_value("run a small sweep here").run()}
    n = _fuzz_page(page, setups.get(page))
    # the Calibration page has nothing to type or slide: only select boxes of listed folders
    assert n > 0 if page != "calibration" else n == 0


def test_fuzz_whatif_serving_and_token_widgets(env):
    def setup(at):
        at.multiselect(key="whatif.policies").set_value(["vase-attnv"]).run()
        at.sidebar.radio(key="whatif.mode").set_value("serving").run()

    assert _fuzz_page("whatif", setup) > 20


def test_number_parsing_is_the_clis():
    from app import params as P

    assert P.number("4.0", "--x", integer=True) == 4
    assert P.number(str(2**53 + 1), "--seed", integer=True) == 2**53 + 1  # exact, not through a float
    with pytest.raises(ValueError, match="out of range"):
        P.number("9" * 400, "--x", integer=True)
    for bad, msg in (("abc", "'abc' is not a number"), ("nan", "finite"), ("inf", "finite"), ("4.5", "integer"),
                     ("", "a value is required"), ("-1", ">= 0")):
        with pytest.raises(ValueError, match=msg):
            P.number(bad, "--x", lo=0, integer=True)
    assert P.number("", "--x", allow_none=True) is None
    assert P.parse_sets(P.split_sets("tau=0.8; l_min=20\nalpha=none"), "--set") == {"tau": 0.8, "l_min": 20,
                                                                                     "alpha": None}
    assert math.isnan(float("nan")) and P.parse_value("nan") == "nan"  # a policy then refuses it by name


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=30), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                      st.integers().map(str)),
       integer=st.booleans(), lo=st.one_of(st.none(), st.floats(-10, 10)), hi=st.one_of(st.none(), st.floats(-10, 10)))
def test_number_never_raises_anything_but_one_line_naming_the_flag(text, integer, lo, hi):
    from app import params as P

    try:
        v = P.number(text, "--flag", lo=lo, hi=hi, integer=integer)
    except ValueError as exc:
        msg = str(exc)
        assert msg.startswith("--flag: ") and "\n" not in msg
        return
    assert math.isfinite(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
    assert isinstance(v, int) if integer else isinstance(v, float)


def test_values_are_shown_in_their_units():
    from app import ui_backend as B

    assert B.fmt("throughput_tokens_per_s", 152.2) == "152.2 tokens/s"
    assert B.fmt("throughput_problems_per_s", 0.2) == "0.2 problems/s"
    assert B.fmt("latency_mean_s", 11.14) == "11.14 s"
    assert B.fmt("peak_kv_bytes", 62.7e6) == "62.7 MB"
    assert B.fmt("kv_reuse", 0.875) == "87.5%"
    assert B.fmt("speedup_vs_no_kv", 1.3911) == "1.391x"
    assert B.fmt("evictions", 1466) == "1,466"
    assert B.fmt("accuracy", None) == "n/a" and B.fmt("accuracy", float("nan")) == "n/a"
    assert B.label("latency_mean_s") == "mean latency per problem (s) · target"
    assert B.label("accuracy").endswith("· trace model")


def test_trace_choice_survives_a_page_switch(env):
    """Streamlit drops a widget's state on pages that do not draw it; the chosen trace must stay."""
    at = _app("serving")
    _ok(at)
    assert at.selectbox(key="trace").value == "examples/trace-gsm8k-persona"   # the bundled one by default
    other = next(o for o in at.selectbox(key="trace").options if o != "examples/trace-gsm8k-persona"
                 and "damaged" not in o and "smollm2" in o)
    at.selectbox(key="trace").set_value(other).run()
    at.switch_page("ui_pages/explorer.py").run()
    _ok(at)
    assert at.selectbox(key="trace").value == other


# ----------------------------------------------------------------------------- errors beside their widget
def _drawn(node, out=None) -> list[tuple[str, str]]:
    """The page's widgets and error lines in drawing order: ``("widget", key)`` / ``("error", text)``."""
    out = [] if out is None else out
    for child in getattr(node, "children", {}).values():
        if getattr(child, "type", None) == "error":
            out.append(("error", child.value))
        elif getattr(child, "key", None):
            out.append(("widget", child.key))
        _drawn(child, out)
    return out


def _errors_under(node, key: str) -> list[str]:
    """The error lines drawn right under the widget ``key`` (before the next widget)."""
    rows = _drawn(node)
    at = rows.index(("widget", key))
    out = []
    for kind, v in rows[at + 1:]:
        if kind == "widget":
            break
        out.append(v)
    return out


def test_a_simulator_error_is_shown_beside_the_widget_of_its_field(env):
    """ConfigError.field / CapacityError.field -> the widget (ui_common.FIELD_WIDGETS), never the message text."""
    from app.ui_common import FIELD_WIDGETS
    from sim.serving.capacity import ServingConfig
    from sim.base.options import declared

    # every serving setting and every target field a RunConfig / Target names has its widget
    assert {f.name for f, _ in declared(ServingConfig)} <= set(FIELD_WIDGETS)
    assert FIELD_WIDGETS["workload.concurrency"] == "srv.concurrency" and FIELD_WIDGETS["hardware"] == "hardware"
    # a capacity too small (CapacityError, field kv_capacity_bytes): under the KV capacity box, once per policy
    at = _app("serving")
    at.text_input(key="serving.srv.kv_capacity_bytes").set_value("1").run()
    _ok(at)
    under = _errors_under(at.main, "serving.srv.kv_capacity_bytes")
    assert len(under) == 4 and all("--kv-capacity-bytes: 1 B holds" in e and "fewer than one block" in e
                                   for e in under), under
    assert {e.split(":")[0] for e in under} == {"no-kv", "exact-prefix", "asks", "rsbcm"}
    assert all(e in under for e in (x.value for x in at.error))  # and nowhere else on the page
    # a model whose weights do not fit the GPU (the layout's ConfigError): under the target model box, in the sidebar
    at = _app()
    at.sidebar.selectbox(key="whatif.hardware").set_value("l4").run()
    at.sidebar.selectbox(key="whatif.model").set_value("qwen2.5-72b").run()
    _ok(at)
    under = _errors_under(at.sidebar, "whatif.model")
    assert under and all("qwen2.5-72b does not fit on l4" in e for e in under), (under, [e.value for e in at.error])
    assert not _errors_under(at.sidebar, "whatif.hardware")
