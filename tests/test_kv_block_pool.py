"""BlockPool: free list, reference counts, the step-fenced pending list."""

from __future__ import annotations

import pytest

from hipcore.kvcache.block_pool import BlockPool
from hipcore.kvcache.errors import KvInvariantError


def test_fresh_pool_hands_out_every_block_but_the_null_block():
    pool = BlockPool(6)
    assert pool.num_free == 5 and pool.num_usable == 5
    taken = pool.take(5, seq_id=1)
    assert sorted(taken) == [1, 2, 3, 4, 5]
    assert all(pool.refcount(b) == 1 for b in taken)
    assert pool.take(1, seq_id=1) is None


def test_take_is_all_or_nothing():
    pool = BlockPool(4)
    before = (pool.free_blocks(), pool.refcounts())
    assert pool.take(4, seq_id=3) is None
    assert (pool.free_blocks(), pool.refcounts()) == before
    assert pool.take(0, seq_id=3) == []


def test_release_goes_through_the_fence():
    pool = BlockPool(4)
    a, b = pool.take(2, seq_id=1)
    assert pool.release(a, seq_id=1, fence=0) is True
    assert pool.num_free == 1 and pool.num_pending == 1 and pool.pending_blocks() == (a,)
    # A pending block is not handed out again before the fence.
    assert pool.take(2, seq_id=2) is None
    assert pool.release_fenced() == 1
    assert pool.num_pending == 0 and pool.num_free == 2
    assert a in pool.take(2, seq_id=2)


def test_fenced_release_only_up_to_the_completed_step():
    pool = BlockPool(5)
    blocks = pool.take(3, seq_id=1)
    for fence, block in zip((1, 2, 3), blocks):
        pool.release(block, seq_id=1, fence=fence)
    assert pool.release_fenced(2) == 2
    assert pool.pending_blocks() == (blocks[2],)
    assert pool.release_fenced(2) == 0
    assert pool.release_fenced(3) == 1


def test_shared_block_is_released_only_by_its_last_holder():
    pool = BlockPool(3)
    (block,) = pool.take(1, seq_id=1)
    pool.share(block, seq_id=2)
    assert pool.refcount(block) == 2
    assert pool.release(block, seq_id=1, fence=0) is False
    assert pool.num_pending == 0 and pool.refcount(block) == 1
    assert pool.release(block, seq_id=2, fence=0) is True


def test_reference_count_never_goes_below_zero_and_the_error_names_block_and_sequence():
    pool = BlockPool(3)
    (block,) = pool.take(1, seq_id=7)
    pool.release(block, seq_id=7, fence=0)
    with pytest.raises(KvInvariantError, match=rf"sequence 9 released block {block}.*below zero"):
        pool.release(block, seq_id=9, fence=0)
    assert pool.refcount(block) == 0 and pool.num_pending == 1


def test_a_block_nobody_holds_cannot_be_shared():
    pool = BlockPool(3)
    with pytest.raises(KvInvariantError, match="sequence 4 tried to share block 1"):
        pool.share(1, seq_id=4)


@pytest.mark.parametrize("op", ["share", "release", "refcount"])
@pytest.mark.parametrize("block", [0, -1, 3, True, 1.0])
def test_the_null_block_and_bad_ids_are_refused(op, block):
    pool = BlockPool(3)
    pool.take(2, seq_id=1)
    before = pool.refcounts()
    with pytest.raises(KvInvariantError, match="null block|outside the pool"):
        if op == "share":
            pool.share(block, seq_id=1)
        elif op == "release":
            pool.release(block, seq_id=1, fence=0)
        else:
            pool.refcount(block)
    assert pool.refcounts() == before


def test_discard_unused_returns_taken_blocks_through_the_fence():
    pool = BlockPool(4)
    taken = pool.take(2, seq_id=1)
    pool.discard_unused(taken, fence=0)
    assert pool.num_free == 1 and pool.num_pending == 2
    pool.release_fenced()
    assert pool.num_free == 3 and all(pool.refcount(b) == 0 for b in taken)
