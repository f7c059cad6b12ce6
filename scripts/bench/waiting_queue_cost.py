"""Host cost of an engine step while a long queue of long prompts waits, with prefix caching on.

A MEASURING TOOL. The real Engine, Scheduler and KvCache (prefix caching on, the demo model's KV shape, 16-token
blocks) with engine_host_cost.py's InstantRunner (computes nothing). --waiting prompts of --prompt-tokens distinct
tokens each are submitted at once into a pool that holds --fit of them, so that the queue's head waits for blocks
over many steps while the running prompts are evaluated and decode. Each step's host time (Engine.step minus the
runner, in wall and in the thread's CPU time) is timed; the block-key hash calls are counted (the cache's hash wrapped). Reported: the median and mean
host us per step over every step until the queue drained and every request ended, the steps, and hash calls per
step and per request (each prompt has prompt-tokens / 16 full blocks).

    PYTHONPATH=$PWD python scripts/bench/waiting_queue_cost.py                          # 64 x 2,000 tokens
    PYTHONPATH=$PWD python scripts/bench/waiting_queue_cost.py --waiting 64 --prompt-tokens 2000 --repeat 3 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_host_cost import MAX_STEP_TOKENS, InstantRunner, SAMPLE_TEXT, machine  # noqa: E402


def build(model_path: str, seqs: int, fit: int, ctx: int):
    from hipcore.engine.engine import Engine
    from hipcore.gguf.file import GGUFFile
    from hipcore.kvcache.cache import KvCache
    from hipcore.kvcache.config import KvCacheConfig
    from hipcore.runtime.selection import pick_device
    from hipcore.tokenizer.tokenizer import Tokenizer

    gguf = GGUFFile.open(model_path)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    cfg = gguf.config
    block_size = 16
    kv_config = KvCacheConfig(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                              num_blocks=fit * -(-ctx // block_size) + 1, block_size=block_size, dtype="f16")
    calls = [0]

    def counted_hash(item: object) -> int:
        calls[0] += 1
        return hash(item)

    cache = KvCache(pick_device("cpu").device, kv_config, prefix_caching=True, model_identity=Path(model_path).name,
                    block_hash=counted_hash)
    text_ids = [t for t in tokenizer.encode(SAMPLE_TEXT * 4) if t not in tokenizer.eot_ids]
    runner = InstantRunner(cfg, kv_config, text_ids)
    engine = Engine(runner, tokenizer, cache, max_seqs=seqs, max_step_tokens=MAX_STEP_TOKENS, max_context=ctx)
    return engine, runner, cache, calls


def one_run(engine, runner, calls, waiting: int, prompt_tokens: int, max_tokens: int, run: int) -> dict:
    from hipcore.engine.sampler import SamplingParams

    vocab = engine.runner.config.vocab_size
    # distinct from the first token on (no prefix hits: the cost measured is the lookups', not the savings)
    prompts = [[100 + (run * 7919 + i * 131 + j * 37) % (vocab - 200) for j in range(prompt_tokens)] for i in range(waiting)]
    for prompt in prompts:
        engine.submit(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    runner.reset_timers()
    calls[0] = 0
    host_us: list[float] = []
    cpu_us: list[float] = []
    while engine.has_work():
        before, cpu_before = runner.runner_s, runner.runner_cpu_s
        t0, c0 = time.perf_counter(), time.thread_time()
        engine.step()
        host_us.append(1e6 * (time.perf_counter() - t0 - (runner.runner_s - before)))
        cpu_us.append(1e6 * (time.thread_time() - c0 - (runner.runner_cpu_s - cpu_before)))
    return {"steps": len(host_us), "host_us": statistics.median(host_us), "host_us_mean": statistics.fmean(host_us),
            "cpu_us": statistics.median(cpu_us), "cpu_us_mean": statistics.fmean(cpu_us), "hash_calls": calls[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file (its tokenizer and KV shape); default: the demo model")
    parser.add_argument("--waiting", type=int, default=64, help="prompts submitted at once")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--fit", type=int, default=4, help="prompts the KV pool holds at once")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median of their figures")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from hipcore.gguf.demo_model import model_or_demo

    try:
        model = model_or_demo(args.model)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    ctx = args.prompt_tokens + args.max_tokens + 16
    engine, runner, cache, calls = build(model, args.waiting, args.fit, ctx)
    try:
        runs = [one_run(engine, runner, calls, args.waiting, args.prompt_tokens, args.max_tokens, r)
                for r in range(args.repeat)]
        cache.flush_prefix_cache()
        cache.check_invariants(quiescent=True)
    finally:
        cache.close()
    blocks = args.prompt_tokens // 16
    result = {key: statistics.median(run[key] for run in runs) for key in ("steps", "host_us", "host_us_mean", "cpu_us", "cpu_us_mean", "hash_calls")}
    report = {"model": model, "waiting": args.waiting, "prompt_tokens": args.prompt_tokens, "fit": args.fit,
              "max_tokens": args.max_tokens, "machine": machine(), "runs": runs, **result,
              "hash_calls_per_request": result["hash_calls"] / args.waiting, "full_blocks_per_prompt": blocks}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    m = report["machine"]
    print(f"{args.waiting} prompts x {args.prompt_tokens} tokens, a pool for {args.fit}, {args.max_tokens} tokens each; "
          f"{Path(model).name}'s KV shape, instant runner, prefix caching on; commit {m['commit']}, "
          f"{m['cpu_count']} CPUs, load {m['load_average'][0]:.1f}")
    per_run = ", ".join(f"{r['host_us']:.0f}/{r['host_us_mean']:.0f}" for r in runs)
    print(f"steps {result['steps']:.0f}, host us per step: median {result['host_us']:.0f}, mean "
          f"{result['host_us_mean']:.0f} (runs, median/mean: {per_run}); thread CPU us per step: median "
          f"{result['cpu_us']:.0f}, mean {result['cpu_us_mean']:.0f}")
    print(f"block-key hash calls: {result['hash_calls']:.0f} ({report['hash_calls_per_request']:.1f} per request of "
          f"{blocks} full blocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
