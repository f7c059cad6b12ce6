"""The structural invariants of a KV cache's bookkeeping (docs/architecture.md, "KV cache invariants").

Checked by `KvCache.check_invariants()` after every operation in the property tests and at the end
of a leak check. O(blocks + table entries): cheap enough to run often, too slow for every step of
a production engine.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from hipcore.kvcache.block_pool import BlockPool
from hipcore.kvcache.config import NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvInvariantError


def check_cache_invariants(config: KvCacheConfig, pool: BlockPool, tables: Mapping[int, Sequence[int]],
                           lengths: Mapping[int, int]) -> None:
    refcounts = pool.refcounts()
    free, pending = pool.free_blocks(), pool.pending_blocks()
    if pool.num_blocks != config.num_blocks or len(refcounts) != config.num_blocks:
        raise KvInvariantError(f"the block pool has {pool.num_blocks} blocks, the config {config.num_blocks}")

    # Table validity (7): ids in range, never the null block, length matches the token count.
    holders: Counter[int] = Counter()
    if set(tables) != set(lengths):
        raise KvInvariantError(f"sequences with a table {sorted(tables)} differ from those with a length {sorted(lengths)}")
    for seq_id, table in tables.items():
        length = lengths[seq_id]
        if length < 0:
            raise KvInvariantError(f"sequence {seq_id} has a negative length {length}")
        if len(table) != config.blocks_for_tokens(length):
            raise KvInvariantError(
                f"sequence {seq_id} holds {len(table)} blocks for {length} tokens; "
                f"ceil({length} / {config.block_size}) = {config.blocks_for_tokens(length)}"
            )
        for block in table:
            if not 0 < block < config.num_blocks:
                what = "the null block" if block == NULL_BLOCK else "a block outside the pool"
                raise KvInvariantError(f"sequence {seq_id}'s table holds {what} ({block})")
        duplicated = [b for b, n in Counter(table).items() if n > 1]
        if duplicated:
            raise KvInvariantError(f"sequence {seq_id}'s table holds block {duplicated[0]} more than once")
        holders.update(table)

    # Reference counts (2): equal to the number of tables holding the block, never negative.
    if refcounts[NULL_BLOCK] != 0:
        raise KvInvariantError(f"the null block has reference count {refcounts[NULL_BLOCK]}")
    for block in range(1, config.num_blocks):
        if refcounts[block] < 0:
            raise KvInvariantError(f"block {block} has a negative reference count {refcounts[block]}")
        if refcounts[block] != holders.get(block, 0):
            seqs = sorted(s for s, t in tables.items() if block in t)[:10]
            raise KvInvariantError(
                f"block {block} has reference count {refcounts[block]} but {holders.get(block, 0)} tables hold it "
                f"(sequences {seqs})"
            )

    # Free and pending lists: distinct, disjoint, never the null block, never referenced.
    for name, blocks in (("free list", free), ("pending list", pending)):
        seen = Counter(blocks)
        for block, n in seen.items():
            if n > 1:
                raise KvInvariantError(f"block {block} is on the {name} {n} times")
            if not 0 < block < config.num_blocks:
                raise KvInvariantError(f"the {name} holds block {block}, which is the null block or outside the pool")
            if refcounts[block]:
                seqs = sorted(s for s, t in tables.items() if block in t)[:10]
                raise KvInvariantError(f"block {block} is on the {name} but referenced {refcounts[block]} times (sequences {seqs})")
    both = set(free) & set(pending)
    if both:
        raise KvInvariantError(f"block {min(both)} is both free and pending")

    # Conservation (1): free + pending + referenced == total - reserved.
    referenced = sum(1 for c in refcounts if c > 0)
    if len(free) + len(pending) + referenced != pool.num_usable:
        raise KvInvariantError(
            f"blocks do not add up: {len(free)} free + {len(pending)} pending + {referenced} referenced "
            f"!= {pool.num_usable} usable"
        )
