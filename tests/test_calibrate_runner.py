"""calibrate.runner paths the real-model tests do not take: random weights, verification on the decode KV, refusals.

The model is ``random:tiny`` (calibrate.random_model.TINY: 16 layers of width 64, SmolLM2's tokenizer),
fast enough on a CPU for a few whole ``run_calibration`` calls.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from calibrate.runner import RealRunConfig, run_calibration  # noqa: E402

TINY = dict(model="random:tiny", problems=1, branches=3, max_new_tokens=4, repeats=1, sweep=False, capture=False)


def _run(tmp_path, name, **kw):
    out = tmp_path / name
    run = run_calibration(RealRunConfig(**{**TINY, **kw}), out, progress=False)
    return run, pd.read_parquet(out / "decisions.parquet"), pd.read_parquet(out / "phases.parquet")


def test_out_that_holds_something_else_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no calibration run"):
        run_calibration(RealRunConfig(**TINY), tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_verification_on_the_decode_kv_scores_what_the_recompute_scores(tmp_path):
    """verify_reuses_kv: the sharing policy's verification reads each branch's KV after decoding (cached
    tokens in its phase rows), No-KV's still recomputes; both score the same sequences as a recompute."""
    pols = ("no-kv", "exact-prefix")
    run, dec, _ = _run(tmp_path, "recompute", policies=pols)
    assert run["model"]["source"].startswith("random:tiny")
    _, dec_r, ph_r = _run(tmp_path, "reuse", policies=pols, verify_reuses_kv=True)
    ver = ph_r[ph_r["phase"].str.startswith("verify")]
    assert (ver[ver["policy"] == "exact-prefix"]["c"].map(min) > 0).all()
    assert (ver[ver["policy"] == "no-kv"]["c"].map(max) == 0).all()
    for a, b in zip(dec.to_dict("records"), dec_r.to_dict("records")):
        assert a["policy"] == b["policy"] and list(a["gen_ids"][0]) == list(b["gen_ids"][0])
        np.testing.assert_allclose(a["scores"], b["scores"], rtol=1e-5, atol=1e-6)


def test_asks_centered_similarity_is_refused(tmp_path):
    with pytest.raises(ValueError, match="similarity='centered'"):
        run_calibration(RealRunConfig(**TINY, policies=("asks",), params={"asks": {"similarity": "centered"}}),
                        tmp_path / "out", progress=False)
