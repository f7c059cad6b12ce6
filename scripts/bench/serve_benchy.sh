#!/usr/bin/env bash
# `rocmforge serve` under llama-benchy (PyPI; the load generator issue 14 names), beside `rocmforge bench -b 32`.
# llama-benchy sends each level's clients together, one batch a run, streaming /v1/chat/completions, and
# reports a batch's generation throughput as the tokens after each request's first, over the time from the
# batch's first token to its last: the decode phase, as llama-batched-bench's S_TG and `rocmforge bench -b`
# measure it, with the HTTP path (the engine's process, the HTTP process, SSE, the client) inside it. The
# prompts' evaluation is its own figure (pp t/s, time to first token). scripts/bench/serve_bench.sh measures
# the same server under llm-benchmark-runner, whose clients go in rounds and whose figure counts the rounds'
# gaps too.
#
#   bash scripts/bench/serve_benchy.sh MODEL OUTDIR [CONCURRENCIES]      (CONCURRENCIES default "1 8 32 64")
#
# So that no network is needed: llama-benchy's tokenizer is written from the model's own vocabulary
# (scripts/bench/gguf_tokenizer_json.py) and its corpus is this repository's README and docs/architecture.md,
# placed where llama-benchy caches a downloaded book. Knobs: as serve_bench.sh's (DEVICE, PROMPT_TOKENS,
# OUTPUT_TOKENS, PORT, WHEELS, SERVE_ARGS, BENCH_BATCH, BENCH_REPS), RUNS (llama-benchy's runs a level, 3) and
# BENCHY_ARGS (more llama-benchy options, e.g. `--extra-body temperature=0`).
# With LLAMA_SERVER (the binary scripts/bench/build_llama_cpp.sh builds) the same load goes to llama.cpp's
# llama-server, started as scripts/bench/llama_server_bench.sh starts it (the same sampling, no prompt cache), and
# llama-batched-bench beside it (-npp 1 -ntg OUTPUT_TOKENS -npl BENCH_BATCH -fa on, its S_TG) takes bench's place.
# Exit 0 when llama-benchy and bench ran and the server exited 0 after SIGTERM (rocmforge serve: every KV block
# back; llama-server's exit code is recorded, not judged).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 MODEL OUTDIR [CONCURRENCIES]" >&2; exit 2; }
MODEL="$1"; OUTDIR="$2"; LEVELS=(${3:-1 8 32 64})
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEVICE="${DEVICE:-auto}" BENCH_BATCH="${BENCH_BATCH:-32}" BENCH_REPS="${BENCH_REPS:-3}" RUNS="${RUNS:-3}"
. scripts/bench/serve_bench_lib.sh
sb_init

sb_install "import starlette, uvicorn, gguf, prometheus_client, typer, rich, regex, jinja2, httpx, httptools, uvloop" \
  starlette uvicorn gguf prometheus-client typer rich regex jinja2 httpx httptools uvloop
# llama-benchy without its transformers requirement: it loads a local tokenizer.json with `tokenizers` alone.
if ! "$PY" -c "import llama_benchy, aiohttp, pydantic, tabulate, tokenizers, requests" 2>/dev/null; then
  sb_pip aiohttp pydantic tabulate requests tokenizers >> "$OUTDIR/pip.log" 2>&1
  sb_pip --no-deps llama-benchy >> "$OUTDIR/pip.log" 2>&1 || { note "llama-benchy not installable"; exit 1; }
fi
"$PY" -m pip list 2>/dev/null | grep -iE "^(starlette|uvicorn|httptools|uvloop|llama-benchy|aiohttp|tokenizers) " > "$OUTDIR/packages.txt"

"$PY" scripts/bench/gguf_tokenizer_json.py "$MODEL" "$OUTDIR/tokenizer.json" > /dev/null || { note "no tokenizer.json"; exit 1; }
BOOK_URL="file:///rocmforge-corpus"
CACHE="$HOME/.cache/llama-benchy"; mkdir -p "$CACHE"
cat README.md docs/architecture.md > "$CACHE/$("$PY" -c "import hashlib, sys; print(hashlib.md5(sys.argv[1].encode()).hexdigest())" "$BOOK_URL").txt"

if [ -n "${LLAMA_SERVER:-}" ]; then
  COUNTER=llamacpp:tokens_predicted_total
  "$LLAMA_SERVER" --version 2>&1 | grep -m1 '^version' > "$OUTDIR/llama_server_version.txt"
  sb_start_llama_server
else
  COUNTER=rocmforge_generated_tokens_total
  sb_start_rocmforge_serve
fi
before=$(metric "$COUNTER"); t0=$SECONDS
note "llama-benchy at ${LEVELS[*]} clients, $RUNS runs a level, pp $PROMPT_TOKENS, tg $OUTPUT_TOKENS"
"$PY" -m llama_benchy --base-url "$URL/v1" --model "$NAME" --tokenizer "$OUTDIR/tokenizer.json" --book-url "$BOOK_URL" \
  --pp "$PROMPT_TOKENS" --tg "$OUTPUT_TOKENS" --concurrency "${LEVELS[@]}" --runs "$RUNS" --skip-coherence \
  ${BENCHY_ARGS:-} --format json --save-result "$OUTDIR/benchy.json" > "$OUTDIR/benchy.log" 2>&1 || { note "llama-benchy failed"; status=1; }
after=$(metric "$COUNTER")
echo "$before $after $(( SECONDS - t0 ))" > "$OUTDIR/server_tokens.txt"
sb_stop_server
grep -a "^shutdown:" "$OUTDIR/server.log" | tail -1 > "$OUTDIR/shutdown_line.txt"
if [ -n "${LLAMA_SERVER:-}" ]; then
  BATCHED="${LLAMA_BATCHED_BENCH:-$(dirname "$LLAMA_SERVER")/llama-batched-bench}"
  note "llama-batched-bench -npl $BENCH_BATCH"
  "$PY" scripts/bench/serve_benchy_report.py batched "$BATCHED" "$MODEL" "$BENCH_BATCH" "$OUTPUT_TOKENS" "$BENCH_REPS" \
    > "$OUTDIR/bench_b32.json" 2> "$OUTDIR/bench.log" || { note "llama-batched-bench failed (see bench.log)"; status=1; }
else
  [ "$SERVER_RC" -eq 0 ] || status=1
  note "rocmforge bench -b $BENCH_BATCH"
  "$PY" -m rocmforge_cli.app bench -m "$MODEL" --device "$DEVICE" -p 0 -n 0 -b "$BENCH_BATCH" --batch-gen "$OUTPUT_TOKENS" \
    -r "$BENCH_REPS" -o json -q > "$OUTDIR/bench_b32.json" 2> "$OUTDIR/bench.log" || { note "bench failed (see bench.log)"; status=1; }
fi
"$PY" scripts/bench/serve_benchy_report.py "$OUTDIR" | tee "$OUTDIR/summary.md" || status=1
note "done, status $status"
exit $status
