"""KvCache: allocation, append, fork, copy-on-write, removal, the step fence, all-or-nothing."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvCacheError, KvInvariantError
from hipcore.runtime.cpu import CpuDevice
from hipcore.runtime.errors import DeviceOutOfMemory


def make_cache(device, num_blocks=9, block_size=4, n_layers=2, dtype="f16"):
    return KvCache(device, KvCacheConfig(n_layers=n_layers, n_kv_heads=2, head_dim=32, num_blocks=num_blocks,
                                         block_size=block_size, dtype=dtype))


def state(cache):
    return ({s: cache.block_table(s) for s in cache.sequences()}, {s: cache.seq_len(s) for s in cache.sequences()},
            cache.num_free_blocks, cache.num_pending_blocks, [cache.refcount(b) for b in range(1, cache.config.num_blocks)])


def test_pools_are_one_kv_allocation_per_layer_and_kind(cpu_device):
    before = cpu_device.ledger.bytes_by_tag()["kv"]
    cache = make_cache(cpu_device, n_layers=3)
    allocs = cpu_device.ledger.live("kv")
    assert len(allocs) == 6 == len(cache.k_pools) + len(cache.v_pools)
    assert {a.label for a in allocs} == {f"kv.layer{i}.{k}" for i in range(3) for k in "kv"}
    assert all(a.nbytes == cache.config.pool_bytes for a in allocs)
    assert cpu_device.ledger.bytes_by_tag()["kv"] - before == cache.config.cache_bytes
    cache.close()
    cache.close()  # idempotent
    assert cpu_device.ledger.bytes_by_tag()["kv"] == before
    with pytest.raises(KvCacheError, match="closed"):
        cache.add_sequence(1)


def test_a_failed_pool_allocation_frees_what_was_allocated():
    device = CpuDevice(capacity=1 << 30)
    for k in range(1, 5):
        device.inject_allocation_failure(k)
        with pytest.raises(DeviceOutOfMemory):
            make_cache(device, n_layers=2)
        assert device.ledger.live() == []


def test_a_cache_larger_than_free_memory_is_refused_before_allocating():
    device = CpuDevice(capacity=1 << 20)
    with pytest.raises(DeviceOutOfMemory, match="KV cache needs") as info:
        make_cache(device, num_blocks=4096)
    assert device.ledger.live() == [] and info.value.exit_code == 5


def test_append_takes_a_block_only_when_the_last_one_is_full(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    assert cache.block_table(1) == () and cache.seq_len(1) == 0
    assert cache.reserve(1, 3)
    assert len(cache.block_table(1)) == 1 and cache.num_free_blocks == 7
    assert cache.blocks_needed(1, 1) == 0 and cache.reserve(1, 1)
    assert len(cache.block_table(1)) == 1
    assert cache.blocks_needed(1, 1) == 1 and cache.reserve(1, 1)
    assert len(cache.block_table(1)) == 2 and cache.seq_len(1) == 5
    assert NULL_BLOCK not in cache.block_table(1)
    assert cache.reserve(1, 0) and cache.seq_len(1) == 5
    cache.check_invariants()
    cache.close()


def test_slot_mapping_follows_the_block_table(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    cache.add_sequence(2)
    cache.reserve(1, 2)
    cache.reserve(2, 5)
    cache.reserve(1, 4)
    table = cache.block_table(1)
    expected = [table[p // 4] * 4 + p % 4 for p in range(6)]
    assert cache.slot_mapping(1, 0, 6).tolist() == expected
    assert cache.slot_mapping(1, 2, 3).tolist() == expected[2:5]
    assert cache.slot_mapping(1, 6, 0).dtype == np.int32
    with pytest.raises(KvCacheError, match="past its 6 reserved tokens"):
        cache.slot_mapping(1, 4, 3)
    padded = cache.block_tables([1, 2], width=4)
    assert padded.tolist() == [list(table) + [NULL_BLOCK] * 2, list(cache.block_table(2)) + [NULL_BLOCK] * 2]
    with pytest.raises(KvCacheError, match="shorter than the longest"):
        cache.block_tables([1], width=1)
    cache.close()


def test_no_space_returns_false_and_changes_nothing(cpu_device):
    cache = make_cache(cpu_device, num_blocks=5)  # 4 usable blocks of 4 tokens
    cache.add_sequence(1)
    assert cache.reserve(1, 10)
    cache.add_sequence(2)
    cache.fork(1, 3)
    before = state(cache)
    assert cache.blocks_needed(2, 5) == 2 and not cache.reserve(2, 5)
    # 7 tokens after the shared block's 2: a copy of that block, then ceil(5 / 4) fresh blocks.
    assert cache.blocks_needed(3, 7) == 3 and not cache.reserve(3, 7)
    assert state(cache) == before
    assert not cache.reserve(1, 10**18)
    assert state(cache) == before
    cache.check_invariants()
    cache.close()


def test_fork_shares_every_block_and_allocates_nothing(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    cache.reserve(1, 8)
    free = cache.num_free_blocks
    cache.fork(1, 2)
    assert cache.block_table(2) == cache.block_table(1) and cache.seq_len(2) == 8
    assert cache.num_free_blocks == free
    assert all(cache.refcount(b) == 2 for b in cache.block_table(1))
    # Full shared blocks: appending takes a fresh block, no copy, the shared ones stay shared.
    assert cache.blocks_needed(2, 1) == 1 and cache.reserve(2, 1)
    assert cache.block_table(2)[:2] == cache.block_table(1)
    cache.check_invariants()
    cache.close()


def fill_sequence(device, cache, seq_id, start, values_per_layer):
    """Write distinct bytes into the sequence's slots, straight into the pools (test helper)."""
    cfg = cache.config
    row = cfg.row_bytes
    for layer in range(cfg.n_layers):
        for kind, pool in (("k", cache.k_pools[layer]), ("v", cache.v_pools[layer])):
            arr = device.view(pool.ptr, np.uint8, (cfg.num_blocks, cfg.n_kv_heads, cfg.block_size, row))
            for i, slot in enumerate(cache.slot_mapping(seq_id, start, len(values_per_layer)).tolist()):
                arr[slot // cfg.block_size, :, slot % cfg.block_size, :] = (values_per_layer[i] + layer * 7 + (kind == "v") * 3) % 251


def read_sequence(device, cache, seq_id):
    cfg = cache.config
    out = []
    for layer in range(cfg.n_layers):
        for pool in (cache.k_pools[layer], cache.v_pools[layer]):
            arr = device.view(pool.ptr, np.uint8, (cfg.num_blocks, cfg.n_kv_heads, cfg.block_size, cfg.row_bytes))
            out.append([arr[s // cfg.block_size, :, s % cfg.block_size, :].copy()
                        for s in cache.slot_mapping(seq_id, 0, cache.seq_len(seq_id)).tolist()])
    return out


def test_copy_on_write_copies_the_shared_partly_filled_block_on_the_device(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    cache.reserve(1, 6)
    fill_sequence(cpu_device, cache, 1, 0, list(range(10, 16)))
    cache.fork(1, 2)
    parent_table = cache.block_table(1)
    parent_data = read_sequence(cpu_device, cache, 1)
    free = cache.num_free_blocks

    assert cache.blocks_needed(2, 1) == 1
    assert cache.reserve(2, 1)
    child_table = cache.block_table(2)
    assert cache.block_table(1) == parent_table  # the other sequence's table is unchanged
    assert child_table[0] == parent_table[0] and child_table[1] != parent_table[1]
    assert cache.num_free_blocks == free - 1
    assert cache.refcount(parent_table[1]) == 1 and cache.refcount(child_table[1]) == 1
    # The copy is real: every layer's K and V of the 6 shared tokens are in the child's new block.
    child_data = read_sequence(cpu_device, cache, 2)
    for parent_rows, child_rows in zip(parent_data, child_data):
        assert all(np.array_equal(p, c) for p, c in zip(parent_rows, child_rows[:6]))
    # Writing the child's new token does not touch the parent.
    fill_sequence(cpu_device, cache, 2, 6, [99])
    assert all(np.array_equal(a, b) for x, y in zip(parent_data, read_sequence(cpu_device, cache, 1)) for a, b in zip(x, y))
    # Now the parent owns its partly filled block alone: appending needs no copy.
    assert cache.blocks_needed(1, 2) == 0 and cache.reserve(1, 2)
    assert cache.block_table(1) == parent_table
    cache.check_invariants()
    cache.close()


def test_freeing_one_sharer_frees_nothing_shared_and_the_last_frees_all(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    cache.reserve(1, 7)
    cache.fork(1, 2)
    cache.fork(2, 3)
    cache.free_sequence(1)
    cache.free_sequence(2)
    assert cache.num_pending_blocks == 0 and all(cache.refcount(b) == 1 for b in cache.block_table(3))
    cache.free_sequence(3)
    assert cache.num_pending_blocks == 2
    assert cache.release_fenced() == 2
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == cache.num_usable_blocks
    cache.close()


def test_freed_blocks_are_not_reused_before_the_fence(cpu_device):
    cache = make_cache(cpu_device, num_blocks=3)  # 2 usable blocks
    cache.add_sequence(1)
    assert cache.reserve(1, 8)
    cache.free_sequence(1)
    cache.add_sequence(2)
    assert not cache.reserve(2, 1)  # the step that wrote sequence 1 may still be running
    assert cache.tokens_that_fit == 0
    cache.release_fenced()
    assert cache.tokens_that_fit == 8 and cache.reserve(2, 1)
    cache.close()


def test_pipelined_steps_release_only_what_the_finished_step_could_touch(cpu_device):
    cache = make_cache(cpu_device)
    for s in (1, 2):
        cache.add_sequence(s)
        cache.reserve(s, 4)
    step1 = cache.begin_step()
    cache.free_sequence(1)  # released while step 1 is in flight
    step2 = cache.begin_step()
    cache.free_sequence(2)  # released while step 2 is in flight
    assert cache.release_fenced(step1) == 1 and cache.num_pending_blocks == 1
    assert cache.release_fenced(step2) == 1
    with pytest.raises(KvCacheError, match="never begun"):
        cache.release_fenced(step2 + 1)
    cache.close()


def test_all_blocks_come_back_after_removal(cpu_device):
    cache = make_cache(cpu_device, num_blocks=33)
    kv_before = cpu_device.ledger.bytes_by_tag()["kv"]
    for s in range(8):
        cache.add_sequence(s)
        assert cache.reserve(s, 3 + s)
    cache.fork(3, 100)
    cache.reserve(100, 2)
    for s in [100, *range(8)]:
        cache.free_sequence(s)
    cache.release_fenced()
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == 32 and cache.memory_profile().physical_blocks == 0
    assert cpu_device.ledger.bytes_by_tag()["kv"] == kv_before
    cache.close()


@pytest.mark.parametrize("call, message", [
    (lambda c: c.add_sequence(1), "already exists"),
    (lambda c: c.add_sequence(-1), "non-negative"),
    (lambda c: c.add_sequence(True), "non-negative"),
    (lambda c: c.reserve(5, 1), "unknown sequence 5"),
    (lambda c: c.reserve(1, -1), "n_tokens must be"),
    (lambda c: c.reserve(1, 2.0), "n_tokens must be"),
    (lambda c: c.fork(5, 6), "unknown sequence 5"),
    (lambda c: c.fork(1, 1), "already exists"),
    (lambda c: c.free_sequence(5), "unknown sequence 5"),
    (lambda c: c.slot_mapping(1, -1, 1), "start must be"),
    (lambda c: c.blocks_needed(1, -3), "n_tokens must be"),
])
def test_bad_calls_are_refused_before_anything_changes(cpu_device, call, message):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    cache.reserve(1, 5)
    before = state(cache)
    with pytest.raises(KvCacheError, match=message):
        call(cache)
    assert state(cache) == before
    cache.close()


def test_a_second_free_is_refused(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    cache.reserve(1, 5)
    cache.free_sequence(1)
    with pytest.raises(KvCacheError, match="unknown sequence 1"):
        cache.free_sequence(1)
    cache.close()


def test_check_invariants_names_a_corrupted_reference_count(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(4)
    cache.reserve(4, 5)
    block = cache.block_table(4)[0]
    cache._pool._refcount[block] += 1  # simulate a bug
    with pytest.raises(KvInvariantError, match=rf"block {block} has reference count 2 but 1 tables hold it \(sequences \[4\]\)"):
        cache.check_invariants()
    cache._pool._refcount[block] -= 1
    cache._tables[4].append(cache._pool.free_blocks()[-1])  # a table grows without the pool knowing
    with pytest.raises(KvInvariantError, match="sequence 4 holds 3 blocks for 5 tokens"):
        cache.check_invariants()
    cache._tables[4].pop()
    cache.check_invariants()
    with pytest.raises(KvInvariantError, match="still live"):
        cache.check_invariants(quiescent=True)
    cache.close()


def test_a_closed_cache_has_no_memory_profile(cpu_device):
    cache = make_cache(cpu_device)
    cache.add_sequence(1)
    assert cache.reserve(1, 5)
    assert cache.memory_profile().pool_bytes_used > 0
    cache.close()
    with pytest.raises(KvCacheError, match="closed"):
        cache.memory_profile()  # it used to describe pools that were freed (bytes used and free, allocator bytes)


@pytest.mark.parametrize("width", [10**12, 10, -1])
def test_an_impossible_block_table_width_is_a_clear_error(cpu_device, width):
    cache = make_cache(cpu_device)  # 9 blocks
    cache.add_sequence(1)
    assert cache.reserve(1, 5)
    with pytest.raises(KvCacheError, match="width"):
        cache.block_tables([1], width=width)  # 10**12 used to be a raw MemoryError
    assert cache.block_tables([1], width=9).shape == (1, 9)
    cache.close()
