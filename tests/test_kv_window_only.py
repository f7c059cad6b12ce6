"""A KV cache whose every layer has a sliding window (a one-layer gpt-oss): the global group holds no layer and only
counts positions, the local pool is the whole cache, and a sequence of any length holds about a window of blocks
(hipcore/kvcache/config.py; docs/architecture.md, "The release path of a KV block")."""

from __future__ import annotations

import pytest

from hipcore.kvcache.block_group import BlockGroup
from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP, NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvConfigError, KvInvariantError
from hipcore.runtime.cpu import CpuDevice

BS, W, CHUNK = 4, 10, 8
ONLY = KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=80, block_size=BS, dtype="f32",
                     layer_windows=(W, 6), window_blocks=16)


@pytest.fixture
def device():
    return CpuDevice(capacity=64 << 20)


def held(cache: KvCache, seq: int, group: str) -> int:
    return sum(1 for b in cache.block_table(seq, group) if b != NULL_BLOCK)


def test_the_global_group_holds_no_layer_and_costs_nothing():
    assert ONLY.window_only and ONLY.global_layers == () and ONLY.window_layers == (0, 1)
    assert ONLY.groups == (GLOBAL_GROUP, LOCAL_GROUP) and ONLY.bytes_per_block == 0
    assert ONLY.cache_bytes == 2 * 2 * ONLY.window_pool_bytes == 16 * ONLY.window_bytes_per_block
    assert ONLY.sequence_bytes(1000) == ONLY.window_blocks_per_sequence() * ONLY.window_bytes_per_block
    assert not KvCacheConfig(2, 1, 32, 80, BS, "f32", (W, 0), 16).window_only


def test_for_memory_gives_the_whole_budget_to_the_local_pool():
    per_block = ONLY.window_bytes_per_block
    cfg = KvCacheConfig.for_memory(30 * per_block + 5, 2, 1, 32, BS, "f32", (W, 6))
    assert (cfg.window_blocks, cfg.num_blocks, cfg.cache_bytes) == (30, 30, 30 * per_block)
    cfg = KvCacheConfig.for_memory(30 * per_block, 2, 1, 32, BS, "f32", (W, 6), window_blocks=12)
    assert (cfg.window_blocks, cfg.cache_bytes) == (12, 12 * per_block)
    with pytest.raises(KvConfigError, match="holds no usable block"):
        KvCacheConfig.for_memory(per_block, 2, 1, 32, BS, "f32", (W, 6))
    with pytest.raises(KvConfigError, match="holds no usable block"):
        KvCacheConfig.for_memory(10 * per_block, 2, 1, 32, BS, "f32", (W, 6), window_blocks=12)


def long_sequence(cache: KvCache, prompt: int = 100, decode: int = 40) -> list[int]:
    """A prompt of `prompt` tokens (10 windows) in chunks of CHUNK, then `decode` single tokens; the local blocks the
    sequence holds after each reservation, the invariants checked at each."""
    cache.add_sequence(1)
    counts = []
    for n in [CHUNK] * (prompt // CHUNK) + [prompt % CHUNK] + [1] * decode:
        assert cache.reserve(1, n), f"the local pool ran out at {cache.seq_len(1)} tokens"
        cache.check_invariants()
        cache.release_fenced()
        counts.append(held(cache, 1, LOCAL_GROUP))
    return counts


def test_a_prompt_far_longer_than_the_window_holds_a_window_and_a_step_of_blocks(device):
    with KvCache(device, ONLY) as cache:
        counts = long_sequence(cache)
        bound = ONLY.window_blocks_per_sequence() + ONLY.blocks_for_tokens(CHUNK)
        assert max(counts) <= bound < 16 and counts[-1] <= ONLY.window_blocks_per_sequence()
        assert cache.seq_len(1) == 140 and len(cache.block_table(1, LOCAL_GROUP)) == 35  # 35 blocks' positions
        assert device.ledger.bytes_by_tag()["kv"] == ONLY.cache_bytes  # the local pools alone
        profile = cache.memory_profile()
        assert profile.pool_bytes_total == ONLY.cache_bytes and profile.groups[0].pool_bytes_used == 0
        assert profile.groups[1].physical_blocks == counts[-1]
        cache.free_sequence(1)
        cache.release_fenced()
        cache.check_invariants(quiescent=True)
        assert cache.num_free_blocks_in(LOCAL_GROUP) == 15


def test_window_blocks_never_released_are_caught(device, monkeypatch):
    """A planted fault: the local group's plan keeps every block (none leaves the window)."""
    planned = BlockGroup.plan

    def keep_everything(self, seq_id, length, n_tokens):
        plan = planned(self, seq_id, length, n_tokens)
        return plan._replace(out_of_window=())

    monkeypatch.setattr(BlockGroup, "plan", keep_everything)
    with KvCache(device, ONLY) as cache:
        with pytest.raises(KvInvariantError, match="all out of the window .*should have gone back to the pool"):
            long_sequence(cache)
