"""Prefix caching in the paged KV cache (hipcore/kvcache/prefix_cache.py, prefix_index.py, block_pool.py): full
blocks hashed by prefix, cached on release, shared by a later prompt that starts alike, evicted least recently
used first before a reservation says "no space"; a hash hit confirmed against the stored token ids."""

from __future__ import annotations

import numpy as np
import pytest

from support.kv_sequences import run

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import LOCAL_GROUP, NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvInvariantError
from hipcore.runtime.cpu import CpuDevice

BS = 4
PLAIN = KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=32, num_blocks=10, block_size=BS, dtype="f32")
WINDOWED = KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=16, block_size=BS, dtype="f32",
                         layer_windows=(6, 0), window_blocks=12)


@pytest.fixture
def device():
    return CpuDevice(capacity=64 << 20)



def test_a_released_prefix_is_cached_and_shared_by_the_next_prompt(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    first = list(range(1, 11))  # 10 tokens: 2 full blocks and a partial one
    assert run(cache, 1, first) == 0
    assert cache.num_cached_blocks == 2 and cache.num_free_blocks == 7  # the partial block went free
    assert cache.num_available_blocks == 9
    cached = cache.add_sequence(2, first[:8] + [99, 98, 97])
    assert cached == 8 and cache.seq_len(2) == 8
    assert cache.num_cached_blocks == 0 and all(cache.refcount(b) == 1 for b in cache.block_table(2))
    cache.add_sequence(3, first[:6])  # a third prompt shares the first block with the second
    assert cache.seq_len(3) == 4 and cache.refcount(cache.block_table(2)[0]) == 2
    cache.check_invariants(sequence_tokens={2: first[:8], 3: first[:4]})
    profile = cache.memory_profile()
    assert (profile.prefix_query_tokens, profile.prefix_hit_tokens) == (10 + 11 + 6, 8 + 4)
    assert profile.prefix_hit_rate == pytest.approx(12 / 27)


def test_a_fully_cached_prompt_leaves_its_last_token_to_compute(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    prompt = list(range(1, 9))  # exactly 2 blocks
    run(cache, 1, prompt)
    assert cache.add_sequence(2, prompt) == 4  # the second block is recomputed, for the last token's logits
    assert cache.add_sequence(3, prompt + [5]) == 8


def test_without_prefix_caching_nothing_is_kept(device):
    cache = KvCache(device, PLAIN)
    prompt = list(range(1, 9))
    assert run(cache, 1, prompt) == 0 and run(cache, 2, prompt) == 0
    assert cache.num_cached_blocks == 0 and cache.num_free_blocks == 9
    cache.add_sequence(3)
    cache.reserve(3, 8)
    assert cache.register_computed(3, prompt) == 0


def test_cached_blocks_are_evicted_least_recently_used_first_before_no_space(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    old, new = [1] * 8, [2] * 8
    run(cache, 1, old)
    run(cache, 2, new)
    assert cache.num_cached_blocks == 4 and cache.num_free_blocks == 5
    cache.add_sequence(3)
    assert cache.reserve(3, 6 * BS)  # 6 blocks: the 5 free and the least recently used cached one
    cache.check_invariants()
    assert cache.num_cached_blocks == 3 and cache.num_free_blocks == 0
    # old's last block went: a sequence releases its last block first, so a prefix's head is evicted last
    assert cache.add_sequence(4, old + [0]) == 4
    assert cache.add_sequence(5, new + [0]) == 8
    assert not cache.reserve(3, 2 * BS)  # nothing free or cached is left: no space, nothing changed
    cache.check_invariants()
    cache.free_sequence(4)
    cache.release_fenced()
    assert cache.num_cached_blocks == 1 and cache.reserve(3, BS)


def test_a_hash_hit_is_confirmed_against_the_stored_tokens(device):
    # Every block key collides: a prompt that starts otherwise must not get the cached block.
    cache = KvCache(device, PLAIN, prefix_caching=True, block_hash=lambda item: 7)
    run(cache, 1, [1, 2, 3, 4, 5])
    assert cache.num_cached_blocks == 1
    assert cache.add_sequence(2, [1, 2, 3, 5, 5]) == 0
    assert cache.add_sequence(3, [1, 2, 3, 4, 9]) == 4
    cache.check_invariants(sequence_tokens={3: [1, 2, 3, 4]})


def test_the_key_depends_on_the_model_and_the_whole_prefix(device):
    cache = KvCache(device, PLAIN, prefix_caching=True, model_identity="a")
    other = KvCache(device, PLAIN, prefix_caching=True, model_identity="b")
    assert cache.prefix.salts != other.prefix.salts
    run(cache, 1, [1, 1, 1, 1, 2, 2, 2, 2, 0])
    assert cache.add_sequence(2, [3, 3, 3, 3, 2, 2, 2, 2, 0]) == 0  # same second block, other first


def test_sliding_window_group_shares_only_the_windows_blocks(device):
    cache = KvCache(device, WINDOWED, prefix_caching=True)
    prompt = list(range(1, 22))  # 21 tokens: 5 full blocks, grown a token at a time as decoding grows them
    cache.add_sequence(1)
    for _ in prompt:
        assert cache.reserve(1, 1)
    cache.free_sequence(1, computed=prompt)
    cache.release_fenced()
    # The local group kept (and cached) only the blocks still in the window of the 21st token: 3 and 4.
    assert cache.num_cached_blocks_in("global") == 5 and cache.num_cached_blocks_in(LOCAL_GROUP) == 2
    assert cache.add_sequence(2, prompt + [50]) == 20
    table = cache.block_table(2, LOCAL_GROUP)
    low = (20 - 6) // BS  # positions 14 ... 19 are in the window of the next query
    assert table[:low] == (NULL_BLOCK,) * low and NULL_BLOCK not in table[low:]
    assert cache.reserve(2, 2)
    cache.check_invariants(sequence_tokens={2: prompt[:20]})
    # A prompt that leaves the cached run earlier needs local blocks the window group no longer has.
    assert cache.add_sequence(3, prompt[:9] + [77, 77]) == 0


def test_pending_blocks_are_not_shared_before_the_fence(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    prompt = list(range(1, 10))
    cache.add_sequence(1, prompt)
    cache.reserve(1, len(prompt))
    cache.free_sequence(1, computed=prompt)
    assert cache.num_pending_blocks == 3
    assert cache.add_sequence(2, prompt) == 0
    cache.free_sequence(2)
    cache.release_fenced()
    assert cache.add_sequence(3, prompt) == 8


def test_a_held_block_is_shared_once_registered(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    prompt = list(range(1, 10))
    cache.add_sequence(1)
    cache.reserve(1, len(prompt))
    assert cache.register_computed(1, prompt) == 2
    assert cache.add_sequence(2, prompt) == 8
    assert cache.block_table(2) == cache.block_table(1)[:2]
    cache.free_sequence(1, computed=prompt)
    cache.free_sequence(2)
    cache.release_fenced()
    assert cache.num_cached_blocks == 2 and cache.num_free_blocks == 7
    assert cache.flush_prefix_cache() == 2
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == 9


def test_invariants_catch_a_hash_entry_left_on_a_free_block(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    run(cache, 1, [1, 2, 3, 4, 5])
    pool = cache._groups["global"].pool
    block = pool.cached_blocks()[0]
    del pool.prefix.lru[block]  # an eviction that forgets the hash entry
    pool._free.append(block)
    with pytest.raises(KvInvariantError, match="which is free"):
        cache.check_invariants()


def test_invariants_catch_a_held_block_hashed_as_other_tokens(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    run(cache, 1, [1, 2, 3, 4, 5])
    cache.add_sequence(2, [1, 2, 3, 4, 5])
    with pytest.raises(KvInvariantError, match="hashed as other tokens"):
        cache.check_invariants(sequence_tokens={2: [1, 2, 3, 9]})


def test_register_refuses_rehashing_a_block_as_another_prefix(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    cache.add_sequence(1)
    cache.reserve(1, 4)
    cache.register_computed(1, [1, 2, 3, 4])
    with pytest.raises(KvInvariantError, match="another prefix"):
        cache.register_computed(1, [1, 2, 3, 5])


def test_profile_reports_cached_blocks_apart(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    run(cache, 1, list(range(1, 14)))
    cache.add_sequence(2)
    cache.reserve(2, 5)
    p = cache.memory_profile()
    assert p.prefix_caching and p.cached_blocks == 3 and p.pool_bytes_cached == 3 * PLAIN.bytes_per_block
    assert p.free_blocks + p.pending_blocks + p.cached_blocks + p.physical_blocks == PLAIN.num_blocks - 1
    assert p.capacity_tokens == (p.free_blocks + p.cached_blocks) * BS
    assert p.fragmentation_ratio == pytest.approx(3 / 8)  # over the 2 held blocks only
    assert p.to_dict()["prefix_hit_rate"] == 0.0
