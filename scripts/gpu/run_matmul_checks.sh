#!/usr/bin/env bash
# The matvec / matmul GPU tier and the matmul measurements, in one command for the GPU machine.
# Run from the repository root (the project need not be installed there):
#   bash scripts/gpu/run_matmul_checks.sh
# Needs python3 with numpy, pytest and cuda-bindings (NVIDIA) or hip-python (AMD); nvrtc / hiprtc when
# kernels/prebuilt holds no current code objects for the device. Writes matmul.md and matmul.json to
# $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
status=0
python3 -m pytest -m gpu tests/gpu/test_ops_gpu.py -q -p no:cacheprovider -rf \
  -k "matmul or matvec or project or compiles_at_run_time" || status=1
python3 scripts/gpu/measure_matmul.py --json-out "$out/matmul.json" | tee "$out/matmul.md" || status=1
exit $status
