"""The KV cache's fast paths change nothing but the time they take: the same random operations on a cache
with them and on one that always takes the general path leave equal state (block tables, lengths, kept
positions, reference counts, free and pending lists) and give equal answers, for a cache of one layer group
and for one with a sliding-window group. Reserve's fast path: a token that fits in the sequence's own partly
filled last block, or into one fresh block after a full one (KvCache.reserve_each, BlockGroup.appends_in_place and
appends_new_block). block_tables' fast path: the numpy rows the
groups keep in step with their tables (table_rows.py) give the lists padded with the null block."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP, NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvCacheError, KvInvariantError
from hipcore.runtime.cpu import CpuDevice

PLAIN = KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=24, block_size=4, dtype="f32")
WINDOWED = KvCacheConfig(n_layers=3, n_kv_heads=1, head_dim=32, num_blocks=24, block_size=4, dtype="f32",
                         layer_windows=(6, 0, 3), window_blocks=16)


def general_path_only(cache: KvCache) -> KvCache:
    """The cache with every fast path off (the reference)."""
    for group in cache._groups.values():
        group.appends_in_place = lambda *args: False
        group.appends_new_block = lambda *args: False
    return cache


def state(cache: KvCache) -> dict:
    groups = {}
    for name, group in cache._groups.items():
        groups[name] = dict(tables={s: list(t) for s, t in group.tables.items()}, kept_from=dict(group.kept_from),
                            refcounts=group.pool.refcounts(), free=group.pool.free_blocks(),
                            pending=tuple(group.pool._pending))
    return dict(lengths=dict(cache._lengths), groups=groups)


def answers(cache: KvCache) -> dict:
    """What the cache's queries say of every live sequence (tables as the kernels read them, and slots)."""
    ids = sorted(cache.sequences())
    out = {}
    for group in cache.groups:
        out[group] = cache.block_tables(ids, group=group).tolist() if ids else []
        for seq in ids:
            length = cache.seq_len(seq)
            kept = cache._groups[group].kept_from[seq]
            out[(group, seq)] = (cache.block_table(seq, group), cache.slot_mapping(seq, kept, length - kept, group).tolist())
    return out


reserve = st.tuples(st.just("reserve"), st.integers(0, 50), st.sampled_from([1, 1, 1, 1, 2, 3, 5, 9]))
def padded(tables: list[list[int]], width: int) -> list[list[int]]:
    return [list(t) + [NULL_BLOCK] * (width - len(t)) for t in tables]


def assert_tables_are_the_lists(cache: KvCache) -> None:
    ids = sorted(cache.sequences())
    for group in cache.groups:
        lists = [list(cache.block_table(s, group)) for s in ids]
        longest = max(map(len, lists), default=0)
        for width in {longest, min(longest + 13, cache.config.num_blocks)}:
            got = cache.block_tables(ids[::-1], width=width, group=group)
            assert got.dtype == np.int32 and got.tolist() == padded(lists[::-1], width)
        assert cache.block_tables(ids, group=group).shape == (len(ids), longest)


operation = st.one_of(  # mostly reserves, so that sequences grow past block and window boundaries
    reserve, reserve, reserve, reserve, reserve, reserve,
    st.tuples(st.just("add")),
    st.tuples(st.just("fork"), st.integers(0, 50)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("begin_step")),
    st.tuples(st.just("release_fenced")),
)


@pytest.mark.parametrize("config", [PLAIN, WINDOWED], ids=["one group", "sliding window"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=40, max_size=160))
def test_reserve_fast_path_leaves_the_state_of_the_general_path(config, ops):
    device = CpuDevice(capacity=64 << 20)
    fast, slow = KvCache(device, config), general_path_only(KvCache(device, config))
    next_seq = 0
    for op in ops:
        live = sorted(fast.sequences())
        if op[0] == "add":
            for cache in (fast, slow):
                cache.add_sequence(next_seq)
            next_seq += 1
        elif op[0] == "reserve" and live:
            seq = live[op[1] % len(live)]
            assert fast.reserve(seq, op[2]) == slow.reserve(seq, op[2])
        elif op[0] == "fork" and live:
            for cache in (fast, slow):
                cache.fork(live[op[1] % len(live)], next_seq)
            next_seq += 1
        elif op[0] == "free" and live:
            for cache in (fast, slow):
                cache.free_sequence(live[op[1] % len(live)])
        elif op[0] == "begin_step":
            assert fast.begin_step() == slow.begin_step()
        elif op[0] == "release_fenced":
            assert fast.release_fenced() == slow.release_fenced()
        assert state(fast) == state(slow)
        fast.check_invariants()  # the table rows among them
        assert_tables_are_the_lists(fast)
    assert answers(fast) == answers(slow)
    for cache in (fast, slow):
        cache.close()


