#!/usr/bin/env bash
# The device runtime's GPU tier and launch-cost table, in one command for the GPU machine.
# Run from the repository root (the project need not be installed there):
#   bash scripts/gpu/run_runtime_checks.sh
# Needs python3 with numpy, pytest and cuda-bindings (NVIDIA) or hip-python (AMD); nvrtc / hiprtc
# for the run-time compiled test kernels. Writes the launch-cost table to $OUT/launch_cost.md when
# $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
python3 -m pytest -m gpu tests/gpu/test_runtime_gpu.py -q -p no:cacheprovider -rA || status=1
python3 scripts/gpu/measure_launch.py | tee "${OUT:-/tmp}/launch_cost.md" || status=1
exit $status
