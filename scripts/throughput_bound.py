"""An upper bound on a maximum-load run's output throughput from datasheet peaks alone, for a 2-byte and a 1-byte
KV cache: which KV dtype a published figure can have run with.

Usage::

    .venv/bin/python scripts/throughput_bound.py [--json]

Every request has ``I`` prompt and ``O`` output tokens; its first token comes from its prefill and the other
``O - 1`` from decode steps that each read the whole context's KV. Per output token, at 100% of every peak::

    t_kv = sum_{c=I}^{I+O-2} c / O * kv_bytes_per_token / (mem_bw tp)
    t_pf = 2 (linear + head params) I / O / (peak_flops_fp8 tp)        (attention flops left out)
    t_w  = weight_bytes / B / (mem_bw tp),  B = (mem_capacity tp - weight_bytes) / kv_bytes_per_token / (I + O)

and the bound is ``1 / (t_kv + t_pf + t_w)``: no activations, no host time, no kernel below its peak, the largest
batch the memory could hold. The weights are FP8 (1 byte) but the LM head (2 bytes), as the ModelOpt checkpoints
ship them. A published figure above the 2-byte bound cannot have run with a 2-byte KV cache. The runs are the four
TensorRT-LLM v1.0 FP8 1000/1000 figures of ``docs/validation/published-figures.yaml`` (``IDS``), read from it:
model, hardware, tensor parallelism, lengths and the published value.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.cost.profiles import load_hardware, load_model  # noqa: E402

FIGURES = ROOT / "docs" / "validation" / "published-figures.yaml"
IDS = ("trtllm-h100-fp8-llama3.1-8b-throughput-1000-1000", "trtllm-h200-fp8-llama3.1-8b-throughput-1000-1000",
       "trtllm-h100-tp2-fp8-llama3.3-70b-throughput-1000-1000", "trtllm-h200-fp8-llama3.3-70b-throughput-1000-1000")


def bound(model: str, hardware: str, tp: int, kv_elem_bytes: int, I: int = 1000, O: int = 1000) -> dict:
    """The bound (tokens/s) and the batch it assumes, for one run and one KV element size."""
    m, h = load_model(model), load_hardware(hardware)
    bw, flops, cap = h.mem_bw * tp, h.peak_flops_fp8 * tp, h.mem_capacity * tp
    lin, head = float(m.layers_params), float(m.lm_head_params)
    weight_bytes = lin + 2.0 * head
    kv_tok = 2 * m.n_layers * m.n_kv_heads * m.head_dim * kv_elem_bytes
    ctx = sum(range(I, I + O - 1)) / O
    batch = (cap - weight_bytes) / kv_tok / (I + O)
    t = ctx * kv_tok / bw + 2.0 * (lin + head) * I / O / flops + weight_bytes / batch / bw
    return {"bound_tok_s": 1.0 / t, "batch": batch}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    figs = {f["id"]: f for f in yaml.safe_load(FIGURES.read_text())["figures"]}
    rows = []
    for fid in IDS:
        f = figs[fid]
        w, tp = f["workload"], int((f.get("parallelism") or {}).get("tp", 1))
        row = {"id": fid, "published_tok_s": f["value"]}
        for b in (2, 1):
            r = bound(f["model"], f["hardware"], tp, b, int(w["input_len"]), int(w["output_len"]))
            row[f"kv{b}"] = {"bound_tok_s": round(r["bound_tok_s"]), "batch": round(r["batch"]),
                             "published_share": round(f["value"] / r["bound_tok_s"], 3)}
        rows.append(row)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['id']}: published {r['published_tok_s']:,} tok/s; 2-byte KV bound {r['kv2']['bound_tok_s']:,} "
              f"({r['kv2']['published_share']:.0%} of it, batch <= {r['kv2']['batch']}); 1-byte KV bound "
              f"{r['kv1']['bound_tok_s']:,} ({r['kv1']['published_share']:.0%}, batch <= {r['kv1']['batch']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
