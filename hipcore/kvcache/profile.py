"""MemoryProfile: where a KV cache's memory is, at one moment.

Device bytes are exact (the pools are the only device memory the cache owns). Host-side figures
(page tables, allocator) are counted as a packed C implementation would store them, which is also
what a GPU needs uploaded; Python's own object overhead is not counted, because it says nothing
about the design:
  page-table bytes: 4 bytes (int32) per block-table entry, summed over live sequences, unpadded.
  allocator bytes:  4 bytes per free-list entry + 8 per pending entry (block, fence)
                    + 4 per block for the reference counts (null block included)
                    + 16 per live sequence (id and token count, two int64)
                    + 8 per live sequence in a sliding-window group (its first kept position).

With sliding-window layers the cache has two layer groups with pools of their own (config.py); the
top-level figures add both groups up (bytes, blocks, slots) and `groups` holds each group's own.
Block counts of the two groups add up only as counts: a local block holds fewer layers than a
global one, so the bytes of each group are in its GroupProfile.

Prefix caching (prefix_cache.py): a cached block is neither used nor free. It holds a prefix no live
sequence holds, valid and findable, and a reservation takes it (evicting it) only when no block is free:
  cached blocks/bytes  reported apart: total == reserved + free + pending + cached + physical.
  capacity             counts them: tokens that fit == (free + cached) x block size.
  fragmentation        is over physical blocks only, as before: a cached block is full by construction
                       (only full blocks are hashed), so counting it would only dilute the ratio.
  hit rate             prompt tokens found in the cache over prompt tokens looked up (vLLM's
                       prefix_cache_hits / prefix_cache_queries), since the cache was made.
The allocator figure counts 8 bytes per cached-LRU entry and, per hashed block, 8 (key) + 8 (parent
key) + 4 per token id of its entry + 8 for the index's key -> block entry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from hipcore.kvcache.block_group import BlockGroup
from hipcore.kvcache.config import NULL_BLOCK, RESERVED_BLOCKS, KvCacheConfig

TABLE_ENTRY_BYTES = 4
FREE_ENTRY_BYTES = 4
PENDING_ENTRY_BYTES = 8
CACHED_ENTRY_BYTES = 8
HASH_ENTRY_BYTES = 24  # key, parent key, and the index's key -> block entry; token ids are 4 bytes each on top
TOKEN_ID_BYTES = 4
REFCOUNT_BYTES = 4
SEQUENCE_RECORD_BYTES = 16
KEPT_FROM_BYTES = 8


@dataclass(frozen=True)
class GroupProfile:
    """One layer group's pool at one moment: total == reserved + free + pending + physical blocks."""

    name: str  # "global" or "local"
    layers: int
    window: int  # 0 for the global group
    bytes_per_token: int  # K + V of one token in this group's layers
    bytes_per_block: int
    total_blocks: int
    free_blocks: int
    pending_blocks: int
    physical_blocks: int
    logical_blocks: int  # table entries that hold a block (a shared block counts once per holder)
    cached_blocks: int  # prefix caching: no table holds it, contents kept until evicted
    released_blocks: int  # table entries released out of the window in live sequences (local group only)
    pool_bytes_total: int
    pool_bytes_used: int
    pool_bytes_free: int
    pool_bytes_pending: int
    pool_bytes_cached: int
    allocated_slots: int
    used_slots: int
    capacity_tokens: int  # (free + cached) blocks x block size


@dataclass(frozen=True)
class MemoryProfile:
    """A KV cache's memory at one moment. Block counts: total == reserved + free + pending + physical."""

    # shape
    dtype: str
    block_size: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    bytes_per_token: int  # K + V, every layer, KV heads, the dtype's real size (q8_0 scales included)
    bytes_per_block: int  # one block across K and V of every layer
    # device bytes of the pools: total == used + free + pending + reserved (+ pool_bytes_cached, below)
    pool_bytes_total: int
    pool_bytes_used: int
    pool_bytes_free: int
    pool_bytes_pending: int
    pool_bytes_reserved: int
    # blocks
    total_blocks: int
    reserved_blocks: int
    free_blocks: int
    pending_blocks: int  # released, waiting for the step fence before they are reusable
    physical_blocks: int  # held by at least one table (reference count > 0)
    logical_blocks: int  # sum of table lengths: a block shared by three sequences counts three times
    # sequences and tokens
    active_sequences: int
    total_tokens: int  # sum of sequence lengths (shared prefixes count once per sequence)
    # fragmentation: token slots of physical blocks that hold no token, over all their slots
    allocated_slots: int
    used_slots: int
    fragmentation_ratio: float
    wasted_bytes: int  # the unused slots' bytes
    # sharing (forks, shared prefixes)
    shared_blocks: int  # reference count > 1
    sharing_saved_bytes: int  # (logical - physical) blocks that did not need memory of their own
    # capacity: tokens that still fit == free blocks x block size
    capacity_tokens: int
    # host bookkeeping (see the module docstring for what is counted)
    page_table_bytes: int
    allocator_bytes: int
    # each layer group's own figures, global first (one entry for a model without sliding windows)
    groups: tuple[GroupProfile, ...] = ()
    # prefix caching (the module docstring): cached blocks of every group, their bytes, and the hit counts in tokens
    prefix_caching: bool = False
    cached_blocks: int = 0
    pool_bytes_cached: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "prefix_hit_rate": self.prefix_hit_rate}


