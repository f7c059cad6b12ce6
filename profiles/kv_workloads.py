"""Engine workloads for `rocmforge profile-kv --workloads`: the KV cache's MemoryProfile after each
of a few request patterns.

Workloads, each run on its own and ended (cancelled) before the next, the cache then checked
quiescent (every block back, every count 0, no sequence left):
  single      one sequence at a time, for several prompt lengths
  concurrent  many sequences of different lengths resident together
  appends     the same length built by single-token appends (decode) and by one batched prompt
              evaluation: fragmentation and page tables depend on the token count, not on how the
              tokens arrived; the figures show it
  forks       one prompt with n parallel samples: the prompt's blocks shared (bytes saved), then the
              partly filled last block copied by each sample that appends to it
  chat        multi-turn conversations, each turn's prompt the whole history (kv_prefix_workloads.py)
  system      requests that share one system prompt (kv_prefix_workloads.py)

Prefix caching is on unless --no-prefix-cache: the cache is flushed after each workload, so each starts empty.

Two modes, the same workloads and the same Engine, Scheduler and KvCache code:
  engine   a real model (hipcore.engine.loader) runs every forward pass.
  kv-only  a preset has no weights: the Engine and Scheduler run on a KV cache alone. Each step's
           StepBatch is checked against the cache (the slots and tables the kernels would read),
           no forward pass runs, and the placeholder logits let every request continue to its
           max tokens. Blocks are reserved, forked, copied on write and freed exactly as for a real
           model, because the same code does it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hipcore.engine.engine import Engine
from hipcore.errors import UsageError
from hipcore.kvcache import KvCache, KvCacheConfig
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.runtime.cpu import CpuDevice
from hipcore.engine.sampler import SamplingParams
from profiles.kv_capacity import check_kv_choices, row_format_problem
from profiles.kv_prefix_workloads import PREFIX_WORKLOADS, prefix_blocks_needed
from profiles.kv_workload_run import Bench, WorkloadResult, WorkloadRun, WorkloadSpec, greedy
from profiles.engine_recording import record_engine
from profiles.memory_timeline import MemoryTimeline
from profiles.presets import ModelShape
from profiles.trace_events import TraceRecorder

# What prompts are made of on a real model: ordinary prose, so that greedy decoding does not stop at
# an end-of-text token before the profile is taken.
PROMPT_TEXT = (
    "The harbour town woke slowly. Fishing boats rocked against the pier while gulls argued over the "
    "morning catch, and the baker on the corner pulled the first loaves from an oven older than the "
    "street itself. Children ran down the hill towards the school, past the lighthouse and the old "
    "customs house, where a clock had shown a quarter past three for as long as anyone could remember. "
)


CONCURRENT_MAX_TOKENS = 16  # long enough that none ends before the last prompt is admitted


@dataclass(frozen=True)
class WorkloadReport:
    model: ModelShape
    mode: str  # "engine" or "kv-only"
    mode_note: str
    device: str
    kv_dtype: str
    block_size: int
    usable_blocks: int
    pool_bytes: int
    max_step_tokens: int
    max_seqs: int
    results: tuple[WorkloadResult, ...]
    seconds: float

    def to_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("model", "results")}
        return {"model": self.model.to_dict(), **out, "workloads": [r.to_dict() for r in self.results]}


# ---- kv-only: the engine without a forward pass ---------------------------------------------------

class KvOnlyRunner:
    """Takes the forward pass's place when a preset has no weights: checks each StepBatch against
    the cache, as the kernels' inputs, and returns all-zero logits (greedy then picks token 0, which a
    preset's KvOnlyTokenizer does not treat as an end of text)."""

    def __init__(self, config: ModelShape, cache: KvCache):
        self.config, self.cache = config, cache

    def execute(self, batch) -> np.ndarray:
        kv = self.cache.config
        batch.validate(kv.block_size, kv.num_blocks, kv.window_blocks if kv.layer_windows else None)
        return np.zeros((int(batch.sample_rows.shape[0]), self.config.vocab_size), dtype=np.float32)


class KvOnlyTokenizer:
    """A preset has no vocabulary: no end-of-text ids, and its tokens decode to no text."""

    eot_ids: frozenset[int] = frozenset()

    def stream_decoder(self) -> "_NoText":
        return _NoText()

    def encode(self, text: str) -> list[int]:
        raise UsageError("a preset has no tokenizer: kv-only workloads submit token ids")


