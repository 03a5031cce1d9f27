"""Attention in a batch that mixes a prefill chunk with decodes, against the same items alone (LLMServingSim's vLLM
0.19 profiles, :mod:`calibrate.llmservingsim_perf`): how much slower the decodes run beside a chunk, by GQA group.

Each ``attention.csv`` times vLLM's attention module over batches of one prefill chunk (``prefill_chunk`` new
tokens over ``kv_prefill`` cached) and ``n_decode`` decodes over ``kv_decode`` cached tokens each, and also each
part alone (the rows with ``n_decode = 0`` or ``prefill_chunk = 0``). For a mixed row, with ``t_mix`` its time,
``t_p`` the chunk's alone and ``t_d`` the decodes' alone, the decodes' slowdown beside the chunk is::

    k = (t_mix - t_p) / t_d

read where the decodes carry the batch (``t_d >= 3 t_p``, at least 4 decodes over at least 256 tokens each: the
sizes of a serving step, where ``k`` is not set by fixed launch costs). With ``G = H / Hkv`` query heads per KV head
of the profiled shape (each rank's at TP 2, :func:`sim.cost.parallel.kv_heads_per_rank`), the table gives the median
``k`` and the median of ``r = (k - 1) / (G - 1)``: if a mixed batch reads each decode's KV once per query head
instead of once per KV head (its ``G - 1`` extra reads reaching DRAM at the fraction ``r``), ``r`` is one number
across shapes.

A reading, not a fit: nothing here sets a preset coefficient (docs/calibration.md, "RTX PRO 6000 and RTX 4090:
vLLM's own kernels"). ``--write`` writes ``calibrate/data/llmservingsim-mixed-attention.json``; ``--check`` exits 1
where it differs from what the shipped profiles give.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import llmservingsim_perf
from .shipped import write_or_check

OUT = Path(__file__).resolve().parent / "data" / "llmservingsim-mixed-attention.json"
PROFILES = (("rtxpro6000", "llama-3.1-8b", 1), ("rtxpro6000", "llama-3.1-8b", 2), ("rtxpro6000", "qwen3-32b", 1),
            ("rtxpro6000", "qwen3-32b", 2), ("rtxpro6000", "qwen3-30b-a3b", 1), ("rtx4090", "llama-3.1-8b", 1))
MIN_DECODES, MIN_KV, DECODE_SHARE = 4, 256, 3.0


def group_size(device: str, model: str, tp: int) -> int:
    """Query heads per KV head of the profiled layer: the preset's shape, split as vLLM splits it at ``tp``."""
    from sim.cost.parallel import kv_heads_per_rank
    from sim.cost.profiles import load_model
    m = load_model(llmservingsim_perf.BUNDLES[(device, model)][1])
    return (m.n_heads // tp) // kv_heads_per_rank(m.n_kv_heads, tp)


def slowdowns(device: str, model: str, tp: int = 1) -> pd.DataFrame:
    """The mixed rows of one profile with ``t_p``, ``t_d`` (seconds of the parts alone) and ``k`` (module
    docstring); rows whose parts were not timed alone are dropped."""
    a = llmservingsim_perf.load(device, model, "attention", tp)
    pre = a[(a.prefill_chunk > 0) & (a.n_decode == 0)].set_index(["prefill_chunk", "kv_prefill"])["seconds"]
    dec = a[(a.prefill_chunk == 0) & (a.n_decode > 0)].set_index(["n_decode", "kv_decode"])["seconds"]
    m = a[(a.prefill_chunk > 0) & (a.n_decode > 0)]
    m = m.join(pre.rename("t_p"), on=["prefill_chunk", "kv_prefill"])
    m = m.join(dec.rename("t_d"), on=["n_decode", "kv_decode"])
    m = m.dropna(subset=["t_p", "t_d"])
    return m.assign(k=(m["seconds"] - m["t_p"]) / m["t_d"])


def summarise(device: str, model: str, tp: int = 1) -> dict:
    """One profile's row of the table: ``G``, the rows read, the median and quartiles of ``k``, the median ``r``."""
    m = slowdowns(device, model, tp)
    sel = m[(m.t_d >= DECODE_SHARE * m.t_p) & (m.n_decode >= MIN_DECODES) & (m.kv_decode >= MIN_KV)]
    if sel.empty:
        raise ValueError(f"{llmservingsim_perf.path(device, model, 'attention', tp)}: no mixed batch the decodes "
                         "carry")
    g = group_size(device, model, tp)
    k = sel["k"].to_numpy()
    return {"profile": f"{device}-{model}" + ("" if tp == 1 else f"-tp{tp}"), "gqa_group": g, "mixed_rows": len(m),
            "rows_read": int(len(k)), "k_median": round(float(np.median(k)), 3),
            "k_p25": round(float(np.quantile(k, 0.25)), 3), "k_p75": round(float(np.quantile(k, 0.75)), 3),
            "r_median": round(float(np.median((k - 1.0) / (g - 1.0))), 3) if g > 1 else None}


def render() -> str:
    rows = [summarise(*p) for p in PROFILES]
    doc = {"what": "decodes' slowdown beside a prefill chunk in vLLM 0.19's attention (calibrate.mixed_attention)",
           "source": f"{llmservingsim_perf.REPO} @ {llmservingsim_perf.SNAPSHOT} (calibrate/data/llmservingsim-perf)",
           "read": {"min_decodes": MIN_DECODES, "min_kv_decode": MIN_KV, "decodes_alone_vs_chunk_alone": DECODE_SHARE},
           "rows": rows}
    return json.dumps(doc, indent=1) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.mixed_attention", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write the table to {OUT.name}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if {OUT.name} differs from what the profiles give")
    a = ap.parse_args(argv)
    text = render()
    print("| profile | G = H / Hkv | mixed rows | rows read | k median (p25-p75) | r median |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in json.loads(text)["rows"]:
        print(f"| {r['profile']} | {r['gqa_group']} | {r['mixed_rows']} | {r['rows_read']} | "
              f"{r['k_median']:.2f} ({r['k_p25']:.2f}-{r['k_p75']:.2f}) | {r['r_median']} |")
    return write_or_check({OUT: text}, write=a.write, check=a.check, how="python -m calibrate.mixed_attention --write")


if __name__ == "__main__":
    sys.exit(main())
