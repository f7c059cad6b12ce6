"""The engine with prefix caching (hipcore/kvcache/prefix_cache.py) gives the output it gives without: on every
family's tiny model (llama, qwen2, qwen3, phi3 with its sliding window, gemma2 and gemma3 with theirs), many random
prompts sharing prefixes of random lengths get the same greedy tokens, in waves of concurrent requests on a pool
small enough to evict and preempt; and a prompt evaluated from its first uncached token has the logits of the same
prompt evaluated whole, within the GPU tier's tolerance (1e-3 of the largest logit). The checks are
tests/support/prefix_cache_checks.py's; tests/gpu/test_prefix_cache_gpu.py runs them on a GPU."""

from __future__ import annotations

import pytest

from support.engine_testing import load_tiny
from support.prefix_cache_checks import WRITERS, tokens_with_and_without, worst_logit_difference

GPU_TIER_TOLERANCE = 1e-3  # of the largest logit (tests/support/family_golden.py)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix-families")
    return {name: write(folder) for name, write in WRITERS.items()}


@pytest.mark.parametrize("name", list(WRITERS))
def test_greedy_tokens_are_the_same_with_and_without_the_cache(models, name):
    expected, got, cached, profile = tokens_with_and_without(load_tiny, models[name], seed=len(name))
    assert got == expected
    assert profile.prefix_hit_tokens >= cached > 0  # (hits after a preemption are counted, not the request's)


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_prompt_from_its_first_uncached_token_has_the_whole_prompts_logits(models, name):
    worst, hits = worst_logit_difference(load_tiny, models[name], seed=len(name) + 100)
    assert hits > 0
    assert worst <= GPU_TIER_TOLERANCE, f"{name}: logits differ by {worst:.2e} of the largest"
