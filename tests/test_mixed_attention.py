"""The mixed prefill + decode attention reading (calibrate.mixed_attention): its slowdown formula on synthetic rows,
the GQA groups it divides by, and the shipped table."""
from __future__ import annotations

import pandas as pd
import pytest

from calibrate import llmservingsim_perf as lp, mixed_attention as ma


def _synthetic(k: float, t_p: float = 20e-6, t_d: float = 100e-6) -> pd.DataFrame:
    """A chunk alone, decodes alone and both together, timed ``t_p``, ``t_d`` and ``t_p + k t_d``."""
    rows = [(512, 0, 0, 0, t_p), (0, 0, 8, 1024, t_d), (512, 0, 8, 1024, t_p + k * t_d),
            (256, 0, 8, 1024, 1.0)]   # its chunk never timed alone: dropped
    return pd.DataFrame(rows, columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "seconds"])


def test_slowdown_is_the_decodes_time_beside_the_chunk_over_alone(monkeypatch):
    monkeypatch.setattr(lp, "load", lambda *a, **k: _synthetic(2.5))
    m = ma.slowdowns("rtxpro6000", "llama-3.1-8b")
    assert len(m) == 1 and m["k"].iloc[0] == pytest.approx(2.5)
    s = ma.summarise("rtxpro6000", "llama-3.1-8b")
    assert s["gqa_group"] == 4 and s["rows_read"] == 1 and s["r_median"] == pytest.approx(0.5)


def test_rows_the_chunk_carries_are_not_read(monkeypatch):
    monkeypatch.setattr(lp, "load", lambda *a, **k: _synthetic(2.5, t_p=100e-6, t_d=50e-6))
    with pytest.raises(ValueError, match="rtxpro6000-llama-3.1-8b-attention.csv: no mixed batch the decodes carry"):
        ma.summarise("rtxpro6000", "llama-3.1-8b")


def test_gqa_groups_of_the_profiled_shapes():
    # Llama-3.1-8B 32 / 8 heads, Qwen3-32B 64 / 8, Qwen3-30B-A3B 32 / 4; TP 2 halves both
    assert ma.group_size("rtxpro6000", "llama-3.1-8b", 1) == ma.group_size("rtxpro6000", "llama-3.1-8b", 2) == 4
    assert ma.group_size("rtxpro6000", "qwen3-32b", 2) == ma.group_size("rtxpro6000", "qwen3-30b-a3b", 1) == 8


def test_shipped_table_is_what_the_profiles_give():
    assert ma.main(["--check"]) == 0
