#!/usr/bin/env bash
# The GPU tier (`pytest -m gpu`) one test file at a time, on a machine with a GPU:
#   bash scripts/bench/run_gpu_tier.sh OUTDIR [TEST_FILE ...]      (default: every tests/gpu/test_*.py)
# Why file by file: a run stopped by an outer time limit loses pytest's report, so a failure's message never
# comes back (2026-12-02: four failures with no message). Here each file's report is written as soon as the
# file ends: OUTDIR/tier/<file>.log (the failures' short tracebacks), and a line per file in
# OUTDIR/tier/summary.txt and on stdout; no new file starts after DEADLINE seconds (default 480), and the files
# not run are listed: run the rest by naming them. ROCMFORGE_DEMO_MODEL (the leak-check and soak tests' model)
# defaults to the demo shapes' random twin, written to ${TMPDIR:-/tmp} when the real demo model is not there
# (scripts/models/random_demo_model.py, which needs TOKENIZER_JSON: the demo model's tokenizer keys, written by
# its --dump-tokenizer where the demo model is installed). The kernels come from kernels/ through a
# rocmforge_kernels link on PYTHONPATH, as the installed package has them.
# Exit 0 when every file that ran passed (skips allowed), 1 otherwise, 2 when a file was left for the deadline.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/bench/run_gpu_tier.sh OUTDIR [TEST_FILE ...]" >&2; exit 2; }
OUTDIR="$(realpath -m "$1")"; shift
cd "$(dirname "$0")/../.."
REPO="$PWD"
DEADLINE="${DEADLINE:-480}"
WORK="${TMPDIR:-/tmp}"
TIER="$OUTDIR/tier"
mkdir -p "$TIER"
# the tests' figures (JSON), written where ROCMFORGE_FIGURES points
export ROCMFORGE_FIGURES="${ROCMFORGE_FIGURES:-$OUTDIR/figures}"
mkdir -p "$ROCMFORGE_FIGURES"
: > "$TIER/summary.txt"

PK="$WORK/rocmforge_tier_pkg"
mkdir -p "$PK" && ln -sfn "$REPO/kernels" "$PK/rocmforge_kernels"
export PYTHONPATH="$REPO:$REPO/tests:$PK${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ -z "${ROCMFORGE_DEMO_MODEL:-}" ]; then
  demo="$WORK/rocmforge_tier_demo.gguf"
  if [ ! -f "$demo" ]; then
    [ -n "${TOKENIZER_JSON:-}" ] || { echo "set ROCMFORGE_DEMO_MODEL, or TOKENIZER_JSON for its random twin" >&2; exit 2; }
    python3 scripts/models/random_demo_model.py --tokenizer "$TOKENIZER_JSON" \
      --out "$demo" > "$TIER/demo_model.log" 2>&1 || { echo "could not write the demo twin: $TIER/demo_model.log" >&2; exit 1; }
  fi
  export ROCMFORGE_DEMO_MODEL="$demo"
fi

if [ $# -gt 0 ]; then FILES=("$@"); else FILES=(tests/gpu/test_*.py); fi
status=0 left=()
for file in "${FILES[@]}"; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then left+=("$file"); continue; fi
  name=$(basename "$file" .py)
  t0=$SECONDS
  python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rfEs "$file" > "$TIER/$name.log" 2>&1
  rc=$?
  counts=$(tail -1 "$TIER/$name.log")
  line="$name rc=$rc $((SECONDS - t0)) s: $counts"
  echo "$line" | tee -a "$TIER/summary.txt"
  if [ "$rc" -ne 0 ]; then
    status=1
    grep -E "^(FAILED|ERROR) " "$TIER/$name.log" | head -20
    grep -E "^E  " "$TIER/$name.log" | head -20
  fi
done
if [ ${#left[@]} -gt 0 ]; then
  echo "not run (DEADLINE ${DEADLINE} s): ${left[*]}" | tee -a "$TIER/summary.txt"
  [ "$status" -eq 0 ] && status=2
fi
exit "$status"
