"""The project side of ``make reference-check`` and H2O's ``mean_over_queries`` (no kvpress, no torch).

kvpress itself runs only in ``make reference-check`` (its own venv); here the formulas it is
compared with are written out independently in numpy from the press's definition.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from policies import get_policy, run_token_eviction

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("reference_check", ROOT / "scripts" / "reference_check.py")
RC = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RC)


def _qkv(T=40, H=2, Hq=4, D=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, Hq, D)), rng.standard_normal((T, H, D)), rng.standard_normal((T, H, D)))


def _causal_attention(Q, K, upto: int):
    """(H_q, upto, n) softmax(q k / sqrt(D)) of queries 0..upto-1 over keys 0..n-1, causal; plain numpy."""
    T, Hq, D = Q.shape
    H = K.shape[1]
    g = Hq // H
    out = np.zeros((Hq, upto, K.shape[0]))
    for h in range(Hq):
        for i in range(upto):
            lg = K[: i + 1, h // g] @ Q[i, h] / np.sqrt(D)
            e = np.exp(lg - lg.max())
            out[h, i, : i + 1] = e / e.sum()
    return out


def _top(score, k):
    """Top-k per row, ties to the lower index, ascending."""
    return np.sort(np.argsort(-score, axis=1, kind="stable")[:, :k], axis=1)


def test_h2o_mean_over_queries_is_observed_attentions_score():
    """kvpress ObservedAttentionPress: mean over the group of sum_i a_ij / (T - j); H2O's default sums."""
    Q, K, V = _qkv()
    T, H = K.shape[0], K.shape[1]
    A = _causal_attention(Q, K, T)                                  # (Hq, T, T)
    observed = (A.sum(axis=1) / np.arange(T, 0, -1)).reshape(H, -1, T).mean(axis=1)
    n = RC.n_kept(T)
    assert np.array_equal(RC.project_kept("h2o-mean", Q, K, V), _top(observed, n))
    summed = A.sum(axis=1).reshape(H, -1, T).sum(axis=1)
    assert np.array_equal(RC.project_kept("h2o-sum", Q, K, V), _top(summed, n))
    # the two rules keep different tokens (the sum favours old tokens)
    assert not np.array_equal(_top(observed, n), _top(summed, n))
    assert RC.project_kept("h2o-sum", Q, K, V).mean() < RC.project_kept("h2o-mean", Q, K, V).mean()


def test_h2o_mean_over_queries_in_the_decode_loop():
    """At the first eviction at t, token j (seen by queries j..t-1) scores sum / (t - j)."""
    Q, K, V = _qkv(T=60)
    P, budget, buffer = 24, 20, 4
    pol = get_policy("h2o", budget=budget, buffer=buffer, mean_over_queries=True)
    res = run_token_eviction(pol, K, V, Q, P)
    t, kept = res.steps[0]
    A = _causal_attention(Q, K[: t + 1], t)                         # queries 0..t-1 over 0..t
    H = K.shape[1]
    acc = A.sum(axis=1).reshape(H, -1, t + 1).sum(axis=1)[:, : t + 1 - buffer]
    mean = acc / (t - np.arange(t + 1 - buffer))
    assert np.array_equal(kept[:, :budget], _top(mean, budget))
    plain = run_token_eviction(get_policy("h2o", budget=budget, buffer=buffer), K, V, Q, P).steps[0][1]
    assert np.array_equal(plain[:, :budget], _top(acc, budget))
    assert not np.array_equal(plain, kept)


def test_h2o_mean_over_queries_is_checked():
    from policies import PolicyError

    assert get_policy("h2o", mean_over_queries=True).mean_over_queries is True
    assert get_policy("h2o").mean_over_queries is False  # H2O's own rule stays the default
    with pytest.raises(PolicyError, match="mean_over_queries: must be true or false"):
        get_policy("h2o", mean_over_queries="yes")


