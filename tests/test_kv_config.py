"""KvCacheConfig: the size arithmetic every other part uses, and the refusal of absurd shapes."""

from __future__ import annotations

import pytest

from hipcore.kvcache.config import MAX_SLOTS, KvCacheConfig
from hipcore.kvcache.dtypes import kv_dtype
from hipcore.kvcache.errors import KvConfigError


@pytest.mark.parametrize("dtype, row_bytes", [("f16", 256), ("bf16", 256), ("f32", 512), ("q8_0", 4 * 34)])
def test_sizes_follow_from_the_shape(dtype, row_bytes):
    cfg = KvCacheConfig(n_layers=32, n_kv_heads=8, head_dim=128, num_blocks=100, block_size=16, dtype=dtype)
    assert cfg.row_bytes == row_bytes
    assert cfg.bytes_per_token == 2 * 32 * 8 * row_bytes
    assert cfg.block_bytes_per_pool == 8 * 16 * row_bytes
    assert cfg.bytes_per_block == cfg.bytes_per_token * 16
    assert cfg.pool_bytes == 100 * 8 * 16 * row_bytes
    assert cfg.cache_bytes == 2 * 32 * cfg.pool_bytes == 100 * cfg.bytes_per_block
    assert cfg.usable_blocks == 99 and cfg.usable_tokens == 99 * 16


def test_q8_0_is_34_bytes_per_32_elements():
    fmt = kv_dtype("Q8_0")
    assert fmt.row_bytes(64) == 68 and (fmt.block_elems, fmt.block_bytes) == (32, 34)


def test_for_memory_takes_the_largest_cache_that_fits():
    probe = KvCacheConfig(4, 2, 64, 2, 16, "f16")
    budget = 10 * probe.bytes_per_block + probe.bytes_per_block - 1
    cfg = KvCacheConfig.for_memory(budget, 4, 2, 64, 16, "f16")
    assert cfg.num_blocks == 10 and cfg.cache_bytes <= budget
    assert KvCacheConfig.for_memory(cfg.cache_bytes, 4, 2, 64).num_blocks == 10


def test_for_memory_refuses_a_budget_without_a_usable_block():
    probe = KvCacheConfig(4, 2, 64, 2)
    with pytest.raises(KvConfigError, match="holds no usable block"):
        KvCacheConfig.for_memory(2 * probe.bytes_per_block - 1, 4, 2, 64)


def test_for_memory_caps_at_the_int32_slot_limit():
    cfg = KvCacheConfig.for_memory(2**49, 1, 1, 32, block_size=256, dtype="q8_0")
    assert cfg.num_slots <= MAX_SLOTS


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=12), "power of two"),
    (dict(block_size=0), "block_size must be between"),
    (dict(block_size=512), "block_size must be between"),
    (dict(num_blocks=1), "num_blocks must be between"),
    (dict(num_blocks=2**40), "num_blocks must be between"),
    (dict(head_dim=48, dtype="q8_0"), "multiple of 32"),
    (dict(dtype="f8"), "unknown KV dtype"),
    (dict(n_layers=0), "n_layers"),
    (dict(n_kv_heads=10**9), "n_kv_heads"),
    (dict(head_dim=2.5), "must be an integer"),
    (dict(num_blocks=True), "must be an integer"),
    (dict(n_layers=1024, n_kv_heads=1024, head_dim=4096, num_blocks=2**20, block_size=1), "past the"),
])
def test_absurd_configurations_are_refused_with_a_clear_message(kwargs, message):
    args = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=8, block_size=16, dtype="f16") | kwargs
    with pytest.raises(KvConfigError, match=message) as info:
        KvCacheConfig(**args)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_dtype_spelling_is_normalised():
    assert KvCacheConfig(1, 1, 32, 2, dtype="BF16").dtype == "bf16"
