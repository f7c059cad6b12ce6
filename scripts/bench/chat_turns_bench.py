"""A multi-turn chat load against an OpenAI-compatible server (`rocmforge serve`, llama.cpp's llama-server): C
conversations run together, turn by turn, each turn's prompt the whole conversation so far, so that a server that
keeps what it computed (a prefix cache, llama-server's cache_prompt) evaluates only what is new. Issue 52, point 6.

    python scripts/bench/chat_turns_bench.py URL OUTDIR [--conversations 32 --turns 8 --turn-tokens 200
                                                          --reply-tokens 32 --label NAME]

The prompts are token ids (/v1/completions takes an array of ids on both servers), so both servers get exactly the
same prompts: turn t of a conversation is its turn t - 1 prompt, then `reply-tokens` ids standing for the reply (the
same for both servers: a server's own reply text would tokenize differently on each), then `turn-tokens` new ids.
What a server can reuse is therefore the previous turn's whole prompt. Ids are drawn from [1000, 30000) (--ids),
inside every vocabulary of the models measured (Llama-3's 128,256, SmolLM2's 49,152), from one seed. Each request streams
(time to first token: from sending the request to its first chunk with text), asks for exactly `reply-tokens`
(ignore_eos) and sends temperature 0. All C requests of a turn start together; the turn ends when all have ended.

Writes OUTDIR/<label>.json (every request's figures) and prints a markdown table: per turn, time to first token
p50 / p99 and the turn's seconds; over the run, tokens per second (prompt + generated, and generated alone).
With --compare A.json B.json ... (no URL) it prints the runs side by side instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np



def stream_one(client: httpx.Client, url: str, model: str, prompt: list[int], reply_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": reply_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    usage = None
    with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if first is None and any(choice.get("text") for choice in event.get("choices", [])):
                first = time.perf_counter()
            if event.get("usage"):
                usage = event["usage"]
    ended = time.perf_counter()
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {"ttft": (first or ended) - started, "seconds": ended - started, "prompt_tokens": len(prompt),
            "completion_tokens": (usage or {}).get("completion_tokens", reply_tokens),
            "cached_tokens": details.get("cached_tokens")}


def run(args) -> dict:
    rng = np.random.default_rng(args.seed)
    histories: list[list[int]] = [[] for _ in range(args.conversations)]
    turns = []
    with httpx.Client(limits=httpx.Limits(max_connections=args.conversations + 4)) as client:
        model = client.get(args.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        for turn in range(1, args.turns + 1):
            for history in histories:
                if turn > 1:  # the reply of the turn before (see the module docstring)
                    history += rng.integers(*args.ids, args.reply_tokens).tolist()
                history += rng.integers(*args.ids, args.turn_tokens).tolist()
            results: list[dict | None] = [None] * len(histories)

            def send(i: int) -> None:
                results[i] = stream_one(client, args.url, model, list(histories[i]), args.reply_tokens)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(histories))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - t0
            if any(r is None for r in results):
                raise SystemExit(f"turn {turn}: a request failed")
            ttfts = [r["ttft"] for r in results]
            turns.append({"turn": turn, "seconds": seconds, "ttft_p50": float(np.percentile(ttfts, 50)),
                          "ttft_p99": float(np.percentile(ttfts, 99)), "requests": results})
            print(f"{args.label} turn {turn}: TTFT p50 {turns[-1]['ttft_p50'] * 1e3:,.1f} ms, {seconds:.2f} s",
                  file=sys.stderr)
    prompt = sum(r["prompt_tokens"] for t in turns for r in t["requests"])
    generated = sum(r["completion_tokens"] for t in turns for r in t["requests"])
    seconds = sum(t["seconds"] for t in turns)
    return {"label": args.label, "url": args.url, "model": model, "conversations": args.conversations,
            "turns_count": args.turns, "turn_tokens": args.turn_tokens, "reply_tokens": args.reply_tokens,
            "seed": args.seed, "turns": turns, "seconds": seconds, "prompt_tokens": prompt,
            "generated_tokens": generated, "tokens_per_second": (prompt + generated) / seconds,
            "generated_per_second": generated / seconds}


def cached_share(run: dict) -> str:
    """The share of the run's prompt tokens its server reported cached (usage.prompt_tokens_details.cached_tokens)."""
    requests = [r for t in run["turns"] for r in t["requests"]]
    if any(r.get("cached_tokens") is None for r in requests):
        return "not reported"
    cached = sum(r["cached_tokens"] for r in requests)
    return f"{cached:,} of {run['prompt_tokens']:,} ({cached / run['prompt_tokens']:.0%})"


def table(runs: list[dict]) -> str:
    first = runs[0]
    lines = [f"{first['conversations']} conversations x {first['turns_count']} turns, {first['turn_tokens']} new tokens "
             f"and {first['reply_tokens']} reply tokens a turn", "",
             "| turn | " + " | ".join(f"{r['label']} TTFT p50 / p99" for r in runs) + " |",
             "| ---: |" + " ---: |" * len(runs)]
    for i, turn in enumerate(first["turns"]):
        cells = [f"{r['turns'][i]['ttft_p50'] * 1e3:,.0f} / {r['turns'][i]['ttft_p99'] * 1e3:,.0f} ms" for r in runs]
        lines.append(f"| {turn['turn']} | " + " | ".join(cells) + " |")
    lines += ["", "| run | seconds | tokens/s (prompt + generated) | generated/s | TTFT p50 from turn 3, median of turns "
              "| prompt tokens the server found cached |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        late = [t["ttft_p50"] for t in r["turns"][2:]] or [t["ttft_p50"] for t in r["turns"]]
        lines.append(f"| {r['label']} | {r['seconds']:,.2f} | {r['tokens_per_second']:,.1f} | "
                     f"{r['generated_per_second']:,.1f} | {statistics.median(late) * 1e3:,.1f} ms | {cached_share(r)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?")
    parser.add_argument("outdir", nargs="?")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--turn-tokens", type=int, default=200)
    parser.add_argument("--reply-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ids", type=int, nargs=2, default=(1000, 30000), metavar=("LOW", "HIGH"),
                        help="prompt token ids are drawn from [LOW, HIGH)")
    parser.add_argument("--label", default="server")
    parser.add_argument("--compare", nargs="+", metavar="RUN_JSON")
    args = parser.parse_args()
    if args.compare:
        print(table([json.loads(Path(p).read_text()) for p in args.compare]))
        return
    if not args.url or not args.outdir:
        parser.error("give URL and OUTDIR (or --compare RUN_JSON ...)")
    result = run(args)
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.label}.json").write_text(json.dumps(result, indent=2))
    print(table([result]))


if __name__ == "__main__":
    main()
