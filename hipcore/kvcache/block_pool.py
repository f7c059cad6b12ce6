"""Host bookkeeping of the KV blocks: free list, reference counts, the step-fenced pending list, and the
prefix cache's hashed blocks (prefix_index.py).

A block is in exactly one of five states:
  reserved   block 0, the null block: never handed out, never freed (table padding points at it)
  free       on the free list, reference count 0: may be handed out
  referenced reference count > 0: held by that many block tables
  pending    reference count 0 but not yet reusable: the device work of a step that may still
             read or write it has not been confirmed finished (the step fence)
  cached     reference count 0, past the fence, contents valid and hashed (prefix caching): on the LRU,
             taken again by a sequence with the same prefix or evicted (oldest first) to the free list
             when a take needs more blocks than are free. A hashed block released goes pending, then
             cached; an unhashed one pending, then free.

Nothing here touches device memory; the KvCache owns the pools and the block tables.
"""

from __future__ import annotations

from collections import deque

from hipcore.kvcache.config import NULL_BLOCK, RESERVED_BLOCKS
from hipcore.kvcache.errors import KvInvariantError
from hipcore.kvcache.prefix_index import BlockEntry, BlockHash, PrefixIndex


class BlockPool:
    """Free list + reference counts of `num_blocks` blocks (block 0 reserved). Not thread-safe:
    the KvCache serialises access."""

    def __init__(self, num_blocks: int, block_hash: BlockHash = hash):
        if num_blocks < RESERVED_BLOCKS + 1:
            raise ValueError(f"a block pool needs at least {RESERVED_BLOCKS + 1} blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self._refcount = [0] * num_blocks
        # A stack: the most recently freed block is reused first (it is the warmest in the caches).
        # Built in reverse so that a fresh pool hands out 1, 2, 3 ... which keeps tests readable.
        self._free: list[int] = list(range(num_blocks - 1, RESERVED_BLOCKS - 1, -1))
        self._pending: deque[tuple[int, int]] = deque()  # (block, fence); fences never decrease
        self.prefix = PrefixIndex(block_hash)  # hashed blocks and the LRU of cached ones (empty without caching)
        self.evictions = 0  # cached blocks evicted to the free list, ever

    # ---- queries -------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self.prefix.lru)

    @property
    def num_available(self) -> int:
        """Blocks a take may hand out: the free ones and the cached ones it would evict."""
        return len(self._free) + len(self.prefix.lru)

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

    def cached_blocks(self) -> tuple[int, ...]:
        """Cached blocks, least recently used first."""
        return tuple(self.prefix.lru)

    # ---- state changes -------------------------------------------------------------------------

    def take(self, count: int, seq_id: int) -> list[int] | None:
        """Hand out `count` blocks, each with reference count 1, or None (nothing changed) if fewer
        than `count` are free or cached; cached blocks are evicted (least recently used first) only for
        what the free list lacks."""
        if count < 0:
            raise ValueError(f"cannot take {count} blocks")
        if count > len(self._free):
            if count > len(self._free) + len(self.prefix.lru):
                return None
            self.evict(count - len(self._free))
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

    # ---- the prefix cache ----------------------------------------------------------------------

    def lookup(self, entry: BlockEntry) -> int | None:
        """The block holding `entry`'s contents if a sequence may take it now (referenced or cached; a pending
        block is not: it waits for the fence), else None."""
        block = self.prefix.find(entry)
        if block is None or (not self._refcount[block] and block not in self.prefix.lru):
            return None
        return block

    def take_cached(self, block: int, seq_id: int) -> None:
        """One more table holds `block`, a hit of lookup(): a cached block leaves the LRU with reference count 1."""
        if block in self.prefix.lru:
            del self.prefix.lru[block]
            self._refcount[block] = 1
        else:
            self.share(block, seq_id)

    def register(self, block: int, entry: BlockEntry, seq_id: int) -> bool:
        """Hash a full block whose contents are computed (a table holds it); False when another block holds that
        prefix already (this one then goes free when released). A block hashed already must be hashed alike."""
        self._check_id(block, f"hashing by sequence {seq_id}")
        if self._refcount[block] <= 0:
            raise KvInvariantError(f"sequence {seq_id} hashed block {block}, which no sequence holds")
        stored = self.prefix.entry_of.get(block)
        if stored is not None:
            if stored != entry:
                raise KvInvariantError(f"sequence {seq_id} hashed block {block} as another prefix than its own entry "
                                       f"(key {entry.key:#x}, stored {stored.key:#x})")
            return True
        return self.prefix.add(block, entry)

    def evict(self, count: int) -> int:
        """Move up to `count` cached blocks, least recently used first, to the free list (their hash entries
        dropped); returns how many moved."""
        lru = self.prefix.lru
        moved = 0
        while moved < count and lru:
            block = next(iter(lru))
            self.prefix.forget(block)
            self._free.append(block)
            moved += 1
        self.evictions += moved
        return moved

    def flush_cached(self) -> int:
        """Evict every cached block (the end of a leak check, or a cache turned off)."""
        return self.evict(len(self.prefix.lru))

    def discard_unused(self, blocks: list[int], fence: int) -> None:
        """Undo `take` for blocks that never reached a table (an error between take and commit).
        They go through the fence too, since device work may have been queued on them."""
        for block in blocks:
            self.release(block, -1, fence)

    def release_fenced(self, completed_fence: int | None = None) -> int:
        """Move pending blocks whose fence is <= completed_fence (all of them when None) to the free
        list, or a hashed one to the LRU of cached blocks; returns how many moved."""
        moved = 0
        hashed, lru = self.prefix.entry_of, self.prefix.lru
        while self._pending and (completed_fence is None or self._pending[0][1] <= completed_fence):
            block, _ = self._pending.popleft()
            if block in hashed:
                lru[block] = None
            else:
                self._free.append(block)
            moved += 1
        return moved

    def _check_id(self, block: object, what: str) -> None:
        if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block < self.num_blocks:
            raise KvInvariantError(f"{what}: block id {block!r} is outside the pool (0..{self.num_blocks - 1})")
        if block == NULL_BLOCK:
            raise KvInvariantError(f"{what}: block {NULL_BLOCK} is the reserved null block and is never handed out or freed")
