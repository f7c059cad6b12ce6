#!/usr/bin/env bash
# rocmforge beside llama.cpp on random-weight Llama-3 models of real shape (Q4_K_M), in one command on a GPU
# machine: build llama.cpp's llama-bench and llama-batched-bench, write the models, and run
#   rocmforge bench -p 512 -n 128 -b 8,32 --llama-bench ...
# on each, side by side. Usage (from the repository root):
#   bash scripts/bench/run_llama3_baseline.sh OUTDIR LLAMA_CPP_TARBALL TOKENIZER_MODEL [SHAPE...]
# SHAPE defaults to "Llama-3.2-1B Llama-3.1-8B Llama-3.2-3B"; a shape starts only while less than
# $DEADLINE seconds (default 480) have passed since the start. Writes to OUTDIR: build.log, models.log,
# <shape>.md with the table, bench.log with every bench's stderr, status.txt with the GPU. The build
# (WORK, default ${TMPDIR:-/tmp}/llama.cpp) and the models (MODELS, default ${TMPDIR:-/tmp}/models) are
# reused when a run finds them, so that a second run measures at once.
# BATCHES (default 8,32) are the -b list.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: bash scripts/bench/run_llama3_baseline.sh OUTDIR LLAMA_CPP_TARBALL TOKENIZER_MODEL [SHAPE...]" >&2; exit 2; }
OUTDIR="$(realpath -m "$1")"; TARBALL="$(realpath -m "$2")"; TOKENIZER="$(realpath -m "$3")"; shift 3
cd "$(dirname "$0")/../.."
if [ $# -gt 0 ]; then SHAPES=("$@"); else SHAPES=(Llama-3.2-1B Llama-3.1-8B Llama-3.2-3B); fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEADLINE="${DEADLINE:-480}" REPS="${REPS:-5}" MODELS="${MODELS:-${TMPDIR:-/tmp}/models}"
WORK="${WORK:-${TMPDIR:-/tmp}/llama.cpp}"
mkdir -p "$OUTDIR" "$MODELS"
note() { echo "$(date -u +%T) t=${SECONDS}s $*" | tee -a "$OUTDIR/status.txt" >&2; }

BIN="$WORK/llama.cpp/build/bin"
if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ]; then
  note "llama.cpp already built in $BIN"; echo "rc=0 (reused)" > "$OUTDIR/build.log"; BUILD=""
else
  note "build llama.cpp (background)"
  (TARGETS="llama-bench llama-batched-bench" bash scripts/bench/build_llama_cpp.sh "$TARBALL" "$WORK" 90 \
    > "$OUTDIR/build.log" 2>&1; echo "rc=$?" >> "$OUTDIR/build.log") &
  BUILD=$!
fi
for shape in "${SHAPES[@]}"; do
  if [ -s "$MODELS/$shape-Q4_K_M.gguf" ]; then note "$shape Q4_K_M already written"; continue; fi
  note "write $shape Q4_K_M"
  python3 scripts/models/synthetic_models.py --shape "$shape" --type Q4_K_M --tokenizer-model "$TOKENIZER" \
    -o "$MODELS/$shape-Q4_K_M.gguf" >> "$OUTDIR/models.log" 2>&1 || note "writing $shape failed"
done
[ -n "$BUILD" ] && wait "$BUILD"
tail -1 "$OUTDIR/build.log" | tee -a "$OUTDIR/status.txt"
[ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ] || { note "llama.cpp did not build"; tail -30 "$OUTDIR/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUTDIR/status.txt" 2>&1
for shape in "${SHAPES[@]}"; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then note "skip $shape: past ${DEADLINE}s"; continue; fi
  note "bench $shape"
  python3 -m rocmforge_cli.app bench -m "$MODELS/$shape-Q4_K_M.gguf" -p 512 -n 128 -b "${BATCHES:-8,32}" -r "$REPS" \
    --llama-bench "$BIN/llama-bench" > "$OUTDIR/$shape.md" 2>> "$OUTDIR/bench.log"
  note "bench $shape rc=$?"
  cat "$OUTDIR/$shape.md"
done
note "done"
