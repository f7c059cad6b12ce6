"""warm_up: an engine run through the step shapes it will meet, before it takes its first request.

What a GPU engine allocates on first use stays allocated for its lifetime and is no leak, but it lands where the
first client meets it: each decode batch-size class's graph is captured the first time a step of that class runs
(hipcore/model/decode_graphs.py), a padded prompt-step shape's at its third run (prompt_graphs.py), and the driver
loads a kernel's code and grows the context's per-thread local memory the first time the kernel launches (CUDA's
lazy loading). A server that took requests at once paid those in its first clients' latency, and its device memory
fell by a few MiB after its first minutes under load: `rocmforge serve-leak-check` on the Llama-3.1-8B shape found
the driver's free memory 10 MiB lower after 240 s of 64 clients than after its four-request warm-up, with every
ledger byte and KV block back; with this warm-up the same soak left the driver's free bytes exactly at their
baseline, and without it the 10 MiB went again (docs/history/2026-12-02-serve-prompt-length-warmup-soak.md). warm_up
runs a decode step of every batch-size class up to the engine's parallel sequences (the batched products' kernels at
each tile shape they take),
a prompt of each of a few lengths up to a whole step (the prompt path's products and attention at their tile shapes),
and brings the runner's prompt-step plans and graphs to their bound, as leak-check's warm-up does
(profiles/leak_check.py), then forgets those requests, so that a server's counters start at its first client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hipcore.engine.engine import Engine
from hipcore.engine.sampler import SamplingParams

# New tokens of each ladder request: a class's first decode step runs eagerly and its graph is captured right after,
# so two decode steps of the class are the least that leaves the graph captured; three leave one replay as well.
LADDER_NEW_TOKENS = 4
LADDER_PROMPT = (1, 2)  # two token ids every vocabulary has; the warm-up reads no text


def prompt_ladder(step_tokens: int, max_context: int) -> list[int]:
    """Prompt lengths a warm-up evaluates, one request each: 16, 64, 256, ... below the longest prompt one step
    takes, and that one (a step's tokens, or the context less the new tokens). The products pick their tiles and
    attention its kernel by the step's tokens."""
    top = min(step_tokens, max_context - LADDER_NEW_TOKENS)
    if top < 1:
        return []
    return [n for n in (4 ** k for k in range(2, 12)) if n < top] + [top]


def batch_ladder(parallel: int) -> list[int]:
    """Batch sizes a warm-up decodes at: powers of two up to `parallel`, and `parallel` itself (runners pad decode
    steps to such classes and may capture a graph for each on first use)."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    sizes = [1 << k for k in range(parallel.bit_length()) if 1 << k <= parallel]
    return sizes + ([parallel] if sizes[-1] != parallel else [])


@dataclass
class WarmUp:
    batch_sizes: list[int]  # the decode batch sizes run, each at least LADDER_NEW_TOKENS - 1 steps
    prompt_lengths: list[int]  # the prompts evaluated, one request each
    prompt_shapes: int      # padded prompt-step shapes brought to their graphs (0: the runner pads none)
    seconds: float


def warm_up(engine: Engine, parallel: int) -> WarmUp:
    """Run `engine` (idle, owned by this thread) through a decode step of every batch-size class up to `parallel`,
    prompts of prompt_ladder's lengths and the runner's padded prompt-step shapes, then clear its counters and
    finished records. Each class's requests are submitted together and decode together, greedy and through their
    end-of-generation tokens, so a step of exactly that many sequences runs LADDER_NEW_TOKENS - 1 times."""
    if engine.has_work():
        raise ValueError("warm_up needs an idle engine")
    started = time.perf_counter()
    sizes = batch_ladder(min(parallel, engine.scheduler.max_seqs))
    params = SamplingParams(temperature=0.0, max_tokens=LADDER_NEW_TOKENS, ignore_eos=True)
    for size in sizes:
        for _ in range(size):
            engine.submit(LADDER_PROMPT, params, tag="warm-up")
        engine.run_until_idle()
    lengths = prompt_ladder(engine.scheduler.max_step_tokens, engine.max_context)
    for length in lengths:
        engine.submit((LADDER_PROMPT * length)[:length], SamplingParams(temperature=0.0, max_tokens=1), tag="warm-up")
        engine.run_until_idle()
    fill_prompt_caches = getattr(engine.runner, "fill_prompt_caches", None)
    shapes = fill_prompt_caches() if fill_prompt_caches is not None else 0
    engine.forget_history()
    return WarmUp(sizes, lengths, shapes, time.perf_counter() - started)