def build_profile(config: KvCacheConfig, groups: Mapping[str, BlockGroup], lengths: Mapping[int, int],
                  prefix: Any = None) -> MemoryProfile:
    """Compute the profile from the cache's state (each group's pool and tables, lengths by sequence id, and the
    PrefixCaching with its counters, or None)."""
    parts = [_group_profile(config, group, lengths) for group in groups.values()]
    bs = config.block_size
    bpb = config.bytes_per_block
    physical = sum(p.physical_blocks for p in parts)
    logical = sum(p.logical_blocks for p in parts)
    allocated_slots = sum(p.allocated_slots for p in parts)
    used_slots = sum(p.used_slots for p in parts)
    # A slot of a local block holds fewer layers than one of a global block: weigh by bytes.
    allocated_bytes = sum(p.allocated_slots * p.bytes_per_token for p in parts)
    wasted = sum((p.allocated_slots - p.used_slots) * p.bytes_per_token for p in parts)
    free = sum(p.free_blocks for p in parts)
    pending = sum(p.pending_blocks for p in parts)
    cached = sum(p.cached_blocks for p in parts)
    hashed = [g.pool.prefix.entry_of for g in groups.values()]
    hash_bytes = sum(len(entries) * (HASH_ENTRY_BYTES + config.block_size * TOKEN_ID_BYTES) for entries in hashed)
    shared = sum(sum(1 for c in g.pool.refcounts() if c > 1) for g in groups.values())
    entries = sum(len(t) for g in groups.values() for t in g.tables.values())
    windowed = sum(len(g.tables) for g in groups.values() if g.window)
    return MemoryProfile(
        dtype=config.dtype, block_size=bs, n_layers=config.n_layers, n_kv_heads=config.n_kv_heads,
        head_dim=config.head_dim, bytes_per_token=config.bytes_per_token, bytes_per_block=bpb,
        pool_bytes_total=config.cache_bytes, pool_bytes_used=sum(p.pool_bytes_used for p in parts),
        pool_bytes_free=sum(p.pool_bytes_free for p in parts), pool_bytes_pending=sum(p.pool_bytes_pending for p in parts),
        pool_bytes_reserved=RESERVED_BLOCKS * sum(p.bytes_per_block for p in parts),
        total_blocks=sum(p.total_blocks for p in parts), reserved_blocks=RESERVED_BLOCKS * len(parts), free_blocks=free,
        pending_blocks=pending, physical_blocks=physical, logical_blocks=logical,
        active_sequences=len(lengths), total_tokens=sum(lengths.values()),
        allocated_slots=allocated_slots, used_slots=used_slots,
        fragmentation_ratio=wasted / allocated_bytes if allocated_bytes else 0.0,
        wasted_bytes=wasted,
        shared_blocks=shared, sharing_saved_bytes=sum((p.logical_blocks - p.physical_blocks) * p.bytes_per_block for p in parts),
        capacity_tokens=parts[0].capacity_tokens,  # tokens that still fit: the global group holds every token
        page_table_bytes=entries * TABLE_ENTRY_BYTES,
        allocator_bytes=(free * FREE_ENTRY_BYTES + pending * PENDING_ENTRY_BYTES + cached * CACHED_ENTRY_BYTES
                         + sum(p.total_blocks for p in parts) * REFCOUNT_BYTES + len(lengths) * SEQUENCE_RECORD_BYTES
                         + windowed * KEPT_FROM_BYTES + hash_bytes),
        groups=tuple(parts),
        prefix_caching=prefix is not None, cached_blocks=cached,
        pool_bytes_cached=sum(p.pool_bytes_cached for p in parts),
        prefix_query_tokens=prefix.query_tokens if prefix is not None else 0,
        prefix_hit_tokens=prefix.hit_tokens if prefix is not None else 0,
    )


def _group_profile(config: KvCacheConfig, group: BlockGroup, lengths: Mapping[int, int]) -> GroupProfile:
    bs = config.block_size
    bpb = config.group_bytes_per_block(group.name)
    refcounts = group.pool.refcounts()
    free, pending, cached = group.pool.num_free, group.pool.num_pending, group.pool.num_cached
    physical = sum(1 for c in refcounts if c > 0)
    # A physical block's filled slots: the most any holder has written into it. (Holders agree, since
    # appending into a shared partly filled block copies it first; max is right either way.)
    filled: dict[int, int] = {}
    logical = released = 0
    for seq_id, table in group.tables.items():
        length = lengths[seq_id]
        for i, block in enumerate(table):
            if block == NULL_BLOCK:
                released += 1
                continue
            logical += 1
            filled[block] = max(filled.get(block, 0), min(bs, length - i * bs))
    layers = len(config.window_layers) if group.window else len(config.global_layers)
    return GroupProfile(
        name=group.name, layers=layers, window=group.window, bytes_per_token=bpb // bs, bytes_per_block=bpb,
        total_blocks=group.pool.num_blocks, free_blocks=free, pending_blocks=pending, physical_blocks=physical,
        logical_blocks=logical, cached_blocks=cached, released_blocks=released,
        pool_bytes_total=group.pool.num_blocks * bpb, pool_bytes_used=physical * bpb, pool_bytes_free=free * bpb,
        pool_bytes_pending=pending * bpb, pool_bytes_cached=cached * bpb,
        allocated_slots=physical * bs, used_slots=sum(filled.values()), capacity_tokens=(free + cached) * bs,
    )
