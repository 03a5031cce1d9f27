"""End to end on the real simulator and the bundled trace: rksim sweep / tune / pareto, local and Dask."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from app.cli import main
from sim.api import default_trace_path, evaluate
from sim.search.pareto import pareto_mask_bruteforce
from sim.search.sweep import read_sweep, single_thread_blas

TRACE = str(default_trace_path())
HW = "h100-sxm"  # a shipped preset: these tests do not depend on the local-cpu fit
SIM_API_KEYS = ("asks_gate_auc", "latency_mean_s", "latency_p50_s", "latency_p95_s", "speedup_vs_no_kv",
                "speedup_vs_exact_prefix", "kv_reuse", "skip_rate", "mean_exit_layer", "cgee_error_rate",
                "accuracy", "peak_kv_bytes", "evictions", "recompute_tokens")


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == b


@pytest.fixture(scope="module")
def asks_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "asks.parquet"
    rc = main(["sweep", "--trace", TRACE, "--hardware", HW, "--policy", "asks", "--grid", "tau=0.9:1.0:0.02",
               "--grid", "alpha=0,2", "--grid", "similarity=cosine,centered", "--quiet", "--out", str(out)])
    assert rc == 0
    return out


def test_sweep_rows_equal_evaluate(asks_sweep):
    df, meta = read_sweep(asks_sweep)
    assert len(df) == 6 * 2 * 2 and df["config_id"].is_unique
    for k in SIM_API_KEYS:
        assert k in df.columns, k
    assert {"param.tau", "param.alpha", "param.similarity"} <= set(df.columns)
    assert meta["policy"] == "asks" and meta["grid"]["alpha"] == [0, 2]
    # every row is exactly what evaluate() says for its parameters
    for i in (0, 7, len(df) - 1):
        row = df.iloc[i]
        params = {"tau": row["param.tau"], "alpha": int(row["param.alpha"]),
                  "similarity": row["param.similarity"]}
        with single_thread_blas():  # as the sweep evaluates
            m = evaluate(TRACE, policy="asks", params=params, hardware=HW)
        for k in SIM_API_KEYS:
            assert _same(m[k], None if pd.isna(row[k]) else row[k].item() if hasattr(row[k], "item") else row[k]), k
    # a higher tau shares less: never more KV reuse at the same alpha/similarity
    for (_, _), g in df.groupby(["param.alpha", "param.similarity"]):
        reuse = g.sort_values("param.tau")["kv_reuse"].to_numpy()
        assert np.all(np.diff(reuse) <= 1e-12)


@pytest.mark.slow
def test_sweep_dask_equals_local_on_the_real_simulator(asks_sweep, tmp_path):
    out = tmp_path / "asks-dask.parquet"
    rc = main(["sweep", "--trace", TRACE, "--hardware", HW, "--policy", "asks", "--grid", "tau=0.9:1.0:0.02",
               "--grid", "alpha=0,2", "--grid", "similarity=cosine,centered", "--backend", "dask",
               "--workers", "2", "--quiet", "--out", str(out)])
    assert rc == 0
    local, _ = read_sweep(asks_sweep)
    dist, meta = read_sweep(out)
    assert meta["backend"] == "dask"
    pd.testing.assert_frame_equal(local, dist, check_exact=True)


@pytest.mark.slow
def test_token_eviction_sweep_dask_equals_local_bit_for_bit(tmp_path):
    """Matmul-heavy metrics: equal only because every backend evaluates with one BLAS thread.

    Each sweep runs as its own ``rksim`` process, as a user runs it: the simulator memoises
    what earlier tests in this process computed (with whatever BLAS threads they had).
    """
    import subprocess
    import sys

    outs = {}
    for backend in ("local", "dask"):
        outs[backend] = tmp_path / f"vase-{backend}.parquet"
        cmd = [sys.executable, "-m", "app.cli", "sweep", "--trace", TRACE, "--hardware", HW,
               "--policy", "vase-attnv", "--grid", "budget=64,128", "--grid", "n_value=0,16",
               "--backend", backend, "--quiet", "--out", str(outs[backend])]
        if backend == "dask":
            cmd += ["--workers", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    local, _ = read_sweep(outs["local"])
    dist, _ = read_sweep(outs["dask"])
    assert local["attn_output_rel_error"].notna().all()
    pd.testing.assert_frame_equal(local, dist, check_exact=True)


def test_pareto_cli(asks_sweep, tmp_path, capsys):
    fig = tmp_path / "fig.html"
    rc = main(["pareto", str(asks_sweep), "--x", "latency_mean_s", "--y", "accuracy", "--out", str(fig), "--json"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    df, _ = read_sweep(asks_sweep)
    mask = pareto_mask_bruteforce(df["latency_mean_s"], df["accuracy"], True, True)
    tied = [cid for r in got["frontier"] for cid in r["tied_config_ids"]]
    assert sorted(tied) == sorted(df.loc[mask, "config_id"])  # every frontier configuration, once
    assert [r["config_id"] for r in got["frontier"]] == [ids[0] for ids in (r["tied_config_ids"] for r in got["frontier"])]
    points = {(r["latency_mean_s"], r["accuracy"]) for r in got["frontier"]}
    assert len(points) == len(got["frontier"]) == got["n_frontier_points"]
    assert got["n_configs"] == len(df) and got["n_frontier_configs"] == int(mask.sum()) >= 1
    html = fig.read_text()
    assert "Pareto frontier" in html and "plotly" in html
    rc = main(["pareto", str(asks_sweep)])
    assert rc == 0
    assert "on the frontier" in capsys.readouterr().out
    rc = main(["pareto", str(asks_sweep), "--x", "latency_mean_s", "--y", "accuracy", "--all-ties", "--json"])
    assert rc == 0
    every = json.loads(capsys.readouterr().out)["frontier"]
    assert sorted(r["config_id"] for r in every) == sorted(tied)


def test_tune_cli_json(tmp_path, capsys):
    out = tmp_path / "tune.json"
    rc = main(["tune", "--trace", TRACE, "--hardware", HW, "--policy", "cgee", "--objective", "speedup_vs_no_kv",
               "--max-cgee-error", "0.01", "--grid", "tau_conf=0.5:1.0:0.25", "--grid", "theta=0,0.5,2",
               "--grid", "l_min=10,20", "--refine-iters", "3", "--split-seed", "7", "--json", "--out", str(out)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == res
    tune_p, held_p = res["split"]["tune"], res["split"]["held_out"]
    assert set(tune_p).isdisjoint(held_p) and tune_p and held_p
    chosen = res["chosen"]["params"]
    assert set(chosen) == {"tau_conf", "theta", "l_min"}
    assert 0.5 <= chosen["tau_conf"] <= 1.0 and 10 <= chosen["l_min"] <= 20
    if res["chosen"]["feasible"]:
        assert res["metrics"]["tune"]["cgee_error_rate"] <= 0.01
    # the reported held-out metrics are evaluate() on the held-out problems
    with single_thread_blas():
        m = evaluate(TRACE, policy="cgee", params=chosen, problems=held_p, hardware=HW)
    for k in SIM_API_KEYS:
        assert _same(m[k], res["metrics"]["held_out"][k]), k
    assert res["metrics"]["tune"]["speedup_vs_no_kv"] >= res["grid_best"]["score"] - 1e-12


def test_tune_cli_table(capsys):
    rc = main(["tune", "--trace", TRACE, "--hardware", HW, "--policy", "asks", "--grid", "tau=0.9,0.95,1.0", "--no-refine",
               "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "chosen: tau=" in out and "held-out" in out and "tune" in out


@pytest.mark.parametrize("argv, msg", [
    (["sweep", "--policy", "asks", "--grid", "foo=1,2"], "--grid 'foo': policy 'asks' has no parameter 'foo'"),
    (["sweep", "--policy", "asks", "--grid", "tau=0:1:0"], "--grid 'tau=0:1:0': step is 0"),
    (["sweep", "--policy", "nope", "--grid", "tau=1"], "--policy 'nope'"),
    (["sweep", "--policy", "asks", "--grid", "tau=0.9", "--workers", "2"], "--backend dask"),
    (["sweep", "--policy", "asks", "--grid", "tau=0.9", "--hardware", "no-such-hw"], "no-such-hw"),
    (["tune", "--policy", "asks", "--grid", "tau=0.9", "--split", "1.5"], "--split"),
    (["tune", "--policy", "lru"], "no default grid"),
])
def test_bad_input_one_line_and_nothing_written(argv, msg, tmp_path, capsys):
    out = tmp_path / "s.parquet"
    out.write_bytes(b"previous")
    argv = argv[:1] + ["--trace", TRACE] + argv[1:]
    if "--hardware" not in argv:
        argv += ["--hardware", HW]
    if argv[0] == "sweep":
        argv += ["--out", str(out)]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert msg in err and "\n" not in err, err
    assert out.read_bytes() == b"previous"


def test_bad_trace_and_out(tmp_path, capsys):
    rc = main(["sweep", "--trace", str(tmp_path / "missing"), "--policy", "asks", "--grid", "tau=1",
               "--out", str(tmp_path / "s.parquet")])
    assert rc == 2 and "--trace" in capsys.readouterr().err
    rc = main(["sweep", "--trace", TRACE, "--hardware", HW, "--policy", "asks", "--grid", "tau=1", "--out", str(tmp_path / "s.csv")])
    assert rc == 2 and "*.parquet" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    rc = main(["tune", "--trace", str(tmp_path / "empty"), "--policy", "asks"])
    err = capsys.readouterr().err
    assert rc == 2 and "--trace" in err and "manifest.json" in err
    rc = main(["pareto", str(tmp_path / "none.parquet")])
    assert rc == 2 and "none.parquet" in capsys.readouterr().err


def test_sweep_prints_its_best_row_with_intervals(tmp_path, capsys):
    """The sweep's best configuration by speedup, with the intervals SimResult.intervals gives that row."""
    from sim.api import simulate
    from app.tables import fmt_ci
    out = tmp_path / "c.parquet"
    assert main(["sweep", "--trace", TRACE, "--hardware", HW, "--policy", "cgee", "--grid", "tau_conf=0.5,0.7",
                 "--grid", "l_min=20,26", "--quiet", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    df, _ = read_sweep(out)
    best = df.iloc[int(df["speedup_vs_no_kv"].to_numpy().argmax())]
    params = {"tau_conf": float(best["param.tau_conf"]), "l_min": int(best["param.l_min"])}
    r = simulate(TRACE, policy="cgee", params=params, hardware=HW)
    ci = r.intervals()
    assert line.startswith(f"best speedup_vs_no_kv: tau_conf={params['tau_conf']:g} l_min={params['l_min']}")
    for k in ("speedup_vs_no_kv", "skip_rate", "cgee_error_rate", "accuracy"):
        assert f"{k} {fmt_ci(r.summary[k], ci[k + '_ci95'])}" in line, k
    assert "over 12 problems" in line
