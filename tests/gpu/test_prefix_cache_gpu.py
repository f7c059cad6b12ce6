"""Prefix caching on the GPU (run with `pytest -m gpu tests/gpu/test_prefix_cache_gpu.py`): on every family's tiny
model, random prompts sharing prefixes get the same greedy tokens with and without the cache (waves of concurrent
requests on a pool that evicts and preempts, graph replay as always), and a prompt evaluated from its first uncached
token has the last logits of the same prompt evaluated whole, within the GPU tier's tolerance (the checks of
tests/support/prefix_cache_checks.py, as tests/test_engine_prefix_cache.py runs them on the cpu backend)."""

from __future__ import annotations

import pytest

from hipcore.engine.loader import LoadOptions, load_model
from support.family_golden import gpu_logit_tolerance
from support.prefix_cache_checks import WRITERS, tokens_with_and_without, worst_logit_difference

pytestmark = pytest.mark.gpu

MAX_RELATIVE_LOGIT_DIFF = 1e-3  # tests/gpu/test_families_gpu.py's: both sides on this GPU here


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix-families-gpu")
    return {name: write(folder) for name, write in WRITERS.items()}


def loader_on(gpu):
    def load(path, **options):
        return load_model(str(path), LoadOptions(**options), device=gpu)  # f16 K/V, the GPU's usual
    return load


@pytest.mark.parametrize("name", list(WRITERS))
def test_greedy_tokens_are_the_same_with_and_without_the_cache(gpu, models, name):
    expected, got, cached, profile = tokens_with_and_without(loader_on(gpu), models[name], seed=len(name))
    assert got == expected
    assert profile.prefix_hit_tokens >= cached > 0


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_prompt_from_its_first_uncached_token_has_the_whole_prompts_logits(gpu, models, name):
    worst, hits = worst_logit_difference(loader_on(gpu), models[name], seed=len(name) + 100)
    assert hits > 0
    assert worst <= gpu_logit_tolerance(name, gpu.arch, MAX_RELATIVE_LOGIT_DIFF), \
        f"{name}: logits differ by {worst:.2e} of the largest on {gpu.arch}"
