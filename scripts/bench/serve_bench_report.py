"""Helpers of scripts/bench/serve_bench.sh and scripts/bench/llama_server_bench.sh (standard library only, so
it runs before any wheel is installed).

  python3 serve_bench_report.py prompt URL MODEL_NAME TOKENS > prompt.txt
      a user message whose chat prompt, as the server counts it (template included), has TOKENS tokens
      (or the nearest count below that the words allow); TOKENS 0: the shortest, a one-word message (the
      workload nearest `rocmforge bench -b`'s 1-token prompts that a chat request can be); the count goes
      to stderr.
  python3 serve_bench_report.py summary OUTDIR > OUTDIR/summary.md
      the markdown table from the load generator's level_<C>.json files, bench_b32.json (rocmforge serve
      only) and the rest; meta.json's "server" names the server (rocmforge serve when absent).
  python3 serve_bench_report.py merge OUT.json PART.json...
      one level run by several load-generator processes (each with its share of the clients) as one file
      of the load generator's format: the requests pooled, their statistics computed again over the pool
      the way the load generator computes them, the level's wall time from the first start to the last chunk
  python3 serve_bench_report.py threads PID > cpu.json
      CPU seconds (user + system) of each thread of process PID, by thread name, from /proc (Linux); read
      before and after a level, the difference per generated token says which of the server's threads
      (the engine's, the event loop's, the template workers') pays for each token on this machine
  python3 serve_bench_report.py compare OUTDIR_A OUTDIR_B > compare.md
      two servers' runs side by side per level (A is usually rocmforge serve, B llama-server): requests
      ok, TTFT p50, ITL p50 and aggregate t/s of each, and the ratio A / B of the aggregates.

The load generator is llm-benchmark-runner (PyPI): per request it records the time of each streamed
content chunk; TTFT = first chunk - request start, ITL = the gaps between chunks (all requests of a level
pooled), and a level's tokens/s = chunks of all requests / (first request start -> last chunk). Beside it,
in parentheses, the server's own count of generated tokens over the same wall time (a token with empty
text sends no chunk); the 32-client ratio to bench uses the server's count.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from serve_bench_server_figures import LATENCY_STAGES, cpu_lines, engine_lines, latency_lines, thread_cpu  # noqa: F401 (LATENCY_STAGES: read by its tests)

WORDS = ("the quick brown fox jumps over a lazy dog while seven small robots count blue stars "
         "in the quiet night and every one of them writes a number on the wall").split()
MAX_PROBES = 12
ROCMFORGE = "rocmforge serve"


def prompt_tokens(url: str, model: str, text: str) -> int:
    """usage.prompt_tokens of a one-token chat request with `text` as the user message."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
                       "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return int(json.load(reply)["usage"]["prompt_tokens"])


