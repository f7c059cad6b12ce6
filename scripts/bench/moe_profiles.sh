#!/usr/bin/env bash
# Where the mixtures of experts' steps spend their time (issue 51): `rocmforge bench --profile` at a few batch sizes
# and context depths, and scripts/bench/profile_prompt_step.py's prompt step, for each model, in one command:
#   bash scripts/bench/moe_profiles.sh OUTDIR [MODEL.gguf ...]
# MODELS default: the two files scripts/bench/moe_vs_llamacpp.sh writes (MODELS folder, default ${TMPDIR:-/tmp}/models),
# so run it after that script on the same machine (it reuses the files: no model is written here).
# PROFILES: decode steps to profile, BATCH or BATCH@DEPTH (default "1 8 1@4096": one sequence and 8 after 128 tokens,
# one after 4,096); PROMPT_TOKENS: the prompt step's tokens (default 512; 0 skips it, as on the cpu backend, which
# has no device timer); DEVICE: bench's --device (default auto). DEADLINE: seconds from the start (default 300)
# after which nothing more starts. Writes OUTDIR/<model>-b<B>-d<D>.md (bench's profile), OUTDIR/<model>-prompt<N>.txt
# and OUTDIR/status.txt (a line a step, with its exit status). Exit 0 when every step ran, 1 when one failed, 2 when
# the deadline left some unrun.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/bench/moe_profiles.sh OUTDIR [MODEL.gguf ...]" >&2; exit 2; }
OUTDIR="$(realpath -m "$1")"; shift
MODELS_DIR="${MODELS:-${TMPDIR:-/tmp}/models}"
[ $# -gt 0 ] && MODEL_LIST=("$@") || MODEL_LIST=("$MODELS_DIR/Qwen3-30B-A3B-Q4_K_M.gguf" "$MODELS_DIR/gpt-oss-20b-MXFP4_MOE.gguf")
read -r -a PROFILE_LIST <<< "${PROFILES:-1 8 1@4096}"
PROMPT_TOKENS="${PROMPT_TOKENS:-512}" DEVICE="${DEVICE:-auto}" DEADLINE="${DEADLINE:-300}"
cd "$(dirname "$0")/../.."
PK="${TMPDIR:-/tmp}/rocmforge_moe_pkg"  # the kernels from kernels/, as the installed package has them
mkdir -p "$OUTDIR" "$PK" && ln -sfn "$PWD/kernels" "$PK/rocmforge_kernels"
export PYTHONPATH="$PWD:$PK${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STATUS=0
note() { echo "$(date -u +%T) t=${SECONDS}s $*" | tee -a "$OUTDIR/status.txt" >&2; }
# run NAME CMD...: CMD's stdout to OUTDIR/NAME, stderr to OUTDIR/NAME.log, unless the deadline has passed
run() {
  local name="$1"; shift
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -le 0 ]; then [ "$STATUS" -eq 1 ] || STATUS=2; note "$name: not started, past DEADLINE (${DEADLINE}s)"; return; fi
  timeout "$left" "$@" > "$OUTDIR/$name" 2> "$OUTDIR/$name.log"
  local rc=$?
  note "$name rc=$rc"
  if [ "$rc" -eq 124 ]; then [ "$STATUS" -eq 1 ] || STATUS=2; elif [ "$rc" -ne 0 ]; then STATUS=1; fi
}
for model in "${MODEL_LIST[@]}"; do
  name="$(basename "$model" .gguf)"
  if [ ! -s "$model" ]; then STATUS=1; note "$name: no model file ($model)"; continue; fi
  for spec in "${PROFILE_LIST[@]}"; do
    batch="${spec%@*}" depth=128
    [ "$spec" != "$batch" ] && depth="${spec#*@}"
    run "$name-b$batch-d$depth.md" python3 -m rocmforge_cli.app bench -m "$model" -d "$DEVICE" -p 0 -n 0 -b 0 -r 1 \
      --profile --profile-batch "$batch" --profile-depth "$depth" -q
  done
  if [ "$PROMPT_TOKENS" -gt 0 ]; then
    run "$name-prompt$PROMPT_TOKENS.txt" python3 scripts/bench/profile_prompt_step.py --model "$model" --tokens "$PROMPT_TOKENS"
  fi
done
note "done (exit $STATUS)"
exit "$STATUS"
