"""Host bookkeeping of the KV blocks: free list, reference counts, and the step-fenced pending list.

A block is in exactly one of four states:
  reserved   block 0, the null block: never handed out, never freed (table padding points at it)
  free       on the free list, reference count 0: may be handed out
  referenced reference count > 0: held by that many block tables
  pending    reference count 0 but not yet reusable: the device work of a step that may still
             read or write it has not been confirmed finished (the step fence)

Nothing here touches device memory; the KvCache owns the pools and the block tables.
"""

from __future__ import annotations

from collections import deque

from hipcore.kvcache.config import NULL_BLOCK, RESERVED_BLOCKS
from hipcore.kvcache.errors import KvInvariantError


class BlockPool:
    """Free list + reference counts of `num_blocks` blocks (block 0 reserved). Not thread-safe:
    the KvCache serialises access."""

    def __init__(self, num_blocks: int):
        if num_blocks < RESERVED_BLOCKS + 1:
            raise ValueError(f"a block pool needs at least {RESERVED_BLOCKS + 1} blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self._refcount = [0] * num_blocks
        # A stack: the most recently freed block is reused first (it is the warmest in the caches).
        # Built in reverse so that a fresh pool hands out 1, 2, 3 ... which keeps tests readable.
        self._free: list[int] = list(range(num_blocks - 1, RESERVED_BLOCKS - 1, -1))
        self._pending: deque[tuple[int, int]] = deque()  # (block, fence); fences never decrease

    # ---- queries -------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_usable(self) -> int:
        return self.num_blocks - RESERVED_BLOCKS

    def refcount(self, block: int) -> int:
        self._check_id(block, "refcount")
        return self._refcount[block]

    def refcount_of_held(self, block: int) -> int:
        """refcount() without the id check, for a block read out of a live table (valid by invariant 7)."""
        return self._refcount[block]

    def refcounts(self) -> tuple[int, ...]:
        return tuple(self._refcount)

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(self._free)

    def pending_blocks(self) -> tuple[int, ...]:
        return tuple(b for b, _ in self._pending)

    # ---- state changes -------------------------------------------------------------------------

    def take(self, count: int, seq_id: int) -> list[int] | None:
        """Hand out `count` blocks, each with reference count 1, or None (nothing changed) if fewer
        than `count` are free."""
        if count < 0:
            raise ValueError(f"cannot take {count} blocks")
        if count > len(self._free):
            return None
        taken = self._free[len(self._free) - count:][::-1]
        for block in taken:
            if self._refcount[block] != 0:
                raise KvInvariantError(
                    f"block {block} was on the free list with reference count {self._refcount[block]} "
                    f"when sequence {seq_id} asked for it"
                )
        del self._free[len(self._free) - count:]
        for block in taken:
            self._refcount[block] = 1
        return taken

    def share(self, block: int, seq_id: int) -> None:
        """One more table holds `block` (a fork). Only a block someone already holds can be shared."""
        self._check_id(block, f"sharing with sequence {seq_id}")
        if self._refcount[block] <= 0:
            raise KvInvariantError(
                f"sequence {seq_id} tried to share block {block}, which no sequence holds (reference count "
                f"{self._refcount[block]}): it is free or pending and may belong to someone else next"
            )
        self._refcount[block] += 1

    def release(self, block: int, seq_id: int, fence: int) -> bool:
        """One table stops holding `block`. When no table holds it any more it goes to the pending
        list under `fence`; returns True in that case."""
        self._check_id(block, f"release by sequence {seq_id}")
        if self._refcount[block] <= 0:
            raise KvInvariantError(
                f"sequence {seq_id} released block {block} whose reference count is already "
                f"{self._refcount[block]}: the count would go below zero (a double free)"
            )
        self._refcount[block] -= 1
        if self._refcount[block]:
            return False
        self._pending.append((block, fence))
        return True

    def discard_unused(self, blocks: list[int], fence: int) -> None:
        """Undo `take` for blocks that never reached a table (an error between take and commit).
        They go through the fence too, since device work may have been queued on them."""
        for block in blocks:
            self.release(block, -1, fence)

    def release_fenced(self, completed_fence: int | None = None) -> int:
        """Move pending blocks whose fence is <= completed_fence (all of them when None) to the free
        list; returns how many moved."""
        moved = 0
        while self._pending and (completed_fence is None or self._pending[0][1] <= completed_fence):
            block, _ = self._pending.popleft()
            self._free.append(block)
            moved += 1
        return moved

    def _check_id(self, block: object, what: str) -> None:
        if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block < self.num_blocks:
            raise KvInvariantError(f"{what}: block id {block!r} is outside the pool (0..{self.num_blocks - 1})")
        if block == NULL_BLOCK:
            raise KvInvariantError(f"{what}: block {NULL_BLOCK} is the reserved null block and is never handed out or freed")
