"""The engine with prefix caching (hipcore/kvcache/prefix_cache.py) gives the output it gives without: on every
family's tiny model (llama, qwen2, qwen3, phi3 with its sliding window, gemma2 and gemma3 with theirs), many random
prompts sharing prefixes of random lengths get the same greedy tokens, in waves of concurrent requests on a pool
small enough to evict and preempt; and a prompt evaluated from its first uncached token has the logits of the same
prompt evaluated whole, within the GPU tier's tolerance (1e-3 of the largest logit)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from support.engine_testing import TINY_SHAPE, greedy, load_tiny, run_alone
from support.family_models import write_family_model
from support.gemma2_models import write_model as write_gemma2
from support.gemma3_models import write_gemma3_model
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from support.phi3_models import write_model as write_phi3

from hipcore.engine.request import Ending

WRITERS = {
    "llama-f32": lambda folder: write_tiny_llama(folder / "llama-f32.gguf", **TINY_SHAPE, tensor_type="F32", seed=7),
    "qwen2-f32": lambda folder: write_family_model("qwen2-f32", folder),
    "qwen3-f16": lambda folder: write_family_model("qwen3-f16", folder),
    "phi3-f16": lambda folder: write_phi3("phi3-f16", folder),  # sliding window 8
    "gemma2-f32": lambda folder: write_gemma2("gemma2-f32", folder),
    "gemma3-f32": lambda folder: write_gemma3_model("gemma3-f32", folder),
}
GPU_TIER_TOLERANCE = 1e-3  # of the largest logit (tests/support/family_golden.py)
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix-families")
    return {name: write(folder) for name, write in WRITERS.items()}


def shared_prefix_prompts(seed: int, count: int) -> list[list[int]]:
    """`count` prompts, each a random cut of one of three random bases plus a random tail (ids 3 and up)."""
    rng = random.Random(seed)
    bases = [[rng.randrange(3, 380) for _ in range(rng.randint(4, 40))] for _ in range(3)]
    prompts = []
    for _ in range(count):
        base = rng.choice(bases)
        prompts.append(base[:rng.randint(0, len(base))] + [rng.randrange(3, 380) for _ in range(rng.randint(1, 12))])
    return prompts


@pytest.mark.parametrize("name", list(WRITERS))
def test_greedy_tokens_are_the_same_with_and_without_the_cache(models, name):
    prompts = shared_prefix_prompts(seed=len(name), count=14)
    options = dict(max_seqs=4, max_step_tokens=16, block_size=BLOCK_SIZE, ctx_size=128)
    with load_tiny(models[name], kv_blocks=64, **options) as model:
        expected = [run_alone(model, prompt, greedy(6, ignore_eos=True)).generated_tokens[0] for prompt in prompts]
    # 20 blocks: four requests at once fill them, so cached blocks are evicted (and, on most, a request preempted).
    with load_tiny(models[name], kv_blocks=20, prefix_caching=True, **options) as model:
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
        assert got == expected
        assert profile.prefix_hit_tokens >= cached > 0  # (hits after a preemption are counted, not the request's)
        assert profile.prefix_query_tokens >= sum(map(len, prompts))
        model.cache.check_invariants(quiescent=True)
        model.cache.flush_prefix_cache()
        assert model.cache.num_free_blocks == model.cache.num_usable_blocks


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_prompt_from_its_first_uncached_token_has_the_whole_prompts_logits(models, name):
    rng = random.Random(len(name) + 100)
    with load_tiny(models[name], kv_blocks=96, max_seqs=2, max_step_tokens=64, block_size=BLOCK_SIZE,
                   ctx_size=128, prefix_caching=True) as model:
        runner, cache = model.runner, model.cache
        worst = 0.0
        for trial in range(4):
            first = [rng.randrange(3, 380) for _ in range(rng.randint(5, 40))]
            second = first[:rng.randint(4, len(first))] + [rng.randrange(3, 380) for _ in range(rng.randint(1, 9))]
            seq = 10 * trial
            runner.execute(step_batch(cache, [(seq, first, 0)]))
            cache.free_sequence(seq, computed=first)
            cache.release_fenced()
            start = cache.add_sequence(seq + 1, second)
            common = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
            assert start == min(common, len(first), len(second) - 1) // BLOCK_SIZE * BLOCK_SIZE
            from_cache = runner.execute(step_batch(cache, [(seq + 1, second[start:], start)]))[-1]
            cache.add_sequence(seq + 2)
            whole = runner.execute(step_batch(cache, [(seq + 2, second, 0)]))[-1]
            for done in (seq + 1, seq + 2):
                cache.free_sequence(done)
            cache.release_fenced()
            assert int(np.argmax(from_cache)) == int(np.argmax(whole))
            worst = max(worst, float(np.max(np.abs(from_cache - whole)) / np.max(np.abs(whole))))
        assert cache.memory_profile().prefix_hit_tokens > 0
        assert worst <= GPU_TIER_TOLERANCE, f"{name}: logits differ by {worst:.2e} of the largest"
