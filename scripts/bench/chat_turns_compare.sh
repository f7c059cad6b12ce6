#!/usr/bin/env bash
# A multi-turn chat load (scripts/bench/chat_turns_bench.py) on `rocmforge serve` with its prefix cache, without
# it (--no-prefix-cache), and on llama.cpp's llama-server with its prompt cache (cache_prompt, its default), the
# same parallel slots; then `rocmforge bench --prefix-reuse` on the same model (the figure without a server).
# Issue 52, point 6: target a TTFT p50 at most half of llama-server's from the third turn on, throughput >= 1.2x.
#
#   bash scripts/bench/chat_turns_compare.sh MODEL LLAMA_SERVER OUTDIR
#
# LLAMA_SERVER is the binary scripts/bench/build_llama_cpp.sh built (empty string: skip llama-server).
# Knobs: CONVERSATIONS (32), TURNS (8), TURN_TOKENS (200), REPLY_TOKENS (32), CTX (per conversation: 2048),
# IDS (prompt token ids drawn from: "1000 30000"), PORT (8095), NGL (99), PYTHON (python3), ROCMFORGE (the command that
# runs rocmforge: default "$PYTHON -m rocmforge_cli.app" from this checkout, as a GPU machine without the package
# installed has it), ROCMFORGE_COMMIT (the commit, where the sources were copied without their .git),
# RF_ARGS (more arguments for both `rocmforge serve` and `rocmforge bench`, e.g. "--device cpu" for a quick check).
# Writes OUTDIR/<run>.json and .log for each server run, OUTDIR/bench_prefix_reuse.md, OUTDIR/compare.md.
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: $0 MODEL LLAMA_SERVER OUTDIR" >&2; exit 2; }
MODEL="$(realpath -m "$1")"; LLAMA_SERVER="${2:+$(realpath -m "$2")}"; OUTDIR="$(realpath -m "$3")"
cd "$(dirname "$0")/../.."
C=${CONVERSATIONS:-32}; T=${TURNS:-8}; U=${TURN_TOKENS:-200}; R=${REPLY_TOKENS:-32}; CTX=${CTX:-2048}
PORT=${PORT:-8095}; PY=${PYTHON:-python3}
read -r -a RF <<< "${ROCMFORGE:-$PY -m rocmforge_cli.app}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
status=0
note() { echo "[chat_turns_compare] $*" | tee -a "$OUTDIR/notes.txt" >&2; }
wait_healthy() {  # $1: pid
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
run_load() {  # $1: label, then the server command
  local label=$1; shift
  note "$label: $*"
  if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then  # another server would answer the load in its place
    status=1; note "$label: port $PORT is taken by another process; not run (set PORT)"; return
  fi
  "$@" > "$OUTDIR/$label.log" 2>&1 &
  local pid=$!
  if wait_healthy $pid; then
    "$PY" scripts/bench/chat_turns_bench.py "http://127.0.0.1:$PORT" "$OUTDIR" --conversations "$C" --turns "$T" \
      --turn-tokens "$U" --reply-tokens "$R" --ids ${IDS:-1000 30000} --label "$label" > "$OUTDIR/$label.md" || { status=1; note "$label: the load failed"; }
    curl -s "http://127.0.0.1:$PORT/metrics" > "$OUTDIR/$label.metrics.txt" || true
  else
    status=1; note "$label: the server did not come up (see $label.log)"
  fi
  kill -TERM $pid 2>/dev/null; wait $pid; note "$label: server exit $?"
}
{ echo "${ROCMFORGE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo 'commit unknown')}"; echo "$MODEL; C=$C T=$T U=$U R=$R CTX=$CTX RF_ARGS=${RF_ARGS:-}"; nvidia-smi -L 2>/dev/null || rocm-smi --showproductname 2>/dev/null; date -u; } > "$OUTDIR/meta.txt"

read -r -a RF_EXTRA <<< "${RF_ARGS:-}"
run_load rocmforge-cached "${RF[@]}" serve -m "$MODEL" --port "$PORT" --parallel "$C" --ctx-size "$CTX" -q ${RF_EXTRA[@]+"${RF_EXTRA[@]}"}
run_load rocmforge-uncached "${RF[@]}" serve -m "$MODEL" --port "$PORT" --parallel "$C" --ctx-size "$CTX" -q \
  --no-prefix-cache ${RF_EXTRA[@]+"${RF_EXTRA[@]}"}
runs=("$OUTDIR/rocmforge-cached.json" "$OUTDIR/rocmforge-uncached.json")
if [ -n "$LLAMA_SERVER" ]; then
  "$LLAMA_SERVER" --version > "$OUTDIR/llama_server_version.txt" 2>&1
  # -c is shared by the slots: CTX each. cache_prompt is llama-server's default for every request.
  run_load llama-server "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -np "$C" -c $((C * CTX)) --cont-batching -fa on \
    -ngl "${NGL:-99}" --metrics --alias bench
  runs+=("$OUTDIR/llama-server.json")
fi
existing=(); for f in "${runs[@]}"; do [ -f "$f" ] && existing+=("$f"); done
[ ${#existing[@]} -gt 0 ] && "$PY" scripts/bench/chat_turns_bench.py --compare "${existing[@]}" | tee "$OUTDIR/compare.md"
note "rocmforge bench --prefix-reuse"
"${RF[@]}" bench -m "$MODEL" --prefix-reuse --conversations "$C" --turns "$T" --turn-tokens "$U" --reply-tokens "$R" \
  ${RF_EXTRA[@]+"${RF_EXTRA[@]}"} > "$OUTDIR/bench_prefix_reuse.md" 2> "$OUTDIR/bench_prefix_reuse.log" || { status=1; note "bench --prefix-reuse failed"; }
cat "$OUTDIR/bench_prefix_reuse.md"
note "done, status $status"
exit $status
