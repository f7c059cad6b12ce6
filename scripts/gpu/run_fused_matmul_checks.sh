#!/usr/bin/env bash
# fused_matmul on the GPU machine in one command: its GPU tests, the model's large-batch replay test, the
# per-product timings against fused_matvec (and each tile shape forced), `rocmforge bench` on a
# random-weights model of the demo model's shapes (scripts/gpu/random_demo_model.py; the tokenizer keys
# travel in .carry/), and where a 512-token prompt step's time goes.
# Run from the repository root:  bash scripts/gpu/run_fused_matmul_checks.sh [bench options...]
# Writes fused_tests.txt, fused_matmul.md/.json, bench.md, bench_progress.txt, prompt_profile.md to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
model=/tmp/random135m.gguf
status=0
[ -f "$model" ] || python3 scripts/gpu/random_demo_model.py --tokenizer .carry/smollm2_tokenizer.json --out "$model" || exit 1
export ROCMFORGE_DEMO_MODEL="$model"
python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/gpu/test_fused_ops_gpu.py tests/gpu/test_model_gpu.py \
  -k "matmul or large_batches or graph_replay or golden or device_sampling" 2>&1 | tail -25 | tee "$out/fused_tests.txt" || status=1
python3 scripts/gpu/measure_fused_matmul.py --tiles --json-out "$out/fused_matmul.json" 2>/dev/null \
  | tee "$out/fused_matmul.md" || status=1
python3 -c 'from rocmforge_cli.app import app; app()' bench -m "$model" "$@" 2>"$out/bench_progress.txt" \
  | tee "$out/bench.md" || status=1
python3 scripts/gpu/profile_prompt_step.py --model "$model" --tokens 512 | tee "$out/prompt_profile.md" || status=1
exit $status
