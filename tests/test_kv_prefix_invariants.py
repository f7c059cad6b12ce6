"""The prefix cache's invariants (docs/architecture.md, "Prefix caching"), each held by a check that a planted fault
must break: a cached block's reference count (0 while cached, one per table once taken, one dropped per release);
eviction least recently used first and only for what the free list lacks; no block both free and cached; a hash hit
confirmed against the stored tokens; a cancelled request's computed full blocks cached, every other block freed,
and nothing held once the cache is flushed. Each fault is patched on one cache's own objects, never on a class."""

from __future__ import annotations

import pytest

from support.engine_testing import greedy, load_tiny, prompt_of, tiny_model
from support.kv_sequences import run

from hipcore.engine.request import Phase
from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import KvCacheConfig
from hipcore.kvcache.errors import KvInvariantError
from hipcore.runtime.cpu import CpuDevice

BS = 4
PLAIN = KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=32, num_blocks=10, block_size=BS, dtype="f32")


@pytest.fixture
def device():
    return CpuDevice(capacity=64 << 20)


def pool_of(cache: KvCache):
    return cache._groups["global"].pool



# ---- a cached block's reference count -------------------------------------------------------------------------

def follow_a_cached_blocks_reference_count(cache: KvCache) -> None:
    prompt = list(range(1, 10))  # 2 full blocks and a token
    run(cache, 1, prompt)
    cached = pool_of(cache).cached_blocks()
    assert len(cached) == 2 and all(cache.refcount(b) == 0 for b in cached)
    assert cache.add_sequence(2, prompt) == 8 and cache.add_sequence(3, prompt) == 8
    cache.check_invariants(sequence_tokens={2: prompt[:8], 3: prompt[:8]})
    assert [cache.refcount(b) for b in cache.block_table(2)] == [2, 2] and cache.num_cached_blocks == 0
    cache.free_sequence(2)
    assert [cache.refcount(b) for b in cache.block_table(3)] == [1, 1]
    cache.free_sequence(3)
    cache.release_fenced()
    cache.check_invariants()
    assert cache.num_cached_blocks == 2 and cache.flush_prefix_cache() == 2
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == cache.num_usable_blocks


def test_a_cached_blocks_reference_count_follows_its_tables(device):
    follow_a_cached_blocks_reference_count(KvCache(device, PLAIN, prefix_caching=True))


