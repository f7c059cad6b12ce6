#!/usr/bin/env bash
# rocmforge beside llama.cpp on the mixtures of experts of issue 51, random weights of the real shapes
# (Qwen3-30B-A3B Q4_K_M, gpt-oss-20b MXFP4_MOE: scripts/models/synthetic_models.py), in one command on a GPU machine
# with no network:
#   bash scripts/bench/moe_vs_llamacpp.sh OUTDIR [LLAMA_CPP_TARBALL TOKENIZER_MODEL]
# (or LLAMA_CPP_TARBALL= and TOKENIZER_MODEL= in the environment). LLAMA_CPP_TARBALL: scripts/llama_cpp/fetch_source.sh's
# llama.cpp-src.tar.gz (made where PyPI is reachable); TOKENIZER_MODEL: Llama 3's tiktoken file. Needs numpy and
# gguf importable by python3, and rocmforge's kernels prebuilt for the GPU (kernels/prebuilt), else they compile
# at run time, slower and inside the measured time budget.
#
# What it does, in order:
#   1. builds llama.cpp's llama-bench and llama-batched-bench with CUDA (CUDA_ARCH, default 90) in the background
#      (scripts/bench/build_llama_cpp.sh; about 290 s on 16 cores, an H100 machine's, 2026-11), unless WORK
#      already holds them;
#   2. meanwhile writes both models to MODELS, each unless already there: Qwen3-30B-A3B 18.55 GB (17.3 GiB),
#      gpt-oss-20b 12.10 GB (11.3 GiB). Measured 2026-12-06 on a 2-core machine shared with a CI run, each
#      shape at full width with --layers 4: gpt-oss-20b 2.84 GiB in 41.5 s wall (3.9 s of user CPU), Qwen3-30B-A3B
#      1.81 GiB in 19.0 s (3.2 s user): about 1.5 s of CPU per GiB and 4 s for the tokenizer, the rest waiting on
#      that shared disk. Scaled: about 30 s of CPU for Qwen3-30B-A3B and 20 s for gpt-oss-20b, plus 29 GiB at the
#      disk's speed; on the GPU machine beside the build, about 1 to 2 minutes for both, inside the build's time;
#   3. runs, for each shape in turn, `rocmforge bench -p 512 -n 128 --n-depth 0,4096 -b 8,32 -r REPS --llama-bench`:
#      llama.cpp first (llama-bench -ngl 99 -fa on -d 0,4096, which also runs a pp512 after 4,096 tokens that
#      has no row of ours; then llama-batched-bench -npp 1 -ntg 128 -npl 8,32 -fa on), then rocmforge on the same
#      file: pp512, tg128, tg128 after 4,096 tokens, 8 and 32 sequences x 128. One invocation per shape loads the
#      model three times (llama-bench, llama-batched-bench, rocmforge); a part per test would load it more often
#      than it measures. REPS (default 3) measured runs of each test after a warm-up. Guessed at EST_S (default
#      120) seconds per shape on an H100 (loading 12-18 GB three times and about a minute of tests): a shape
#      starts only when that much of DEADLINE is left, and runs under `timeout` of what is left; bench prints
#      each row as soon as its test is measured, so a shape stopped at the deadline keeps its finished rows;
#   4. writes OUTDIR/table.md (scripts/bench/moe_table.py: shape x test: rocmforge, llama.cpp, ratio, target,
#      device, commit; a line per thing skipped or cut, and why), OUTDIR/<shape>.md (bench's own table),
#      status.txt (timeline, GPU), build.log, models.log, bench.log (bench's stderr), llama.cpp's SOURCE.txt.
# Expected: the build bounds the start (about 290 s; the models are written meanwhile), then about 2 x EST_S:
# about 8-9 minutes in all on a fresh H100 machine, so DEADLINE (default 540) may cut the second shape; running
# the same command again on the warm machine reuses the build, the models and every finished shape's table and
# measures what is missing (a few minutes). Seen on an H100 on 2026-12-06 with REPS=2: the build and both models
# 382 s (beside a GPU test run), then each shape about 40 s and each variant about 20 s (the guesses are generous).
# DEADLINE: seconds from the start (default 540) after which no shape starts and a running one is stopped.
# Everything is reused by a second run on the same machine: the build (WORK, default ${TMPDIR:-/tmp}/llama.cpp),
# the models (MODELS, default ${TMPDIR:-/tmp}/models) and each shape's finished table (RESULTS, default
# ${TMPDIR:-/tmp}/moe-bench; FRESH=1 measures again); the second run's table.md holds both runs' shapes.
# SHAPES (space-separated) chooses fewer, in that order.
# VARIANT: settings to measure beside the defaults in the same run, as NAME=VALUE words (e.g.
# VARIANT="ROCMFORGE_MMA_FIRST_MIN_COLS=2880"): after every shape's own bench (first every shape, then the
# variants, so the deadline cuts a variant before a shape), rocmforge alone again with those settings on the same
# file and tests, into RESULTS/<shape>@variant.md; the table shows its rows as "<shape> with VARIANT" against the
# same llama.cpp figures. Guessed at VARIANT_EST_S (default 80) seconds a shape.
# ROCMFORGE_COMMIT names the commit where the tree has no .git. Exit 0 when every shape was measured whole, 1 when
# something failed (a build, a model, a bench), 2 when something was left for the deadline.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/bench/moe_vs_llamacpp.sh OUTDIR [LLAMA_CPP_TARBALL TOKENIZER_MODEL]" >&2; exit 2; }
OUTDIR="$(realpath -m "$1")"
TARBALL="${2:-${LLAMA_CPP_TARBALL:-}}"; TOKENIZER="${3:-${TOKENIZER_MODEL:-}}"
[ -n "$TARBALL" ] && TARBALL="$(realpath -m "$TARBALL")"
[ -n "$TOKENIZER" ] && TOKENIZER="$(realpath -m "$TOKENIZER")"
cd "$(dirname "$0")/../.."
REPO="$PWD"
DEADLINE="${DEADLINE:-540}" REPS="${REPS:-3}" EST_S="${EST_S:-120}" CUDA_ARCH="${CUDA_ARCH:-90}"
MODELS="${MODELS:-${TMPDIR:-/tmp}/models}" WORK="${WORK:-${TMPDIR:-/tmp}/llama.cpp}"
RESULTS="${RESULTS:-${TMPDIR:-/tmp}/moe-bench}"
read -r -a SHAPE_LIST <<< "${SHAPES:-Qwen3-30B-A3B gpt-oss-20b}"
mkdir -p "$OUTDIR" "$MODELS" "$RESULTS"
: > "$RESULTS/skipped.txt"
# the kernels from kernels/, as the installed package has them (a rocmforge_kernels link on PYTHONPATH)
PK="${TMPDIR:-/tmp}/rocmforge_moe_pkg"
mkdir -p "$PK" && ln -sfn "$REPO/kernels" "$PK/rocmforge_kernels"
export PYTHONPATH="$REPO:$PK${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
note() { echo "$(date -u +%T) t=${SECONDS}s $*" | tee -a "$OUTDIR/status.txt" >&2; }
STATUS=0  # 1: something failed; 2: something was left for the deadline (the same command again finishes it)
skip() { echo "$*" >> "$RESULTS/skipped.txt"; note "skip: $*"; }
failed() { STATUS=1; skip "$@"; }
late() { [ "$STATUS" -eq 1 ] || STATUS=2; skip "$@"; }
file_type() { case "$1" in gpt-oss-*) echo MXFP4_MOE ;; *) echo Q4_K_M ;; esac; }
model_path() { echo "$MODELS/$1-$(file_type "$1").gguf"; }
TESTS=(-p 512 -n 128 --n-depth 0,4096 -b 8,32 --batch-gen 128)
finished() { grep -q '^quant: .*commit: ' "$1" 2> /dev/null; }  # bench's foot: printed after its last test
write_table() {
  local device commit
  device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)"
  commit="${ROCMFORGE_COMMIT:-$(git rev-parse --short=10 HEAD 2> /dev/null)}"
  python3 scripts/bench/moe_table.py "$RESULTS" "${device:-?}" "${commit:-?}" > "$OUTDIR/table.md"
  cp "$RESULTS"/*.md "$OUTDIR/" 2> /dev/null
  cat "$OUTDIR/table.md"
}

BIN="$WORK/llama.cpp/build/bin"
BUILD=""
if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ]; then
  note "llama.cpp already built in $BIN"; echo "rc=0 (reused)" > "$OUTDIR/build.log"
elif [ -z "$TARBALL" ] || [ ! -f "$TARBALL" ]; then
  note "no llama.cpp tarball (${TARBALL:-none given}) and no build in $BIN"
else
  note "build llama.cpp (background, sm_$CUDA_ARCH)"
  (TARGETS="llama-bench llama-batched-bench" bash scripts/bench/build_llama_cpp.sh "$TARBALL" "$WORK" "$CUDA_ARCH" \
    > "$OUTDIR/build.log" 2>&1; echo "rc=$?" >> "$OUTDIR/build.log") &
  BUILD=$!
fi
for shape in "${SHAPE_LIST[@]}"; do
  model="$(model_path "$shape")"
  if [ -s "$model" ]; then note "$shape already written ($model)"; continue; fi
  if [ -z "$TOKENIZER" ] || [ ! -f "$TOKENIZER" ]; then failed "$shape: not written (no tokenizer file: ${TOKENIZER:-none given})"; continue; fi
  note "write $shape $(file_type "$shape")"
  # written under another name first: a file cut short by a deadline is never taken for a whole one
  if python3 scripts/models/synthetic_models.py --shape "$shape" --type "$(file_type "$shape")" \
      --tokenizer-model "$TOKENIZER" -o "$model.part" >> "$OUTDIR/models.log" 2>&1; then
    mv "$model.part" "$model"; note "wrote $shape: $(tail -1 "$OUTDIR/models.log")"
  else
    rm -f "$model.part"; failed "$shape: writing failed (models.log)"
  fi
done
[ -n "$BUILD" ] && wait "$BUILD"
tail -1 "$OUTDIR/build.log" 2> /dev/null | tee -a "$OUTDIR/status.txt"
[ -f "$WORK/llama.cpp/SOURCE.txt" ] && cp "$WORK/llama.cpp/SOURCE.txt" "$OUTDIR/SOURCE.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUTDIR/status.txt" 2>&1
if [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-batched-bench" ]; then
  failed "every shape: not measured, llama.cpp did not build (build.log)"; tail -30 "$OUTDIR/build.log" 2> /dev/null
  write_table; exit 1
fi
# bench_one LABEL TABLE MODEL EST_S [NAME=VALUE ...] -- [BENCH_ARG ...]: rocmforge bench's tests on MODEL with those
# settings into TABLE, unless an earlier run finished it, the model is missing or less than EST_S of DEADLINE is left
bench_one() {
  local label="$1" table="$2" model="$3" est="$4" settings=()
  shift 4
  while [ "$1" != "--" ]; do settings+=("$1"); shift; done
  shift
  if finished "$table" && [ -z "${FRESH:-}" ]; then note "$label: measured by an earlier run ($table)"; return; fi
  [ -s "$model" ] || { failed "$label: not measured (no model file)"; return; }
  local left=$((DEADLINE - SECONDS)); [ "$left" -gt 0 ] || left=0  # past the deadline: none left, however far past
  if [ "$left" -lt "$est" ]; then late "$label: not started, ${left}s of DEADLINE left (a shape takes about ${est}s)"; return; fi
  note "bench $label (${TESTS[*]})"
  timeout "$left" env "${settings[@]}" python3 -m rocmforge_cli.app bench -m "$model" "${TESTS[@]}" -r "$REPS" "$@" \
    > "$table" 2>> "$OUTDIR/bench.log"
  local rc=$?
  note "bench $label rc=$rc"
  if [ "$rc" -eq 124 ]; then late "$label: stopped at DEADLINE (${DEADLINE}s)"
  elif [ "$rc" -ne 0 ]; then failed "$label: rocmforge bench exited with $rc ($(tail -1 "$OUTDIR/bench.log" | cut -c1-200))"
  fi
}
for shape in "${SHAPE_LIST[@]}"; do
  bench_one "$shape" "$RESULTS/$shape.md" "$(model_path "$shape")" "$EST_S" -- --llama-bench "$BIN/llama-bench"
done
if [ -n "${VARIANT:-}" ]; then
  read -r -a VARIANT_ENV <<< "$VARIANT"
  for setting in "${VARIANT_ENV[@]}"; do
    [[ "$setting" =~ ^[A-Z_][A-Z0-9_]*=.+$ ]] || { failed "VARIANT: '$setting' is not NAME=VALUE; no variant measured"; VARIANT_ENV=(); break; }
  done
  echo "$VARIANT" > "$RESULTS/variant.txt"
  if [ "${#VARIANT_ENV[@]}" -gt 0 ]; then
    for shape in "${SHAPE_LIST[@]}"; do
      bench_one "$shape with $VARIANT" "$RESULTS/$shape@variant.md" "$(model_path "$shape")" "${VARIANT_EST_S:-80}" \
        "${VARIANT_ENV[@]}" --
    done
  fi
fi
write_table
note "done (exit $STATUS)"
exit "$STATUS"
