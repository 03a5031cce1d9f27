"""Sharded capture (``--shard I/N``) and ``rksim trace merge``.

A tiny random-weight Llama (tests/tiny_hf.py) is captured once directly and
once in three parts; the merged parts must equal the direct capture file for
file (every recorded array and table; only the measured timings and the
manifest differ), validate, and replay to the same simulated figures. Bad
inputs give one line naming the part and field or the flag.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

from app.cli import main as cli_main  # noqa: E402
from traces.capture import CaptureConfig, run_capture  # noqa: E402
from traces.merge import first_difference, merge_traces, parse_shard  # noqa: E402
from traces.store import TraceError, load_trace  # noqa: E402

from tiny_hf import save_tiny  # noqa: E402
from trace_files import deterministic_files  # noqa: E402

N = 3


def tiny(model: str, **kw) -> CaptureConfig:
    base = dict(model=model, problems=5, branches=3, max_new_tokens=6, long_decode=5, long_decode_seqs=2,
                long_decode_layers=[1, 3], tree_depth=2, tree_step=3, tree_expand=1, tree_branching=2, trees=2,
                device="cpu", seed=5)
    return CaptureConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from traces.models import load_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("merge")
    folder = save_tiny(root / "hf")
    lm = load_model(str(folder), device="cpu")
    direct = root / "direct"
    run_capture(tiny(str(folder)), direct, command="direct", progress=False, lm=lm)
    parts = []
    for i in range(N):
        p = root / f"part{i}"
        run_capture(tiny(str(folder), shard=f"{i}/{N}"), p, command=f"part {i}", progress=False, lm=lm)
        parts.append(p)
    return {"root": root, "folder": folder, "lm": lm, "direct": direct, "parts": parts}


def test_parts_hold_every_nth_problem(run):
    counts = []
    for i, p in enumerate(run["parts"]):
        tr = load_trace(p)  # a part is a complete trace of its own
        assert tr.manifest["capture"]["shard"] == f"{i}/{N}"
        assert [q.index for q in tr.problems] == list(range(i, 5, N))
        assert [s.meta["seq_index"] for s in tr.long_decodes] == list(range(i, 2, N))
        assert [t.meta["problem_index"] for t in tr.trees] == list(range(i, 2, N))
        counts.append(len(tr.problems))
    assert counts == [2, 2, 1]
    # the unsharded capture's config.json carries no shard key (old traces resume unchanged)
    assert "shard" not in json.loads((run["direct"] / "config.json").read_text())


def test_merge_equals_direct_capture(run, tmp_path, capsys):
    out = tmp_path / "merged"
    parts = [str(p) for p in run["parts"]]
    assert cli_main(["trace", "merge", parts[2], parts[0], parts[1], "--out", str(out)]) == 0  # any order
    assert "5 problems, 2 long decodes, 2 trees from 3 parts" in capsys.readouterr().out
    got, want = deterministic_files(out), deterministic_files(run["direct"])
    assert sorted(got) == sorted(want)
    for rel in want:
        assert got[rel] == want[rel], rel
    assert cli_main(["trace", "validate", str(out)]) == 0
    m, d = load_trace(out).manifest, load_trace(run["direct"]).manifest
    assert m["n_problems"] == 5 and m["shards"] == d["shards"] and m["capture"] == d["capture"]
    assert m["has_tree"] and [x["shard"] for x in m["merged_from"]] == ["0/3", "1/3", "2/3"]
    # timings travel with their shards: part 1's first problem is the merged trace's second
    assert ((out / "problems/p00001/timings.parquet").read_bytes()
            == (run["parts"][1] / "problems/p00000/timings.parquet").read_bytes())
    # and replay: the simulator's figures are the direct capture's, exactly
    capsys.readouterr()
    figs = []
    for t in (run["direct"], out):
        assert cli_main(["compare", "--trace", str(t), "--hardware", "h100-sxm", "--json"]) == 0
        figs.append(json.loads(capsys.readouterr().out))
    strip = lambda x: {k: v for k, v in x.items() if k not in ("trace", "path")} if isinstance(x, dict) else x
    assert json.dumps(strip(figs[0]), sort_keys=True).replace(str(run["direct"]), "T") == \
        json.dumps(strip(figs[1]), sort_keys=True).replace(str(out), "T")


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_bad_inputs_one_line_nothing_written(run, tmp_path, capsys):
    p0, p1, p2 = (str(p) for p in run["parts"])
    out = tmp_path / "m"

    def merge(*parts) -> str:
        capsys.readouterr()
        assert cli_main(["trace", "merge", *parts, "--out", str(out)]) == 2
        assert not out.exists() and not list(tmp_path.glob(".m.merge-*"))
        return _err(capsys)

    assert "part 2/3 missing" in merge(p0, p1)
    dup = tmp_path / "dup0"
    shutil.copytree(p0, dup)
    assert "capture.shard: 0/3 overlaps" in merge(p0, str(dup), p1, p2)
    assert "given twice" in merge(p0, p0, p1, p2)
    # another seed: the first field that differs is named
    other = tmp_path / "seed6"
    run_capture(tiny(str(run["folder"]), seed=6, shard="2/3"), other, progress=False, lm=run["lm"])
    e = merge(p0, p1, str(other))
    assert f"{other}: capture.seed: 6 here, 5 in {p0}" in e
    # another model: of another shape, the model block names it; of the same shape with other
    # weights (and another folder), the reference arrays it computed differ
    from traces.models import load_model

    for family, seed, what in (("gemma3", 0, "model.architecture: 'Gemma3ForCausalLM' here, 'LlamaForCausalLM'"),
                               ("llama", 1, "reference_mean.npy: values: differ")):
        folder = save_tiny(tmp_path / f"{family}{seed}" / "hf", family=family, seed=seed)
        cfg = tiny(str(folder), shard="2/3")
        cfg.model = str(run["folder"])  # the same --model string: only the model itself differs
        p = tmp_path / f"{family}{seed}-part"
        run_capture(cfg, p, progress=False, lm=load_model(str(folder), device="cpu"))
        assert what in merge(p0, p1, str(p))
    # another N
    n2 = tmp_path / "n2"
    run_capture(tiny(str(run["folder"]), shard="1/2"), n2, progress=False, lm=run["lm"])
    assert "capture.shard: 1/2 here, 0/3" in merge(p0, str(n2), p2)
    # an unsharded trace, an incomplete part
    assert "capture.shard: not a part" in merge(str(run["direct"]), p1, p2)
    broken = tmp_path / "broken"
    shutil.copytree(p2, broken)
    (broken / "manifest.json").unlink()
    assert f"{broken}/manifest.json: file: missing" in merge(p0, p1, str(broken))
    # a corrupted part is caught before anything is written
    bad = tmp_path / "bad"
    shutil.copytree(p1, bad)
    f = bad / "problems/p00000/asks.parquet"
    f.write_bytes(f.read_bytes()[:-3] + b"xyz")
    assert f"{bad}/problems/p00000/asks.parquet: sha256" in merge(p0, str(bad), p2)
    # an --out that holds something is refused and kept
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    capsys.readouterr()
    assert cli_main(["trace", "merge", p0, p1, p2, "--out", str(out)]) == 2
    assert "--out: exists and is not an empty directory" in _err(capsys)
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("spec,what", [("3/2", "I must be in 0..1"), ("0/0", "N must be >= 1"),
                                       ("2/2", "I must be in 0..1"), ("a/b", "is not I/N"), ("-1/2", "is not I/N"),
                                       ("1", "is not I/N"), ("7/9", "takes no problem of --problems 5")])
def test_bad_shard_flag(run, tmp_path, capsys, spec, what):
    out = tmp_path / "x"
    assert cli_main(["capture", "--model", str(run["folder"]), "--problems", "5", f"--shard={spec}",
                     "--no-progress", "--out", str(out)]) == 2
    err = _err(capsys)
    assert err.startswith("rksim: error: --shard: ") and what in err
    assert not out.exists()


def test_part_resumes(run, tmp_path):
    """A part is resumable like any capture: an interrupted part re-run finishes with the same shards."""
    out = tmp_path / "p1"

    class Stop(Exception):
        pass

    def boom(rel):
        if rel == "problems/p00000":
            raise Stop

    cfg = tiny(str(run["folder"]), shard=f"1/{N}")
    with pytest.raises(Stop):
        run_capture(cfg, out, progress=False, after_shard=boom, lm=run["lm"])
    run_capture(cfg, out, progress=False, lm=run["lm"])
    assert deterministic_files(out) == deterministic_files(run["parts"][1])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50))
def test_parse_shard(i, n):
    if n >= 1 and i < n:
        assert parse_shard(f"{i}/{n}") == (i, n) == parse_shard(f" {i} / {n} ")
    else:
        with pytest.raises(ValueError, match="^--shard: "):
            parse_shard(f"{i}/{n}")


def test_first_difference():
    assert first_difference({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 3]}}) == "b.c.1"
    assert first_difference({"a": 1}, {"a": 1, "z": 0}) == "z"
    assert first_difference({"x": 1.0}, {"x": 1}) == "x"  # 1.0 and 1 are not the same config value
    assert first_difference({"k": [1]}, {"k": [1, 2]}) == "k"
    assert first_difference({"k": np.int64(1).item()}, {"k": 1}) is None
