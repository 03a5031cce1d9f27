"""Trace store: writer, verifying loader, one-line faults. No torch."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from traces import schema as S
from traces.store import (
    TraceError, TraceWriter, load_trace, problem_dir, long_dir, tree_dir, table_bytes, sha256_file, manifest_self_hash,
)

L, D, B, HQ, HKV, HD = 3, 8, 3, 2, 1, 4


def _problem_tables(rng, B=B, L=L):
    prompts = [[1, 2, 3 + b, 4, 5] for b in range(B)]
    gens = [list(rng.integers(0, 50, size=4)) for _ in range(B)]
    lp = [list(-rng.random(4).astype(np.float32)) for _ in range(B)]
    branches = {
        "branch": list(range(B)), "variant_id": list(range(B)), "variant_text": [f"v{b}" for b in range(B)],
        "prompt_ids": prompts, "prompt_len": [5] * B,
        "seg_kinds": [["shared", "variant", "shared"]] * B, "seg_lens": [[2, 1, 2]] * B,
        "variant_start": [2] * B, "variant_end": [3] * B,
        "gen_ids": gens, "gen_len": [4] * B, "gen_logprobs": lp,
        "mean_logprob": [float(np.mean(x)) for x in lp], "mean_prob": [float(np.mean(np.exp(x))) for x in lp],
        "answer": ["3"] * B, "correct": [True] * B, "vote_share": [1.0] * B,
        "cf_gen_ids": gens, "cf_gen_len": [4] * B, "cf_gen_logprobs": lp,
        "cf_mean_logprob": [float(np.mean(x)) for x in lp], "cf_mean_prob": [0.5] * B,
        "cf_answer": ["3"] * B, "cf_correct": [True] * B, "cf_vote_share": [1.0] * B,
        "verify_prompt_len": [7] * B, "verify_score": list(rng.random(B)), "cf_verify_score": list(rng.random(B)),
    }
    cos = rng.uniform(-1, 1, size=(B, L))
    cos[0] = 1.0
    asks = {"branch": np.repeat(np.arange(B), L), "layer": np.tile(np.arange(1, L + 1), B)}
    for c in ("cos_mean_raw", "cos_mean_centered", "cos_last_raw", "cos_last_centered"):
        asks[c] = cos.reshape(-1)
    n = 2 * B * L
    verify = {
        "gen": ["own"] * (B * L) + ["cf"] * (B * L),
        "branch": np.tile(np.repeat(np.arange(B), L), 2), "layer": np.tile(np.arange(1, L + 1), 2 * B),
        "entropy": rng.random(n) * 5, "p_yes": rng.random(n) / 2, "p_no": rng.random(n) / 2,
        "top1": rng.integers(0, 50, n),
        "entropy_nonorm": rng.random(n) * 5, "p_yes_nonorm": rng.random(n) / 2, "p_no_nonorm": rng.random(n) / 2,
        "top1_nonorm": rng.integers(0, 50, n),
    }
    timings = {"phase": ["prefill", "decode"], "branch": [-1, -1], "n_new": [15, 12], "n_cached": [0, 15],
               "batch": [B, B], "seconds": [0.1, 0.2]}
    return {"branches.parquet": branches, "asks.parquet": asks, "verify.parquet": verify,
            "timings.parquet": timings}


def make_synthetic_trace(root: Path, n_problems=2, seed=0) -> Path:
    """A tiny but complete trace written through the real writer."""
    rng = np.random.default_rng(seed)
    w = TraceWriter(root, {"seed": seed, "n": n_problems})
    w.write_arrays({"reference_mean.npy": rng.standard_normal((L, D)).astype(np.float32),
                    "reference_last.npy": rng.standard_normal((L, D)).astype(np.float32)})
    shards = {"problems": [], "long": [], "trees": []}
    for i in range(n_problems):
        rel = problem_dir(i)
        meta = {"problem_index": i, "question": "q?", "truth": "3", "answer_kind": "number",
                "n_branches": B, "shared_prefix_tokens": 2}
        w.write_shard(rel, meta, _problem_tables(rng), {
            "hidden_mean.npy": rng.standard_normal((B, L, D)).astype(np.float16),
            "hidden_last.npy": rng.standard_normal((B, L, D)).astype(np.float16)})
        shards["problems"].append(rel)
    T = 6
    w.write_shard(long_dir(0), {
        "seq_index": 0, "problem_index": 0, "prompt_len": 4, "gen_len": 2, "layers": [1, 3], "n_heads": HQ,
        "n_kv_heads": HKV, "head_dim": HD, "token_ids": list(range(T)), "answer": "3", "truth": "3",
        "correct": True}, None, {
        "K.npy": rng.standard_normal((2, T, HKV, HD)).astype(np.float16),
        "V.npy": rng.standard_normal((2, T, HKV, HD)).astype(np.float16),
        "Q.npy": rng.standard_normal((2, T, HQ, HD)).astype(np.float16),
        "value_range.npy": rng.random((2, T, HKV)).astype(np.float32),
        "key_norm.npy": rng.random((2, T, HKV)).astype(np.float32)})
    shards["long"].append(long_dir(0))
    nodes = {"node": [0, 1, 2], "parent": [-1, 0, 0], "depth": [0, 1, 1], "score": [1.0, 0.3, 0.7],
             "n_tokens": [3, 2, 2], "context_len": [0, 3, 3], "token_ids": [[1, 2, 3], [4, 5], [6, 7]],
             "expanded": [True, False, False], "answer": ["", "1", "3"], "correct": [False, False, True]}
    w.write_shard(tree_dir(0), {"problem_index": 0, "depth": 1, "step_tokens": 2, "expand_k": 1,
                                "branching": 2}, {"nodes.parquet": nodes})
    shards["trees"].append(tree_dir(0))
    w.finalize({
        "rksim_version": "0", "created": "2026-01-01T00:00:00Z", "command": "synthetic",
        "model": {"name": "toy", "source": "none", "n_layers": L, "hidden_size": D, "n_heads": HQ,
                  "n_kv_heads": HKV, "head_dim": HD, "intermediate_size": 16, "vocab_size": 50,
                  "dtype": "float32"},
        "device": "cpu", "dataset": "gsm8k", "layout": "persona-prefix", "n_problems": n_problems,
        "n_branches": B, "capture": {"max_new_tokens": 4, "seed": seed}, "versions": {}, "shards": shards,
        "long_decode_layers": [1, 3], "has_hidden_vectors": True, "has_counterfactual": True,
        "has_verification_lens": True, "has_tree": True,
    })
    return root


def rehash(root: Path) -> None:
    """Recompute every checksum (to test faults the checksums alone would not name)."""
    m = json.loads((root / "manifest.json").read_text())
    for sj in root.rglob("shard.json"):
        meta = json.loads(sj.read_text())
        for name in meta["files"]:
            p = sj.parent / name
            meta["files"][name] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        sj.write_text(json.dumps(meta))
    for rel in m["files"]:
        p = root / rel
        m["files"][rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    m["manifest_sha256"] = manifest_self_hash(m)
    (root / "manifest.json").write_text(json.dumps(m))


@pytest.fixture()
def trace(tmp_path):
    return make_synthetic_trace(tmp_path / "t")


def _err(root, **kw) -> str:
    with pytest.raises(TraceError) as ei:
        load_trace(root, **kw)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_roundtrip(trace):
    tr = load_trace(trace)
    assert tr.n_layers == L and tr.n_branches == B and tr.model_name == "toy"
    assert len(tr.problems) == 2 and len(tr.long_decodes) == 1 and len(tr.trees) == 1
    p = tr.problems[0]
    assert p.index == 0 and p.truth == "3"
    assert p.cos("mean", "cosine").shape == (B, L)
    assert np.all(p.cos("last", "centered")[0] == 1.0)
    lens = p.lens("cf", norm=False)
    assert set(lens) == {"entropy", "p_yes", "p_no", "top1"} and lens["top1"].shape == (B, L)
    assert isinstance(p.hidden_mean, np.memmap) and p.hidden_mean.dtype == np.float16
    assert p.hidden_last.shape == (B, L, D)
    ld = tr.long_decodes[0]
    assert ld.K.shape == (2, 6, HKV, HD) and ld.Q.shape == (2, 6, HQ, HD) and ld.layers == [1, 3]
    assert list(tr.trees[0].nodes["parent"]) == [-1, 0, 0]
    assert tr.reference_mean.shape == (L, D)
    info = tr.info()
    for k in ("schema_version", "model", "dataset", "layout", "n_problems", "n_branches", "n_layers",
              "has_counterfactual", "has_verification_lens", "long_decode_layers", "has_tree"):
        assert k in info
    with pytest.raises(ValueError, match="pooling"):
        p.cos("max")


def test_parquet_bytes_deterministic():
    rng = np.random.default_rng(1)
    t1 = _problem_tables(rng)["branches.parquet"]
    assert table_bytes("branches.parquet", t1) == table_bytes("branches.parquet", dict(t1))


def test_truncated_file(trace):
    f = trace / "problems/p00001/hidden_mean.npy"
    f.write_bytes(f.read_bytes()[:-10])
    msg = _err(trace)
    assert msg.startswith("problems/p00001/hidden_mean.npy: bytes:")
    # with checksums re-blessed the npy reader itself names the file
    rehash(trace)
    msg = _err(trace)
    assert msg.startswith("problems/p00001/hidden_mean.npy: npy:")


def test_byte_flip(trace):
    f = trace / "problems/p00000/asks.parquet"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    assert _err(trace).startswith("problems/p00000/asks.parquet: sha256:")


def test_nan_in_table(trace):
    rng = np.random.default_rng(3)
    t = _problem_tables(rng)["verify.parquet"]
    t["entropy"][4] = np.nan
    (trace / "problems/p00000/verify.parquet").write_bytes(table_bytes("verify.parquet", t))
    rehash(trace)
    assert _err(trace) == "problems/p00000/verify.parquet: column entropy: 1 non-finite value(s) (NaN or inf)"


def test_nan_in_array(trace):
    a = np.zeros((2, 6, HKV, HD), np.float16)
    a[1, 3, 0, 2] = np.inf
    np.save(trace / "long/s00000/V.npy", a, allow_pickle=False)
    rehash(trace)
    assert _err(trace).startswith("long/s00000/V.npy: values:")


def test_wrong_shape(trace):
    np.save(trace / "problems/p00000/hidden_last.npy", np.zeros((B, L, D + 1), np.float16), allow_pickle=False)
    rehash(trace)
    assert _err(trace) == f"problems/p00000/hidden_last.npy: shape: ({B}, {L}, {D + 1}), expected ({B}, {L}, {D})"


def test_wrong_dtype(trace):
    np.save(trace / "problems/p00000/hidden_last.npy", np.zeros((B, L, D), np.float32), allow_pickle=False)
    rehash(trace)
    assert _err(trace).startswith("problems/p00000/hidden_last.npy: dtype: float32")


def test_missing_file(trace):
    (trace / "trees/t00000/nodes.parquet").unlink()
    assert _err(trace) == "trees/t00000/nodes.parquet: file: missing (listed in manifest.json)"


def test_missing_column(trace):
    rng = np.random.default_rng(3)
    t = _problem_tables(rng)["timings.parquet"]
    import pyarrow as pa, pyarrow.parquet as pq
    tab = pa.table({k: pa.array(v, S.TIMINGS[k]) for k, v in t.items() if k != "seconds"})
    pq.write_table(tab, trace / "problems/p00001/timings.parquet")
    rehash(trace)
    assert _err(trace) == "problems/p00001/timings.parquet: column seconds: missing"


def test_future_schema_version(trace):
    m = json.loads((trace / "manifest.json").read_text())
    m["schema_version"] = S.SCHEMA_VERSION + 1
    m["manifest_sha256"] = manifest_self_hash(m)
    (trace / "manifest.json").write_text(json.dumps(m))
    msg = _err(trace)
    assert msg.startswith("manifest.json: schema_version: trace has schema version 2, newer")


def test_missing_manifest_and_bad_json(trace):
    (trace / "manifest.json").write_text("{not json")
    assert _err(trace).startswith("manifest.json: json:")
    (trace / "manifest.json").unlink()
    assert "re-run the same capture command" in _err(trace)


def test_verify_false_skips_checksums(trace):
    f = trace / "problems/p00000/asks.parquet"
    b = bytearray(f.read_bytes())
    b[-20] ^= 0x01  # footer metadata stays parseable or not; size unchanged
    f.write_bytes(bytes(b))
    tr = load_trace(trace, verify=False)  # sizes match: no error until the table is read
    assert tr.manifest["files"] and len(tr.problems) == 2
    with pytest.raises(TraceError, match="asks.parquet"):  # the checksum is what verify=True adds
        load_trace(trace, verify=True)


def test_writer_refuses_other_config(trace):
    with pytest.raises(TraceError, match="n=2"):
        TraceWriter(trace, {"seed": 0, "n": 5})
    TraceWriter(trace, {"seed": 0, "n": 2})  # same config: resume is fine


def test_writer_refuses_foreign_dir(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("hi")
    with pytest.raises(TraceError, match="not empty"):
        TraceWriter(tmp_path / "x", {"a": 1})


def test_shard_complete_detects_corruption(trace):
    w = TraceWriter(trace, {"seed": 0, "n": 2})
    assert w.shard_complete(problem_dir(0))
    (trace / "problems/p00000/asks.parquet").write_bytes(b"x")
    assert not w.shard_complete(problem_dir(0))
    assert not w.shard_complete(problem_dir(7))


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_any_single_byte_flip_is_named(tmp_path_factory, pos):
    root = make_synthetic_trace(tmp_path_factory.mktemp("h") / "t", n_problems=1)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    f = files[pos % len(files)]
    b = bytearray(f.read_bytes())
    b[pos % len(b)] ^= 0x41
    f.write_bytes(bytes(b))
    msg = _err(root)
    assert msg.startswith(f.relative_to(root).as_posix() + ":")


def test_manifest_field_fault(trace):
    m = json.loads((trace / "manifest.json").read_text())
    m["model"]["n_layers"] = "thirty"
    m["manifest_sha256"] = manifest_self_hash(m)
    (trace / "manifest.json").write_text(json.dumps(m))
    assert _err(trace) == "manifest.json: model.n_layers: expected an integer >= 1, got 'thirty'"


def test_edited_manifest_is_named(trace):
    m = json.loads((trace / "manifest.json").read_text())
    m["n_branches"] = 4  # edited without updating its own checksum
    (trace / "manifest.json").write_text(json.dumps(m))
    assert _err(trace).startswith("manifest.json: manifest_sha256:")


# --------------------------------------------------------------------------- merge (no torch)
def _as_part(root: Path, shard: str = "0/1", **capture) -> Path:
    """Mark a synthetic trace as part ``shard`` of a capture (as ``rksim capture --shard`` would)."""
    m = json.loads((root / "manifest.json").read_text())
    m["capture"].update({"shard": shard, "problem_start": 0, "problems": 2, "long_decode": 6, "long_decode_seqs": 1,
                         "tree_depth": 1, "trees": 1, **capture})
    (root / "manifest.json").write_text(json.dumps(m))
    rehash(root)
    return root


def test_merge_single_part_is_the_trace(tmp_path):
    from traces.merge import merge_traces

    part = _as_part(make_synthetic_trace(tmp_path / "p"))
    out = tmp_path / "m"
    m = merge_traces([part], out)
    tr = load_trace(out)  # validates
    assert len(tr.problems) == 2 and len(tr.long_decodes) == 1 and len(tr.trees) == 1
    assert "shard" not in m["capture"] and m["merged_from"][0]["shard"] == "0/1"
    src = {p.relative_to(part).as_posix(): p.read_bytes() for p in part.rglob("*") if p.is_file()}
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(src)
    assert all(got[k] == src[k] for k in src if k != "manifest.json")
    assert m["files"] == json.loads((part / "manifest.json").read_text())["files"]  # checksums recomputed, equal


def test_merge_refuses_non_parts_and_bad_parts(tmp_path):
    from traces.merge import merge_traces

    plain = make_synthetic_trace(tmp_path / "plain")
    with pytest.raises(TraceError, match="plain: capture.shard: not a part"):
        merge_traces([plain], tmp_path / "m")
    part = _as_part(make_synthetic_trace(tmp_path / "p"), problems="2")
    with pytest.raises(TraceError, match=r"p/manifest.json: capture.problems: expected an integer, got '2'"):
        merge_traces([part], tmp_path / "m")
    part = _as_part(make_synthetic_trace(tmp_path / "q"), problems=3)  # holds 2 of 3 problems
    with pytest.raises(TraceError, match=r"q: shards.problems: positions \[0, 1\], part 0/1 of 3 must hold \[0, 1, 2\]"):
        merge_traces([part], tmp_path / "m")
    assert not (tmp_path / "m").exists()
