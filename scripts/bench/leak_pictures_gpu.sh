#!/usr/bin/env bash
# The pictures of leak-check on a GPU (issue 54): a clean run and two planted leaks, each with --report (HTML),
# --plot (PNG) and --trace (Perfetto JSON), on the Llama-3.1-8B shape (random weights, Q4_K_M) when its file
# can be made, else on LEAK_MODEL or the demo model.
#
#   bash scripts/bench/leak_pictures_gpu.sh OUTDIR
#
# Knobs: LEAK_MODEL=path.gguf (skips making the 8B file), LEAK_REQUESTS (2000 for the clean run),
# PLANTED_REQUESTS (400). Writes OUTDIR/{clean,kv_leak,device_leak}.{html,png,json,txt,stderr}, model.txt,
# device.txt, commit.txt and summary.md (the first lines each run prints: what a user sees first).
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: bash scripts/bench/leak_pictures_gpu.sh OUTDIR" >&2; exit 2; }
OUTDIR="$(realpath -m "$1")"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=100
mkdir -p "$OUTDIR"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null \
    || rocm-smi --showproductname 2>/dev/null || echo "no GPU tool found"; } > "$OUTDIR/device.txt"
if [ -n "${ROCMFORGE_COMMIT:-}" ]; then echo "$ROCMFORGE_COMMIT" > "$OUTDIR/commit.txt"
else git log -1 --format='%H %cd' > "$OUTDIR/commit.txt" 2>/dev/null || true; fi

MODEL_ARGS=()
if [ -n "${LEAK_MODEL:-}" ]; then
  MODEL_ARGS=(--model "$LEAK_MODEL")
elif python3 scripts/models/synthetic_models.py --shape Llama-3.1-8B --type Q4_K_M -o "$OUTDIR/llama-3.1-8b-random.gguf" \
       > "$OUTDIR/model_make.log" 2>&1; then
  MODEL_ARGS=(--model "$OUTDIR/llama-3.1-8b-random.gguf")
fi
echo "${MODEL_ARGS[*]:-the demo model}" > "$OUTDIR/model.txt"

run() {  # $1: name; the rest: leak-check options
  local name=$1; shift
  local start=$SECONDS
  python3 -m rocmforge_cli.app leak-check "${MODEL_ARGS[@]}" --device auto --report "$OUTDIR/$name.html" \
      --plot "$OUTDIR/$name.png" --trace "$OUTDIR/$name.json" "$@" > "$OUTDIR/$name.txt" 2> "$OUTDIR/$name.stderr"
  local rc=$?
  { echo "## $name: exit $rc after $((SECONDS - start)) s (leak-check $*)"; echo '```'; head -12 "$OUTDIR/$name.txt"; echo '```'; } \
      >> "$OUTDIR/summary.md"
}
: > "$OUTDIR/summary.md"
run clean --requests "${LEAK_REQUESTS:-2000}"
ROCMFORGE_TESTING=1 run kv_leak --requests "${PLANTED_REQUESTS:-400}" --kv-blocks 2000 --plant-bug release-on-cancel-only
ROCMFORGE_TESTING=1 run device_leak --requests "${PLANTED_REQUESTS:-400}" --plant-bug device-leak
ls -la "$OUTDIR" >> "$OUTDIR/summary.md"
cat "$OUTDIR/summary.md"
