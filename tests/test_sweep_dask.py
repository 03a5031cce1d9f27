"""Sweep runner, local and on a Dask LocalCluster: equal rows, no lost or repeated configuration.

These tests inject a deterministic test-only ``evaluate`` (defined here; Dask
workers import this module by name) so that they exercise the machinery in a
few seconds; tests/test_sweep_cli.py runs the real ``sim.api.evaluate`` on the
bundled trace, local against Dask too.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.search.grid import config_id, parse_grids
from sim.search.sweep import SweepOptions, read_sweep, run_sweep, write_parquet

distributed = pytest.importorskip("distributed")


def fake_evaluate(trace, policy, params, problems=None, seed=0, **kw):
    """A deterministic function of its inputs with non-trivial floats (not a simulator)."""
    tau = float(params.get("tau", 0.5))
    alpha = float(params.get("alpha", 1.0))
    n = len(problems) if problems is not None else 12
    x = math.sin(13.0 * tau + 0.7 * alpha + 0.01 * seed) / 3.0
    return {
        "speedup_vs_no_kv": 1.0 + tau * math.exp(-alpha / 7.0) + x,
        "cgee_error_rate": abs(x) / n,
        "accuracy": round(1 - tau / 3, 6),
        "evictions": int(10 * tau) + int(alpha),
        "asks_gate_auc": None,
        "mode_is_isolated": kw.get("mode") == "isolated",
    }


def killing_evaluate(trace, policy, params, **kw):
    """Kills its own worker process the first time it meets tau == 0.5 (marker file in ``trace``)."""
    if params.get("tau") == 0.5 and params.get("alpha") == 1:
        try:
            fd = os.open(Path(trace) / "killed-once", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os._exit(17)  # the worker dies mid-task, mid-sweep
    return fake_evaluate(trace, policy, params, **kw)


GRID = ["tau=0:0.95:0.05", "alpha=0,1,2"]  # 60 configurations


@pytest.fixture(scope="module")
def client():
    from sim.search.dist import open_client

    with open_client(workers=2) as c:
        yield c


def test_local_rows_in_grid_order(tmp_path):
    grid = parse_grids(GRID)
    df = run_sweep(tmp_path, "asks", grid, SweepOptions(), evaluate=fake_evaluate, progress=False)
    cfgs = list(grid.configs())
    assert len(df) == 60
    assert list(df["config_id"]) == [config_id(c) for c in cfgs]
    assert list(df["param.tau"]) == [c["tau"] for c in cfgs]
    assert df["asks_gate_auc"].dtype == np.float64 and df["asks_gate_auc"].isna().all()
    assert df["evictions"].dtype == np.int64
    assert df["mode_is_isolated"].all()
    assert (df["policy"] == "asks").all()


def test_dask_equals_local_exactly(tmp_path, client):
    grid = parse_grids(GRID)
    opts = SweepOptions(problems=(0, 2, 5), seed=3)
    local = run_sweep(tmp_path, "asks", grid, opts, evaluate=fake_evaluate, progress=False)
    dist = run_sweep(tmp_path, "asks", grid, opts, evaluate=fake_evaluate, backend="dask",
                     client=client, progress=False, chunk_size=7)
    pd.testing.assert_frame_equal(local, dist, check_exact=True)
    # bit-for-bit: same float64 words
    a = local["speedup_vs_no_kv"].to_numpy()
    b = dist["speedup_vs_no_kv"].to_numpy()
    assert a.view(np.uint64).tolist() == b.view(np.uint64).tolist()


def test_worker_killed_mid_sweep_loses_and_repeats_nothing(tmp_path, client):
    grid = parse_grids(GRID)
    expected = run_sweep(tmp_path, "asks", grid, evaluate=fake_evaluate, progress=False)
    assert not (tmp_path / "killed-once").exists()
    got = run_sweep(tmp_path, "asks", grid, evaluate=killing_evaluate, backend="dask",
                    client=client, progress=False, chunk_size=4)
    assert (tmp_path / "killed-once").exists(), "the worker kill did not happen"
    assert got["config_id"].is_unique and len(got) == grid.size
    pd.testing.assert_frame_equal(expected, got, check_exact=True)


def test_user_error_on_a_worker_is_raised_not_retried(tmp_path, client):
    def bad(trace, policy, params, **kw):
        raise ValueError("tau: must be in [0, 1]")

    with pytest.raises(ValueError, match=r"config [0-9a-f]{16} .*tau: must be in \[0, 1\]"):
        run_sweep(tmp_path, "asks", [{"tau": 2.0}], evaluate=bad, backend="dask", client=client,
                  progress=False, retries=0)


def test_parquet_atomic_and_readable_by_pandas_and_dask(tmp_path):
    import dask.dataframe as dd

    grid = parse_grids(GRID)
    df = run_sweep(tmp_path, "asks", grid, evaluate=fake_evaluate, progress=False)
    out = write_parquet(df, tmp_path / "s.parquet", {"policy": "asks", "grid": grid.to_json()})
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    back, meta = read_sweep(out)
    pd.testing.assert_frame_equal(df, back, check_exact=True)
    assert meta["grid"]["alpha"] == [0, 1, 2]
    pd.testing.assert_frame_equal(df, pd.read_parquet(out), check_exact=True)
    ddf = dd.read_parquet(str(out)).compute().reset_index(drop=True)
    assert list(ddf.columns) == list(df.columns)
    np.testing.assert_array_equal(ddf["speedup_vs_no_kv"].to_numpy(), df["speedup_vs_no_kv"].to_numpy())
    # a failing write leaves the previous file intact
    with pytest.raises(ValueError, match="--out"):
        write_parquet(df, tmp_path / "s.csv")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_parquet(df, tmp_path / "nope" / "s.parquet")


def test_missing_dask_gives_a_clear_error(monkeypatch):
    import builtins

    from sim.search import dist

    real_import = builtins.__import__

    def no_distributed(name, *a, **k):
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError("No module named 'distributed'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    with pytest.raises(ValueError, match=r"optional extra 'dist'.*rksim\[dist\]"):
        dist.require_dask()


def test_existing_scheduler_address(tmp_path, client):
    grid = parse_grids(["tau=0.1,0.2,0.3", "alpha=0,1"])
    local = run_sweep(tmp_path, "asks", grid, evaluate=fake_evaluate, progress=False)
    remote = run_sweep(tmp_path, "asks", grid, evaluate=fake_evaluate, backend="dask",
                       scheduler=client.scheduler.address, progress=False)
    pd.testing.assert_frame_equal(local, remote, check_exact=True)
    with pytest.raises(ValueError, match="--workers applies to the LocalCluster only"):
        run_sweep(tmp_path, "asks", grid, evaluate=fake_evaluate, backend="dask",
                  scheduler=client.scheduler.address, workers=2, progress=False)
    with pytest.raises(ValueError, match="--backend: 'spark'"):
        run_sweep(tmp_path, "asks", grid, evaluate=fake_evaluate, backend="spark", progress=False)
