"""MemoryProfile on hand-built situations: every figure computed by hand from the shapes."""

from __future__ import annotations

import json

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import KvCacheConfig

# 3 layers, 2 KV heads, head_dim 64, f16: one token is 2 * 3 * 2 * 64 * 2 = 1,536 bytes;
# blocks of 4 tokens are 6,144 bytes; 11 blocks (block 0 reserved) are 67,584 bytes.
CFG = KvCacheConfig(n_layers=3, n_kv_heads=2, head_dim=64, num_blocks=11, block_size=4, dtype="f16")
TOKEN, BLOCK = 1536, 6144


def test_empty_cache(cpu_device):
    with KvCache(cpu_device, CFG) as cache:
        p = cache.memory_profile()
        assert (p.bytes_per_token, p.bytes_per_block) == (TOKEN, BLOCK)
        assert p.pool_bytes_total == 11 * BLOCK == cpu_device.ledger.bytes_by_tag()["kv"]
        assert (p.pool_bytes_used, p.pool_bytes_free, p.pool_bytes_reserved) == (0, 10 * BLOCK, BLOCK)
        assert (p.physical_blocks, p.logical_blocks, p.free_blocks, p.total_blocks) == (0, 0, 10, 11)
        assert p.fragmentation_ratio == 0.0 and p.capacity_tokens == 40
        assert p.allocator_bytes == 10 * 4 + 11 * 4 and p.page_table_bytes == 0


def test_fragmentation_counts_unused_slots_of_allocated_blocks(cpu_device):
    with KvCache(cpu_device, CFG) as cache:
        for seq, n in ((1, 5), (2, 4), (3, 1)):  # blocks: 2 (3 slots unused), 1 (0), 1 (3)
            cache.add_sequence(seq)
            cache.reserve(seq, n)
        p = cache.memory_profile()
        assert (p.physical_blocks, p.logical_blocks, p.active_sequences, p.total_tokens) == (4, 4, 3, 10)
        assert (p.allocated_slots, p.used_slots) == (16, 10)
        assert p.fragmentation_ratio == 6 / 16
        assert p.wasted_bytes == 6 * TOKEN
        assert p.pool_bytes_used == 4 * BLOCK and p.pool_bytes_free == 6 * BLOCK
        assert p.capacity_tokens == 24 == cache.tokens_that_fit
        assert p.page_table_bytes == 4 * 4
        assert p.allocator_bytes == 6 * 4 + 11 * 4 + 3 * 16
        assert p.shared_blocks == 0 and p.sharing_saved_bytes == 0


def test_sharing_is_counted_once_physically_and_per_sequence_logically(cpu_device):
    with KvCache(cpu_device, CFG) as cache:
        cache.add_sequence(1)
        cache.reserve(1, 10)  # blocks of 4, 4, 2 tokens
        cache.fork(1, 2)
        cache.fork(1, 3)
        p = cache.memory_profile()
        assert (p.physical_blocks, p.logical_blocks, p.shared_blocks) == (3, 9, 3)
        assert p.sharing_saved_bytes == 6 * BLOCK
        assert p.total_tokens == 30 and (p.allocated_slots, p.used_slots) == (12, 10)
        cache.reserve(3, 1)  # copy-on-write of the last block: one block more; 1 and 2 still share it
        p = cache.memory_profile()
        assert (p.physical_blocks, p.logical_blocks, p.shared_blocks) == (4, 9, 3)
        assert cache.refcount(cache.block_table(1)[-1]) == 2
        assert p.sharing_saved_bytes == 5 * BLOCK
        assert (p.allocated_slots, p.used_slots) == (16, 13)


def test_pending_blocks_are_neither_free_nor_used(cpu_device):
    with KvCache(cpu_device, CFG) as cache:
        cache.add_sequence(1)
        cache.reserve(1, 9)
        cache.free_sequence(1)
        p = cache.memory_profile()
        assert (p.pending_blocks, p.free_blocks, p.physical_blocks) == (3, 7, 0)
        assert p.pool_bytes_pending == 3 * BLOCK and p.capacity_tokens == 28
        assert p.pool_bytes_used + p.pool_bytes_free + p.pool_bytes_pending + p.pool_bytes_reserved == p.pool_bytes_total
        assert p.allocator_bytes == 7 * 4 + 3 * 8 + 11 * 4


def test_q8_0_bytes_per_token_include_the_scales(cpu_device):
    cfg = KvCacheConfig(n_layers=3, n_kv_heads=2, head_dim=64, num_blocks=3, block_size=4, dtype="q8_0")
    with KvCache(cpu_device, cfg) as cache:
        assert cache.memory_profile().bytes_per_token == 2 * 3 * 2 * (2 * 34)


def test_to_dict_is_json(cpu_device):
    with KvCache(cpu_device, CFG) as cache:
        cache.add_sequence(1)
        cache.reserve(1, 3)
        d = json.loads(json.dumps(cache.memory_profile().to_dict()))
        assert d["total_tokens"] == 3 and d["dtype"] == "f16" and d["fragmentation_ratio"] == 0.25
