"""Sliding-window layers in the paged KV cache: two layer groups, the local one keeping only the blocks
inside the window (docs/architecture.md, "The release path of a KV block")."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP, NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvCacheError, KvConfigError, KvInvariantError
from hipcore.ops.kv_gather import gather_kv
from hipcore.ops.kv_store import reference as kv_store_reference
from hipcore.runtime.cpu import CpuDevice

BS, W = 4, 10
# layers 0, 1 slide (window 10 and 6: the group keeps the larger), layer 2 is global
WINDOWED = KvCacheConfig(n_layers=3, n_kv_heads=1, head_dim=32, num_blocks=64, block_size=BS, dtype="f32",
                         layer_windows=(W, 6, 0), window_blocks=12)


@pytest.fixture
def device():
    return CpuDevice(capacity=64 << 20)


def held(cache: KvCache, seq: int, group: str) -> list[int]:
    return [b for b in cache.block_table(seq, group) if b != NULL_BLOCK]


# ---- the config ------------------------------------------------------------------------------------

def test_groups_follow_the_layer_windows():
    assert WINDOWED.groups == (GLOBAL_GROUP, LOCAL_GROUP)
    assert WINDOWED.global_layers == (2,) and WINDOWED.window_layers == (0, 1) and WINDOWED.window == W
    assert [WINDOWED.layer_num_blocks(i) for i in range(3)] == [12, 12, 64]
    row = WINDOWED.row_bytes
    assert WINDOWED.bytes_per_block == 2 * 1 * BS * row and WINDOWED.window_bytes_per_block == 2 * 2 * BS * row
    assert WINDOWED.cache_bytes == 2 * (64 + 2 * 12) * BS * row
    assert WINDOWED.bytes_per_token == WINDOWED.global_bytes_per_token + WINDOWED.window_bytes_per_token


def test_no_window_is_one_group_exactly_as_before():
    plain = KvCacheConfig(3, 1, 32, 64, BS, "f32")
    assert KvCacheConfig(3, 1, 32, 64, BS, "f32", layer_windows=(0, None, 0)) == plain
    assert plain.groups == (GLOBAL_GROUP,) and plain.window_blocks == 0 and plain.window == 0
    assert plain.bytes_per_block == plain.bytes_per_token * BS and plain.cache_bytes == 2 * 3 * plain.pool_bytes


@pytest.mark.parametrize("kwargs, message", [
    (dict(layer_windows=(4, 0)), "2 entries for 3 layers"),
    (dict(layer_windows=(4, -1, 0)), "window of layer 1 must be between"),
    (dict(layer_windows=(4, 1.5, 0)), "window of layer 1 must be an integer"),
    (dict(layer_windows="4,0,0"), "sequence of window lengths"),
    (dict(window_blocks=8), "no layer has a sliding window"),
    (dict(layer_windows=(4, 0, 0), window_blocks=1), "window_blocks must be between"),
])
def test_bad_windows_are_refused_with_a_clear_message(kwargs, message):
    with pytest.raises(KvConfigError, match=message):
        KvCacheConfig(3, 1, 32, 64, BS, "f32", **kwargs)


def test_a_gemma3_sequence_of_32k_tokens_costs_its_local_layers_only_their_window():
    # Gemma 3 4B's KV shape: 34 layers, 5 local (window 1024) to 1 global, 4 KV heads of 256.
    windows = tuple(0 if i % 6 == 5 else 1024 for i in range(34))
    cfg = KvCacheConfig(34, 4, 256, 3000, 16, "f16", windows)
    assert len(cfg.global_layers) == 5 and len(cfg.window_layers) == 29
    per_layer_token = 2 * 4 * 256 * 2
    assert cfg.global_bytes_per_token == 5 * per_layer_token
    assert cfg.window_blocks_per_sequence() == 64 + 1  # 1024 positions at any offset span 65 blocks of 16
    n = 32768
    assert cfg.sequence_bytes(n) == 2048 * 16 * 5 * per_layer_token + 65 * 16 * 29 * per_layer_token
    assert cfg.sequence_bytes(n) < 0.2 * n * cfg.bytes_per_token  # all-global would cost 5x more
    assert cfg.sequence_bytes(100) == 7 * 16 * cfg.bytes_per_token  # inside the window every layer keeps all


def test_the_planned_local_pool_is_sized_by_sequences_and_capped_by_the_global_pool():
    cfg = KvCacheConfig(3, 1, 32, 1000, 16, "f16", (1024, 0, 0))
    assert cfg.window_pool_blocks(4, 512) == 4 * (64 + 3) + 2 * 32 + 1
    assert cfg.window_pool_blocks(100, 512) == 1000  # never more than the global pool


def test_for_memory_takes_the_local_pool_first_and_gives_the_global_group_the_rest():
    probe = KvCacheConfig(3, 1, 32, 2, 16, "f16", (64, 0, 0), 2)
    budget = 50 * probe.window_bytes_per_block + 100 * probe.bytes_per_block + 7
    cfg = KvCacheConfig.for_memory(budget, 3, 1, 32, 16, "f16", (64, 0, 0), window_blocks=50)
    assert (cfg.window_blocks, cfg.num_blocks) == (50, 100) and cfg.cache_bytes <= budget
    twin = KvCacheConfig.for_memory(budget, 3, 1, 32, 16, "f16", (64, 0, 0))  # a local twin for each global block
    assert twin.window_blocks == twin.num_blocks and twin.cache_bytes <= budget


# ---- the cache ------------------------------------------------------------------------------------

def test_pools_are_sized_per_group_and_named(device):
    with KvCache(device, WINDOWED) as cache:
        assert [p.nbytes for p in cache.k_pools] == [WINDOWED.window_pool_bytes] * 2 + [WINDOWED.pool_bytes]
        assert [p.label for p in cache.k_pools] == ["kv.local.layer0.k", "kv.local.layer1.k", "kv.layer2.k"]
        assert device.ledger.bytes_by_tag()["kv"] == WINDOWED.cache_bytes == cache.memory_profile().pool_bytes_total


def test_a_long_sequence_keeps_a_window_of_local_blocks_while_the_global_group_grows(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 3)  # a prompt of 3, then decode one token at a time
    cap = -(-W // BS) + 1
    local_counts = []
    for length in range(4, 101):
        assert cache.reserve(1, 1)
        cache.release_fenced()
        cache.check_invariants()
        assert len(held(cache, 1, GLOBAL_GROUP)) == -(-length // BS)
        local_counts.append(len(held(cache, 1, LOCAL_GROUP)))
        kept_from = length - 1 - W + 1  # the window of the newest token's query (position length - 1)
        table = cache.block_table(1, LOCAL_GROUP)
        assert all(table[i] == NULL_BLOCK for i in range(max(0, kept_from) // BS))
        assert all(table[i] != NULL_BLOCK for i in range(max(0, kept_from) // BS, len(table)))
    assert max(local_counts) == cap == WINDOWED.window_blocks_per_sequence() + 0
    assert local_counts[-1] <= cap
    # what left the window is back on the free list: 11 usable local blocks, at most `cap` held
    assert cache.num_free_blocks_in(LOCAL_GROUP) == 11 - local_counts[-1]
    profile = cache.memory_profile()
    local = profile.groups[1]
    assert (local.name, local.physical_blocks, local.released_blocks) == ("local", local_counts[-1], 25 - local_counts[-1])
    assert profile.groups[0].physical_blocks == 25 and profile.physical_blocks == 25 + local_counts[-1]
    cache.free_sequence(1)
    cache.release_fenced()
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks_in(LOCAL_GROUP) == 11 and cache.num_free_blocks == 63


def test_blocks_left_behind_wait_for_the_step_fence(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 16)
    cache.begin_step()
    first_local = cache.block_table(1, LOCAL_GROUP)[0]
    assert cache.reserve(1, 1)  # 16 tokens: the next query reads from position 7 on; block 0 (0..3) leaves
    assert cache.block_table(1, LOCAL_GROUP)[0] == NULL_BLOCK
    assert cache.num_pending_blocks_in(LOCAL_GROUP) == 1 and first_local not in cache._groups[LOCAL_GROUP].pool.free_blocks()
    cache.release_fenced(1)
    assert first_local in cache._groups[LOCAL_GROUP].pool.free_blocks()
    cache.check_invariants()


def test_a_position_out_of_the_window_has_no_local_slot(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 20) and cache.reserve(1, 1)
    with pytest.raises(KvCacheError, match="position 0 of sequence 1 is out of the local group's window"):
        cache.slot_mapping(1, 0, 1, LOCAL_GROUP)
    assert cache.slot_mapping(1, 20, 1, LOCAL_GROUP)[0] // BS == cache.block_table(1, LOCAL_GROUP)[5]
    assert cache.slot_mapping(1, 0, 1)[0] // BS == cache.block_table(1)[0]  # the global group keeps everything
    with pytest.raises(KvCacheError, match="no layer group 'sliding'"):
        cache.block_table(1, "sliding")


def test_when_the_local_pool_runs_out_nothing_changes_in_either_group(device):
    cache = KvCache(device, WINDOWED)  # 11 usable local blocks
    cache.add_sequence(1)
    assert cache.reserve(1, 40)  # a prompt chunk holds all its positions in both groups
    cache.add_sequence(2)
    before = (cache.block_table(1), cache.block_table(1, LOCAL_GROUP), cache.num_free_blocks,
              cache.num_free_blocks_in(LOCAL_GROUP))
    assert cache.blocks_needed(2, 8, LOCAL_GROUP) == 2 > cache.num_free_blocks_in(LOCAL_GROUP) == 1
    assert not cache.reserve(2, 8)
    assert cache.block_table(2) == () and cache.seq_len(2) == 0
    assert before == (cache.block_table(1), cache.block_table(1, LOCAL_GROUP), cache.num_free_blocks,
                      cache.num_free_blocks_in(LOCAL_GROUP))
    cache.check_invariants()


def test_a_fork_shares_the_local_window_and_copy_on_write_copies_only_local_layers(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 22)
    assert cache.reserve(1, 1)  # the local table now starts with released entries
    shape = (WINDOWED.window_blocks, 1, BS, WINDOWED.row_bytes)
    for slot in cache.slot_mapping(1, 13, 10, LOCAL_GROUP).tolist():
        for layer in (0, 1):
            kv_store_reference(device.view(cache.k_pools[layer].ptr, np.uint8, shape),
                               np.full((1, 1, 32), float(slot), np.float32), np.array([slot]), WINDOWED.format)
    free_local = cache.num_free_blocks_in(LOCAL_GROUP)
    cache.fork(1, 2)
    assert cache.num_free_blocks_in(LOCAL_GROUP) == free_local  # a fork allocates nothing
    assert cache.block_table(2, LOCAL_GROUP) == cache.block_table(1, LOCAL_GROUP)
    shared_last = cache.block_table(1, LOCAL_GROUP)[-1]
    assert cache.refcount(shared_last, LOCAL_GROUP) == 2
    assert cache.reserve(2, 1)  # 23 tokens, last block partly filled and shared: copied in both groups
    cache.check_invariants()
    private = cache.block_table(2, LOCAL_GROUP)[-1]
    assert private != shared_last and cache.refcount(shared_last, LOCAL_GROUP) == 1
    k1, _ = gather_kv(cache, 1, 0)
    k2, _ = gather_kv(cache, 2, 0)
    assert k2[20:23, 0, 0].tolist() == k1[20:23, 0, 0].tolist() != [0.0, 0.0, 0.0]
    for seq in (1, 2):
        cache.free_sequence(seq)
    cache.release_fenced()
    cache.check_invariants(quiescent=True)


# ---- the invariants catch what they claim to (planted faults) ---------------------------------------

def test_a_local_block_kept_out_of_the_window_is_caught(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 30) and cache.reserve(1, 1)
    group = cache._groups[LOCAL_GROUP]
    stolen = group.pool.take(1, 1)[0]
    group.tables[1][0] = stolen  # a released position that still holds a block
    with pytest.raises(KvInvariantError, match=r"local table still holds block \d+ for positions 0 to 3, all out of "
                                               r"the window .*should have gone back to the pool"):
        cache.check_invariants()


def test_a_block_released_inside_the_window_is_caught(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 30) and cache.reserve(1, 1)
    group = cache._groups[LOCAL_GROUP]
    group.kept_from[1] = 28  # as if the cache had dropped positions the newest token still reads
    with pytest.raises(KvInvariantError, match="released its local blocks below position 28, inside the window of its "
                                               "newest token"):
        cache.check_invariants()


def test_a_leaked_reference_is_named_with_its_group(device):
    cache = KvCache(device, WINDOWED)
    cache.add_sequence(1)
    assert cache.reserve(1, 5)
    block = cache.block_table(1, LOCAL_GROUP)[0]
    cache._groups[LOCAL_GROUP].pool._refcount[block] += 1
    with pytest.raises(KvInvariantError, match=rf"local block {block} has reference count 2 but 1 tables hold it"):
        cache.check_invariants()
