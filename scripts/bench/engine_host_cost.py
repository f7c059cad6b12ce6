"""Host cost of one batched decode step of the engine, with the device's work taken out.

A MEASURING TOOL. The real Engine runs (its Scheduler, the KvCache with the demo model's shape, the batch
builder, the SamplingRows of device sampling, the Samplers' draws, the StopCheckers, the tokenizer's stream
decoders, the per-request event queues, the stats); only the runner is replaced by `InstantRunner`, a
SamplingRunner whose execute_sampled computes nothing and returns, for each sampled row, the next token of a
fixed English text (never an end-of-generation token), each sequence at its own offset. What a step then
costs is the host work that a GPU's replayed graph waits behind (or the GPU waits behind, when the host is
slower).

For each batch size (default 1, 8, 32, 64 sequences) and each sampling config (greedy; sampled: temperature
0.8, top-p 0.95, llama.cpp's other defaults, which the device sampler takes), the script submits that many
requests (distinct prompts of 16 to 31 tokens, so that the sequences take their new KV blocks on different
steps, as a server's do), steps until every one is decoding, then times --steps decode-only steps one by one. Reported per step, in microseconds:

    engine us     Engine.step's wall time minus the time spent inside the runner's execute_sampled (which
                  is the device's, on a GPU; here it is almost nothing)
    cpu us        the same in the thread's CPU time (steadier than wall time where other processes share
                  the cores; a step that waited for a core shows in wall time only)
    pack us       the GPU runner's host packing of the same step, measured on the cpu device: the checks
                  of ModelRunner._run (StepBatch.validate) and StepInputs.pack for the decode bucket, its
                  upload a host memcpy here (0 with --no-pack)

Each figure is the median over the timed steps of a run; with --repeat R the runs are repeated R times
(fresh requests each) and the median of the runs' medians is printed, with the spread of the run medians.
This machine may be shared: compare figures taken back to back, and look at the spread.

    PYTHONPATH=$PWD python scripts/bench/engine_host_cost.py                      # 1 8 32 64, greedy and sampled
    PYTHONPATH=$PWD python scripts/bench/engine_host_cost.py --seqs 32 --repeat 5 --json
    PYTHONPATH=$PWD python scripts/bench/engine_host_cost.py --seqs 32 --profile OUTDIR   # cProfile of the timed steps

The tokenizer and the KV cache shape are the demo model's (SmolLM2-135M-Instruct; no weights are loaded), or
--model's. The KV cache is sized for the run's sequences at --ctx tokens each.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]  # the repository
MAX_STEP_TOKENS = 512

SAMPLE_TEXT = (
    "The history of computing is a story of layers. Each generation of engineers builds on the abstractions "
    "left by the one before, and each layer hides the details of the layer below it. A programmer who writes "
    "a web server rarely thinks about the instructions the processor executes, and the designer of a "
    "processor rarely thinks about the web servers that will run on it. Yet the boundaries leak: a cache "
    "miss, a lock held too long, a copy made once per byte instead of once per buffer, and the layers above "
    "feel it. Good systems are built by people who can move between the layers when they must. Café, naïve, "
    "日本語のテキスト, emoji 🙂 and other characters that take several bytes keep the decoder honest. "
)


class InstantRunner:
    """A SamplingRunner that computes nothing (measuring only): each sampled row gets the next token of a fixed
    text, sequence r of the step at offset 7 r. With `inputs` (a StepInputs on the cpu device) it also does
    the GPU runner's host work of the step (validate + pack + upload) and times it apart."""

    def __init__(self, config, kv_config, text_ids: list[int], inputs=None):
        import numpy as np

        self.config = config
        self._kv = kv_config
        n = len(text_ids)
        # Every step's answer prepared up front, so that the runner's own time is a slice.
        ring = np.array(text_ids, dtype=np.int32)
        self._table = np.stack([np.roll(ring, -7 * r) for r in range(128)], axis=1)  # [n, 128]: row t = step t
        self._n = n
        self._cursor = 0
        self.inputs = inputs
        self.runner_s = 0.0  # wall time inside execute_sampled / execute (pack included)
        self.runner_cpu_s = 0.0  # the same in this thread's CPU time
        self.pack_s: list[float] = []  # per step: validate + pack + upload

    def reset_timers(self) -> None:
        self.runner_s = self.runner_cpu_s = 0.0
        self.pack_s = []

    def _pack(self, batch, sampling) -> None:
        from hipcore.model.decode_graphs import BUCKETS

        t0 = time.perf_counter()
        kv = self._kv
        n = batch.num_tokens
        batch.validate(kv.block_size, kv.num_blocks, kv.window_blocks if kv.layer_windows else None)
        if batch.is_decode_only:
            bucket = next(b for b in BUCKETS if b >= n)
            self.inputs.pack(batch, padded_tokens=bucket, all_rows=True, sampling=sampling, stream=None)
        else:
            self.inputs.pack(batch, padded_tokens=n, all_rows=False, sampling=sampling, stream=None)
        self.pack_s.append(time.perf_counter() - t0)

    def _tokens(self, rows: int):
        out = self._table[self._cursor % self._n, :rows]
        self._cursor += 1
        return out

    def execute_sampled(self, batch, sampling):
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.inputs is not None:
            self._pack(batch, sampling)
        out = self._tokens(int(batch.sample_rows.shape[0]))
        self.runner_s += time.perf_counter() - t0
        self.runner_cpu_s += time.thread_time() - c0
        return out

    def execute(self, batch):  # host sampling (not taken by the configs here): logits favouring the text
        import numpy as np

        t0, c0 = time.perf_counter(), time.thread_time()
        rows = int(batch.sample_rows.shape[0])
        logits = np.zeros((rows, self.config.vocab_size), dtype=np.float32)
        logits[np.arange(rows), self._tokens(rows)] = 30.0
        self.runner_s += time.perf_counter() - t0
        self.runner_cpu_s += time.thread_time() - c0
        return logits


