# Shared by scripts/bench/serve_bench.sh (rocmforge serve) and scripts/bench/llama_server_bench.sh
# (llama.cpp's llama-server): the same load generator, prompt, output length, levels and records for
# any OpenAI-compatible server, so that serve_bench_report.py can put the two side by side.
# Sourced, not run. The caller sets MODEL, OUTDIR and LEVELS (an array), then:
#   sb_init; sb_install PACKAGE...; sb_start_server LABEL CMD... (or sb_start_rocmforge_serve,
#   sb_start_llama_server); sb_fit_prompt;
#   sb_run_levels TOKEN_COUNTER; sb_stop_server; sb_summary
# Knobs (environment): PROMPT_TOKENS (128; 0: a one-word message, the shortest chat prompt),
# OUTPUT_TOKENS (128), MIN_REQUESTS (16), ROUNDS (2),
# CLIENT_PROCS (4: processes of the load generator per level, each with its share of the clients),
# PORT (8090), DEADLINE (seconds after which no new level starts; 150), WHEELS (a folder of
# wheels to install missing packages from with no index, for a machine without one; unset: pip's index),
# PYTHON (python3).

sb_init() {
  [ -f "$MODEL" ] || { echo "no model file at $MODEL" >&2; exit 2; }
  PROMPT_TOKENS="${PROMPT_TOKENS:-128}" OUTPUT_TOKENS="${OUTPUT_TOKENS:-128}"
  MIN_REQUESTS="${MIN_REQUESTS:-16}" ROUNDS="${ROUNDS:-2}" CLIENT_PROCS="${CLIENT_PROCS:-4}"
  PORT="${PORT:-8090}" DEADLINE="${DEADLINE:-150}" WHEELS="${WHEELS:-}"
  PY="${PYTHON:-python3}"
  mkdir -p "$OUTDIR"
  URL="http://127.0.0.1:$PORT"
  NAME=bench  # the model name both servers answer to
  MAXC=1; for c in "${LEVELS[@]}"; do [ "$c" -gt "$MAXC" ] && MAXC=$c; done
  # Prompt + output + the chat template (up to 64 tokens: a default system prompt), in whole 16-token blocks:
  # the context of one client.
  CTX=$(( (PROMPT_TOKENS + OUTPUT_TOKENS + 64 + 15) / 16 * 16 ))
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
      || echo "device ${DEVICE:-cpu}"; } > "$OUTDIR/device.txt"
  COMMIT="${ROCMFORGE_COMMIT:-$(git log -1 --format=%h 2>/dev/null || echo unknown)}"
  SERVER=""
  status=0
}

note() { echo "$(date -u +%T) t=${SECONDS}s $*" | tee -a "$OUTDIR/status.txt" >&2; }
# curl may be missing: status codes and bodies through Python's urllib.
http_ok() { "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1" > /dev/null 2>&1; }
http_get() { "$PY" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())" "$1"; }
# The value of one Prometheus counter on /metrics (empty when absent).
metric() { http_get "$URL/metrics" 2>/dev/null | awk -v k="$1" '$1 == k { print $2; exit }'; }

# sb_pip PIP_INSTALL_ARGS...: pip install from $WHEELS with no index where it is set, else from pip's index.
sb_pip() {
  if [ -n "$WHEELS" ]; then "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$@"
  else "$PY" -m pip install -q "$@"; fi
}

# sb_install IMPORT_CHECK PACKAGE...: install the packages unless the Python statement IMPORT_CHECK already
# succeeds.
sb_install() {
  local check="$1"; shift
  "$PY" -c "$check" 2>/dev/null && return 0
  note "installing $* ${WHEELS:+from $WHEELS (no index)}"
  sb_pip "$@" >> "$OUTDIR/pip.log" 2>&1 \
    || { note "pip install failed"; tail -20 "$OUTDIR/pip.log" >&2; exit 1; }
}

