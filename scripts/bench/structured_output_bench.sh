#!/usr/bin/env bash
# Constrained decoding under load (issue 53, point 5): `rocmforge serve` with 2 x STREAMS slots, then
# scripts/bench/structured_load.py: STREAMS json_schema streams beside STREAMS unconstrained ones, against 2 x STREAMS
# unconstrained alone (throughput loss; first-token latency of a constrained request, its grammar's compile inside).
#
#   bash scripts/bench/structured_output_bench.sh MODEL OUTDIR
#
# MODEL: e.g. the Llama-3.1-8B shape at Q4_K_M from scripts/models/synthetic_models.py (random weights, Llama 3's
# tokenizer). Knobs: STREAMS (32), MAX_TOKENS (128), ROUNDS (2), CTX (8192), PORT (8097), PYTHON (python3),
# ROCMFORGE (rocmforge). Writes OUTDIR/serve.log, OUTDIR/structured_load.{json,md}, OUTDIR/metrics.txt.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 MODEL OUTDIR" >&2; exit 2; }
MODEL="$(realpath -m "$1")"; OUTDIR="$(realpath -m "$2")"
cd "$(dirname "$0")/../.."
S=${STREAMS:-32}; PORT=${PORT:-8097}; PY=${PYTHON:-python3}; RF=${ROCMFORGE:-rocmforge}
mkdir -p "$OUTDIR"
"$RF" serve -m "$MODEL" --port "$PORT" --parallel $((2 * S)) --ctx-size "${CTX:-8192}" > "$OUTDIR/serve.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 900); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  kill -0 $pid 2>/dev/null || { echo "the server did not start (see $OUTDIR/serve.log)" >&2; exit 1; }
  sleep 1
done
PYTHONPATH=. "$PY" scripts/bench/structured_load.py "http://127.0.0.1:$PORT" "$OUTDIR" --streams "$S" \
  --max-tokens "${MAX_TOKENS:-128}" --rounds "${ROUNDS:-2}"
status=$?
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUTDIR/metrics.txt" || true
exit $status