def words(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def fit_prompt(url: str, model: str, target: int) -> tuple[str, int]:
    """Grow or shrink the word count until the server's count is `target`: most of these words are one
    token each, so the step toward the target is the difference, and a few probes settle it."""
    shortest = prompt_tokens(url, model, words(1))
    if target <= 0:
        return words(1), shortest
    n = max(1, target - shortest + 1)
    best: tuple[int, int] | None = None  # (tokens, words) of the longest prompt not over the target
    for _ in range(MAX_PROBES):
        got = prompt_tokens(url, model, words(n))
        if got <= target and (best is None or got > best[0]):
            best = (got, n)
        if got == target:
            break
        n = max(1, n + (target - got) if abs(target - got) > 1 else n + (1 if got < target else -1))
    if best is None:
        raise SystemExit(f"no prompt of at most {target} tokens: the chat template alone is longer")
    return words(best[1]), best[0]


def _ms(stats: dict, key: str) -> str:
    return f"{stats[key]:.1f}"


def level_rows(outdir: Path) -> list[dict]:
    rows = []
    for path in sorted(outdir.glob("level_*.json"), key=lambda p: int(p.stem.split("_")[1])):
        result = json.loads(path.read_text())["results"][0]
        level = result["concurrencyResults"][0]
        raw = result["rawResults"]
        ok = [r for r in raw if r["status"] == "success"]
        m = level["metrics"]
        wall = (max((r["tokenTimestamps"][-1] for r in ok if r["tokenTimestamps"]), default=0.0)
                - min(r["requestStart"] for r in raw)) if raw else 0.0
        server_tokens = None
        counts = path.with_suffix(".server_tokens")
        if counts.exists() and len(counts.read_text().split()) == 2:
            before, after = (float(v) for v in counts.read_text().split())
            server_tokens = after - before
        rows.append({"clients": level["concurrency"], "requests": len(raw), "ok": len(ok), "wall": wall,
                     "tokens_per_request": sum(r["outputTokenCount"] for r in ok) / max(1, len(ok)),
                     "server_tokens_per_request": None if server_tokens is None else server_tokens / max(1, len(raw)),
                     "server_tokens_per_s": None if not server_tokens or wall <= 0 else server_tokens / wall,
                     "ttft": m["ttft"], "itl": m["itl"], "e2e": m["e2eLatency"], "tps_request": m["tps"],
                     "tokens_per_s": level["tokenThroughput"],
                     "errors": sorted({(r["error"] or "")[:160] for r in raw if r["status"] != "success"})})
    return rows


TARGET = 0.8  # issue 14: the 32-client aggregate over bench -b 32 (the HTTP layer costing at most 20%)


def bench_record(path: Path) -> tuple[str, str, float, float] | None:
    """(tool, test, mean, sd) of the batched row of a bench_b32.json: `rocmforge bench -o json`'s, or
    serve_benchy_report.py's form of llama-batched-bench's (its "tool" naming it)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for r in report.get("results", []):
        if r["test"].startswith("b"):
            return report.get("tool", "rocmforge bench"), r["test"], float(r["mean"]), float(r["sd"])
    return None


def bench_b(outdir: Path) -> tuple[str, float, float] | None:
    record = bench_record(outdir / "bench_b32.json")
    return None if record is None else record[1:]


def aggregate_tps(row: dict) -> float:
    """A level's tokens/s: the server's own count where it was read, else the load generator's chunks."""
    return row["server_tokens_per_s"] if row["server_tokens_per_s"] is not None else row["tokens_per_s"]


def bench_lines(outdir: Path, rows: list[dict]) -> list[str]:
    """`rocmforge bench -b 32` and the ratio of the 32-client HTTP aggregate to it."""
    bench = bench_b(outdir)
    if bench is None:
        return ["- rocmforge bench: no result (see bench.log)"]
    test, mean, sd = bench
    lines = [f"- rocmforge bench {test}: {mean:.1f} ± {sd:.1f} t/s (decode steps only, 1-token prompts)"]
    batch = int(test[1:].split("x")[0])
    at = [r for r in rows if r["clients"] == batch]
    if at and mean > 0:
        ratio = aggregate_tps(at[0]) / mean
        verdict = "met" if ratio >= TARGET else "NOT met"
        prompt = _meta(outdir).get("prompt_tokens")
        lines.append(f"- HTTP aggregate at {batch} clients / bench {test}: {ratio:.2f} (target >= 0.80: {verdict}; "
                     f"the HTTP figure also pays for its {prompt if prompt else 'unknown'}-token prompts and the "
                     "ramp of each round)")
    return lines


def summary(outdir: Path) -> str:
    meta = _meta(outdir)
    rows = level_rows(outdir)
    server = meta.get("server", ROCMFORGE)
    lines = [f"# {server} under llm-benchmark-runner: {meta.get('model', '?')}", ""]
    for key in ("device", "commit", "llama_server_version", "date", "serve_args", "prompt_tokens", "max_tokens", "tool"):
        if key in meta:
            lines.append(f"- {key.replace('_', ' ')}: {meta[key]}")
    lines += ["", "| clients | requests ok | chunks/request (server tokens) | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
              "| ITL p99 ms | E2E p50 ms | t/s per request (p50) | aggregate t/s (server tokens) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_request = "" if r["server_tokens_per_request"] is None else f" ({r['server_tokens_per_request']:.1f})"
        aggregate = "" if r["server_tokens_per_s"] is None else f" ({r['server_tokens_per_s']:.1f})"
        lines.append(f"| {r['clients']} | {r['ok']}/{r['requests']} | {r['tokens_per_request']:.1f}{per_request} "
                     f"| {_ms(r['ttft'], 'median')} | {_ms(r['ttft'], 'p99')} | {_ms(r['itl'], 'median')} "
                     f"| {_ms(r['itl'], 'p99')} | {_ms(r['e2e'], 'median')} | {r['tps_request']['median']:.1f} "
                     f"| {r['tokens_per_s']:.1f}{aggregate} |")
    lines.append("")
    if server == ROCMFORGE:
        lines += bench_lines(outdir, rows)
    lines += cpu_lines(outdir, rows)
    lines += engine_lines(outdir, rows)
    lines += latency_lines(outdir, rows)
    for name, label in (("server_exit.txt", "server exit code after SIGTERM"), ("shutdown_line.txt", "server's shutdown check")):
        if (outdir / name).exists():
            lines.append(f"- {label}: {(outdir / name).read_text().strip()}")
    for r in rows:
        for error in r["errors"]:
            lines.append(f"- errors at {r['clients']} clients: {json.dumps(error)}")
    return "\n".join(lines) + "\n"


def _meta(outdir: Path) -> dict:
    path = outdir / "meta.json"
    return json.loads(path.read_text()) if path.exists() else {}


def compare(a: Path, b: Path) -> str:
    """Two runs of the same load (serve_bench.sh and llama_server_bench.sh) side by side, per level."""
    meta_a, meta_b = _meta(a), _meta(b)
    name_a, name_b = meta_a.get("server", ROCMFORGE), meta_b.get("server", "llama-server")
    rows_a = {r["clients"]: r for r in level_rows(a)}
    rows_b = {r["clients"]: r for r in level_rows(b)}
    lines = [f"# {name_a} vs {name_b} under llm-benchmark-runner: {meta_a.get('model', '?')}", ""]
    for key in ("device", "date", "commit", "llama_server_version"):
        values = [(meta[key], name) for meta, name in ((meta_a, name_a), (meta_b, name_b)) if key in meta]
        if len(values) == 2 and values[0][0] == values[1][0]:
            values = values[:1]
        for value, name in values:
            lines.append(f"- {key.replace('_', ' ')}{'' if len(values) == 1 and key != 'commit' else f' ({name})'}: "
                         f"{value}")
    for meta, name in ((meta_a, name_a), (meta_b, name_b)):
        if "serve_args" in meta:
            lines.append(f"- {name}: `{meta['serve_args']}`")
    load = [(Path(meta.get("model", "?")).name, meta.get("prompt_tokens"), meta.get("max_tokens"))
            for meta in (meta_a, meta_b)]
    if load[0] != load[1]:
        lines.append(f"- NOT the same load: model, prompt tokens, output tokens {load[0]} ({name_a}) "
                     f"vs {load[1]} ({name_b})")
    else:
        lines.append(f"- same load: prompt {load[0][1]} tokens (as each server counts them, template included), "
                     f"{load[0][2]} tokens out per request")
    lines += ["", f"Each pair of figures: {name_a} / {name_b}. Aggregate t/s: the server's own count of generated "
              "tokens over the level's wall time (the load generator's chunk count where the server's was not "
              f"read); ratio = {name_a} / {name_b} of the aggregates.", "",
              "| clients | requests ok | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | E2E p50 ms "
              "| aggregate t/s | ratio |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for clients in sorted(set(rows_a) | set(rows_b)):
        ra, rb = rows_a.get(clients), rows_b.get(clients)

        def pair(cell) -> str:
            return " / ".join("-" if r is None else cell(r) for r in (ra, rb))

        agg_a = None if ra is None else aggregate_tps(ra)
        agg_b = None if rb is None else aggregate_tps(rb)
        ratio = f"{agg_a / agg_b:.2f}" if agg_a is not None and agg_b else "-"
        cells = [pair(lambda r: f"{r['ok']}/{r['requests']}")]
        cells += [pair(lambda r, key=key, stat=stat: _ms(r[key], stat))
                  for key, stat in (("ttft", "median"), ("ttft", "p99"), ("itl", "median"), ("itl", "p99"),
                                    ("e2e", "median"))]
        cells.append(pair(lambda r: f"{aggregate_tps(r):.1f}"))
        lines.append(f"| {clients} | {' | '.join(cells)} | {ratio} |")
    for rows, name in ((rows_a, name_a), (rows_b, name_b)):
        for r in rows.values():
            for error in r["errors"]:
                lines.append(f"- errors at {r['clients']} clients ({name}): {json.dumps(error)}")
    return "\n".join(lines) + "\n"


def _percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between closest ranks, as llm-benchmark-runner 0.2.0 computes its percentiles."""
    if not ordered:
        return 0.0
    idx = p / 100 * (len(ordered) - 1)
    lower = int(idx)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (idx - lower)


def _stats_of(values: list[float]) -> dict:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0, "p99": 0.0, "min": 0.0, "max": 0.0, "stdDev": 0.0}
    ordered = sorted(values)
    mean = sum(ordered) / len(ordered)
    return {"mean": mean, "median": _percentile(ordered, 50), "p95": _percentile(ordered, 95),
            "p99": _percentile(ordered, 99), "min": ordered[0], "max": ordered[-1],
            "stdDev": (sum((v - mean) ** 2 for v in ordered) / len(ordered)) ** 0.5}


def merge(parts: list[Path]) -> dict:
    """One level from the outputs of several processes of the load generator run at the same time.

    Why several: the load generator parses every streamed chunk's JSON in one Python process, which on a
    fast model is a core's worth of work before the server is (measured without a GPU: ~60 us a chunk), so
    a single process would measure itself. Timestamps are time.perf_counter(), CLOCK_MONOTONIC on Linux:
    one clock for every process of the machine, so the pooled requests share a time line."""
    raw, clients = [], 0
    for part in parts:
        result = json.loads(part.read_text())["results"][0]
        raw += result["rawResults"]
        clients += result["concurrencyResults"][0]["concurrency"]
    ok = [r for r in raw if r["status"] == "success" and r["tokenTimestamps"]]
    per_request = []
    for r in ok:
        stamps = r["tokenTimestamps"]
        duration = r["requestEnd"] - stamps[0]
        per_request.append({"ttft": (stamps[0] - r["requestStart"]) * 1000,
                            "tps": r["outputTokenCount"] / duration if duration > 0 else 0.0,
                            "itl": [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])],
                            "e2e": (r["requestEnd"] - r["requestStart"]) * 1000})
    wall = (max(r["tokenTimestamps"][-1] for r in ok) - min(r["requestStart"] for r in raw)) if ok else 0.0
    metrics = {"ttft": _stats_of([m["ttft"] for m in per_request]), "tps": _stats_of([m["tps"] for m in per_request]),
               "itl": _stats_of([v for m in per_request for v in m["itl"]]),
               "e2eLatency": _stats_of([m["e2e"] for m in per_request]),
               "successRate": 100.0 * len(ok) / len(raw) if raw else 0.0, "totalRequests": len(raw)}
    level = {"concurrency": clients, "processes": len(parts),
             "requestThroughput": len(ok) / wall if wall > 0 else 0.0,
             "tokenThroughput": sum(r["outputTokenCount"] for r in raw) / wall if wall > 0 else 0.0,
             "metrics": metrics}
    return {"results": [{"concurrencyResults": [level], "rawResults": raw}]}


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[0] == "prompt":
        text, count = fit_prompt(argv[1].rstrip("/"), argv[2], int(argv[3]))
        print(count, file=sys.stderr)
        print(text)
    elif len(argv) == 2 and argv[0] == "summary":
        sys.stdout.write(summary(Path(argv[1])))
    elif len(argv) >= 3 and argv[0] == "merge":
        Path(argv[1]).write_text(json.dumps(merge([Path(a) for a in argv[2:]])))
    elif len(argv) == 2 and argv[0] == "threads":
        print(json.dumps(thread_cpu(int(argv[1]))))
    elif len(argv) == 3 and argv[0] == "compare":
        sys.stdout.write(compare(Path(argv[1]), Path(argv[2])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
