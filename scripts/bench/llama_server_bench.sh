#!/usr/bin/env bash
# llama.cpp's llama-server under the same load as scripts/bench/serve_bench.sh gives `rocmforge serve`
# (issue 14, point 5): llm-benchmark-runner's streaming chat clients at each level, the same prompt length
# (fitted through this server's own usage count), the same number of output tokens, the same levels and
# request counts, and the same summary.md; with COMPARE_WITH (a serve_bench.sh OUTDIR) also
# OUTDIR/compare.md, the two servers side by side per level.
#
#   bash scripts/bench/llama_server_bench.sh LLAMA_SERVER MODEL OUTDIR [CONCURRENCIES]   (default "1 8 32 64")
#
# LLAMA_SERVER is the binary scripts/bench/build_llama_cpp.sh built (BUILD_DIR/llama.cpp/build/bin/llama-server).
# The server runs as rocmforge serve does in serve_bench.sh:
#   -np <largest level> -c <per-client context x slots> (each slot gets the per-client context, which
#   llama.cpp pads to a multiple of 256 tokens; the KV cache is not unified when -np is given)
#   --cont-batching -fa on -ngl 99 --ignore-eos --metrics
#   --alias bench, and the sampling rocmforge serve applies to requests that name none (OpenAI's
#   defaults): --temp 1 --top-k 0 --top-p 1 --min-p 0 (llama-server's own defaults are 0.8 / 40 / 0.95 /
#   0.05).
#   --no-cache-prompt --cache-ram 0: every request prefills its whole prompt, as in rocmforge serve (no
#   prefix cache); with llama-server's default prompt cache, the identical prompts of this benchmark would
#   be prefilled once per slot only.
# The load generator sends no extra body fields, so ignore-eos is the server's default for every request
# (--ignore-eos: the end-of-generation tokens get a -inf logit bias), as `rocmforge serve --ignore-eos`.
# The server's count of generated tokens per level is llamacpp:tokens_predicted_total on /metrics.
# Knobs: LLAMA_SERVER_ARGS (more llama-server options, after ours: a later flag wins), NGL (99), and those
# of serve_bench_lib.sh: PROMPT_TOKENS (128; 0: the shortest chat prompt), OUTPUT_TOKENS (128), MIN_REQUESTS
# (16), ROUNDS (2), CLIENT_PROCS (4), PORT (8090), DEADLINE (150), WHEELS (a folder of wheels),
# PYTHON (python3).
# Exit 0 when every request of every level succeeded (llama-server's exit code after SIGTERM is recorded,
# not judged: it has no shutdown check of its own).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 LLAMA_SERVER MODEL OUTDIR [CONCURRENCIES]" >&2; exit 2; }
# paths as given from the caller's directory; the rest runs from the repository root
LLAMA_SERVER="$(realpath -m "$1")"; MODEL="$(realpath -m "$2")"; OUTDIR="$(realpath -m "$3")"; LEVELS=(${4:-1 8 32 64})
[ -n "${COMPARE_WITH:-}" ] && COMPARE_WITH="$(realpath -m "$COMPARE_WITH")"
cd "$(dirname "$0")/../.."
[ -x "$LLAMA_SERVER" ] || { echo "no llama-server binary at $LLAMA_SERVER (scripts/bench/build_llama_cpp.sh builds it)" >&2; exit 2; }
export PYTHONUNBUFFERED=1
. scripts/bench/serve_bench_lib.sh
sb_init

sb_install "import httpx, rich, llm_benchmark_runner" httpx rich llm-benchmark-runner
"$PY" -m pip list 2>/dev/null | grep -iE "^(httpx|rich|llm-benchmark-runner) " > "$OUTDIR/packages.txt"
# Which llama.cpp: the binary's own line (no git in the tarball: "build 0, commit unknown") and the
# SOURCE.txt that scripts/llama_cpp/fetch_source.sh put at the top of the source tree.
VERSION=$("$LLAMA_SERVER" --version 2>&1 | grep -m1 '^version' || echo "version unknown")
SOURCE_TXT="$(dirname "$LLAMA_SERVER")/../../SOURCE.txt"
[ -f "$SOURCE_TXT" ] && VERSION="$VERSION; $(head -1 "$SOURCE_TXT")"
echo "$VERSION" > "$OUTDIR/llama_server_version.txt"

EXTRA_META="llama_server_version=$VERSION"
sb_start_llama_server
sb_fit_prompt
sb_run_levels llamacpp:tokens_predicted_total
sb_stop_server
sb_summary
if [ -n "${COMPARE_WITH:-}" ]; then
  "$PY" scripts/bench/serve_bench_report.py compare "$COMPARE_WITH" "$OUTDIR" > "$OUTDIR/compare.md" && cat "$OUTDIR/compare.md" \
    || note "the comparison with $COMPARE_WITH failed"
fi
note "done, status $status"
exit $status