def sampling_configs():
    from hipcore.engine.sampler import SamplingParams

    return {
        "greedy": lambda max_tokens: SamplingParams(temperature=0.0, max_tokens=max_tokens),
        "sampled": lambda max_tokens: SamplingParams(temperature=0.8, top_p=0.95, seed=1234, max_tokens=max_tokens),
    }


def build(model_path: str, max_seqs: int, ctx: int, pack: bool):
    from hipcore.engine.engine import Engine
    from hipcore.gguf.file import GGUFFile
    from hipcore.kvcache.cache import KvCache
    from hipcore.kvcache.config import KvCacheConfig
    from hipcore.model.activations import step_capacity
    from hipcore.model.step_inputs import StepInputs
    from hipcore.runtime.selection import pick_device
    from hipcore.tokenizer.tokenizer import Tokenizer

    gguf = GGUFFile.open(model_path)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    cfg = gguf.config
    device = pick_device("cpu").device
    block_size = 16
    blocks_per_seq = -(-ctx // block_size)
    windows = tuple(cfg.layer_window(i) for i in range(cfg.n_layers))
    kv_config = KvCacheConfig(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                              num_blocks=max_seqs * blocks_per_seq + 1, block_size=block_size, dtype="f16",
                              layer_windows=windows)
    if kv_config.layer_windows:
        kv_config = KvCacheConfig(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                                  num_blocks=kv_config.num_blocks, block_size=block_size, dtype="f16",
                                  layer_windows=windows, window_blocks=kv_config.window_pool_blocks(max_seqs, MAX_STEP_TOKENS))
    cache = KvCache(device, kv_config)
    text_ids = [t for t in tokenizer.encode(SAMPLE_TEXT * 4) if t not in tokenizer.eot_ids]
    inputs = None
    if pack:
        tokens, rows = step_capacity(MAX_STEP_TOKENS, max_seqs)
        inputs = StepInputs(device, tokens=tokens, rows=rows, seqs=max(max_seqs, rows), max_blocks=blocks_per_seq,
                            window_group=bool(kv_config.layer_windows))
    runner = InstantRunner(cfg, kv_config, text_ids, inputs)
    engine = Engine(runner, tokenizer, cache, max_seqs=max_seqs, max_step_tokens=MAX_STEP_TOKENS, max_context=ctx)
    return engine, runner, cache, inputs


def prompts(tokenizer_vocab: int, count: int, length: int) -> list[list[int]]:
    """`count` prompts of length to length + 15 tokens: the sequences fill their KV blocks on different steps, as
    in a server (with equal lengths every sequence would take a new block on the same step, one in 16)."""
    return [[100 + (i * 131 + j * 37) % (tokenizer_vocab - 200) for j in range(length + i % 16)] for i in range(count)]


def one_run(engine, runner, seqs: int, make_params, steps: int, warmup: int, prompt_tokens: int,
            profile: cProfile.Profile | None) -> dict:
    from hipcore.engine.request import Phase

    # requests whose prompt finished early decode while the others' prompts are evaluated: room for that
    max_tokens = warmup + steps + prompt_steps(seqs, prompt_tokens + 15) + 8
    ids = [engine.submit(p, make_params(max_tokens)) for p in prompts(engine.runner.config.vocab_size, seqs, prompt_tokens)]
    requests = [engine.request(i) for i in ids]
    # prompt evaluation, then a few decode steps out of the timings (first-use costs)
    for _ in range(1000):
        engine.step()
        if all(r is not None and r.phase == Phase.DECODE for r in requests):
            break
    for _ in range(warmup):
        engine.step()
    runner.reset_timers()
    engine_us: list[float] = []
    engine_cpu_us: list[float] = []
    generated_before = engine.stats.generated_tokens
    if profile is not None:
        profile.enable()
    for _ in range(steps):
        runner_before, runner_cpu_before = runner.runner_s, runner.runner_cpu_s
        t0, c0 = time.perf_counter(), time.thread_time()
        engine.step()
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        engine_us.append(1e6 * (wall - (runner.runner_s - runner_before)))
        engine_cpu_us.append(1e6 * (cpu - (runner.runner_cpu_s - runner_cpu_before)))
    if profile is not None:
        profile.disable()
    generated = engine.stats.generated_tokens - generated_before
    if generated != steps * seqs:
        raise SystemExit(f"expected {steps * seqs} tokens in the timed steps, got {generated}: a request ended early")
    for rid in ids:
        engine.cancel(rid)
    engine.run_until_idle()
    return {"engine_us": statistics.median(engine_us), "engine_us_mean": statistics.fmean(engine_us),
            "engine_cpu_us": statistics.median(engine_cpu_us),
            "pack_us": 1e6 * statistics.median(runner.pack_s) if runner.pack_s else 0.0}


def prompt_steps(seqs: int, prompt_tokens: int) -> int:
    """More than the steps until every prompt is evaluated (decoding requests share the step budget)."""
    return 2 * (-(-seqs * prompt_tokens // MAX_STEP_TOKENS) + 1)


def machine() -> dict:
    import platform

    import numpy as np

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"python": platform.python_version(), "numpy": np.__version__, "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg(), "commit": commit}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file (its tokenizer and KV shape); default: the demo model")
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 32, 64], help="sequences decoding together")
    parser.add_argument("--configs", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    parser.add_argument("--steps", type=int, default=200, help="timed decode steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="decode steps before the timed ones")
    parser.add_argument("--repeat", type=int, default=3, help="runs per (seqs, config); the median of their medians")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="the shortest prompt (they run to 15 more)")
    parser.add_argument("--no-pack", action="store_true", help="skip the GPU runner's packing (StepInputs.pack)")
    parser.add_argument("--profile", default=None, help="path prefix: cProfile of the timed steps per (seqs, config)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from hipcore.gguf.demo_model import model_or_demo

    try:
        model = model_or_demo(args.model)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    most = max(args.seqs)
    ctx = args.prompt_tokens + 15 + args.warmup + args.steps + prompt_steps(most, args.prompt_tokens + 15) + 16
    engine, runner, cache, inputs = build(model, most, ctx, pack=not args.no_pack)
    configs = sampling_configs()
    results = []
    try:
        one_run(engine, runner, min(2, most), configs["greedy"], 5, 2, args.prompt_tokens, None)  # first-use costs
        for name in args.configs:
            for seqs in args.seqs:
                runs = [one_run(engine, runner, seqs, configs[name], args.steps, args.warmup, args.prompt_tokens, None)
                        for _ in range(args.repeat)]
                if args.profile:  # a run of its own: the profiler's overhead stays out of the figures
                    profile = cProfile.Profile()
                    one_run(engine, runner, seqs, configs[name], args.steps, args.warmup, args.prompt_tokens, profile)
                    path = f"{args.profile}.{name}.{seqs}"
                    profile.dump_stats(path + ".prof")
                    with open(path + ".txt", "w") as out:
                        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(40)
                meds = [run["engine_us"] for run in runs]
                cpus = [run["engine_cpu_us"] for run in runs]
                packs = [run["pack_us"] for run in runs]
                results.append({"config": name, "seqs": seqs, "engine_us": statistics.median(meds),
                                "engine_us_runs": meds, "engine_cpu_us": statistics.median(cpus), "pack_us": statistics.median(packs), "pack_us_runs": packs})
                if not args.json:
                    print(f"  {name} {seqs}: engine {statistics.median(meds):.0f} us "
                          f"(runs {', '.join(f'{m:.0f}' for m in meds)}), pack {statistics.median(packs):.0f} us",
                          file=sys.stderr)
        cache.check_invariants(quiescent=True)
    finally:
        if inputs is not None:
            inputs.close()
        cache.close()
    report = {"model": model, "steps": args.steps, "repeat": args.repeat, "machine": machine(), "results": results}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    m = report["machine"]
    print(f"{Path(model).name}'s tokenizer and KV shape, instant runner; median host us per decode step "
          f"({args.steps} steps x {args.repeat} runs)")
    print(f"python {m['python']}, numpy {m['numpy']}, {m['cpu_count']} CPUs, load {m['load_average'][0]:.1f}, "
          f"commit {m['commit']}")
    print(f"{'config':>8} {'seqs':>5} {'engine us':>10} {'per seq':>8} {'cpu us':>7} {'pack us':>8}")
    for r in results:
        print(f"{r['config']:>8} {r['seqs']:>5} {r['engine_us']:>10.0f} {r['engine_us'] / r['seqs']:>8.1f} "
              f"{r['engine_cpu_us']:>7.0f} {r['pack_us']:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