class _NoText:
    def feed(self, token: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


# ---- the bench: an engine and its cache, in either mode --------------------------------------------

def blocks_needed(spec: WorkloadSpec, block_size: int) -> int:
    """Usable blocks for the largest workload, by the engine's own admission rule (each sample its
    own blocks for prompt + max tokens - 1), with room for the scheduler's reserve."""
    def per(length: int, max_tokens: int, n: int = 1) -> int:
        return n * -(-(length + max_tokens - 1) // block_size)
    need = max(
        max(per(n, 2) for n in spec.lengths),
        sum(per(n, CONCURRENT_MAX_TOKENS) for n in spec.concurrent_lengths),
        per(1, spec.append_tokens + 1),
        per(spec.fork_prompt, spec.fork_tokens + 2, spec.samples),
        prefix_blocks_needed(spec, block_size),
    )
    return need + max(2, need // 50)


def open_engine_bench(shape: ModelShape, path: str, device: str, dtype: str, block_size: int, spec: WorkloadSpec,
                      max_step_tokens: int, prefix_caching: bool = True) -> Bench:
    ctx = min(spec.longest + 16, shape.context_length)
    opts = LoadOptions(device=device, ctx_size=ctx, max_seqs=spec.max_seqs,
                       max_step_tokens=max_step_tokens, kv_dtype=dtype, block_size=block_size,
                       kv_blocks=blocks_needed(spec, block_size), prefix_caching=prefix_caching)
    loaded = load_model(path, opts)
    words = loaded.tokenizer.encode(PROMPT_TEXT)

    def prompt(length: int) -> list[int]:
        return (words * (length // len(words) + 1))[:length]

    return Bench(loaded.engine, loaded.cache, loaded.device.describe(), "engine", prompt, loaded.close, loaded.device)


def open_kv_only_bench(shape: ModelShape, dtype: str, block_size: int, spec: WorkloadSpec, max_step_tokens: int,
                       prefix_caching: bool = True) -> Bench:
    config = KvCacheConfig(shape.n_layers, shape.n_kv_heads, shape.head_dim, blocks_needed(spec, block_size) + 1,
                           block_size, dtype)
    device = CpuDevice(capacity=config.cache_bytes + (64 << 20))
    cache = KvCache(device, config, prefix_caching=prefix_caching, model_identity=shape.name)
    engine = Engine(KvOnlyRunner(shape, cache), KvOnlyTokenizer(), cache, max_seqs=spec.max_seqs,
                    max_step_tokens=max_step_tokens, max_context=shape.context_length)

    def close() -> None:
        engine.shutdown()
        cache.close()
        device.close()

    def prompt(length: int) -> list[int]:
        return [1 + i % (shape.vocab_size - 1) for i in range(length)]

    return Bench(engine, cache, "host memory (numpy): a pool sized to the workloads, not to a device", "kv-only",
                 prompt, close, device)


# ---- the workloads ------------------------------------------------------------------------------

def single_sequences(bench: Bench, spec: WorkloadSpec) -> WorkloadResult:
    run = WorkloadRun(bench)
    for length in spec.lengths:
        rid = run.submit(length, greedy(2))
        run.step_until(lambda: run.cached(rid) == [length])
        run.snapshot(f"{length} tokens", rid)
        run.engine.cancel(rid)
        run.engine.run_until_idle()
    return run.finish("single", "one sequence at a time, profiled once its prompt is in the cache")


def concurrent_sequences(bench: Bench, spec: WorkloadSpec) -> WorkloadResult:
    run = WorkloadRun(bench)
    lengths = spec.concurrent_lengths
    ids = [run.submit(n, greedy(CONCURRENT_MAX_TOKENS)) for n in lengths]
    # The first ones decode while the last prompts are still being admitted: profile once every
    # prompt is in, whatever each has generated by then.
    run.step_until(lambda: all(run.cached(rid) and run.cached(rid)[0] >= n for rid, n in zip(ids, lengths)))
    run.snapshot(f"{len(lengths)} sequences", *ids)
    return run.finish("concurrent", f"{len(lengths)} sequences of {lengths[0]}..{lengths[-1]} tokens resident together")


def appends_vs_batched(bench: Bench, spec: WorkloadSpec) -> WorkloadResult:
    run = WorkloadRun(bench)
    n = spec.append_tokens
    appended = run.submit(1, greedy(n + 1))
    run.step_until(lambda: run.cached(appended) == [n])
    run.snapshot(f"{n} tokens by 1-token appends", appended)
    run.engine.cancel(appended)
    run.engine.run_until_idle()
    bench.cache.flush_prefix_cache()  # the second part starts from the same empty pool as the first
    batched = run.submit(n, greedy(2))
    run.step_until(lambda: run.cached(batched) == [n])
    run.snapshot(f"{n} tokens by one batched prompt", batched)
    return run.finish("appends", f"{n} tokens built by single-token appends (a 1-token prompt, decoding), then the same "
                                 f"length evaluated as one batched prompt")


def shared_prefix_forks(bench: Bench, spec: WorkloadSpec) -> WorkloadResult:
    run = WorkloadRun(bench)
    p, n, g = spec.fork_prompt, spec.samples, spec.fork_tokens
    params = SamplingParams(n=n, seed=0, temperature=0.8, max_tokens=g + 2)
    rid = run.submit(p, params)
    run.step_until(lambda: run.cached(rid) == [p] * n)
    run.snapshot(f"{n} samples forked from a {p}-token prompt", rid)
    run.step_until(lambda: run.cached(rid) == [p + g] * n)
    run.snapshot(f"after {g} tokens each", rid)
    return run.finish("forks", f"{n} parallel samples of one {p}-token prompt: prompt blocks shared, the last one copied "
                               "on write")


WORKLOADS = (single_sequences, concurrent_sequences, appends_vs_batched, shared_prefix_forks, *PREFIX_WORKLOADS)

KV_ONLY_NOTE = ("kv-only: a preset has no weights, so no forward pass runs; the engine's scheduler and the KV cache "
                "reserve, fork, copy and free blocks exactly as they would for this model (the same code), and each "
                "step's batch is checked against the cache")
ENGINE_NOTE = "engine: the real model runs every forward pass"


def check_workloads(shape: ModelShape, dtype: str, block_size: int, spec: WorkloadSpec, max_step_tokens: int) -> None:
    """UsageError (exit 2) for anything that would fail later, before a model is loaded."""
    spec.check(shape.context_length)
    check_kv_choices([dtype], [block_size])
    problem = row_format_problem(shape, dtype)
    if problem:
        raise UsageError(f"--dtype {dtype}: {problem}")
    if not 1 <= max_step_tokens <= 1 << 20:
        raise UsageError(f"--max-step-tokens must be between 1 and {1 << 20:,}, got {max_step_tokens:,}")


def run_workloads(shape: ModelShape, *, model_path: str | None, device: str = "auto", dtype: str = "f16",
                  block_size: int = 16, spec: WorkloadSpec = WorkloadSpec(), max_step_tokens: int = 512,
                  prefix_caching: bool = True, status=lambda _text: None, timeline: MemoryTimeline | None = None,
                  trace: TraceRecorder | None = None) -> WorkloadReport:
    """Run every workload on a real model (model_path) or, for a preset, on the KV cache alone; `status` is told
    of each workload as it starts, `timeline` and `trace` (optional) record the run."""
    check_workloads(shape, dtype, block_size, spec, max_step_tokens)
    t0 = time.perf_counter()
    if model_path is not None:
        bench = open_engine_bench(shape, model_path, device, dtype, block_size, spec, max_step_tokens, prefix_caching)
    else:
        bench = open_kv_only_bench(shape, dtype, block_size, spec, max_step_tokens, prefix_caching)
    try:
        if timeline is not None:
            timeline.total_blocks = bench.cache.num_usable_blocks
            device = bench.device
            record_engine(bench.engine, bench.cache, timeline, device.ledger, trace, device.driver_free_bytes)
        results = []
        for k, workload in enumerate(WORKLOADS):
            status(f"workload {k + 1} of {len(WORKLOADS)}: {workload.__name__.replace('_', ' ')}")
            results.append(workload(bench, spec))
            if timeline is not None:
                timeline.mark("phase", results[-1].name)
        results = tuple(results)
        cfg = bench.cache.config
        return WorkloadReport(
            model=shape, mode=bench.mode, mode_note=ENGINE_NOTE if bench.mode == "engine" else KV_ONLY_NOTE,
            device=bench.device_text, kv_dtype=cfg.dtype, block_size=cfg.block_size, usable_blocks=cfg.usable_blocks,
            pool_bytes=cfg.cache_bytes, max_step_tokens=max_step_tokens, max_seqs=bench.engine.scheduler.max_seqs,
            results=results, seconds=time.perf_counter() - t0,
        )
    finally:
        bench.close()
