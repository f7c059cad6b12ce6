"""The summary of scripts/bench/serve_benchy.sh: llama-benchy's levels beside `rocmforge bench -b 32`.

    python3 scripts/bench/serve_benchy_report.py OUTDIR
    python3 scripts/bench/serve_benchy_report.py batched LLAMA_BATCHED_BENCH MODEL BATCH TOKENS REPS   (JSON to stdout)

Reads OUTDIR/benchy.json (llama-benchy's JSON report), OUTDIR/bench_b32.json (`rocmforge bench -o json`) and
OUTDIR/shutdown_line.txt; prints a markdown table, one row a level: llama-benchy's generation throughput (the
batch's tokens after each request's first, over its first token to its last), its prompt throughput and time
to first token (means over the runs, ± their spread), then the 32-client throughput over bench -b 32 (or over
llama-batched-bench's S_TG, for llama-server: `batched` runs it and writes bench_b32.json's form, with "tool"
naming it). Exit 1 when a file is missing or llama-benchy reported no level.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench_report import TARGET, bench_record  # noqa: E402  (one reading of bench_b32.json for both reports)


def _metric(run: dict, key: str) -> tuple[float, float] | None:
    m = run.get(key)
    return None if not m else (float(m["mean"]), float(m["std"]))


def _cell(m: tuple[float, float] | None, digits: int = 0) -> str:
    return "-" if m is None else f"{m[0]:,.{digits}f} ± {m[1]:,.{digits}f}"


def batched(exe: str, model: str, batch: int, tokens: int, reps: int) -> dict:
    """llama-batched-bench's S_TG at `batch` sequences (profiles.llama_cpp_runs runs it as `rocmforge bench
    --llama-batched-bench` does), in bench_b32.json's form."""
    from profiles.llama_cpp_runs import run_llama_batched_bench

    cfg = types.SimpleNamespace(model=model, batches=(batch,), batch_gen_tokens=tokens, repetitions=reps)
    rows = run_llama_batched_bench(exe, cfg, gpu=True)
    return {"tool": "llama-batched-bench", "results": [{"test": r["test"], "mean": r["avg_ts"], "sd": r["stddev_ts"]}
                                                      for r in rows]}


def summary(outdir: Path) -> tuple[str, bool]:
    runs = [r for r in json.loads((outdir / "benchy.json").read_text()).get("benchmarks", [])
            if not r.get("is_context_prefill_phase")]
    lines = ["| clients | generation t/s (decode phase) | per request t/s | prompt t/s | time to first token ms |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    by_clients = {}
    for r in sorted(runs, key=lambda r: r["concurrency"]):
        by_clients[r["concurrency"]] = r
        lines.append(f"| {r['concurrency']} | {_cell(_metric(r, 'tg_throughput'))} | "
                     f"{_cell(_metric(r, 'tg_req_throughput'), 1)} | {_cell(_metric(r, 'pp_throughput'))} | "
                     f"{_cell(_metric(r, 'e2e_ttft'), 1)} |")
    bench = bench_record(outdir / "bench_b32.json")
    if bench is None:
        lines.append("\n- the batched bench: no result (see bench.log)")
        return "\n".join(lines) + "\n", False
    tool, test, mean, sd = bench
    lines.append(f"\n- {tool} {test}: {mean:,.1f} ± {sd:,.1f} t/s (decode steps only)")
    batch = int(test[1:].split("x")[0])
    level = by_clients.get(batch)
    tg = None if level is None else _metric(level, "tg_throughput")
    if tg is not None and mean > 0:
        ratio = tg[0] / mean
        verdict = "met" if ratio >= TARGET else "NOT met"
        lines.append(f"- llama-benchy's generation throughput at {batch} clients / {tool} {test}: {ratio:.2f} "
                     f"(target >= {TARGET:.2f}: {verdict})")
    shutdown = outdir / "shutdown_line.txt"
    if shutdown.exists() and shutdown.read_text().strip():
        lines.append(f"- the server's shutdown check: {shutdown.read_text().strip()}")
    return "\n".join(lines) + "\n", bool(runs)


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] == "batched":
        print(json.dumps(batched(argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5]))))
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        text, ok = summary(Path(argv[0]))
    except (OSError, ValueError, KeyError) as exc:
        print(f"no summary: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
