"""Constrained decoding under load (issue 53, point 5): N streams with a json_schema beside N unconstrained ones on
any OpenAI-compatible server, against 2N unconstrained streams alone; the throughput lost and the first-token
latency of a constrained request (its grammar's compile inside).

    python scripts/bench/structured_load.py URL OUTDIR [--streams 32] [--max-tokens 128] [--rounds 2]

Each constrained request carries a schema of its own (a property named after the request), so every one pays a
compile, as a client with per-request schemas would. Unconstrained requests ask ignore_eos so that their lengths
are max_tokens; constrained ones end when their JSON is whole (the schema's long strings keep them near
max_tokens: most are cut there, counted apart; the JSON of those that ended is validated). Writes
OUTDIR/structured_load.json and OUTDIR/structured_load.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path

import httpx


def schema_for(index: int) -> dict:
    return {"type": "object", "properties": {
        f"field_{index}": {"type": "string", "minLength": 200, "maxLength": 400},
        "count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}}},
        "required": [f"field_{index}", "count", "tags"], "additionalProperties": False}


async def one_stream(client: httpx.AsyncClient, url: str, index: int, constrained: bool, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": f"Describe item {index} as JSON."}], "max_tokens": max_tokens,
            "temperature": 0.8, "seed": index, "stream": True, "stream_options": {"include_usage": True}}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": f"item{index}", "schema": schema_for(index), "strict": True}}
    else:
        body["ignore_eos"] = True
    started = time.perf_counter()
    first = None
    tokens = 0
    text = []
    finish = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"constrained": constrained, "error": f"{response.status_code} {(await response.aread())[:200]!r}"}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - started
                    text.append(piece)
    out = {"constrained": constrained, "ttft_s": first, "seconds": time.perf_counter() - started, "tokens": tokens,
           "finish_reason": finish}
    if constrained and finish == "stop":  # one cut at max_tokens is a JSON's beginning, judged by nothing here
        try:
            json.loads("".join(text))
            out["valid_json"] = True
        except ValueError:
            out["valid_json"] = False
    return out


async def run(url: str, constrained: int, free: int, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=constrained + free + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        started = time.perf_counter()
        jobs = [one_stream(client, url, i, True, max_tokens) for i in range(constrained)]
        jobs += [one_stream(client, url, 1000 + i, False, max_tokens) for i in range(free)]
        results = await asyncio.gather(*jobs)
        wall = time.perf_counter() - started
    errors = [r["error"] for r in results if "error" in r]
    done = [r for r in results if "error" not in r]
    tokens = sum(r["tokens"] for r in done)

    def ttft(kind: bool) -> dict:
        values = sorted(r["ttft_s"] for r in done if r["constrained"] == kind and r["ttft_s"] is not None)
        if not values:
            return {}
        return {"p50_ms": 1000 * statistics.median(values), "p90_ms": 1000 * values[math.ceil(0.9 * len(values)) - 1],
                "max_ms": 1000 * values[-1]}

    return {"constrained": constrained, "unconstrained": free, "wall_s": wall, "tokens": tokens,
            "tokens_per_s": tokens / wall, "errors": errors,
            "valid_json": sum(1 for r in done if r.get("valid_json")),
            "ended": sum(1 for r in done if r["constrained"] and r["finish_reason"] == "stop"),
            "at_max_tokens": sum(1 for r in done if r["constrained"] and r["finish_reason"] == "length"),
            "ttft_constrained": ttft(True), "ttft_unconstrained": ttft(False)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--streams", type=int, default=32, help="constrained streams (and as many unconstrained)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="each load this many times; the best throughput kept")
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    url = args.url.rstrip("/")
    asyncio.run(run(url, 0, 4, 8))  # warm-up: the server's first requests, not measured
    report = {"baseline": [], "mixed": []}
    for _ in range(args.rounds):
        report["baseline"].append(asyncio.run(run(url, 0, 2 * args.streams, args.max_tokens)))
        report["mixed"].append(asyncio.run(run(url, args.streams, args.streams, args.max_tokens)))
    base = max(report["baseline"], key=lambda r: r["tokens_per_s"])
    mixed = max(report["mixed"], key=lambda r: r["tokens_per_s"])
    report["throughput_loss"] = 1 - mixed["tokens_per_s"] / base["tokens_per_s"]
    (args.outdir / "structured_load.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    lines = [
        f"# {args.streams} json_schema streams beside {args.streams} unconstrained, against {2 * args.streams} "
        f"unconstrained ({args.max_tokens} tokens max, best of {args.rounds})", "",
        "| load | tokens/s | TTFT p50 constrained | p90 | TTFT p50 unconstrained | p90 | valid JSON of those ended | "
        "cut at max_tokens | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in (("unconstrained", base), ("mixed", mixed)):
        c, u = r["ttft_constrained"], r["ttft_unconstrained"]
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {c.get('p50_ms', 0):.0f} ms | {c.get('p90_ms', 0):.0f} ms | "
                     f"{u.get('p50_ms', 0):.0f} ms | {u.get('p90_ms', 0):.0f} ms | {r['valid_json']}/{r['ended']} | "
                     f"{r['at_max_tokens']}/{r['constrained']} | {len(r['errors'])} |")
    lines += ["", f"throughput loss: {100 * report['throughput_loss']:.1f}% (target: at most 10%)"]
    (args.outdir / "structured_load.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 1 if base["errors"] or mixed["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
