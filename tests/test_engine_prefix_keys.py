"""Each full block of a request's tokens is hashed once for the prefix cache (hipcore/kvcache/prefix_index.py's
BlockKeys, kept on the Sequence): while it waits in the queue (a lookup every step), at its admission, at its
prompt's end and at its release, the keys computed first are reused; a sequence's new token list gets new keys."""

from __future__ import annotations

import collections

import pytest

from support.engine_testing import greedy, load_tiny, prompt_of, tiny_model

from hipcore.engine.request import Phase, Request, Sequence
from hipcore.engine.sampler import SamplingParams
from hipcore.kvcache.prefix_index import BlockKeys, chain_entries

BS = 16


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def count_hashes(cache) -> collections.Counter:
    """Wrap the cache's block hash: how many times each (parent key, token ids) was hashed."""
    counts: collections.Counter = collections.Counter()
    real = cache.prefix.block_hash

    def counted(item):
        counts[item] += 1
        return real(item)

    cache.prefix.block_hash = counted
    return counts


def count_lookups(cache) -> list[int]:
    """Wrap cache.cached_prefix: the lengths of the token lists looked up, one per call."""
    calls: list[int] = []
    real = cache.cached_prefix

    def counted(tokens, keys=None):
        calls.append(len(tokens))
        return real(tokens, keys)

    cache.cached_prefix = counted
    return calls


def test_a_prompt_that_waits_several_steps_is_hashed_once(path):
    # 13 blocks: the first request's 150-token prompt and its decoding hold all but 2, so the second, looked up every
    # step, waits until the first ends.
    with load_tiny(path, kv_blocks=13, prefix_caching=True) as model:
        engine, cache = model.engine, model.cache
        hashes, lookups = count_hashes(cache), count_lookups(cache)
        first = engine.submit(prompt_of(150, salt=1), greedy(12, ignore_eos=True))
        waiting = prompt_of(72, salt=2)
        second = engine.submit(waiting, greedy(20, ignore_eos=True))
        waited = 0
        while engine.has_work():
            engine.step()
            request = engine.request(second)
            waited += request is not None and request.phase is Phase.WAITING
        assert waited >= 3 and lookups.count(len(waiting)) >= 3  # it was looked up on several steps
        record = engine.finished_record(second)
        assert engine.finished_record(first).ending.value == "length" and record.ending.value == "length"
        tokens = waiting + list(record.generated_tokens[0])
        computed = tokens[:-1]  # the last sampled token ends the sequence before its K/V is computed
        own = chain_entries(cache.prefix.salts["global"], computed, BS, len(computed) // BS, hash)
        assert len(own) == 5  # 91 computed tokens: 5 full blocks, the last of them generated ones
        assert [hashes[(entry.parent, entry.tokens)] for entry in own] == [1] * len(own)
        assert cache.num_cached_blocks >= len(own)  # they were hashed for something: cached at its release
        cache.flush_prefix_cache()
        cache.check_invariants(quiescent=True)


def test_parallel_samples_share_the_prompts_keys(path):
    with load_tiny(path, kv_blocks=40, prefix_caching=True) as model:
        hashes = count_hashes(model.cache)
        prompt = prompt_of(40, salt=3)
        rid = model.engine.submit(prompt, SamplingParams(temperature=0.9, seed=5, n=3, max_tokens=4, ignore_eos=True))
        model.engine.run_until_idle()
        assert model.engine.finished_record(rid).ending.value == "length"
        salt = model.cache.prefix.salts["global"]
        own = chain_entries(salt, prompt, BS, len(prompt) // BS, hash)
        assert [hashes[(entry.parent, entry.tokens)] for entry in own] == [1, 1]


def test_block_keys_extend_as_tokens_grow_and_a_new_token_list_gets_new_keys():
    calls = []

    def counted(item):
        calls.append(item)
        return hash(item)

    tokens = list(range(40))
    keys = BlockKeys(tokens)
    assert keys.entries(11, 8, 2, counted) == chain_entries(11, tokens, 8, 2)
    assert len(calls) == 2
    tokens += range(40, 48)
    assert keys.entries(11, 8, 6, counted) == chain_entries(11, tokens, 8, 6)
    assert len(calls) == 6 and keys.entries(11, 8, 3, counted) == chain_entries(11, tokens, 8, 3) and len(calls) == 6
    with pytest.raises(ValueError, match="7 full blocks of 8 asked of 48 tokens"):
        keys.entries(11, 8, 7, counted)

    request = Request(1, tokens[:10], SamplingParams(), arrival=1)
    seq = Sequence(1, request, list(tokens), num_prompt=10)
    assert seq.block_keys is seq.block_keys
    seq.block_keys.entries(11, 8, 6, counted)
    twin = Sequence(2, request, list(seq.tokens), num_prompt=10)
    twin.copy_block_keys(seq)
    assert twin.block_keys.tokens is twin.tokens and twin.block_keys.entries(11, 8, 6, counted)[-1] == \
        seq.block_keys.entries(11, 8, 6, counted)[-1]
    assert len(calls) == 12
    seq.tokens = [5] * 48  # another token list: the keys of the old one are not used
    assert seq.block_keys.entries(11, 8, 1, counted) == chain_entries(11, [5] * 8, 8, 1)
