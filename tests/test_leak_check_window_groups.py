"""leak-check's KV layer with sliding-window layers: both layer groups are reconciled, and a leaked local
block and a leaked global block are each caught and named (planted faults)."""

from __future__ import annotations

import pytest

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP, KvCacheConfig
from hipcore.runtime.cpu import CpuDevice
from profiles.leak_layers import read_blocks

CONFIG = KvCacheConfig(n_layers=3, n_kv_heads=1, head_dim=32, num_blocks=40, block_size=4, dtype="f32",
                       layer_windows=(8, 0, 8), window_blocks=16)


@pytest.fixture
def cache():
    with KvCache(CpuDevice(capacity=64 << 20), CONFIG) as c:
        # a workload that leaves the window behind, then ends: everything must come back
        c.add_sequence(1)
        assert c.reserve(1, 30) and all(c.reserve(1, 1) for _ in range(10))
        c.free_sequence(1)
        c.release_fenced()
        yield c


def test_a_clean_cache_reads_clean_in_both_groups(cache):
    reading = read_blocks(cache, lambda s: None)
    assert reading.invariant_error is None and reading.leaked == [] and reading.leaked_bytes == 0
    assert reading.groups == {GLOBAL_GROUP: (39, 39, CONFIG.bytes_per_block),
                              LOCAL_GROUP: (15, 15, CONFIG.window_bytes_per_block)}
    assert reading.to_dict()["groups"][LOCAL_GROUP]["not_free"] == 0


@pytest.mark.parametrize("group", [LOCAL_GROUP, GLOBAL_GROUP])
def test_a_leaked_block_of_either_group_is_caught_and_named(cache, group):
    pool = cache._groups[group].pool
    (block,) = pool.take(1, 99)  # a reference nobody's table holds: the bug leak-check exists for
    reading = read_blocks(cache, lambda s: None)
    assert reading.leaked == [{"group": group, "block": block, "refcount": 1, "sequences": [], "owners": []}]
    assert reading.not_free == 1
    assert reading.leaked_bytes == CONFIG.group_bytes_per_block(group)
    assert f"{group} block {block} has reference count 1 but 0 tables hold it" in reading.invariant_error
    other = LOCAL_GROUP if group == GLOBAL_GROUP else GLOBAL_GROUP
    assert reading.to_dict()["groups"][other]["not_free"] == 0 and reading.to_dict()["groups"][group]["not_free"] == 1


def test_a_sequence_that_was_never_freed_is_named_in_both_groups(cache):
    cache.add_sequence(5)
    assert cache.reserve(5, 20) and cache.reserve(5, 1)
    reading = read_blocks(cache, lambda s: {"request_id": 50 + s})
    groups = {item["group"] for item in reading.leaked}
    assert groups == {GLOBAL_GROUP, LOCAL_GROUP}
    assert all(item["sequences"] == [5] and item["owners"] == [{"request_id": 55}] for item in reading.leaked)
    assert "not quiescent: sequences [5] are still live" in reading.invariant_error
    local = [item for item in reading.leaked if item["group"] == LOCAL_GROUP]
    assert len(local) == len([b for b in cache.block_table(5, LOCAL_GROUP) if b]) < 6  # the window's, not 6
