"""Re-run the bundled trace's long decodes with today's recorder and compare the arrays bit for bit.

Whether ``examples/trace-gsm8k-persona`` must be re-captured after a change to how capture
records Q/K/V: each long decode is re-run exactly as ``rksim capture`` ran it (its manifest's
config, seeds and layers; ``traces.capture.capture_long``), and every recorded array is
compared with the stored one. About two minutes per sequence on one CPU thread.

Usage: ``PYTHONPATH=. .venv/bin/python scripts/reference_check_bundled_trace.py``; exits 1 if any differs.
"""
import json
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from traces import capture as C  # noqa: E402
from traces.datasets import load_dataset  # noqa: E402
from traces.models import load_model  # noqa: E402
from traces.workload import WorkloadConfig  # noqa: E402

def main() -> int:
    root = ROOT / "examples" / "trace-gsm8k-persona"
    all_same = True
    man = json.loads((root / "manifest.json").read_text())
    capd = man["capture"]
    names = {f.name for f in fields(C.CaptureConfig)}
    cfg = C.CaptureConfig(**{k: v for k, v in capd.items() if k in names})
    torch.set_num_threads(1)
    lm = load_model(cfg.model, cfg.device, cfg.dtype)
    tok = lm.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    yes, no = C.yes_no_ids(tok)
    ctx = C._Ctx(lm, cfg, pad_id, C._stop_ids(tok), yes, no, C.verify_suffix_ids(tok, cfg.verify_prompt), None, None,
                 WorkloadConfig(layout=cfg.layout, n_branches=cfg.branches, seed=cfg.seed,
                                target_prefix_tokens=cfg.target_prefix_tokens, verify_prompt=cfg.verify_prompt))
    probs = load_dataset(cfg.dataset, limit=cfg.problem_start + cfg.problems)[cfg.problem_start:]
    layers = man["long_decode_layers"]
    for j in range(cfg.long_decode_seqs):
        meta, tables, arrays = C.capture_long(ctx, probs[j], j, layers)
        d = root / "long" / f"s{j:05d}"
        old = json.loads((d / "shard.json").read_text())
        print(j, "token_ids equal:", old["token_ids"] == meta["token_ids"], flush=True)
        for name, a in arrays.items():
            b = np.load(d / name, allow_pickle=False)
            same = a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            all_same &= bool(same)
            print(f"  {name}: identical={same} max|diff|={diff.max():.3g} n_diff={(diff > 0).sum()} / {diff.size}", flush=True)
        all_same &= old["token_ids"] == meta["token_ids"]
    print("identical to the bit: no re-capture needed" if all_same else "DIFFERENT: re-capture with `make capture`")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
