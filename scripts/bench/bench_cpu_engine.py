"""Engine throughput on the cpu backend (or --device) at several numbers of concurrent requests.

    python scripts/bench/bench_cpu_engine.py                      # the demo model, 1, 4 and 16 requests
    python scripts/bench/bench_cpu_engine.py --concurrency 1 8 --prompt-tokens 128 --json

Each request: --prompt-tokens fixed pseudo-random token ids (speed does not depend on them) and up
to --gen-tokens tokens, greedy unless --sampling says otherwise (fewer only if it emits an end-of-text token;
the counts are the real ones). All requests of a run are submitted at once and the engine steps until they have all ended:
continuous batching evaluates the prompts (in chunks of --max-step-tokens) and then decodes every
request's next token in one forward pass per step.

Reported per concurrency, from one timed run after a warm-up request (this script is for a shared
machine too: the load average is printed beside the figures):
  total tok/s     (prompt + generated tokens) / wall time of the run
  gen tok/s       generated tokens / wall time of the run
  decode tok/s    tokens generated in decode-only steps / the time of those steps (the batched
                  decode rate, without prompt evaluation)
  step ms         mean time of a decode-only step (one token for every running request)
  TTFT s          mean time from submission to a request's first token
  burst tok/s     llama-benchy's generation throughput of a batch: the tokens after each request's first over the
                  time from the first request's first token to the last request's last (the engine alone under
                  scripts/bench/serve_benchy.sh's load: beside the server's figure, what the HTTP layer costs)

--rounds-of K --rounds R: the load of scripts/bench/serve_bench.sh's load generator instead, without HTTP: the
concurrency's requests in groups of K (as its processes hold their clients), each group submitting its K
requests together and the next K only once all K have ended, R times. Beside the server's figure under that
load, the difference is what the HTTP layer costs; beside `rocmforge bench -b`, what the load's rounds and
prompts cost the engine itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

TOKEN_SEED = 1234


def bench_prompts(vocab_size: int, count: int, length: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(TOKEN_SEED)
    # Skip the first ids: special tokens in most vocabularies.
    return [[int(t) for t in rng.integers(100, vocab_size, size=length)] for _ in range(count)]


# --sampling: what each request samples with. greedy: as `rocmforge bench` decodes; openai: the whole vocabulary at
# temperature 1, what `rocmforge serve` gives a request without sampling options (OpenAI's defaults); llama:
# llama.cpp's defaults, what `rocmforge generate` samples with unless told otherwise.
SAMPLING = {"greedy": dict(temperature=0.0), "openai": dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
            "llama": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)}


def run_once(engine, prompts: list[list[int]], gen_tokens: int, sampling: str = "greedy") -> dict:
    from hipcore.engine.sampler import SamplingParams

    params = SamplingParams(**SAMPLING[sampling], max_tokens=gen_tokens, seed=TOKEN_SEED)
    ids = [engine.submit(p, params) for p in prompts]
    decode_seconds, decode_tokens, decode_steps = 0.0, 0, 0
    start = time.perf_counter()
    while engine.has_work():
        prompt_before, generated_before = engine.stats.prompt_tokens, engine.stats.generated_tokens
        t0 = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - t0
        if engine.stats.prompt_tokens == prompt_before:  # a decode-only step
            decode_seconds += seconds
            decode_tokens += engine.stats.generated_tokens - generated_before
            decode_steps += 1
    wall = time.perf_counter() - start
    records = [engine.finished_record(i) for i in ids]
    generated = sum(len(r.generated_tokens[0]) for r in records)
    prompt = sum(len(p) for p in prompts)
    # The burst's window from the engine's own times, each since its request's submission (the requests were
    # submitted together: microseconds apart): the first first token to the last request's end.
    after_first = sum(max(0, len(r.generated_tokens[0]) - 1) for r in records)
    window = max(r.seconds for r in records) - min(r.time_to_first_token or r.seconds for r in records)
    return {
        "requests": len(prompts), "prompt_tokens": prompt, "generated_tokens": generated, "wall_s": wall,
        "total_tok_s": (prompt + generated) / wall, "gen_tok_s": generated / wall,
        "decode_tok_s": decode_tokens / decode_seconds if decode_seconds else 0.0,
        "decode_step_ms": 1e3 * decode_seconds / decode_steps if decode_steps else 0.0,
        "ttft_s": statistics.mean(r.time_to_first_token or 0.0 for r in records),
        "burst_tok_s": after_first / window if window > 0 else 0.0, "burst_window_s": window,
        "endings": sorted({r.ending.value for r in records}),
    }


def run_rounds(engine, vocab: int, concurrency: int, group: int, rounds: int, prompt_tokens: int, gen_tokens: int,
               sampling: str = "greedy") -> dict:
    """run_once's figures for the load of --rounds-of: concurrency // group groups, each `rounds` rounds of
    `group` requests submitted together, a group's next round as soon as its last request of the round ends."""
    from hipcore.engine.sampler import SamplingParams

    if group < 1 or concurrency % group:
        raise SystemExit(f"--rounds-of {group} must divide the concurrency {concurrency}")
    params = SamplingParams(**SAMPLING[sampling], max_tokens=gen_tokens, seed=TOKEN_SEED)
    prompts = bench_prompts(vocab, concurrency, prompt_tokens)
    groups = [prompts[g:g + group] for g in range(0, concurrency, group)]
    left = [rounds] * len(groups)
    live: list[list[int]] = [[] for _ in groups]
    ids: list[int] = []
    start = time.perf_counter()
    while True:
        for g, requests in enumerate(live):
            if left[g] and all(engine.finished_record(i) is not None for i in requests):
                live[g] = [engine.submit(p, params) for p in groups[g]]
                ids += live[g]
                left[g] -= 1
        if not engine.has_work():
            break
        engine.step()
    wall = time.perf_counter() - start
    records = [engine.finished_record(i) for i in ids]
    generated = sum(len(r.generated_tokens[0]) for r in records)
    prompt = prompt_tokens * len(ids)
    return {
        "requests": len(ids), "prompt_tokens": prompt, "generated_tokens": generated, "wall_s": wall,
        "total_tok_s": (prompt + generated) / wall, "gen_tok_s": generated / wall, "decode_tok_s": 0.0,
        "decode_step_ms": 0.0, "ttft_s": statistics.mean(r.time_to_first_token or 0.0 for r in records),
        "burst_tok_s": 0.0, "burst_window_s": 0.0,  # a burst's figure: run_once's loads only
        "endings": sorted({r.ending.value for r in records}), "rounds_of": group, "rounds": rounds,
    }