# sb_start_server LABEL CMD...: start the server in the background (log: OUTDIR/server.log), stop it on
# exit, wait up to 5 minutes for /health.
sb_start_server() {
  SERVER_LABEL="$1"; shift
  SERVER_CMD="$*"
  note "start: $SERVER_CMD"
  "$@" > "$OUTDIR/server.log" 2>&1 &
  SERVER=$!
  trap sb_kill_server EXIT
  for _ in $(seq 600); do
    http_ok "$URL/health" && break
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
  done
  if ! http_ok "$URL/health"; then note "the server did not become healthy"; tail -30 "$OUTDIR/server.log" >&2; exit 1; fi
  note "healthy"
}

# The two servers as every benchmark here starts them (the reasons for each option: llama_server_bench.sh's and
# serve_bench.sh's headers): `rocmforge serve` with SERVE_ARGS, llama-server ($LLAMA_SERVER) with LLAMA_SERVER_ARGS
# (after ours: a later flag wins).
sb_start_rocmforge_serve() {
  sb_start_server "rocmforge serve" "$PY" -m rocmforge_cli.app serve -m "$MODEL" --device "$DEVICE" --host 127.0.0.1 \
    --port "$PORT" --parallel "$MAXC" --queue "$MAXC" --ctx-size "$CTX" --ignore-eos --model-name "$NAME" ${SERVE_ARGS:-}
}
sb_start_llama_server() {
  sb_start_server "llama-server" "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --alias "$NAME" \
    -np "$MAXC" -c "$(( CTX * MAXC ))" --cont-batching -fa on -ngl "${NGL:-99}" --ignore-eos --metrics \
    --temp 1 --top-k 0 --top-p 1 --min-p 0 --no-cache-prompt --cache-ram 0 ${LLAMA_SERVER_ARGS:-}
}