def test_the_fast_paths_are_taken_for_a_token_into_its_own_block_or_a_fresh_one(cpu_device):
    cache = KvCache(cpu_device, WINDOWED)  # block size 4, the local group's window 6
    cache.add_sequence(1)
    assert cache.reserve(1, 5)  # two blocks in each group, the second holds one token
    plans = []
    for group in cache._groups.values():
        group.plan = lambda *args, _plan=group.plan: plans.append(args) or _plan(*args)
    local = cache._groups[LOCAL_GROUP]
    for _ in range(3):  # positions 5, 6, 7: room in the last block of each group
        assert cache.reserve(1, 1)
    assert not plans and local.kept_from[1] == 2
    assert cache.reserve(1, 1) and not plans  # position 8: a new block in each group, the window still in block 0
    assert len(cache.block_table(1)) == 3 and local.kept_from[1] == 3
    assert cache.reserve(1, 1) and len(plans) == 2  # position 9: the window leaves block 0 behind (general path)
    assert local.kept_from[1] == 4 and cache.block_table(1, LOCAL_GROUP)[0] == 0
    assert cache.reserve(1, 1) and len(plans) == 2 and local.kept_from[1] == 5  # position 10: in place again
    cache.fork(1, 2)
    assert cache.reserve(2, 1) and len(plans) == 4  # a shared partly filled block: copy-on-write, general path
    assert cache.seq_len(1) == 11
    cache.check_invariants()


@pytest.mark.parametrize("seq_id, n_tokens, message", [
    (True, 1, "sequence ids are non-negative integers"),  # True == 1 as a dict key: still refused
    (np.int64(1), 1, "sequence ids are non-negative integers"),
    (1, -1, "n_tokens must be a non-negative integer"),
    (1, 1.0, "n_tokens must be a non-negative integer"),
    (2, 1, "unknown sequence 2"),
])
def test_the_fast_path_refuses_what_the_general_path_refuses(cpu_device, seq_id, n_tokens, message):
    cache = KvCache(cpu_device, PLAIN)
    cache.add_sequence(1)
    cache.reserve(1, 1)
    before = state(cache)
    with pytest.raises(KvCacheError, match=message):
        cache.reserve(seq_id, n_tokens)
    assert state(cache) == before


def test_a_closed_cache_refuses_the_fast_path_too(cpu_device):
    cache = KvCache(cpu_device, PLAIN)
    cache.add_sequence(1)
    cache.reserve(1, 1)
    cache.close()
    with pytest.raises(KvCacheError, match="closed"):
        cache.reserve(1, 1)


def test_groups_are_named_as_the_cache_names_them():
    assert PLAIN.groups == (GLOBAL_GROUP,) and WINDOWED.groups == (GLOBAL_GROUP, LOCAL_GROUP)


def test_table_rows_grow_with_sequences_and_tables(cpu_device):
    config = KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=2000, block_size=4, dtype="f32",
                           layer_windows=(9, 0), window_blocks=1500)
    cache = KvCache(cpu_device, config)
    for seq in range(40):  # past the rows' first capacity, and tables past its first width
        cache.add_sequence(seq)
        assert cache.reserve(seq, 1 + 3 * seq)
    for seq in range(0, 40, 3):
        cache.fork(seq, 100 + seq)
        assert cache.reserve(100 + seq, 2)
    for seq in range(0, 40, 2):
        cache.free_sequence(seq)
    cache.check_invariants()
    assert_tables_are_the_lists(cache)
    for seq in range(200, 230):  # freed rows are taken again, all null block
        cache.add_sequence(seq)
        assert cache.reserve(seq, 5)
    cache.check_invariants()
    assert_tables_are_the_lists(cache)
    for seq in list(cache.sequences()):
        cache.free_sequence(seq)
    cache.release_fenced()
    cache.check_invariants(quiescent=True)
    assert cache.block_tables([]).shape == (0, 0)


def test_a_table_row_out_of_step_with_its_table_is_caught(cpu_device):
    cache = KvCache(cpu_device, PLAIN)
    cache.add_sequence(3)
    cache.reserve(3, 6)
    rows = cache._groups[GLOBAL_GROUP].rows
    rows.array[rows.row_of[3], 1] += 1  # a bug that changed a table without its row
    with pytest.raises(KvInvariantError, match=r"global group's table rows disagree with its block tables: the row of "
                                               r"sequence 3"):
        cache.check_invariants()
    rows.array[rows.row_of[3], 1] -= 1
    rows.array[rows.row_of[3] + 1, 0] = 5  # a row no sequence holds
    with pytest.raises(KvInvariantError, match="a row of no sequence holds blocks"):
        cache.check_invariants()


@pytest.mark.parametrize("config", [PLAIN, WINDOWED], ids=["one group", "sliding window"])
@pytest.mark.parametrize("seed", range(20))
def test_reserve_each_is_reserve_in_order_up_to_the_first_that_does_not_fit(config, seed):
    import random

    rng = random.Random(seed)
    device = CpuDevice(capacity=64 << 20)
    each, one = KvCache(device, config), KvCache(device, config)
    for cache in (each, one):
        for seq in range(6):
            cache.add_sequence(seq)
    for _ in range(12):
        items = [(rng.randrange(6), rng.choice([1, 1, 1, 2, 4, 7])) for _ in range(rng.randint(0, 8))]
        done = each.reserve_each(items)
        want = 0
        for seq, n in items:
            if not one.reserve(seq, n):
                break
            want += 1
        assert done == want and state(each) == state(one)
        if rng.random() < 0.3:  # make room again
            seq = rng.randrange(6)
            for cache in (each, one):
                cache.free_sequence(seq)
                cache.release_fenced()
                cache.add_sequence(seq)
    each.check_invariants()
