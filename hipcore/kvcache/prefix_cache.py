"""Prefix caching across a KvCache's layer groups: find the longest cached prefix of a prompt, attach its blocks to
a new sequence, and hash a sequence's computed full blocks (docs/architecture.md "Prefix caching"; the per-pool
maps are prefix_index.py, the block states block_pool.py).

What is shared: only full blocks, and only blocks below the prompt's last token, so that every attached block is
read and never written (a sequence writes at its length and past it) and the step that follows computes at least
the last prompt token (its logits). A prompt fully cached recomputes its last block's tokens.

Sliding-window groups: a block out of the window of the sequence that held it went back to its pool when it left
the window (block_group.py), hashed or not; a hashed one stays cached, an unhashed one is free. A new sequence of
P cached tokens needs, in a window group, only the blocks of positions max(0, P - window) ... P - 1 (what its next
query can read); its table is the null block below them, as a sequence that grew to P would hold. The prefix hit is
the longest P (a multiple of the block size) that every group can give: all P tokens in the global group, the
window's blocks in each window group.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Mapping, Sequence

from hipcore.kvcache.block_group import BlockGroup
from hipcore.kvcache.config import NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvCacheError
from hipcore.kvcache.prefix_index import BlockEntry, BlockHash, BlockKeys, chain_entries


class PrefixCaching:
    """The prefix cache of one KvCache (the cache holds its lock around every call), with its hit counters in
    tokens, as vLLM counts them: queries (prompt tokens looked up) and hits (tokens found)."""

    def __init__(self, config: KvCacheConfig, groups: Mapping[str, BlockGroup], model_identity: str,
                 block_hash: BlockHash = hash):
        self.config = config
        self.groups = groups
        self.block_hash = block_hash
        self.salts = {name: block_hash(("rocmforge-kv", model_identity, config.dtype, config.block_size, name, group.window))
                      for name, group in groups.items()}
        self.query_tokens = 0
        self.hit_tokens = 0

    def entries(self, group: str, tokens: Sequence[int], count: int, keys: BlockKeys | None = None) -> list[BlockEntry]:
        """The entries of the first `count` full blocks of `tokens` in `group`; from `keys` (the BlockKeys of a token
        list that starts with `tokens`), hashed there once, where given."""
        if keys is not None:
            return keys.entries(self.salts[group], self.config.block_size, count, self.block_hash)
        return chain_entries(self.salts[group], tokens, self.config.block_size, count, self.block_hash)

    def match(self, tokens: Sequence[int], keys: BlockKeys | None = None) -> tuple[int, dict[str, list[int]]]:
        """(cached tokens, each group's table for them) of the longest cached prefix of `tokens` that leaves the
        last token to compute; changes nothing."""
        bs = self.config.block_size
        most = (len(tokens) - 1) // bs if tokens else 0
        found: dict[str, list[int | None]] = {}
        full = most
        for name, group in self.groups.items():
            entries = self.entries(name, tokens, most, keys)
            blocks = [group.pool.lookup(entry) for entry in entries]
            found[name] = blocks
            if not group.window:
                full = min(full, next((i for i, b in enumerate(blocks) if b is None), len(blocks)))
        for n in range(full, 0, -1):  # the longest prefix every window group can give too
            tables = {}
            for name, group in self.groups.items():
                low = max(0, n * bs - group.window) // bs if group.window else 0
                blocks = found[name][low:n]
                if None in blocks:
                    break
                tables[name] = [NULL_BLOCK] * low + blocks  # type: ignore[operator]
            else:
                return n * bs, tables
        return 0, {}

    def peek(self, tokens: Sequence[int], keys: BlockKeys | None = None) -> tuple[int, int]:
        """(cached tokens, how many of the global blocks holding them are cached, not held) for `tokens`: what
        attach would give, and how many available blocks it would take out of the pool's reach."""
        cached, tables = self.match(tokens, keys)
        if not cached:
            return 0, 0
        pool = next(iter(self.groups.values())).pool  # the global group: the admission unit
        table = next(iter(tables.values()))
        return cached, sum(1 for block in table if not pool.refcount_of_held(block))

    def attach(self, seq_id: int, tokens: Sequence[int], keys: BlockKeys | None = None) -> int:
        """Give the new (empty) sequence `seq_id` the blocks of the longest cached prefix of `tokens`; returns its
        length (cached tokens). Counts the lookup."""
        cached, tables = self.match(tokens, keys)
        self.query_tokens += len(tokens)
        self.hit_tokens += cached
        for name, table in tables.items():
            group = self.groups[name]
            for block in table:
                if block != NULL_BLOCK:
                    group.pool.take_cached(block, seq_id)
            kept_from = max(0, cached - group.window) if group.window else 0
            group.attach(seq_id, table, kept_from)
        return cached

    def register(self, seq_id: int, tokens: Sequence[int], length: int, keys: BlockKeys | None = None) -> int:
        """Hash the full blocks of sequence `seq_id` (of `length` reserved tokens) whose tokens, `tokens`, have their
        K/V computed; returns how many blocks are hashed after it (in the global group)."""
        bs = self.config.block_size
        count = min(len(tokens), length) // bs
        hashed = 0
        for name, group in self.groups.items():
            table = group.tables[seq_id]
            for block, entry in zip(table, self.entries(name, tokens, count, keys)):
                if block != NULL_BLOCK and group.pool.register(block, entry, seq_id) and not group.window:
                    hashed += 1
        return hashed

    def flush(self) -> int:
        """Evict every cached block of every group; returns how many."""
        return sum(group.pool.flush_cached() for group in self.groups.values())


class PrefixCacheMethods:
    """The KvCache's prefix-caching methods (mixed into KvCache, which provides these attributes)."""

    config: KvCacheConfig
    prefix: PrefixCaching | None
    _groups: dict[str, BlockGroup]
    _lengths: dict[int, int]
    _tables: dict[int, list[int]]
    _lock: threading.RLock
    _model_identity: str
    _block_hash: BlockHash

    if TYPE_CHECKING:  # KvCache's

        def _check_open(self) -> None: ...

        def _table(self, seq_id: int) -> list[int]: ...

    num_pending_blocks: int  # (BlockCounts')

    def cached_prefix(self, tokens: Sequence[int], keys: BlockKeys | None = None) -> tuple[int, int]:
        """(tokens add_sequence(_, tokens) would start with, cached global blocks it would take out of the available
        ones); (0, 0) with caching off. Changes nothing, counts nothing. `keys`: as add_sequence's."""
        with self._lock:
            self._check_open()
            return self.prefix.peek(tokens, keys) if self.prefix is not None and tokens else (0, 0)

    def register_computed(self, seq_id: int, computed: Sequence[int], keys: BlockKeys | None = None) -> int:
        """With prefix caching on: the sequence's first len(computed) tokens are `computed` and their K/V are written
        (the step that wrote them has finished); its full blocks among them are hashed, to be found by later
        prompts. Returns how many of its global blocks are hashed (0 with caching off). `keys`: as add_sequence's."""
        with self._lock:
            self._table(seq_id)
            if self.prefix is None:
                return 0
            return self.prefix.register(seq_id, computed, self._lengths[seq_id], keys)

    def flush_prefix_cache(self) -> int:
        """Evict every cached block to the free list; returns how many (0 with caching off)."""
        with self._lock:
            return self.prefix.flush() if self.prefix is not None else 0

    def set_prefix_caching(self, enabled: bool) -> None:
        """Turn prefix caching on or off (off evicts every cached block); only with no sequence live (a bench that
        measures the same load both ways on one model)."""
        with self._lock:
            self._check_open()
            if self._tables or self.num_pending_blocks:
                raise KvCacheError("prefix caching changes only while no sequence is live and nothing is pending")
            if enabled and self.prefix is None:
                self.prefix = PrefixCaching(self.config, self._groups, self._model_identity, self._block_hash)
            elif not enabled and self.prefix is not None:
                self.prefix.flush()
                self.prefix = None

    def reset_prefix_counts(self) -> None:
        """The hit counters (MemoryProfile.prefix_query_tokens, prefix_hit_tokens) back to 0."""
        with self._lock:
            if self.prefix is not None:
                self.prefix.query_tokens = self.prefix.hit_tokens = 0
