#!/usr/bin/env bash
# The issue-12 baseline on the GPU machine, in one command: build llama.cpp's llama-bench and
# llama-batched-bench, write random-weight Llama-3 models of real shape (Q4_K_M), and run
#   rocmforge bench -p 512 -n 128 -b 8,32 --llama-bench ...
# on each, side by side. Usage (from the repository root):
#   bash scripts/gpu/run_llama3_baseline.sh LLAMA_CPP_TARBALL TOKENIZER_MODEL [SHAPE...]
# SHAPE defaults to "Llama-3.2-1B Llama-3.1-8B Llama-3.2-3B"; a shape starts only while less than
# $DEADLINE seconds (default 480) have passed since the start. Outputs go to $OUT (build.log,
# models.log, <shape>.md with the table, bench.log with every bench's stderr, status.txt with the GPU).
# A build and models left by an earlier call on the same machine are reused (the machine keeps /tmp for a
# little while between calls), so a first call can build and write while it measures something else.
# BATCHES (default 8,32) are the -b list.
set -uo pipefail
cd "$(dirname "$0")/../.."
TARBALL="$1"; TOKENIZER="$2"; shift 2
if [ $# -gt 0 ]; then SHAPES=("$@"); else SHAPES=(Llama-3.2-1B Llama-3.1-8B Llama-3.2-3B); fi
export OUT="${OUT:-/tmp/llama3_baseline}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEADLINE="${DEADLINE:-480}" REPS="${REPS:-5}" MODELS="${MODELS:-/tmp/models}"
mkdir -p "$OUT" "$MODELS"
note() { echo "$(date -u +%T) t=${SECONDS}s $*" | tee -a "$OUT/status.txt" >&2; }

BIN=/tmp/llama.cpp/llama.cpp/build/bin
if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ]; then
  note "llama.cpp already built in $BIN"; echo "rc=0 (reused)" > "$OUT/build.log"; BUILD=""
else
  note "build llama.cpp (background)"
  (TARGETS="llama-bench llama-batched-bench" bash scripts/gpu/build_llama_cpp.sh "$TARBALL" /tmp/llama.cpp 90 \
    > "$OUT/build.log" 2>&1; echo "rc=$?" >> "$OUT/build.log") &
  BUILD=$!
fi
for shape in "${SHAPES[@]}"; do
  if [ -s "$MODELS/$shape-Q4_K_M.gguf" ]; then note "$shape Q4_K_M already written"; continue; fi
  note "write $shape Q4_K_M"
  python3 scripts/synthetic_models.py --shape "$shape" --type Q4_K_M --tokenizer-model "$TOKENIZER" \
    -o "$MODELS/$shape-Q4_K_M.gguf" >> "$OUT/models.log" 2>&1 || note "writing $shape failed"
done
[ -n "$BUILD" ] && wait "$BUILD"
tail -1 "$OUT/build.log" | tee -a "$OUT/status.txt"
[ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ] || { note "llama.cpp did not build"; tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUT/status.txt" 2>&1
for shape in "${SHAPES[@]}"; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then note "skip $shape: past ${DEADLINE}s"; continue; fi
  note "bench $shape"
  python3 -m rocmforge_cli.app bench -m "$MODELS/$shape-Q4_K_M.gguf" -p 512 -n 128 -b "${BATCHES:-8,32}" -r "$REPS" \
    --llama-bench "$BIN/llama-bench" > "$OUT/$shape.md" 2>> "$OUT/bench.log"
  note "bench $shape rc=$?"
  cat "$OUT/$shape.md"
done
note "done"
