"""The latency-rate curve and its knee (``sim.search.knee``, ``rksim bench sweep``), checked against queueing theory.

The M/D/1 case: ``--max-num-seqs 1`` serves one request at a time and a prompt of fixed length with one
output token takes the same time ``D`` every time (measured: a lone request's E2E), so with Poisson
arrivals the server is an M/D/1 queue. Its mean wait is the Pollaczek-Khinchine formula with
``E[S^2] = D^2`` (L. Kleinrock, *Queueing Systems* Vol. I, 1975, ch. 5):
``W_q = rho D / (2 (1 - rho))``, ``rho = lambda D``; the request's TTFT is ``W_q + D``. The highest rate
with mean TTFT <= ``X`` solves ``W_q = w = X - D``: ``rho* = 2 w / (D + 2 w)``, ``lambda* = rho* / D``.
The queue is stable iff ``lambda < 1 / D``. The runs are in-process (``--no-frontend``): the API
server in front is a second queue in series (sim.overheads.FrontendCost), which would make it a tandem
queue; the engine's host time per step is in ``D`` (async scheduling, hidden behind the forward).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.cli import main
from sim.search import knee
from sim.bench import plain
from sim.serving.capacity import ServingConfig
from sim.cost.profiles import load_hardware, load_model

BASE = ["bench", "sweep", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--no-progress"]
MD1 = ["--max-num-seqs", "1", "--random-input-len", "512", "--random-output-len", "1", "--no-enable-prefix-caching",
       "--no-frontend"]


def _err(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("rksim: error:") and "\n" not in err, err
    return err


@pytest.fixture(scope="module")
def md1():
    """``(D, model, hardware, serving)`` of the one-at-a-time server."""
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    sv = ServingConfig(max_num_seqs=1, prefix_caching=False)
    r = plain.run(m, hw, plain.random_workload(1, 512, 1), request_rate=1.0, serving=sv, frontend=False)
    D = float(r.e2el[0])
    assert D > 0 and r.ttft[0] == pytest.approx(D)
    return D, m, hw, sv


def _sweep(tmp_path, capsys, *extra):
    assert main([*BASE, *extra, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    return json.loads((tmp_path / "latency-rate.json").read_text()), out


def _batch_se(x, batches: int = 20) -> float:
    """Standard error of the mean of a correlated series by non-overlapping batch means (Law & Kelton,
    *Simulation Modeling and Analysis*, batch-means method): the batches' means are nearly independent
    once a batch is much longer than the series' correlation time."""
    b = np.asarray(x)[: len(x) // batches * batches].reshape(batches, -1).mean(axis=1)
    return float(b.std(ddof=1) / math.sqrt(batches))


@pytest.mark.slow   # eight runs of 3000 requests: about 7 s on a free core
def test_md1_knee_matches_the_closed_form(md1, tmp_path, capsys):
    D, m, hw, sv = md1
    K, rho_star = 3000, 0.5
    w = rho_star * D / (2 * (1 - rho_star))          # the wait at the knee: 0.5 D
    X_ms = (D + w) * 1000
    lam_star = 2 * w / (D * (D + 2 * w))
    assert lam_star == pytest.approx(rho_star / D)
    rates = [0.4 / D, 0.6 / D]
    refine = 4
    doc, out = _sweep(tmp_path, capsys, *MD1, "--num-prompts", str(K), "--seed", "5",
                      "--request-rate", ",".join(f"{r:.6f}" for r in rates), "--slo", f"mean_ttft_ms={X_ms:.6f}",
                      "--refine", str(refine))
    c = doc["curve"]
    assert c["knee_bounded"] and c["first_failing_rate"] is not None
    # The tolerance the sample justifies: the mean wait measured over K requests at lambda* has standard
    # error se (batch means of the very run); a wait error dW moves the knee by dW / (dW_q/dlambda) with
    # dW_q/dlambda = D^2 / (2 (1 - rho)^2). Three standard errors (a normal mean is outside them 0.3% of the time;
    # measured 2026-12-03: se = 0.033 D, the knee 0.506 / D against 0.5 / D), plus the bisection's resolution.
    r = plain.run(m, hw, plain.random_workload(K, 512, 1, seed=5), request_rate=lam_star, serving=sv, seed=5,
                   frontend=False)
    se = _batch_se(r.ttft - D)
    assert abs(float(np.mean(r.ttft - D)) - w) < 4 * se        # the simulator is the M/D/1 queue at lambda*
    slope = D ** 2 / (2 * (1 - rho_star) ** 2)
    tol = 3 * se / slope + (rates[1] - rates[0]) / 2 ** refine
    assert tol < 0.15 * lam_star, (tol, lam_star)               # a check that can fail: about 12% of lambda*
    assert c["knee_rate"] == pytest.approx(lam_star, abs=tol), (c["knee_rate"] * D, tol * D)
    # every point below the knee meets the SLO and none is saturated (all rates < 1 / D)
    assert all(p["meets_slo"] for p in c["points"] if p["rate"] <= c["knee_rate"])
    assert not any(p["saturated"] for p in c["points"])
    assert sum(p["refined"] for p in c["points"]) == refine
    assert "knee" in out and "max_num_seqs 1," in out


def test_md1_saturation_above_one_over_d_and_not_below(md1, tmp_path, capsys):
    D = md1[0]
    rates = [0.5 / D, 0.9 / D, 1.15 / D, 1.5 / D]
    doc, out = _sweep(tmp_path, capsys, *MD1, "--num-prompts", "1500", "--seed", "2",
                      "--request-rate", ",".join(f"{r:.6f}" for r in rates))
    c = doc["curve"]
    by = {round(p["rate"] * D, 3): p for p in c["points"]}
    assert by[0.5]["saturated"] is False and by[0.9]["saturated"] is False
    assert by[1.15]["saturated"] is True and by[1.5]["saturated"] is True
    assert c["saturation_rate"] == pytest.approx(1.15 / D, rel=1e-6)
    # the fluid limit: the wait grows at rho - 1 seconds per second once overloaded. About it, the Poisson count's
    # fluctuation over the window's n = 750 sends (sqrt(n) D of wait over a span of n D / rho) moves the slope by
    # about rho / sqrt(n) = 0.055 at rho = 1.5: two of those
    assert by[1.5]["growth_s_per_s"] == pytest.approx(0.5, abs=0.11)
    assert by[1.15]["growth_s_per_s"] == pytest.approx(0.15, abs=0.09)
    # the achieved throughput of an overloaded one-at-a-time server is its capacity 1 / D
    assert c["capacity_rps"] == pytest.approx(1 / D, rel=0.01)
    # saturated points cannot be the knee, whatever the SLO
    assert c["knee_rate"] == pytest.approx(0.9 / D, rel=1e-6)
    assert "stable" in out and " no " in out


# ---------------------------------------------------------------------------------- pure data
def _fake(fn, sat_above=math.inf):
    calls = []

    def evaluate(rate):
        calls.append(rate)
        return {"mean_ttft_ms": fn(rate), "request_throughput": min(rate, sat_above)}, \
            {"growth_s_per_s": 0.0, "saturated": rate > sat_above, "window_requests": 100}
    return evaluate, calls


def test_knee_is_the_last_of_the_passing_run_and_bisection_narrows_it():
    slo = knee.KneeSLO.parse("mean_ttft_ms=100")
    ev, calls = _fake(lambda r: 10 * r)                  # meets the SLO up to rate 10 exactly
    c = knee.sweep(ev, [1, 2, 4, 8, 16], slo)
    assert c["knee_rate"] == 8 and c["first_failing_rate"] == 16 and c["knee_bounded"]
    c = knee.sweep(ev, [1, 2, 4, 8, 16], slo, refine=6)
    assert 10 - 8 / 2 ** 6 <= c["knee_rate"] <= 10 and len(calls) == 5 + 5 + 6
    # a rate that passes again above a failing one does not extend the knee
    ev, _ = _fake(lambda r: 200 if r == 4 else 10)
    assert knee.sweep(ev, [1, 2, 4, 8], slo)["knee_rate"] == 2
    # all pass: the knee is at least the highest rate (unbounded); the lowest fails: none
    ev, _ = _fake(lambda r: 1)
    c = knee.sweep(ev, [1, 2], slo, refine=3)
    assert c["knee_rate"] == 2 and not c["knee_bounded"] and len(c["points"]) == 2
    ev, _ = _fake(lambda r: 1e9)
    assert knee.sweep(ev, [1, 2], slo, refine=3)["knee_rate"] is None
    # saturation: the lowest saturated rate; a saturated point is never the knee
    ev, _ = _fake(lambda r: 1, sat_above=5)
    c = knee.sweep(ev, [1, 4, 6, 8], slo)
    assert c["saturation_rate"] == 6 and c["knee_rate"] == 4 and c["capacity_rps"] == 5


def test_queue_growth_slope_and_too_few_requests():
    rng = np.random.default_rng(0)
    due = np.sort(rng.uniform(0, 100, 2000))
    stable = rng.exponential(0.5, due.size)
    assert knee.queue_growth(due, stable)["saturated"] is False
    grow = 0.2 * due + stable                            # rho = 1.2
    g = knee.queue_growth(due, grow)
    assert g["saturated"] is True and g["growth_s_per_s"] == pytest.approx(0.2, abs=0.01)
    assert knee.queue_growth(due, grow, tolerance=0.3)["saturated"] is False
    assert knee.queue_growth(due[:30], grow[:30])["saturated"] is None      # 15 in the window < MIN_WINDOW


@pytest.mark.parametrize("text,word", [("p99_ttf_ms=1", "'p99_ttf_ms=1'"), ("p99_ttft_ms", "METRIC=MILLISECONDS"),
                                       ("p101_ttft_ms=3", "p101"), ("mean_tpot_ms=-1", "positive"),
                                       ("mean_tpot_ms=abc", "not a number"), ("ttft=0.5", "vllm bench serve's keys"),
                                       ("p99_ttft_ms=1,p99_ttft_ms=2", "twice")])
def test_slo_parsing_errors_name_the_flag(text, word):
    with pytest.raises(knee.KneeError) as e:
        knee.KneeSLO.parse(text)
    assert str(e.value).startswith("--slo:") and word in str(e.value)


def test_slo_parse_and_rates():
    s = knee.KneeSLO.parse(None)
    assert str(s) == knee.DEFAULT_SLO and s.limits == (("p99_ttft_ms", 1000.0), ("mean_tpot_ms", 50.0))
    assert knee.KneeSLO.parse("p99.9_e2el_ms=5,median_itl_ms=2").percentiles == (99.9,)
    assert s.meets({"p99_ttft_ms": 1000, "mean_tpot_ms": 49}) and not s.meets({"p99_ttft_ms": 1001, "mean_tpot_ms": 1})
    with pytest.raises(knee.KneeError, match="--slo: mean_tpot_ms is not among"):
        s.meets({"p99_ttft_ms": 1})
    assert knee.parse_rates("8,1:3:1, 0.5") == [0.5, 1, 2, 3, 8]
    assert knee.parse_rates("0.5:2:0.5") == [0.5, 1.0, 1.5, 2.0]
    for bad in ("0", "inf", "a", "4:1:1", "1:2:0", "1:2"):
        with pytest.raises(knee.KneeError, match="^--request-rate:"):
            knee.parse_rates(bad)


def test_cli_errors_are_one_line_and_come_before_any_work(capsys, tmp_path):
    big = [*BASE, "--num-prompts", "10000000", "--request-rate", "1,2"]   # would run for hours
    assert "--slo: 'p99_ttf_ms=1'" in _err(capsys, [*big, "--slo", "p99_ttf_ms=1"])
    assert "--request-rate: every rate must be finite" in _err(capsys, [*BASE, "--request-rate", "1,inf"])
    f = tmp_path / "file"
    f.write_text("x")
    assert f"--out: {f} is a file" in _err(capsys, [*big, "--out", str(f)])
    (tmp_path / "d" / "latency-rate.json").mkdir(parents=True)
    assert "is a folder" in _err(capsys, [*big, "--out", str(tmp_path / "d")])
    assert "--refine" in _err(capsys, [*BASE, "--request-rate", "1", "--refine", "-1"])
    assert "--saturation-tolerance" in _err(capsys, [*BASE, "--request-rate", "1", "--saturation-tolerance", "1"])


def test_same_seed_bit_identical_json_and_the_figure(tmp_path, capsys):
    argv = [*BASE, "--num-prompts", "60", "--random-input-len", "256", "--random-output-len", "16",
            "--request-rate", "2,8", "--seed", "4"]
    runs = []
    for name, seed in (("a", "4"), ("b", "4"), ("c", "5")):
        assert main([*argv[:-1], seed, "--out", str(tmp_path / name)]) == 0
        runs.append((tmp_path / name / "latency-rate.json").read_bytes())
    out = capsys.readouterr().out
    assert runs[0] == runs[1] and runs[0] != runs[2]
    doc = json.loads(runs[0])
    assert doc["rates"] == [2.0, 8.0] and [p["rate"] for p in doc["curve"]["points"]] == [2.0, 8.0]
    assert "max_num_batched_tokens 8192" in doc["provenance"] and "h100-sxm" in doc["caption"]
    html = (tmp_path / "a" / "latency-rate.html").read_text()
    for trace in ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50", "E2E p99", "TPOT mean"):
        assert f'"name":"{trace}"' in html, trace
    assert "KV capacity" in html and "scheduler vllm-v1" in html          # the caption: what the figure holds under
    assert "TTFT p99" in out and "knee" in out


@pytest.mark.slow
def test_rate_sweep_on_dask_equals_local(tmp_path, capsys):
    # issue 32 item 5: the rates' independent runs on a Dask LocalCluster give the very same file
    argv = [*BASE, "--num-prompts", "40", "--random-input-len", "256", "--random-output-len", "16",
            "--request-rate", "2,8,64", "--refine", "1", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    assert main([*argv, "--backend", "dask", "--workers", "2", "--out", str(tmp_path / "dask")]) == 0
    assert (tmp_path / "local" / "latency-rate.json").read_bytes() == (tmp_path / "dask" / "latency-rate.json").read_bytes()
    assert main([*argv, "--workers", "2"]) == 2
    assert "--dask-scheduler/--workers need --backend dask" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- plan --knee and the dashboard
PLAN = ["plan", "--model-preset", "qwen2.5-7b", "--hardware", "dgx-h100", "--gpus", "1", "--policies", "exact-prefix",
        "--tensor-parallel-size", "1", "--num-problems", "48", "--max-num-seqs", "256", "--max-num-batched-tokens", "2048"]


def test_plan_knee_and_the_deployment_page_use_one_function(capsys):
    assert main([*PLAN, "--knee", "4,64", "--knee-slo", "p99_ttft_ms=300", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (k,) = doc["meta"]["knees"]
    assert k["policy"] == "exact-prefix" and [p["rate"] for p in k["points"]] == [4.0, 64.0]
    assert k["knee_rate"] == 4.0 and k["first_failing_rate"] == 64.0 and k["points"][0]["saturated"] is False
    assert k["saturation_rate"] == 64.0 and k["points"][-1]["growth_s_per_s"] > 0.05
    assert "max_num_seqs 256, max_num_batched_tokens 2048, KV capacity" in k["caption"]   # the flags'; not the defaults
    from app import ui_backend as B
    row = doc["best_per_policy"][0]
    curve, cap = B.deployment_knee(row, doc["meta"], "4,64", "p99_ttft_ms=300")
    assert curve["knee_rate"] == k["knee_rate"] and curve["saturation_rate"] == k["saturation_rate"]
    assert cap == k["caption"]
    html = B.knee_figure(curve, cap).to_html(include_plotlyjs=False)
    assert '"name":"TTFT p99"' in html and "offered rate (problems" in html
    with pytest.raises(ValueError, match="^--knee: "):
        B.deployment_knee(row, doc["meta"], "2,x", None)


def test_plan_knee_flags_are_checked_before_any_deployment_runs(capsys):
    assert "--knee: every rate must be finite and > 0" in _err(capsys, [*PLAN, "--knee", "0"])
    assert "--knee-slo: 'ttft=1'" in _err(capsys, [*PLAN, "--knee", "1", "--knee-slo", "ttft=1"])


def test_plan_knee_is_priced_on_the_plan_s_target_flags(capsys):
    """An MoE plan with --enable-expert-parallel and --kv-cache-dtype fp8: its knees, from the CLI and from the
    Deployment page (the plan's meta), are priced as its rows were: expert parallel, one byte per KV element
    (twice the blocks of a 16-bit cache); the same rates without those flags give another KV capacity."""
    moe = ["plan", "--model-preset", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--gpus", "2", "--policies",
           "exact-prefix", "--tensor-parallel-size", "1", "--data-parallel-size", "2", "--num-problems", "24",
           "--knee", "4,64", "--json"]
    assert main([*moe, "--enable-expert-parallel", "--kv-cache-dtype", "fp8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["meta"]["target_options"] == {"enable_expert_parallel": True, "moe_routing": "expected",
                                             "kv_cache_dtype": "fp8"}
    (k,) = doc["meta"]["knees"]
    assert "model qwen3-30b-a3b (fp8 KV cache)" in k["caption"] and "expert parallel" in k["caption"]
    from app import ui_backend as B
    row = doc["best_per_policy"][0]
    curve, cap = B.deployment_knee(row, doc["meta"], "4,64", None)
    assert cap == k["caption"] and curve["knee_rate"] == k["knee_rate"]
    assert main([*moe, "--kv-cache-dtype", "fp8"]) == 0   # the experts on every replica: less room for KV
    (no_ep,) = json.loads(capsys.readouterr().out)["meta"]["knees"]
    assert main(moe) == 0
    (plain,) = json.loads(capsys.readouterr().out)["meta"]["knees"]
    blocks = [int(c.split("KV capacity ")[1].split(" blocks")[0]) for c in (k["caption"], no_ep["caption"],
                                                                             plain["caption"])]
    assert "expert parallel" not in no_ep["caption"] and blocks[0] > blocks[1] > 1.9 * blocks[2]