def machine() -> dict:
    import numpy as np

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "numpy": np.__version__,
            "python": platform.python_version(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF model (default: the demo model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="requests submitted together")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--max-step-tokens", type=int, default=512, help="prompt tokens evaluated per step")
    parser.add_argument("--kv-dtype", default="f16")
    parser.add_argument("--sampling", choices=sorted(SAMPLING), default="greedy",
                        help="greedy (default, as `rocmforge bench` decodes); openai: temperature 1 over the whole "
                             "vocabulary, what `rocmforge serve` gives a request without sampling options; llama: "
                             "llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), what "
                             "`rocmforge generate` uses")
    parser.add_argument("--rounds-of", type=int, default=0,
                        help="requests in groups of this many, each group in rounds (serve_bench.sh's load without HTTP)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each group (with --rounds-of)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), or a GPU (cuda, hip, auto): the engine alone under the load a server "
                             "benchmark gives it (scripts/bench/serve_bench.sh), to tell the HTTP layer's cost")
    args = parser.parse_args()

    from hipcore.gguf.demo_model import INSTALL_HINT, find_demo_model
    from hipcore.engine.loader import LoadOptions, load_model

    path = args.model or find_demo_model()
    if path is None:
        print(f"no --model and the demo model is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    most = max(args.concurrency)
    per_request = args.prompt_tokens + args.gen_tokens
    options = LoadOptions(device=args.device, ctx_size=per_request + 16, max_seqs=most, max_step_tokens=args.max_step_tokens,
                          kv_dtype=args.kv_dtype, kv_blocks=most * (-(-per_request // 16) + 1))
    t0 = time.perf_counter()
    with load_model(str(path), options) as model:
        load_s = time.perf_counter() - t0
        vocab = model.config.vocab_size
        run_once(model.engine, bench_prompts(vocab, 1, 8), 4)  # warm-up: first-use costs out of the timings
        results = []
        for n in args.concurrency:
            if args.rounds_of:
                results.append(run_rounds(model.engine, vocab, n, args.rounds_of, args.rounds, args.prompt_tokens,
                                          args.gen_tokens, args.sampling))
            else:
                results.append(run_once(model.engine, bench_prompts(vocab, n, args.prompt_tokens), args.gen_tokens,
                                        args.sampling))
            if not args.json:
                print(f"  {n} concurrent: done in {results[-1]['wall_s']:.1f} s", file=sys.stderr)
        model.cache.check_invariants(quiescent=True)
    report = {"model": str(path), "load_s": load_s, "prompt_tokens_each": args.prompt_tokens,
              "sampling": args.sampling,
              "gen_tokens_each": args.gen_tokens, "max_step_tokens": args.max_step_tokens, "kv_dtype": args.kv_dtype,
              "machine": machine(), "runs": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    m = report["machine"]
    print(f"{Path(str(path)).name} on the {args.device} backend: {args.prompt_tokens} prompt + up to {args.gen_tokens} generated "
          f"tokens per request, {args.sampling} sampling, "
          f"KV {args.kv_dtype}")
    print(f"{m['cpu']}, {m['cpu_count']} CPUs, load average {m['load_average'][0]:.1f}, numpy {m['numpy']}, "
          f"commit {m['commit']}, {m['date']}")
    header = (f"{'requests':>8} {'total tok/s':>12} {'gen tok/s':>10} {'decode tok/s':>13} {'burst tok/s':>12} "
              f"{'step ms':>8} {'TTFT s':>7} {'wall s':>7}")
    print(header)
    for r in results:
        print(f"{r['requests']:>8} {r['total_tok_s']:>12.1f} {r['gen_tok_s']:>10.1f} {r['decode_tok_s']:>13.1f} "
              f"{r['burst_tok_s']:>12.1f} {r['decode_step_ms']:>8.0f} {r['ttft_s']:>7.2f} {r['wall_s']:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
