#!/usr/bin/env bash
# Captures the traces `rksim reproduce` reads (examples/reproduce/), on the CPU, one thread each.
# Usage: scripts/reproduce_traces.sh [NAME ...]   (default: all; names below)
# Capture resumes by shard: re-running after an interruption skips finished problems. Each command
# is recorded verbatim in its trace's manifest.json. CPU cost here (1 thread): ~20 min per SmolLM2
# trace, ~40 min for the Gemma one; run names in parallel on more cores, or split one with --shard.
set -euo pipefail
RKSIM=${RKSIM:-.venv/bin/rksim}
OUT=${OUT:-examples/reproduce}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0
COMMON="--problems 24 --branches 8 --max-new-tokens 128 --sampling-seed 0 --device cpu --threads 1 --no-hidden-vectors"
declare -A ARGS=(
  [smollm2-gsm8k-persona]="--model smollm2-135m --dataset gsm8k --layout persona-prefix --long-decode 512 --long-decode-seqs 2 --long-decode-layers 8,16,24,30 --tree-depth 2 --tree-expand 2 --tree-branching 3 --tree-step 32 --trees 2"
  [smollm2-gsm8k-paraphrase]="--model smollm2-135m --dataset gsm8k --layout paraphrase"
  [smollm2-mmlu-persona]="--model smollm2-135m --dataset mmlu --layout persona-prefix"
  [smollm2-mmlu-paraphrase]="--model smollm2-135m --dataset mmlu --layout paraphrase"
  [gemma3-gsm8k-persona]="--model gemma3-270m --dataset gsm8k --layout persona-prefix --long-decode 512 --long-decode-seqs 1 --long-decode-layers 6,12,18"
)
ORDER=(smollm2-gsm8k-persona smollm2-gsm8k-paraphrase smollm2-mmlu-persona smollm2-mmlu-paraphrase gemma3-gsm8k-persona)
names=("$@"); [ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")
for n in "${names[@]}"; do
  [ -n "${ARGS[$n]+x}" ] || { echo "unknown trace name: $n (known: ${ORDER[*]})" >&2; exit 2; }
  echo "== $n"
  # shellcheck disable=SC2086
  $RKSIM capture ${ARGS[$n]} $COMMON --out "$OUT/$n"
done