def test_planted_a_take_from_the_cache_with_a_reference_too_many_is_caught(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    pool = pool_of(cache)
    take_cached = pool.take_cached

    def take_twice(block, seq_id):
        was_cached = block in pool.prefix.lru
        take_cached(block, seq_id)
        if was_cached:
            pool.share(block, seq_id)  # the fault: a reference no table holds

    pool.take_cached = take_twice
    with pytest.raises(KvInvariantError, match="has reference count 3 but 2 tables hold it"):
        follow_a_cached_blocks_reference_count(cache)


def test_planted_a_release_that_skips_the_decrement_is_caught(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    pool = pool_of(cache)
    release = pool.release
    pool.release = lambda block, seq_id, fence: False if seq_id == 3 else release(block, seq_id, fence)
    with pytest.raises(KvInvariantError, match="has reference count 1 but 0 tables hold it"):
        follow_a_cached_blocks_reference_count(cache)


# ---- eviction: least recently used first, only what the free list lacks -----------------------------------------

def evict_two_of_three(cache: KvCache) -> None:
    """Three one-block prefixes cached in the order a, b, c, then a used again (most recent); a reservation that
    needs the free blocks and two more evicts b and c, and leaves a."""
    a, b, c = [1] * 5, [2] * 5, [3] * 5
    for seq, prompt in enumerate((a, b, c), start=1):
        run(cache, seq, prompt)
    assert run(cache, 4, a) == 4
    assert cache.num_cached_blocks == 3 and cache.num_free_blocks == 6
    cache.add_sequence(5)
    assert cache.reserve(5, (6 + 2) * BS)
    assert cache.num_cached_blocks == 1 and pool_of(cache).evictions == 2  # no more than the free list lacked
    cache.check_invariants()
    assert [cache.cached_prefix(p + [0])[0] for p in (a, b, c)] == [4, 0, 0]


def test_eviction_takes_the_least_recently_used_blocks_and_no_more(device):
    evict_two_of_three(KvCache(device, PLAIN, prefix_caching=True))


@pytest.mark.parametrize("fault", ["newest first", "one too many"])
def test_planted_a_wrong_eviction_is_caught(device, fault):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    pool = pool_of(cache)
    evict = pool.evict

    def evict_newest(count):
        moved = 0
        while moved < count and pool.prefix.lru:
            block = next(reversed(pool.prefix.lru))  # the fault: the most recently used
            pool.prefix.forget(block)
            pool._free.append(block)
            moved += 1
        pool.evictions += moved
        return moved

    pool.evict = evict_newest if fault == "newest first" else (lambda count: evict(count + 1))
    with pytest.raises(AssertionError):
        evict_two_of_three(cache)


# ---- no block both free and cached ---------------------------------------------------------------------------

def test_planted_a_block_both_free_and_cached_is_caught(device):
    cache = KvCache(device, PLAIN, prefix_caching=True)
    pool = pool_of(cache)
    release_fenced = pool.release_fenced

    def release_to_both(completed_fence=None):
        moved = release_fenced(completed_fence)
        pool._free.extend(b for b in pool.prefix.lru if b not in pool._free)  # the fault: freed and kept
        return moved

    pool.release_fenced = release_to_both
    with pytest.raises(KvInvariantError, match="is both free and cached"):
        run(cache, 1, list(range(1, 6)))


# ---- a hash hit confirmed against the stored tokens ----------------------------------------------------------

def share_only_equal_tokens(cache: KvCache) -> None:
    """Every key collides (the cache's hash is constant): only a prompt whose first block's tokens are those
    stored gets the block, and the invariants hold against each sequence's own tokens."""
    run(cache, 1, [1, 2, 3, 4, 5])
    cache.add_sequence(2, [1, 2, 3, 5, 5])
    cache.add_sequence(3, [1, 2, 3, 4, 9])
    cache.check_invariants(sequence_tokens={2: [1, 2, 3, 5], 3: [1, 2, 3, 4]})
    assert (cache.seq_len(2), cache.seq_len(3)) == (0, 4)


def test_a_colliding_key_shares_no_block(device):
    share_only_equal_tokens(KvCache(device, PLAIN, prefix_caching=True, block_hash=lambda item: 7))


def test_planted_a_hit_not_confirmed_against_the_tokens_is_caught(device):
    cache = KvCache(device, PLAIN, prefix_caching=True, block_hash=lambda item: 7)
    index = pool_of(cache).prefix
    index.find = lambda entry: index.block_of.get(entry.key)  # the fault: the key alone
    with pytest.raises(KvInvariantError, match="hashed as other tokens than the sequence's own"):
        share_only_equal_tokens(cache)


# ---- the blocks of a cancelled request ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def cancel_mid_prompt_and_mid_decode(model) -> None:
    """One request cancelled while decoding, one in the middle of its prompt (128 of 150 tokens computed): their
    computed full blocks (16 tokens each) are cached, every other block free, none held; a prompt that starts as
    either finds its blocks; after a flush every block is free."""
    engine, cache = model.engine, model.cache
    decoding, prompting = prompt_of(70, salt=4), prompt_of(150, salt=5)
    first = engine.submit(decoding, greedy(40, ignore_eos=True))
    while engine.request(first).phase is not Phase.DECODE or len(engine.request(first).seqs[0].tokens) < 75:
        engine.step()
    engine.cancel(first)
    second = engine.submit(prompting, greedy(40, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.request(second).phase is Phase.PROMPT and engine.request(second).seqs[0].num_cached == 128
    engine.cancel(second)
    engine.run_until_idle()
    assert engine.finished_record(first).ending.value == "cancelled" == engine.finished_record(second).ending.value
    cache.check_invariants(quiescent=True)
    assert cache.num_cached_blocks == 4 + 8  # 74 and 128 tokens computed
    assert all(cache.refcount(b) == 0 for b in range(1, cache.config.num_blocks))
    assert cache.cached_prefix(decoding + [3])[0] == 64 and cache.cached_prefix(prompting)[0] == 128
    cache.flush_prefix_cache()
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == cache.num_usable_blocks


def test_a_cancelled_requests_computed_blocks_are_cached_and_the_rest_freed(tiny):
    with load_tiny(tiny, kv_blocks=40, prefix_caching=True) as model:
        cancel_mid_prompt_and_mid_decode(model)


def test_planted_a_cancel_whose_release_skips_the_decrement_is_caught(tiny):
    with load_tiny(tiny, kv_blocks=40, prefix_caching=True) as model:
        engine, pool = model.engine, pool_of(model.cache)
        release = pool.release
        cancelled: set[int] = set()
        cancel = engine.cancel

        def cancel_and_mark(request_id):
            cancelled.update(s.seq_id for s in engine.request(request_id).seqs)
            return cancel(request_id)

        # the fault: a cancelled request's blocks lose no reference as its table goes
        pool.release = lambda block, seq_id, fence: False if seq_id in cancelled else release(block, seq_id, fence)
        engine.cancel = cancel_and_mark
        with pytest.raises(KvInvariantError, match="but 0 tables hold it"):
            cancel_mid_prompt_and_mid_decode(model)
