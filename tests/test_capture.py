"""Capture from the real model (SmolLM2-135M on CPU): a tiny trace, resume, determinism, CLI.

One uninterrupted capture (module fixture) is the reference; a capture
interrupted after its first shard and re-run, and a CLI capture of the same
command, must equal it file for file except the measured timings.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trace_files import deterministic_files

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

from app.cli import main as cli_main  # noqa: E402
from traces.capture import CaptureConfig, run_capture  # noqa: E402
from traces.store import load_trace  # noqa: E402

TINY = dict(problems=2, branches=3, max_new_tokens=6, long_decode=8, long_decode_seqs=1,
            long_decode_layers=[1, 30], tree_depth=2, tree_step=4, tree_expand=1, tree_branching=2,
            device="cpu", seed=11)
CLI_ARGS = ["capture", "--problems", "2", "--branches", "3", "--max-new-tokens", "6", "--long-decode", "8",
            "--long-decode-seqs", "1", "--long-decode-layers", "1,30", "--tree-depth", "2", "--tree-step", "4",
            "--tree-expand", "1", "--tree-branching", "2", "--device", "cpu", "--sampling-seed", "11", "--no-progress"]


class Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def lm():
    from traces.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def ref(tmp_path_factory, lm):
    out = tmp_path_factory.mktemp("cap") / "ref"
    run_capture(CaptureConfig(**TINY), out, command="test", progress=False, lm=lm)
    return out


def test_tiny_capture_contents(ref, lm):
    tr = load_trace(ref)
    info = tr.info()
    assert info["n_problems"] == 2 and info["n_branches"] == 3 and info["n_layers"] == 30
    assert info["long_decode_layers"] == [1, 30] and info["has_tree"] and info["has_counterfactual"]
    m = tr.manifest
    assert m["model"]["hidden_size"] == 576 and m["model"]["n_kv_heads"] == 3 and m["model"]["dtype"] == "float32"
    assert m["capture"]["seed"] == 11 and m["versions"]["torch"] and m["command"] == "test"
    for p in tr.problems:
        b = p.branches
        assert (b["gen_len"] >= 1).all() and (b["gen_len"] <= 6).all()
        # the root's counterfactual is its own generation
        assert list(b["cf_gen_ids"][0]) == list(b["gen_ids"][0]) and b["cf_answer"][0] == b["answer"][0]
        # log-probs are real log-probabilities
        lp = np.concatenate(list(b["gen_logprobs"]))
        assert (lp <= 0).all() and np.isclose(b["mean_prob"][1], np.exp(b["gen_logprobs"][1]).mean())
        cos = p.cos("mean", "cosine")
        assert cos.shape == (3, 30) and (cos[0] == 1).all() and (cos[1:] < 1).all()
        assert not np.allclose(p.cos("mean", "centered"), cos)
        lens = p.lens("own", norm=True)
        # layer L of the normed lens is the model's own output: it gives the verification score
        s = lens["p_yes"][:, -1] / (lens["p_yes"][:, -1] + lens["p_no"][:, -1])
        np.testing.assert_allclose(s, b["verify_score"], rtol=1e-4)
        nonorm = p.lens("own", norm=False)
        np.testing.assert_allclose(nonorm["entropy"][:, -1], lens["entropy"][:, -1], rtol=1e-5, atol=1e-6)
        assert not np.allclose(nonorm["entropy"][:, 10], lens["entropy"][:, 10])
        assert (lens["entropy"] >= -1e-6).all() and (lens["entropy"] <= np.log(49152) + 1e-3).all()
        assert p.hidden_mean.shape == (3, 30, 576)
        # pooled vectors reproduce the stored cosine
        h = p.hidden_mean.astype(np.float64)
        c = (h[1] * h[0]).sum(-1) / np.linalg.norm(h[1], axis=-1) / np.linalg.norm(h[0], axis=-1)
        np.testing.assert_allclose(c, cos[1], atol=2e-3)
        assert set(p.timings["phase"]) >= {"prefill", "decode", "cf_prefill", "cf_decode", "verify", "cf_verify", "gate"}
        assert (p.timings["seconds"] > 0).all()
    ld = tr.long_decodes[0]
    T = ld.meta["prompt_len"] + 8
    assert ld.meta["gen_len"] == 8 and len(ld.meta["token_ids"]) == T
    assert ld.K.shape == (2, T, 3, 64) and ld.Q.shape == (2, T, 9, 64) and ld.V.dtype == np.float16
    np.testing.assert_allclose(ld.key_norm, np.linalg.norm(ld.K.astype(np.float32), axis=-1), rtol=2e-3, atol=1e-2)
    vr = ld.V.astype(np.float32)
    np.testing.assert_allclose(ld.value_range, vr.max(-1) - vr.min(-1), rtol=2e-3, atol=1e-2)
    # recorded K at layer 1 equals the model's cache for the same tokens
    ids = torch.tensor([ld.meta["token_ids"]])
    with torch.inference_mode():
        out = lm.model(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    k1 = cache.layers[0].keys[0].transpose(0, 1).numpy()
    np.testing.assert_allclose(ld.K[0].astype(np.float32), k1, rtol=1e-2, atol=2e-2)
    nodes = tr.trees[0].nodes
    # depth 2, expand 1, branching 2: root + 2 + 2 children
    assert list(nodes["depth"]) == [0, 1, 1, 2, 2] and list(nodes["parent"])[:3] == [-1, 0, 0]
    best = nodes[nodes["depth"] == 1].sort_values(["score", "node"], ascending=[False, True]).iloc[0]
    assert set(nodes[nodes["depth"] == 2]["parent"]) == {best["node"]}
    assert nodes["expanded"].sum() == 2


def test_resume_after_interrupt_equals_uninterrupted(ref, lm, tmp_path):
    out = tmp_path / "resumed"

    def boom(rel):
        if rel == "problems/p00000":
            raise Interrupt(rel)

    with pytest.raises(Interrupt):
        run_capture(CaptureConfig(**TINY), out, progress=False, after_shard=boom, lm=lm)
    assert (out / "problems/p00000/shard.json").exists() and not (out / "problems/p00001").exists()
    assert not (out / "manifest.json").exists()
    with pytest.raises(ValueError, match="re-run the same capture command"):
        load_trace(out)
    first = (out / "problems/p00000/timings.parquet").read_bytes()
    run_capture(CaptureConfig(**TINY), out, progress=False, lm=lm)
    assert (out / "problems/p00000/timings.parquet").read_bytes() == first  # the complete shard was skipped
    load_trace(out)
    assert deterministic_files(out) == deterministic_files(ref)


def test_other_config_refused(ref, lm):
    cfg = CaptureConfig(**{**TINY, "max_new_tokens": 7})
    with pytest.raises(ValueError, match="max_new_tokens=6"):
        run_capture(cfg, ref, progress=False, lm=lm)
    load_trace(ref)  # nothing lost


def test_cli_end_to_end(ref, tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli_main([*CLI_ARGS, "--out", str(out)]) == 0
    assert deterministic_files(out) == deterministic_files(ref)
    m = json.loads((out / "manifest.json").read_text())
    assert m["command"].startswith("rksim capture ") and "--problems 2" in m["command"]
    assert cli_main(["trace", "validate", str(out)]) == 0
    capsys.readouterr()
    assert cli_main(["trace", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_problems"] == 2 and info["long_decode_layers"] == [1, 30]
    # resume of a finished trace is a no-op that keeps the data
    assert cli_main([*CLI_ARGS, "--out", str(out)]) == 0
    assert deterministic_files(out) == deterministic_files(ref)
    # a different config into the same directory: one-line error, exit 2
    capsys.readouterr()
    assert cli_main([*CLI_ARGS[:-1], "--sampling-seed", "12", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "config.json: seed:" in err
    assert cli_main(["capture", "--layout", "middle", "--out", str(tmp_path / "x")]) == 2
    assert "--layout" in capsys.readouterr().err


def test_long_decode_layers_default_to_those_that_evict():
    """A sliding-window layer keeps its window (token eviction does not apply), so the default long-decode layers of a
    model with window layers are the full-attention ones among every 4th and the last (all of them if none)."""
    cfg = CaptureConfig(long_decode=32)
    gemma = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert cfg.layers_for(18, gemma) == [12, 18]
    assert cfg.layers_for(30) == cfg.layers_for(30, None) == [4, 8, 12, 16, 20, 24, 28, 30]
    oss = ["sliding_attention", "full_attention"] * 12
    assert cfg.layers_for(24, oss) == [4, 8, 12, 16, 20, 24]
    assert cfg.layers_for(5, ["sliding_attention"] * 4 + ["full_attention"]) == [5]
    assert cfg.layers_for(6, ["full_attention"] + ["sliding_attention"] * 5) == [1]
    assert CaptureConfig(long_decode=32, long_decode_layers=[1, 2]).layers_for(18, gemma) == [1, 2]  # as asked
    assert CaptureConfig().layers_for(18, gemma) == []