sb_kill_server() {
  [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null || return 0
  kill -TERM "$SERVER"
  for _ in $(seq 600); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SERVER" 2>/dev/null && { note "server still up 60 s after SIGTERM: killed"; kill -KILL "$SERVER"; }
}

# SIGTERM, wait, keep the exit code in OUTDIR/server_exit.txt and $SERVER_RC.
sb_stop_server() {
  http_get "$URL/metrics" > "$OUTDIR/metrics_after.txt" 2>/dev/null
  sb_kill_server
  wait "$SERVER"; SERVER_RC=$?
  echo "$SERVER_RC" > "$OUTDIR/server_exit.txt"
  trap - EXIT
  note "server exit code $SERVER_RC after SIGTERM"
}

# A user message of PROMPT_TOKENS tokens as this server counts them (chat template included), and
# OUTDIR/meta.json. EXTRA_META: more "key=value" lines for meta.json.
sb_fit_prompt() {
  PROMPT=$("$PY" scripts/bench/serve_bench_report.py prompt "$URL" "$NAME" "$PROMPT_TOKENS" 2> "$OUTDIR/prompt_tokens.txt") \
    || { note "fitting the prompt failed"; cat "$OUTDIR/prompt_tokens.txt" >&2; exit 1; }
  printf '%s\n' "$PROMPT" > "$OUTDIR/prompt.txt"
  note "prompt: $(cat "$OUTDIR/prompt_tokens.txt") tokens"
  "$PY" - "$OUTDIR/meta.json" "$SERVER_LABEL" "$MODEL" "$(cat "$OUTDIR/device.txt")" "$COMMIT" "$SERVER_CMD" \
    "$(cat "$OUTDIR/prompt_tokens.txt")" "$OUTPUT_TOKENS" "$CLIENT_PROCS" "${EXTRA_META:-}" <<'EOF'
import json, sys, datetime
out, server, model, device, commit, serve, prompt, max_tokens, procs, extra = sys.argv[1:]
meta = {"server": server, "model": model, "device": device, "commit": commit,
        "date": datetime.date.today().isoformat(), "serve_args": serve, "prompt_tokens": int(prompt),
        "max_tokens": int(max_tokens), "tool": "llm-benchmark-runner 0.2.0 (streaming /v1/chat/completions), "
        f"up to {procs} processes per level, each with its share of the clients"}
meta.update(line.split("=", 1) for line in extra.splitlines() if "=" in line)
json.dump(meta, open(out, "w"), indent=1)
EOF
}

# sb_procs C: how many load-generator processes share C clients: the largest divisor of C not above
# CLIENT_PROCS. One process parses every chunk's JSON on one core (~60 us a chunk measured without a GPU):
# at tens of thousands of tokens a second it would measure itself, not the server.
sb_procs() {
  local c="$1" p="$CLIENT_PROCS"
  [ "$p" -lt 1 ] && p=1
  while [ $(( c % p )) -ne 0 ]; do p=$(( p - 1 )); done
  echo "$p"
}

# sb_run_levels TOKEN_COUNTER: warm up at every level, then each level with max(MIN_REQUESTS,
# ROUNDS x clients) requests (OUTDIR/level_<C>.json, merged from the processes' OUTDIR/parts/level_<C>.<I>.json
# when sb_procs gives more than one; each process runs its share in rounds of its clients, as one would);
# TOKEN_COUNTER, the server's Prometheus counter of generated tokens, is read around each level (OUTDIR/level_<C>.server_tokens): the load generator counts
# streamed chunks, and a token whose text is empty (an end-of-generation token under ignore-eos, half a
# UTF-8 character) sends none.
sb_run_levels() {
  local counter="$1" c n p i before after pids parts
  LB=("$PY" -m llm_benchmark_runner --url "$URL" --model "$NAME" --prompt "$PROMPT")
  note "warm-up at ${LEVELS[*]} clients (4 tokens each; discarded)"
  "${LB[@]}" --max-tokens 4 --repeat "$MAXC" --concurrency "$(IFS=,; echo "${LEVELS[*]}")" \
    --output "$OUTDIR/warmup.json" > "$OUTDIR/warmup.log" 2>&1
  for c in "${LEVELS[@]}"; do
    if [ "$SECONDS" -ge "$DEADLINE" ]; then note "skip $c clients: past ${DEADLINE}s"; continue; fi
    n=$(( ROUNDS * c )); [ "$n" -lt "$MIN_REQUESTS" ] && n=$MIN_REQUESTS
    p=$(sb_procs "$c"); n=$(( (n + p - 1) / p * p ))
    note "$c clients, $n requests, $p load-generator processes"
    before=$(metric "$counter")
    "$PY" scripts/bench/serve_bench_report.py threads "$SERVER" > "$OUTDIR/level_$c.cpu_before" 2>/dev/null
    http_get "$URL/metrics" > "$OUTDIR/level_$c.metrics_before" 2>/dev/null
    pids=(); parts=(); mkdir -p "$OUTDIR/parts"
    for i in $(seq "$p"); do
      parts+=("$OUTDIR/parts/level_$c.$i.json")
      "${LB[@]}" --max-tokens "$OUTPUT_TOKENS" --repeat $(( n / p )) --concurrency $(( c / p )) \
        --output "$OUTDIR/parts/level_$c.$i.json" > "$OUTDIR/parts/level_$c.$i.log" 2>&1 &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || { note "the load generator failed at $c clients"; status=1; }; done
    after=$(metric "$counter")
    "$PY" scripts/bench/serve_bench_report.py threads "$SERVER" > "$OUTDIR/level_$c.cpu_after" 2>/dev/null
    http_get "$URL/metrics" > "$OUTDIR/level_$c.metrics_after" 2>/dev/null
    "$PY" scripts/bench/serve_bench_report.py merge "$OUTDIR/level_$c.json" "${parts[@]}" \
      || { note "merging the load generator's outputs failed at $c clients"; status=1; }
    echo "$before $after" > "$OUTDIR/level_$c.server_tokens"
  done
}

# OUTDIR/summary.md (status 1 when a level had errors).
sb_summary() {
  "$PY" scripts/bench/serve_bench_report.py summary "$OUTDIR" > "$OUTDIR/summary.md" || status=1
  grep -q "errors at" "$OUTDIR/summary.md" && status=1
  cat "$OUTDIR/summary.md"
}
