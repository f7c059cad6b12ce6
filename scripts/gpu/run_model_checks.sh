#!/usr/bin/env bash
# Everything GPU-side for the model (issue 6) in one command, for the GPU machine:
#   bash scripts/gpu/run_model_checks.sh [MODEL.gguf]
# MODEL defaults to $ROCMFORGE_DEMO_MODEL, else /root/model/SmolLM2-135M-Instruct.Q4_1.gguf.
# Run from anywhere; the project need not be installed (the repository goes on PYTHONPATH). Needs
# python3 with numpy, pytest, typer, rich, regex, jinja2 and cuda-bindings (NVIDIA) or hip-python (AMD).
#
# 1. GPU tier of the model: fused kernels and device sampling against their references, the whole
#    model against the cpu backend on the golden prompts, graph replay == eager, device == host
#    sampling, weights bytes == file bytes, every byte back after a generate run.
# 2. `rocmforge generate` on the GPU: the memory plan printed before allocation, and exit 5 with the
#    plan when it does not fit.
# 3. `rocmforge bench`: pp512, tg128, batched decode at 8/32/64/128 sequences (5 runs each), the
#    decode-step profile at batch 1 and 64, and tg128 without graphs (what replay saves).
# Logs and JSON go to $OUT (default /tmp/rocmforge_model_checks); a summary table is printed last.
# PP, TG, BATCHES, BATCH_GEN, REPS override the bench sizes (e.g. for a dry run on the CPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
MODEL="${1:-${ROCMFORGE_DEMO_MODEL:-/root/model/SmolLM2-135M-Instruct.Q4_1.gguf}}"
export ROCMFORGE_DEMO_MODEL="$MODEL"
export OUT="${OUT:-/tmp/rocmforge_model_checks}"
mkdir -p "$OUT"
RF=(python3 -m rocmforge_cli.app)
: > "$OUT/status.txt"

step() {  # step NAME CMD... : run; stdout to $OUT/NAME.out, stderr to $OUT/NAME.log; record the exit status
  local name="$1"; shift
  local t0=$SECONDS
  echo "== $name: $*" >&2
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.log"
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/status.txt" >&2
  return 0
}

[ -f "$MODEL" ] || { echo "model not found: $MODEL (pass its path as the first argument)" >&2; exit 2; }
step devices "${RF[@]}" devices

# 1. GPU tier
step tests_fused python3 -m pytest -m gpu tests/gpu/test_fused_ops_gpu.py -q -p no:cacheprovider -rfE
step tests_model python3 -m pytest -m gpu tests/gpu/test_model_gpu.py -q -p no:cacheprovider -rA -s

# 2. generate: the plan on stderr; a KV cache that cannot fit -> exit 5 with the plan
step generate "${RF[@]}" generate -m "$MODEL" --device auto --temp 0 -n 32 "The capital of France is"
step generate_oom "${RF[@]}" generate -m "$MODEL" --device auto --temp 0 -n 4 --kv-memory 4096GiB "Hello"

# 3. bench (JSON; the markdown table is rendered from it by the summary)
PP="${PP:-512}" TG="${TG:-128}" BATCHES="${BATCHES:-8,32,64,128}" BATCH_GEN="${BATCH_GEN:-128}" REPS="${REPS:-5}"
step bench "${RF[@]}" bench -m "$MODEL" -p "$PP" -n "$TG" -b "$BATCHES" --batch-gen "$BATCH_GEN" -r "$REPS" -o json
step bench_profile_b1 "${RF[@]}" bench -m "$MODEL" -p 0 -n 0 -b 0 -r 1 --profile --profile-batch 1 -o json
step bench_profile_b64 "${RF[@]}" bench -m "$MODEL" -p 0 -n 0 -b 0 -r 1 --profile --profile-batch 64 -o json
step bench_no_graphs "${RF[@]}" bench -m "$MODEL" -p 0 -n "$TG" -b 0 -r 2 --no-graphs -o json

python3 scripts/gpu/summarize_model_checks.py "$OUT" | tee "$OUT/summary.md"
