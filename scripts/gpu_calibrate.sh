#!/usr/bin/env bash
# GPU calibration kit (DESIGN §6, docs/calibration.md "GPU kit"): random-weight bf16 models in the
# shapes of model presets, built on the device, the op sweep and `rksim calibrate run` on each (the
# parity trace captured from the same random model), one hardware profile fitted on all of them, and
# the held-out report of each.
#
# Made for a lent GPU machine: its own python3 with PYTHONPATH=. (no venv), no registry, a working
# tree of at most 64 MiB. What that python3 lacks (simpy, plotly) travels as wheels in .whl/ and the
# tokenizer (SmolLM2's, 3.5 MB) in .gpukit/tokenizer/; both folders are git-ignored and prepared here:
#
#   PY=.venv/bin/python scripts/gpu_calibrate.sh prepare   # on this machine (pip download + the tokenizer)
#   scripts/gpu_calibrate.sh [OUT]              # on the GPU machine (carry .whl and .gpukit); OUT: runs/gpu-calibrate
#   scripts/gpu_calibrate.sh --smoke [OUT]      # the same steps on CPU, tiny random model (make test runs it)
#
# Environment: PY (python, default python3), MODELS (default "qwen2.5-7b llama-3-8b qwen3-4b"),
# NAME (profile name, default: from the GPU's name, e.g. h200), PROBLEMS, BRANCHES, TOKENS, REPEATS,
# RUN_TIMEOUT (seconds per model run). Results: OUT/<NAME>.yaml, OUT/report.txt, OUT/report.json,
# OUT/runs.tar.gz (phases, decisions, run.json, fit.json of every run), OUT/log.txt. When $OUT is set
# (the device tool's folder that comes back) the summary files are copied there as well.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
KIT=.gpukit

if [[ "${1:-}" == "prepare" ]]; then
  mkdir -p .whl "$KIT"
  # pure-Python wheels the device's python3 (3.12) lacks; versions pinned to this project's venv
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform any -d .whl simpy==4.1.2 plotly==7.1.0
  "$PY" - <<'PY'
import shutil
from pathlib import Path
from calibrate.random_model import tokenizer_folder
src = tokenizer_folder(None)
dst = Path(".gpukit/tokenizer")
dst.mkdir(parents=True, exist_ok=True)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
    if (src / f).is_file():
        shutil.copy2(src / f, dst / f)
print(f"tokenizer: {src} -> {dst}")
PY
  du -sh .whl "$KIT"
  echo "prepared; on the GPU machine: carry .whl and .gpukit, run scripts/gpu_calibrate.sh"
  exit 0
fi

SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then SMOKE=1; shift; fi
OUT_DIR=${1:-runs/gpu-calibrate}
rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/log.txt"
start=$(date +%s)

if [[ $SMOKE == 1 ]]; then
  DEVICE=cpu; DTYPE=float32; MODELS=${MODELS:-tiny}; NAME=${NAME:-smoke-cpu}
  PROBLEMS=${PROBLEMS:-4}; BRANCHES=${BRANCHES:-3}; TOKENS=${TOKENS:-8}; REPEATS=${REPEATS:-1}
  SW_PREFILL=16,64,256; SW_BATCH=1,4,8; SW_CTX=32,128; RUN_TIMEOUT=${RUN_TIMEOUT:-300}
  TOK_ARGS=()
  [[ -f "$KIT/tokenizer/tokenizer.json" ]] && TOK_ARGS=(--tokenizer "$KIT/tokenizer")
