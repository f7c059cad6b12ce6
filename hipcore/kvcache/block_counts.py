"""BlockCounts: the block counts a KvCache answers, of the global group (the admission unit) or of one named group
(block_pool.py says what free, pending, cached and available mean)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hipcore.kvcache.config import GLOBAL_GROUP

if TYPE_CHECKING:
    import threading

    from hipcore.kvcache.block_group import BlockGroup
    from hipcore.kvcache.block_pool import BlockPool
    from hipcore.kvcache.config import KvCacheConfig


class BlockCounts:
    """Mixed into KvCache, which provides these attributes."""

    config: "KvCacheConfig"
    _pool: "BlockPool"
    _groups: "dict[str, BlockGroup]"
    _lock: "threading.RLock"

    if TYPE_CHECKING:

        def _group(self, group: str) -> "BlockGroup": ...  # KvCache's

    @property
    def num_free_blocks(self) -> int:
        """Free blocks of the global group (the admission unit; see num_free_blocks_in)."""
        return self._pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        """Cached (evictable) blocks of every group: neither used nor free (block_pool.py)."""
        return sum(group.pool.num_cached for group in self._groups.values())

    @property
    def num_available_blocks(self) -> int:
        """Global blocks a reservation may take: the free ones and the cached ones it would evict."""
        return self._pool.num_available

    def num_available_blocks_in(self, group: str) -> int:
        return self._group(group).pool.num_available

    def num_cached_blocks_in(self, group: str) -> int:
        return self._group(group).pool.num_cached

    @property
    def num_pending_blocks(self) -> int:
        """Blocks of every group waiting for the step fence."""
        return sum(group.pool.num_pending for group in self._groups.values())

    @property
    def num_usable_blocks(self) -> int:
        """Global blocks a sequence could ever get (all but the null block): the admission limit."""
        return self._pool.num_usable

    def num_free_blocks_in(self, group: str) -> int:
        return self._group(group).pool.num_free

    def num_pending_blocks_in(self, group: str) -> int:
        return self._group(group).pool.num_pending

    def num_usable_blocks_in(self, group: str) -> int:
        return self._group(group).pool.num_usable

    @property
    def tokens_that_fit(self) -> int:
        return self._pool.num_available * self.config.block_size

    def refcount(self, block: int, group: str = GLOBAL_GROUP) -> int:
        with self._lock:
            return self._group(group).pool.refcount(block)
