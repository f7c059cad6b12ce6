"""The structural invariants of a KV cache's bookkeeping (docs/architecture.md, "KV cache invariants").

Checked by `KvCache.check_invariants()` after every operation in the property tests and at the end
of a leak check. O(blocks + table entries): cheap enough to run often, too slow for every step of
a production engine.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from hipcore.kvcache.block_group import BlockGroup
from hipcore.kvcache.config import NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvInvariantError


def check_group_invariants(config: KvCacheConfig, group: BlockGroup, lengths: Mapping[int, int]) -> None:
    """Invariants 1, 2 and 7 in one layer group; every message names the group. In a sliding-window
    group also: a table entry is the null block exactly below the sequence's first kept position, and
    every released position is out of the window of the sequence's newest token (and so of every later
    one): position p was released only if p + window < length."""
    pool, tables, name = group.pool, group.tables, group.name
    refcounts = pool.refcounts()
    free, pending, cached = pool.free_blocks(), pool.pending_blocks(), pool.cached_blocks()
    num_blocks = config.group_blocks(name)
    if pool.num_blocks != num_blocks or len(refcounts) != num_blocks:
        raise KvInvariantError(f"the {name} block pool has {pool.num_blocks} blocks, the config {num_blocks}")

    # Table validity (7): ids in range, never the null block (but out of the window), length matches the tokens.
    holders: Counter[int] = Counter()
    if set(tables) != set(lengths) or set(group.kept_from) != set(lengths):
        raise KvInvariantError(f"sequences with a {name} table {sorted(tables)} differ from those with a length "
                               f"{sorted(lengths)}")
    for seq_id, table in tables.items():
        length = lengths[seq_id]
        if length < 0:
            raise KvInvariantError(f"sequence {seq_id} has a negative length {length}")
        if len(table) != config.blocks_for_tokens(length):
            raise KvInvariantError(
                f"sequence {seq_id} holds {len(table)} blocks for {length} tokens in the {name} group; "
                f"ceil({length} / {config.block_size}) = {config.blocks_for_tokens(length)}"
            )
        released = _check_window(config, group, seq_id, table, length)
        held = table[released:]
        for block in held:
            if not 0 < block < num_blocks:
                what = "the null block" if block == NULL_BLOCK else "a block outside the pool"
                raise KvInvariantError(f"sequence {seq_id}'s {name} table holds {what} ({block})")
        duplicated = [b for b, n in Counter(held).items() if n > 1]
        if duplicated:
            raise KvInvariantError(f"sequence {seq_id}'s {name} table holds block {duplicated[0]} more than once")
        holders.update(held)

    # Reference counts (2): equal to the number of tables holding the block, never negative.
    if refcounts[NULL_BLOCK] != 0:
        raise KvInvariantError(f"the {name} null block has reference count {refcounts[NULL_BLOCK]}")
    for block in range(1, num_blocks):
        if refcounts[block] < 0:
            raise KvInvariantError(f"{name} block {block} has a negative reference count {refcounts[block]}")
        if refcounts[block] != holders.get(block, 0):
            seqs = sorted(s for s, t in tables.items() if block in t)[:10]
            raise KvInvariantError(
                f"{name} block {block} has reference count {refcounts[block]} but {holders.get(block, 0)} tables "
                f"hold it (sequences {seqs})"
            )

    # Free, pending and cached lists: distinct, disjoint, never the null block, never referenced.
    for listing, blocks in (("free list", free), ("pending list", pending), ("cached list", cached)):
        seen = Counter(blocks)
        for block, n in seen.items():
            if n > 1:
                raise KvInvariantError(f"{name} block {block} is on the {listing} {n} times")
            if not 0 < block < num_blocks:
                raise KvInvariantError(f"the {name} {listing} holds block {block}, which is the null block or outside "
                                       "the pool")
            if refcounts[block]:
                seqs = sorted(s for s, t in tables.items() if block in t)[:10]
                raise KvInvariantError(f"{name} block {block} is on the {listing} but referenced {refcounts[block]} "
                                       f"times (sequences {seqs})")
    for (one, a), (other, b) in (((("free", free), ("pending", pending))), (("free", free), ("cached", cached)),
                                 (("pending", pending), ("cached", cached))):
        both = set(a) & set(b)
        if both:
            raise KvInvariantError(f"{name} block {min(both)} is both {one} and {other}")

    # Conservation (1): free + pending + cached + referenced == total - reserved.
    referenced = sum(1 for c in refcounts if c > 0)
    if len(free) + len(pending) + len(cached) + referenced != pool.num_usable:
        raise KvInvariantError(
            f"{name} blocks do not add up: {len(free)} free + {len(pending)} pending + {len(cached)} cached + "
            f"{referenced} referenced != {pool.num_usable} usable"
        )

    # The numpy copy of the tables that steps read (table_rows.py) says what the lists say.
    disagreement = group.rows.check(tables)
    if disagreement:
        raise KvInvariantError(f"the {name} group's table rows disagree with its block tables: {disagreement}")


def _check_window(config: KvCacheConfig, group: BlockGroup, seq_id: int, table: list[int], length: int) -> int:
    """How many leading entries of the table were released out of the window (0 in a global group)."""
    kept_from, bs, window = group.kept_from[seq_id], config.block_size, group.window
    if not window:
        if kept_from:
            raise KvInvariantError(f"sequence {seq_id} keeps its {group.name} blocks from position {kept_from}, "
                                   "but a global group keeps every position")
        return 0
    if not 0 <= kept_from <= max(0, length - window):
        raise KvInvariantError(
            f"sequence {seq_id} released its {group.name} blocks below position {kept_from}, inside the window of "
            f"its newest token (positions {max(0, length - window)} to {length - 1}, window {window})")
    released = kept_from // bs
    stray = [i for i in range(released) if table[i] != NULL_BLOCK]
    if stray:
        raise KvInvariantError(
            f"sequence {seq_id}'s {group.name} table still holds block {table[stray[0]]} for positions "
            f"{stray[0] * bs} to {stray[0] * bs + bs - 1}, all out of the window (kept from {kept_from}): it "
            "should have gone back to the pool")
    return released


def check_prefix_invariants(group: BlockGroup, salt: int, block_size: int,
                            sequence_tokens: Mapping[int, Sequence[int]] | None = None) -> None:
    """The prefix cache's invariants in one layer group (docs/architecture.md, "Prefix caching"): every hash entry's
    key is the hash of its parent key and token ids (a full block's), the key maps back to that block, and the block
    is referenced, pending or cached, never free; every cached block is hashed. With `sequence_tokens` (each live
    sequence's computed tokens), every hashed block a sequence holds at table index i holds that sequence's tokens
    i * block_size ... (i + 1) * block_size - 1, and a sequence's first block is keyed on the group's salt."""
    pool, name = group.pool, group.name
    index = pool.prefix
    free = set(pool.free_blocks())
    for key, block in index.block_of.items():
        entry = index.entry_of.get(block)
        if entry is None or entry.key != key:
            raise KvInvariantError(f"the {name} prefix index maps key {key:#x} to block {block}, whose entry "
                                   f"{'is missing' if entry is None else f'has key {entry.key:#x}'}")
    for block, entry in index.entry_of.items():
        if index.block_of.get(entry.key) != block:
            raise KvInvariantError(f"{name} block {block}'s hash entry (key {entry.key:#x}) is not in the index")
        if block in free:
            raise KvInvariantError(f"the {name} prefix index points at block {block}, which is free: a lookup of its "
                                   "prefix would hand out a block someone else may fill")
        if len(entry.tokens) != block_size or index.block_hash((entry.parent, entry.tokens)) != entry.key:
            raise KvInvariantError(f"{name} block {block}'s hash entry does not match its contents: key {entry.key:#x} "
                                   f"is not the hash of its parent key and its {len(entry.tokens)} token ids")
    for block in index.lru:
        if block not in index.entry_of:
            raise KvInvariantError(f"{name} block {block} is cached but has no hash entry: nothing can find it")
        if pool.refcount_of_held(block):
            raise KvInvariantError(f"{name} block {block} is cached (evictable) but referenced "
                                   f"{pool.refcount_of_held(block)} times")
    for seq_id, tokens in (sequence_tokens or {}).items():
        table = group.tables.get(seq_id, ())
        for i, block in enumerate(table):
            entry = index.entry_of.get(block) if block != NULL_BLOCK else None
            if entry is None:
                continue
            chunk = tuple(tokens[i * block_size:(i + 1) * block_size])
            if len(chunk) == block_size and entry.tokens != chunk:  # (tokens given only as far as they are known)
                raise KvInvariantError(f"sequence {seq_id} holds {name} block {block} at index {i}, hashed as other "
                                       "tokens than the sequence's own there")
            if i == 0 and entry.parent != salt:
                raise KvInvariantError(f"sequence {seq_id}'s first {name} block {block} is keyed on another parent "
                                       "than the group's salt")