else
  if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rksim-site .whl/*.whl
    export PYTHONPATH=".:/tmp/rksim-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_calibrate: no CUDA device visible to torch; nothing to calibrate (use --smoke on CPU)" >&2
    exit 3
  fi
  DEVICE=cuda; DTYPE=bfloat16; MODELS=${MODELS:-"qwen2.5-7b llama-3-8b qwen3-4b"}
  GPU=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')
  NAME=${NAME:-$(echo "$GPU" | tr 'A-Z' 'a-z' | sed -E 's/nvidia //; s/[^a-z0-9]+/-/g; s/-+$//')}
  PROBLEMS=${PROBLEMS:-4}; BRANCHES=${BRANCHES:-4}; TOKENS=${TOKENS:-32}; REPEATS=${REPEATS:-2}
  SW_PREFILL=128,512,2048,8192; SW_BATCH=1,4,16,64; SW_CTX=512,4096; RUN_TIMEOUT=${RUN_TIMEOUT:-140}
  [[ -f "$KIT/tokenizer/tokenizer.json" ]] || { echo "gpu_calibrate: $KIT/tokenizer missing (run 'prepare' here and carry .gpukit)" >&2; exit 2; }
  TOK_ARGS=(--tokenizer "$KIT/tokenizer")
  echo "device: $GPU | $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')" | tee -a "$LOG"
fi
export PYTHONPATH="${PYTHONPATH:-.}"
[[ ":$PYTHONPATH:" == *":.:"* || "$PYTHONPATH" == "." || "$PYTHONPATH" == .:* ]] || export PYTHONPATH=".:$PYTHONPATH"

DIRS=()
for m in $MODELS; do
  d="$OUT_DIR/runs/$m"
  echo "== calibrate run random:$m on $DEVICE ($DTYPE)" | tee -a "$LOG"
  if ! timeout "$RUN_TIMEOUT" "$PY" -m app.cli calibrate run --model "random:$m" "${TOK_ARGS[@]}" --device "$DEVICE" \
      --dtype "$DTYPE" --problems "$PROBLEMS" --branches "$BRANCHES" --max-new-tokens "$TOKENS" --repeats "$REPEATS" \
      --sweep-prefill "$SW_PREFILL" --sweep-decode-batch "$SW_BATCH" --sweep-decode-ctx "$SW_CTX" \
      --out "$d" 2>>"$LOG.stderr" | tee -a "$LOG"; then
    # a model that runs past its share of the time budget is left out; the others still fit
    echo "gpu_calibrate: random:$m failed or ran past ${RUN_TIMEOUT} s; left out (see $LOG.stderr)" | tee -a "$LOG"
    tail -3 "$LOG.stderr" >&2 || true
    continue
  fi
  DIRS+=("$d")
done
if [[ ${#DIRS[@]} == 0 ]]; then
  echo "gpu_calibrate: no model finished its run; nothing to fit" | tee -a "$LOG" >&2
  [[ -n "${OUT:-}" && -d "${OUT:-}" ]] && cp "$LOG" "$LOG.stderr" "$OUT/" 2>/dev/null
  exit 4
fi

echo "== calibrate fit ($NAME) on ${#DIRS[@]} run(s)" | tee -a "$LOG"
"$PY" -m app.cli calibrate fit "${DIRS[@]}" --name "$NAME" --out "$OUT_DIR/$NAME.yaml" | tee -a "$LOG"

: > "$OUT_DIR/report.txt"
echo "[" > "$OUT_DIR/report.json"
sep=""
for d in "${DIRS[@]}"; do
  echo "== held-out report: $d" | tee -a "$OUT_DIR/report.txt"
  "$PY" -m app.cli calibrate report "$d" | tee -a "$OUT_DIR/report.txt"
  printf '%s' "$sep" >> "$OUT_DIR/report.json"
  "$PY" -m app.cli calibrate report "$d" --json >> "$OUT_DIR/report.json"
  sep=","
done
echo "]" >> "$OUT_DIR/report.json"
cat "$OUT_DIR/report.txt" >> "$LOG"

# the runs without their traces and HTML (small; the trace is re-captured by a rerun)
tar -czf "$OUT_DIR/runs.tar.gz" -C "$OUT_DIR" --exclude='trace' --exclude='*.html' runs
echo "wall: $(( $(date +%s) - start )) s" | tee -a "$LOG"
if [[ -n "${OUT:-}" && -d "${OUT:-}" && "$OUT" != "$OUT_DIR" ]]; then
  cp "$OUT_DIR/$NAME.yaml" "$OUT_DIR/report.txt" "$OUT_DIR/report.json" "$OUT_DIR/runs.tar.gz" "$LOG" "$OUT/"
fi
