"""MemoryProfile: where a KV cache's memory is, at one moment.

Device bytes are exact (the pools are the only device memory the cache owns). Host-side figures
(page tables, allocator) are counted as a packed C implementation would store them, which is also
what a GPU needs uploaded; Python's own object overhead is not counted, because it says nothing
about the design:
  page-table bytes: 4 bytes (int32) per block-table entry, summed over live sequences, unpadded.
  allocator bytes:  4 bytes per free-list entry + 8 per pending entry (block, fence)
                    + 4 per block for the reference counts (null block included)
                    + 16 per live sequence (id and token count, two int64).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hipcore.kvcache.config import RESERVED_BLOCKS, KvCacheConfig

TABLE_ENTRY_BYTES = 4
FREE_ENTRY_BYTES = 4
PENDING_ENTRY_BYTES = 8
REFCOUNT_BYTES = 4
SEQUENCE_RECORD_BYTES = 16


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
    # device bytes of the pools: total == used + free + pending + reserved
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_profile(config: KvCacheConfig, tables: Mapping[int, Sequence[int]], lengths: Mapping[int, int],
                  refcounts: Sequence[int], free_blocks: int, pending_blocks: int) -> MemoryProfile:
    """Compute the profile from the cache's state (tables and lengths keyed by sequence id)."""
    bs = config.block_size
    bpb = config.bytes_per_block
    physical = sum(1 for c in refcounts if c > 0)
    logical = sum(len(t) for t in tables.values())
    # A physical block's filled slots: the most any holder has written into it. (Holders agree, since
    # appending into a shared partly filled block copies it first; max is right either way.)
    filled: dict[int, int] = {}
    for seq_id, table in tables.items():
        length = lengths[seq_id]
        for i, block in enumerate(table):
            filled[block] = max(filled.get(block, 0), min(bs, length - i * bs))
    used_slots = sum(filled.values())
    allocated_slots = physical * bs
    unused = allocated_slots - used_slots
    return MemoryProfile(
        dtype=config.dtype, block_size=bs, n_layers=config.n_layers, n_kv_heads=config.n_kv_heads,
        head_dim=config.head_dim, bytes_per_token=config.bytes_per_token, bytes_per_block=bpb,
        pool_bytes_total=config.cache_bytes, pool_bytes_used=physical * bpb, pool_bytes_free=free_blocks * bpb,
        pool_bytes_pending=pending_blocks * bpb, pool_bytes_reserved=RESERVED_BLOCKS * bpb,
        total_blocks=config.num_blocks, reserved_blocks=RESERVED_BLOCKS, free_blocks=free_blocks,
        pending_blocks=pending_blocks, physical_blocks=physical, logical_blocks=logical,
        active_sequences=len(tables), total_tokens=sum(lengths.values()),
        allocated_slots=allocated_slots, used_slots=used_slots,
        fragmentation_ratio=unused / allocated_slots if allocated_slots else 0.0,
        wasted_bytes=unused * config.bytes_per_token,
        shared_blocks=sum(1 for c in refcounts if c > 1), sharing_saved_bytes=(logical - physical) * bpb,
        capacity_tokens=free_blocks * bs,
        page_table_bytes=logical * TABLE_ENTRY_BYTES,
        allocator_bytes=(free_blocks * FREE_ENTRY_BYTES + pending_blocks * PENDING_ENTRY_BYTES
                         + config.num_blocks * REFCOUNT_BYTES + len(tables) * SEQUENCE_RECORD_BYTES),
    )
