"""The prefix cache's output checks (not a test module), run on the cpu backend by tests/test_engine_prefix_cache.py
and on a GPU by tests/gpu/test_prefix_cache_gpu.py: `load(path, **LoadOptions fields)` opens the model either way.

    tokens_with_and_without(load, path, seed)   greedy tokens of random prompts sharing prefixes, both ways
    worst_logit_difference(load, path, seed)    a prompt from its first uncached token against the whole prompt
"""

from __future__ import annotations

import random

import numpy as np

from support.engine_testing import greedy, run_alone
from support.gguf_factory import write_tiny_llama
from support.engine_testing import TINY_SHAPE
from support.family_models import write_family_model
from support.gemma2_models import write_model as write_gemma2
from support.gemma3_models import write_gemma3_model
from support.model_steps import step_batch
from support.phi3_models import write_model as write_phi3

from hipcore.engine.request import Ending

# Every family's tiny model (the window families with their sliding windows).
WRITERS = {
    "llama-f32": lambda folder: write_tiny_llama(folder / "llama-f32.gguf", **TINY_SHAPE, tensor_type="F32", seed=7),
    "qwen2-f32": lambda folder: write_family_model("qwen2-f32", folder),
    "qwen3-f16": lambda folder: write_family_model("qwen3-f16", folder),
    "phi3-f16": lambda folder: write_phi3("phi3-f16", folder),  # sliding window 8
    "gemma2-f32": lambda folder: write_gemma2("gemma2-f32", folder),
    "gemma3-f32": lambda folder: write_gemma3_model("gemma3-f32", folder),
}
BLOCK_SIZE = 4
OPTIONS = dict(max_seqs=4, max_step_tokens=16, block_size=BLOCK_SIZE, ctx_size=128)


def shared_prefix_prompts(seed: int, count: int) -> list[list[int]]:
    """`count` prompts, each a random cut of one of three random bases plus a random tail (ids 3 and up)."""
    rng = random.Random(seed)
    bases = [[rng.randrange(3, 380) for _ in range(rng.randint(4, 40))] for _ in range(3)]
    prompts = []
    for _ in range(count):
        base = rng.choice(bases)
        prompts.append(base[:rng.randint(0, len(base))] + [rng.randrange(3, 380) for _ in range(rng.randint(1, 12))])
    return prompts


def tokens_with_and_without(load, path, seed: int, count: int = 14):
    """(tokens without the cache, tokens with it, cached tokens the records report, the cached run's profile): the
    prompts one at a time on a large pool without the cache, then in waves of four on a pool of 20 blocks with it
    (cached blocks evicted, requests preempted), the invariants checked after every step."""
    prompts = shared_prefix_prompts(seed, count)
    with load(path, kv_blocks=64, **OPTIONS) as model:
        expected = [run_alone(model, prompt, greedy(6, ignore_eos=True)).generated_tokens[0] for prompt in prompts]
    with load(path, kv_blocks=20, prefix_caching=True, **OPTIONS) as model:
        engine, got, cached = model.engine, [], 0
        for wave in range(0, len(prompts), 4):
            ids = [engine.submit(prompt, greedy(6, ignore_eos=True)) for prompt in prompts[wave:wave + 4]]
            while engine.has_work():
                engine.step()
                live = {seq.seq_id: seq.tokens[:seq.num_cached] for r in engine.scheduler.running for seq in r.seqs
                        if not seq.finished}
                model.cache.check_invariants(sequence_tokens=live)
            for rid in ids:
                record = engine.finished_record(rid)
                assert record.ending is Ending.LENGTH
                got.append(record.generated_tokens[0])
                cached += record.cached_tokens
        profile = model.cache.memory_profile()
        model.cache.check_invariants(quiescent=True)
        model.cache.flush_prefix_cache()
        assert model.cache.num_free_blocks == model.cache.num_usable_blocks
    assert profile.prefix_query_tokens >= sum(map(len, prompts))
    return expected, got, cached, profile


def worst_logit_difference(load, path, seed: int, trials: int = 4) -> tuple[float, int]:
    """(the largest difference, relative to the largest logit, between a prompt's last logits evaluated from its first
    uncached token and evaluated whole; tokens found in the cache), over `trials` pairs of prompts sharing a random
    prefix. Asserts the cached length is what the blocks allow and the greedy choices agree."""
    rng = random.Random(seed)
    with load(path, kv_blocks=96, max_seqs=2, max_step_tokens=64, block_size=BLOCK_SIZE, ctx_size=128,
              prefix_caching=True) as model:
        runner, cache = model.runner, model.cache
        worst = 0.0
        for trial in range(trials):
            first = [rng.randrange(3, 380) for _ in range(rng.randint(5, 40))]
            second = first[:rng.randint(4, len(first))] + [rng.randrange(3, 380) for _ in range(rng.randint(1, 9))]
            seq = 10 * trial
            runner.execute(step_batch(cache, [(seq, first, 0)]))
            cache.free_sequence(seq, computed=first)
            cache.release_fenced()
            start = cache.add_sequence(seq + 1, second)
            common = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
            assert start == min(common, len(first), len(second) - 1) // BLOCK_SIZE * BLOCK_SIZE
            from_cache = np.asarray(runner.execute(step_batch(cache, [(seq + 1, second[start:], start)]))[-1])
            cache.add_sequence(seq + 2)
            whole = np.asarray(runner.execute(step_batch(cache, [(seq + 2, second, 0)]))[-1])
            for done in (seq + 1, seq + 2):
                cache.free_sequence(done)
            cache.release_fenced()
            assert int(np.argmax(from_cache)) == int(np.argmax(whole))
            worst = max(worst, float(np.max(np.abs(from_cache - whole)) / np.max(np.abs(whole))))
        hits = cache.memory_profile().prefix_hit_tokens
    return worst, hits
