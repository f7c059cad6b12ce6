"""BlockGroup: the block tables of one layer group over its own BlockPool (docs/architecture.md, "The
release path of a KV block").

A global group keeps every block of a sequence. A local (sliding-window) group keeps, in a table of the
same length (ceil(tokens / block_size), indexed by position // block_size as every kernel indexes it),
only the blocks that hold a position the sequence's next queries may read: when a sequence of L tokens
reserves more, every block wholly below L - window + 1 (`kept_from`) is released and its table entry
becomes the null block. The attention kernel's window guarantees no query reads below kept_from; the
released block waits for the step fence like any other.

Nothing here touches device memory and nothing here locks: the KvCache owns the pools and serialises
access, and it asks every group for a plan before it changes any (all or nothing across groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from hipcore.kvcache.block_pool import BlockPool
from hipcore.kvcache.config import NULL_BLOCK
from hipcore.kvcache.prefix_index import BlockHash
from hipcore.kvcache.table_rows import TableRows


class AppendPlan(NamedTuple):
    """What appending n tokens to one sequence does in one group. (A tuple: made per group on every reserve that
    takes a block, ~4 times a step at 64 decoding sequences; a frozen dataclass costs several times more.)"""

    copy_on_write: bool  # the partly filled last block is shared: copy it to a new block first
    new_blocks: int  # blocks appended to the table
    out_of_window: tuple[int, ...]  # table indices whose blocks every window layer has left behind
    kept_from: int  # the group's new first kept position

    @property
    def blocks_taken(self) -> int:
        return int(self.copy_on_write) + self.new_blocks


@dataclass
class BlockGroup:
    name: str
    num_blocks: int
    block_size: int
    window: int  # 0: global (keeps everything)
    block_hash: BlockHash = hash  # the prefix cache's block key (prefix_index.py)
    pool: BlockPool = field(init=False)
    tables: dict[int, list[int]] = field(default_factory=dict, init=False)
    kept_from: dict[int, int] = field(default_factory=dict, init=False)  # first position still held
    rows: TableRows = field(default_factory=TableRows, init=False)  # the tables in numpy, kept in step below

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.num_blocks, self.block_hash)

    def plan(self, seq_id: int, length: int, n_tokens: int) -> AppendPlan:
        """The plan to grow sequence `seq_id` (now `length` tokens) by n_tokens; changes nothing."""
        table, bs = self.tables[seq_id], self.block_size
        kept_from = self.kept_from[seq_id]
        if n_tokens == 0:
            return AppendPlan(False, 0, (), kept_from)
        filled = length % bs
        room = bs - filled if filled else 0  # free slots in a partly filled last block
        # The partly filled last block holds position length - 1, never below length - window + 1, so it is
        # never out of the window (a window of 1 keeps it too: its next slot is about to be written).
        copy_on_write = room > 0 and self.pool.refcount(table[-1]) > 1
        new_blocks = -(-max(0, n_tokens - room) // bs)
        dropped: tuple[int, ...] = ()
        if self.window:
            new_kept = max(kept_from, length - self.window + 1)
            dropped = tuple(i for i in range(kept_from // bs, new_kept // bs) if table[i] != NULL_BLOCK)
            kept_from = new_kept
        return AppendPlan(copy_on_write, new_blocks, dropped, kept_from)

    def appends_in_place(self, seq_id: int, length: int, n_tokens: int) -> bool:
        """True when plan(seq_id, length, n_tokens) would take no block and release none: the n_tokens (> 0)
        fit in the partly filled last block, no other table holds that block, and (in a window group) the
        first kept position stays inside the same block. Then appending changes only the length and, in a
        window group, kept_from (advance_window). The engine's decode steps take this path 15 times in 16."""
        bs = self.block_size
        filled = length % bs
        if not filled or n_tokens > bs - filled or self.pool.refcount_of_held(self.tables[seq_id][-1]) != 1:
            return False
        return self._window_stays_in_its_block(seq_id, length)

    def appends_new_block(self, seq_id: int, length: int, n_tokens: int) -> bool:
        """True when plan(seq_id, length, n_tokens) would take exactly one new block and copy and release nothing:
        the last block is full (or there is none), the n_tokens (> 0) fit in one block, and (in a window group)
        the first kept position stays inside the same block. Then appending takes a block for the table's end
        (append_block) and changes kept_from as advance_window does. A decode step takes this path 1 time in 16."""
        bs = self.block_size
        if length % bs or n_tokens > bs:
            return False
        return self._window_stays_in_its_block(seq_id, length)

    def _window_stays_in_its_block(self, seq_id: int, length: int) -> bool:
        """True when appending to a sequence of `length` tokens moves its first kept position (kept_from, as
        advance_window sets it) within the block it is in, so that no block leaves the window; always in a
        group without a window."""
        if not self.window:
            return True
        kept_from = self.kept_from[seq_id]
        return max(kept_from, length - self.window + 1) // self.block_size == kept_from // self.block_size

    def append_block(self, seq_id: int, block: int) -> None:
        """`block` (just taken from this group's pool) becomes the last entry of the sequence's table."""
        table = self.tables[seq_id]
        self.rows.write(seq_id, len(table), (block,))
        table.append(block)

    def advance_window(self, seq_id: int, length: int) -> None:
        """kept_from after an in-place append to a sequence of `length` tokens (as plan() computes it)."""
        if self.window:
            self.kept_from[seq_id] = max(self.kept_from[seq_id], length - self.window + 1)

    def apply(self, seq_id: int, plan: AppendPlan, taken: list[int], fence: int) -> int | None:
        """Carry out `plan` with the blocks `taken` (plan.blocks_taken of them, reference count 1 each).
        Returns the shared block to copy into taken[0] when the plan copies on write (the caller queues
        the copy before calling), else None."""
        table = self.tables[seq_id]
        for index in plan.out_of_window:  # the oldest first, as a sequence's end releases its last first
            block, table[index] = table[index], NULL_BLOCK
            self.rows.write(seq_id, index, (NULL_BLOCK,))
            self.pool.release(block, seq_id, fence)
        self.kept_from[seq_id] = plan.kept_from
        shared = None
        if plan.copy_on_write:
            shared, table[-1] = table[-1], taken[0]
            self.rows.write(seq_id, len(table) - 1, taken[:1])
            self.pool.release(shared, seq_id, fence)
            taken = taken[1:]
        if taken:
            self.rows.write(seq_id, len(table), taken)
            table.extend(taken)
        return shared

    def add(self, seq_id: int) -> None:
        self.tables[seq_id] = []
        self.kept_from[seq_id] = 0
        self.rows.add(seq_id)

    def attach(self, seq_id: int, table: Sequence[int], kept_from: int) -> None:
        """The new (empty) sequence's table is `table`, blocks of a cached prefix it holds already (prefix_cache.py),
        the null block below `kept_from` in a window group."""
        self.tables[seq_id] = list(table)
        self.kept_from[seq_id] = kept_from
        if table:
            self.rows.write(seq_id, 0, table)

    def fork(self, parent_id: int, child_id: int) -> None:
        parent = self.tables[parent_id]
        for block in parent:
            if block != NULL_BLOCK:
                self.pool.share(block, child_id)
        self.tables[child_id] = list(parent)
        self.kept_from[child_id] = self.kept_from[parent_id]
        self.rows.add(child_id)
        self.rows.write(child_id, 0, parent)

    def free(self, seq_id: int, fence: int) -> None:
        """Every block the sequence still holds loses one reference, last block first."""
        table = self.tables[seq_id]
        for block in reversed(table):
            if block != NULL_BLOCK:
                self.pool.release(block, seq_id, fence)
        self.rows.remove(seq_id, len(table))
        del self.tables[seq_id]
        del self.kept_from[seq_id]

    def clear(self) -> None:
        """Forget every sequence (the cache is closing; its pools go with it)."""
        self.tables.clear()
        self.kept_from.clear()
        self.rows.clear()

    def held_blocks(self, seq_id: int) -> int:
        return sum(1 for block in self.tables[seq_id] if block != NULL_BLOCK)
