#!/usr/bin/env bash
# "Nothing moves but code" (issue 31): the --json / result files of ten rksim commands on fixed inputs, so a
# refactor is checked by comparing two snapshots (wall clocks, dates and the 'wrote' lines are ignored).
#   scripts/json_snapshot.sh OUTDIR            # from the repository root, before and after a change
#   scripts/json_snapshot.sh --diff DIR1 DIR2  # prints IDENTICAL or the differences (exit 1)
set -u
PY=${PY:-.venv/bin/python}
if [ "${1:-}" = "--diff" ]; then
    # compared one key a line (vllm bench's result files are one line long): an ignored key (wall clock, date)
    # then drops its own line only, never a whole file's differences
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    for side in a b; do
        src=$([ $side = a ] && echo "$2" || echo "$3"); mkdir -p "$tmp/$side"
        for f in "$src"/*; do
            n=$(basename "$f")
            case "$n" in
                *.json) $PY -m json.tool "$f" > "$tmp/$side/$n" 2>/dev/null || cp "$f" "$tmp/$side/$n" ;;
                *) cp "$f" "$tmp/$side/$n" ;;
            esac
        done
    done
    (cd "$tmp" && diff -r -I '"wall_s"' -I '^wrote ' -I '"date"' -I '_time_s"' a b) && echo IDENTICAL
    exit
fi
out=${1:?usage: scripts/json_snapshot.sh OUTDIR | --diff DIR1 DIR2}
mkdir -p "$out"; rm -f "$out/FAILED"
fail() { echo "FAILED: $1" >> "$out/FAILED"; }
run() { n=$1; shift; $PY -m app.cli "$@" --json > "$out/$n.json" 2> "$out/$n.err" || fail "$n"; }
serve() { n=$1; shift; $PY -m app.cli bench serve "$@" --save-result --save-detailed --result-dir "$out" \
    --result-filename "$n.json" > "$out/$n.txt" 2> "$out/$n.err" || fail "$n"; }
thr() { n=$1; shift; $PY -m app.cli bench throughput "$@" --output-json "$out/$n.json" > "$out/$n.txt" 2> "$out/$n.err" || fail "$n"; }
serve bench-serve --model-preset llama-3-8b --hardware h100-sxm --num-prompts 100 --request-rate 10 --seed 1
serve bench-serve-tp2 --model-preset llama-3-70b --hardware h100-sxm --tensor-parallel-size 2 --num-prompts 60 --request-rate 4
serve bench-serve-moe --model-preset qwen3-30b-a3b --hardware h100-sxm --num-prompts 60 --request-rate 4
thr bench-thr --model-preset llama-3-8b --hardware h100-sxm --num-prompts 200 --input-len 128 --output-len 512
thr bench-thr-ss --model-preset llama-3-8b --hardware h100-sxm --num-prompts 100 --input-len 128 --output-len 512 --step-by-step
run simulate simulate --policy rksc --hardware h100-sxm --model-preset qwen2.5-7b
run serve serve --policy vase-dkv --num-problems 6 --hardware h100-sxm --model-preset qwen2.5-7b
run tree tree --hardware h100-sxm --model-preset qwen2.5-7b
run plan plan --model-preset qwen2.5-7b --hardware h100-sxm --gpus 2 --num-problems 6 --max-num-seqs 64
run compare compare --hardware h200 --model-preset qwen3-4b
# the checkout's path is in some outputs: written as <repo> so two checkouts compare
root=$(pwd); sed -i "s#$root#<repo>#g" "$out"/*.json
echo "snapshot in $out: $(ls "$out"/*.json | wc -l) files; failures: $(cat "$out/FAILED" 2>/dev/null || echo none)"
[ ! -s "$out/FAILED" ]
