#!/usr/bin/env bash
# `rocmforge serve` under an existing load generator for OpenAI-compatible endpoints (issue 14, point 5):
# llm-benchmark-runner (PyPI; needs only httpx and rich) sends streaming chat requests at each level of
# concurrent clients and records TTFT, inter-token latency and throughput; then `rocmforge bench -b 32`
# on the same model gives the figure the 32-client aggregate is compared with (>= 80%).
#
#   bash scripts/gpu/serve_bench.sh MODEL OUTDIR [CONCURRENCIES]      (CONCURRENCIES default "1 8 32 64")
#
# Steps: install what is missing from the carried wheels ($WHEELS, no index); start the server on
# 127.0.0.1 with --parallel = the largest level, --ignore-eos (every request generates exactly
# $OUTPUT_TOKENS) and a context for prompt + output; wait for /health; fit a prompt of $PROMPT_TOKENS
# tokens (as the server counts them, chat template included); warm up at every level; run each level
# with max($MIN_REQUESTS, $ROUNDS x clients) requests; SIGTERM the server and keep its exit code (0 only
# when its shutdown check found every KV block back); then bench; then OUTDIR/summary.md.
# Knobs: DEVICE (auto), PROMPT_TOKENS (128), OUTPUT_TOKENS (128), MIN_REQUESTS (16), ROUNDS (2),
# BENCH_BATCH (32), BENCH_REPS (3), PORT (8090), DEADLINE (seconds after which no new level starts; 150),
# WHEELS (.carry/servebench/whl), SERVE_ARGS (more `rocmforge serve` options).
# Exit 0 when every request of every level succeeded and the server exited 0 after SIGTERM.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 MODEL OUTDIR [CONCURRENCIES]" >&2; exit 2; }
MODEL="$1"; OUT="$2"; LEVELS=(${3:-1 8 32 64})
[ -f "$MODEL" ] || { echo "no model file at $MODEL" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEVICE="${DEVICE:-auto}" PROMPT_TOKENS="${PROMPT_TOKENS:-128}" OUTPUT_TOKENS="${OUTPUT_TOKENS:-128}"
MIN_REQUESTS="${MIN_REQUESTS:-16}" ROUNDS="${ROUNDS:-2}" BENCH_BATCH="${BENCH_BATCH:-32}" BENCH_REPS="${BENCH_REPS:-3}"
PORT="${PORT:-8090}" DEADLINE="${DEADLINE:-150}" WHEELS="${WHEELS:-.carry/servebench/whl}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
note() { echo "$(date -u +%T) t=${SECONDS}s $*" | tee -a "$OUT/status.txt" >&2; }
URL="http://127.0.0.1:$PORT"
# curl may be missing on the GPU machine: status codes and bodies through Python's urllib.
http_ok() { "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1" > /dev/null 2>&1; }
http_get() { "$PY" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())" "$1"; }
NAME=bench
MAXC=1; for c in "${LEVELS[@]}"; do [ "$c" -gt "$MAXC" ] && MAXC=$c; done
# Prompt + output + the chat template's few tokens, in whole 16-token blocks.
CTX=$(( (PROMPT_TOKENS + OUTPUT_TOKENS + 32 + 15) / 16 * 16 ))

if ! "$PY" -c "import starlette, uvicorn, gguf, prometheus_client, typer, rich, regex, jinja2, httpx, llm_benchmark_runner" 2>/dev/null; then
  note "installing from $WHEELS (no index)"
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" starlette uvicorn gguf prometheus-client typer rich \
    regex jinja2 httpx llm-benchmark-runner > "$OUT/pip.log" 2>&1 || { note "pip install failed"; tail -20 "$OUT/pip.log" >&2; exit 1; }
fi
# Optional: uvicorn takes httptools (HTTP parsing and writes) and uvloop (the event loop) by itself when they are
# installed; measured on the cpu, the event loop's cost per streamed token fell from 28 to 19 us with them.
if ! "$PY" -c "import httptools, uvloop" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" httptools uvloop >> "$OUT/pip.log" 2>&1 \
    || note "httptools/uvloop not in $WHEELS: uvicorn runs on h11 and asyncio"
fi
"$PY" -m pip list 2>/dev/null | grep -iE "^(starlette|uvicorn|gguf|httpx|rich|llm-benchmark-runner|httptools|uvloop) " > "$OUT/packages.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "device $DEVICE"; } > "$OUT/device.txt"
COMMIT="${ROCMFORGE_COMMIT:-$(git log -1 --format=%h 2>/dev/null || echo unknown)}"

SERVE=("$PY" -m rocmforge_cli.app serve -m "$MODEL" --device "$DEVICE" --host 127.0.0.1 --port "$PORT"
       --parallel "$MAXC" --queue "$MAXC" --ctx-size "$CTX" --ignore-eos --model-name "$NAME" ${SERVE_ARGS:-})
note "start: ${SERVE[*]}"
"${SERVE[@]}" > "$OUT/server.log" 2>&1 &
SERVER=$!
stop_server() {
  kill -0 "$SERVER" 2>/dev/null || return 0
  kill -TERM "$SERVER"
  for _ in $(seq 600); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SERVER" 2>/dev/null && { note "server still up 60 s after SIGTERM: killed"; kill -KILL "$SERVER"; }
}
trap stop_server EXIT
for _ in $(seq 600); do
  http_ok "$URL/health" && break
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.5
done
if ! http_ok "$URL/health"; then note "the server did not become healthy"; tail -30 "$OUT/server.log" >&2; exit 1; fi
note "healthy"

PROMPT=$("$PY" scripts/gpu/serve_bench_report.py prompt "$URL" "$NAME" "$PROMPT_TOKENS" 2> "$OUT/prompt_tokens.txt") \
  || { note "fitting the prompt failed"; cat "$OUT/prompt_tokens.txt" >&2; exit 1; }
printf '%s\n' "$PROMPT" > "$OUT/prompt.txt"
note "prompt: $(cat "$OUT/prompt_tokens.txt") tokens"
"$PY" - "$OUT/meta.json" "$MODEL" "$(cat "$OUT/device.txt")" "$COMMIT" "${SERVE[*]}" "$(cat "$OUT/prompt_tokens.txt")" "$OUTPUT_TOKENS" <<'EOF'
import json, sys, datetime
out, model, device, commit, serve, prompt, max_tokens = sys.argv[1:]
json.dump({"model": model, "device": device, "commit": commit, "date": datetime.date.today().isoformat(),
           "serve_args": serve, "prompt_tokens": int(prompt), "max_tokens": int(max_tokens),
           "tool": "llm-benchmark-runner 0.2.0 (streaming /v1/chat/completions)"}, open(out, "w"), indent=1)
EOF

LB=("$PY" -m llm_benchmark_runner --url "$URL" --model "$NAME" --prompt "$PROMPT")
note "warm-up at ${LEVELS[*]} clients (4 tokens each; discarded)"
WARM_LEVELS=$(IFS=,; echo "${LEVELS[*]}")
"${LB[@]}" --max-tokens 4 --repeat "$MAXC" --concurrency "$WARM_LEVELS" --output "$OUT/warmup.json" > "$OUT/warmup.log" 2>&1
status=0
for c in "${LEVELS[@]}"; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then note "skip $c clients: past ${DEADLINE}s"; continue; fi
  n=$(( ROUNDS * c )); [ "$n" -lt "$MIN_REQUESTS" ] && n=$MIN_REQUESTS
  note "$c clients, $n requests"
  # The server's own count of generated tokens around the level: the tool counts streamed chunks, and a
  # token whose text is empty (an end-of-generation token under --ignore-eos, half a UTF-8 character) sends none.
  before=$(http_get "$URL/metrics" | grep '^rocmforge_generated_tokens_total ' | cut -d' ' -f2)
  "${LB[@]}" --max-tokens "$OUTPUT_TOKENS" --repeat "$n" --concurrency "$c" --output "$OUT/level_$c.json" \
    > "$OUT/level_$c.log" 2>&1 || { note "the load generator failed at $c clients"; status=1; }
  after=$(http_get "$URL/metrics" | grep '^rocmforge_generated_tokens_total ' | cut -d' ' -f2)
  echo "$before $after" > "$OUT/level_$c.server_tokens"
done
http_get "$URL/metrics" > "$OUT/metrics_after.txt"
stop_server
wait "$SERVER"; rc=$?
echo "$rc" > "$OUT/server_exit.txt"
grep -a "^shutdown:" "$OUT/server.log" | tail -1 > "$OUT/shutdown_line.txt"
note "server exit code $rc after SIGTERM"
[ "$rc" -eq 0 ] || status=1
trap - EXIT

note "rocmforge bench -b $BENCH_BATCH"
"$PY" -m rocmforge_cli.app bench -m "$MODEL" --device "$DEVICE" -p 0 -n 0 -b "$BENCH_BATCH" --batch-gen "$OUTPUT_TOKENS" \
  -r "$BENCH_REPS" -o json -q > "$OUT/bench_b32.json" 2> "$OUT/bench.log" || note "bench failed (see bench.log)"
"$PY" scripts/gpu/serve_bench_report.py summary "$OUT" > "$OUT/summary.md" || status=1
grep -q "errors at" "$OUT/summary.md" && status=1
cat "$OUT/summary.md"
note "done, status $status"
exit $status