def test_snapkv_and_streamingllm_mappings_keep_what_the_presses_keep():
    Q, K, V = _qkv(T=140)
    T, H = K.shape[0], K.shape[1]
    n = RC.n_kept(T)
    s = RC.project_kept("streamingllm", Q, K, V)
    assert np.array_equal(s, np.tile(np.r_[0:4, T - (n - 4):T], (H, 1)))
    for w in (32, 64):
        k = RC.project_kept(f"snapkv-w{w}", Q, K, V)
        assert k.shape == (H, n) and (k[:, -w:] == np.arange(T - w, T)).all()   # the window is kept
        # SnapKVPress: mean of the window's attention over the first T - w keys, avg-pool 5, group mean
        A = _causal_attention(Q, K, T)[:, T - w:, : T - w].mean(axis=1)
        pad = np.pad(A, ((0, 0), (2, 2)))
        pooled = sum(pad[:, i:i + T - w] for i in range(5)) / 5
        score = pooled.reshape(H, -1, T - w).mean(axis=1)
        assert np.array_equal(k[:, : n - w], _top(score, n - w))


def test_cur_mapping_is_curpress_local_windows_without_projection():
    """CURPress(use_local_approximation=True, local_window_size=16): ||k||^2 and ||v||^2 each
    normalised within consecutive 16-token windows (the last one zero-padded), multiplied; 4 sinks."""
    Q, K, V = _qkv(T=140)
    T, H = K.shape[0], K.shape[1]
    n = RC.n_kept(T)

    def local(x, w=16):
        xp = np.pad(x, ((0, 0), (0, (-T) % w))).reshape(H, -1, w)
        return (xp / xp.sum(axis=2, keepdims=True)).reshape(H, -1)[:, :T]

    score = local((K ** 2).sum(axis=2).T) * local((V ** 2).sum(axis=2).T)
    score[:, :4] = np.inf
    assert np.array_equal(RC.project_kept("cur-local16", Q, K, V), _top(score, n))


def _fake_capture(tmp_path: Path, T=140, layers=(1, 2)):
    qdir = tmp_path / "qkv"
    qdir.mkdir()
    for l in layers:
        Q, K, V = _qkv(T=T, seed=l)
        for name, a in (("Q", Q), ("K", K), ("V", V)):
            np.save(qdir / f"L{l:02d}_{name}.npy", a.astype(np.float32))
    meta = {"model": "random", "layers": list(layers), "T": T, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8,
            "compression": 0.5}
    (qdir / "meta.json").write_text(json.dumps(meta))
    return meta, qdir


def test_the_check_passes_on_agreement_and_fails_on_a_regression(tmp_path):
    meta, qdir = _fake_capture(tmp_path)
    # a stand-in for kvpress that agrees with the project
    source = {"snapkv-w32": "snapkv-w32", "snapkv-w64": "snapkv-w64", "streamingllm": "streamingllm",
              "observed-attention": "h2o-mean", "cur-local16": "cur-local16", "cur-defaults": "cur-defaults"}
    ref = {"kvpress_version": "test",
           "kept": {kv: {str(l): RC.project_kept(proj, *RC.load_qkv(qdir, l)).tolist() for l in meta["layers"]}
                    for kv, proj in source.items()}}
    rows = RC.compare(meta, qdir, ref)
    by = {r["project"]: r for r in rows}
    assert all(r["status"] in ("ok", "info") for r in rows)
    assert by["snapkv-w32"]["jaccard"] == 1.0 and by["streamingllm"]["status"] == "ok"
    assert by["h2o-sum"]["status"] == "info" and by["h2o-sum"]["jaccard"] < 1.0
    _, failed = RC.write_report(tmp_path, meta, ref, rows)
    assert not failed
    # one head of SnapKV keeps 5 other tokens: that head is a regression, and the check fails
    bad = json.loads(json.dumps(ref))
    h0 = bad["kept"]["snapkv-w32"]["1"][0]
    dropped = set(h0[:5])
    h0[:5] = sorted(set(range(140)) - set(h0))[:5]
    rows = RC.compare(meta, qdir, bad)
    reg = [r for r in rows if r["status"] == "REGRESSION"]
    assert [(r["project"], r["layer"], r["kv_head"]) for r in reg] == [("snapkv-w32", 1, 0)]
    assert reg[0]["jaccard"] == pytest.approx((70 - 5) / (70 + 5))
    text, failed = RC.write_report(tmp_path, meta, bad, rows)
    assert failed and "REGRESSION" in text and dropped
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["regression"] is True and "REGRESSION" in (tmp_path / "report.md").read_text()
