#!/usr/bin/env bash
# `rocmforge serve` under an existing load generator for OpenAI-compatible endpoints (issue 14, point 5):
# llm-benchmark-runner (PyPI; needs only httpx and rich) sends streaming chat requests at each level of
# concurrent clients and records TTFT, inter-token latency and throughput; then `rocmforge bench -b 32`
# on the same model gives the figure the 32-client aggregate is compared with (>= 80%).
# scripts/bench/llama_server_bench.sh runs the same load against llama.cpp's llama-server; then
# `python3 scripts/bench/serve_bench_report.py compare ROCMFORGE_OUTDIR LLAMA_SERVER_OUTDIR` sets them side by side.
#
#   bash scripts/bench/serve_bench.sh MODEL OUTDIR [CONCURRENCIES]      (CONCURRENCIES default "1 8 32 64")
#
# Steps (the shared ones in scripts/bench/serve_bench_lib.sh): install what is missing (from the
# wheels in $WHEELS with no index, when set); start the server on 127.0.0.1 with --parallel = the largest level,
# --ignore-eos (every request generates exactly $OUTPUT_TOKENS) and a context for prompt + output; wait
# for /health; fit a prompt of $PROMPT_TOKENS tokens (as the server counts them, chat template included);
# warm up at every level; run each level with max($MIN_REQUESTS, $ROUNDS x clients) requests; SIGTERM the
# server and keep its exit code (0 only when its shutdown check found every KV block back); then bench;
# then OUTDIR/summary.md.
# Knobs: DEVICE (auto), PROMPT_TOKENS (128; 0: the shortest chat prompt), OUTPUT_TOKENS (128), MIN_REQUESTS
# (16), ROUNDS (2), CLIENT_PROCS (4 load-generator processes at most per level), BENCH_BATCH (32), BENCH_REPS
# (3), PORT (8090), DEADLINE (seconds after which no new level starts; 150),
# WHEELS (a folder of wheels, for a machine without a package index), SERVE_ARGS (more `rocmforge serve` options).
# Exit 0 when every request of every level succeeded and the server exited 0 after SIGTERM.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 MODEL OUTDIR [CONCURRENCIES]" >&2; exit 2; }
MODEL="$1"; OUTDIR="$2"; LEVELS=(${3:-1 8 32 64})
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEVICE="${DEVICE:-auto}" BENCH_BATCH="${BENCH_BATCH:-32}" BENCH_REPS="${BENCH_REPS:-3}"
. scripts/bench/serve_bench_lib.sh
sb_init

sb_install "import starlette, uvicorn, gguf, prometheus_client, typer, rich, regex, jinja2, httpx, llm_benchmark_runner" \
  starlette uvicorn gguf prometheus-client typer rich regex jinja2 httpx llm-benchmark-runner
# httptools (HTTP parsing and writes) and uvloop (the event loop): the project's dependencies, which
# rocmforge_serve/uvicorn_stack.py asks uvicorn for (h11 and asyncio where they are missing); sb_install
# takes them from $WHEELS where that is set. Measured on the cpu, the event loop's cost per streamed token
# fell from 28 to 19 us with them.
if ! "$PY" -c "import httptools, uvloop" 2>/dev/null; then
  sb_pip httptools uvloop >> "$OUTDIR/pip.log" 2>&1 \
    || note "httptools/uvloop not installable: uvicorn runs on h11 and asyncio"
fi
"$PY" -m pip list 2>/dev/null | grep -iE "^(starlette|uvicorn|gguf|httpx|rich|llm-benchmark-runner|httptools|uvloop) " > "$OUTDIR/packages.txt"

sb_start_rocmforge_serve
sb_fit_prompt
sb_run_levels rocmforge_generated_tokens_total
sb_stop_server
grep -a "^shutdown:" "$OUTDIR/server.log" | tail -1 > "$OUTDIR/shutdown_line.txt"
[ "$SERVER_RC" -eq 0 ] || status=1

note "rocmforge bench -b $BENCH_BATCH"
"$PY" -m rocmforge_cli.app bench -m "$MODEL" --device "$DEVICE" -p 0 -n 0 -b "$BENCH_BATCH" --batch-gen "$OUTPUT_TOKENS" \
  -r "$BENCH_REPS" -o json -q > "$OUTDIR/bench_b32.json" 2> "$OUTDIR/bench.log" || note "bench failed (see bench.log)"
sb_summary
note "done, status $status"
exit $status
