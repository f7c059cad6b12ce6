"""TableRows: a numpy copy of one layer group's block tables, one row per live sequence, kept in step with the
tables' lists by the group (block_group.py) as it changes them.

Why: every decode step hands the kernels the tables of all its sequences as one int32 [sequences, width]
array. Converting each sequence's list to numpy, every step, cost about 5 ns per entry plus ~0.5 us per
sequence (~300 us for 64 sequences of 2,000 tokens); a row per sequence kept up to date costs nothing per
step, and the step's array is one fancy-index copy (`gather`). The lists stay the truth (invariants,
profiles, queries); `check` says whether the rows agree with them, and the invariants call it.

Entries past a table's length are the null block, so a gathered row is already padded. The array grows
by doubling (rows for sequences, columns for the longest table) and never shrinks: its size is the peak
of live sequences x the longest table, a bounded host cost.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from hipcore.kvcache.config import NULL_BLOCK


class TableRows:
    def __init__(self, rows: int = 8, width: int = 8):
        self.array = np.full((rows, width), NULL_BLOCK, dtype=np.int32)
        self.row_of: dict[int, int] = {}  # sequence id -> its row
        self._free_rows: list[int] = list(range(rows - 1, -1, -1))

    def add(self, seq_id: int) -> None:
        """A row for a new, empty table (every entry is the null block already)."""
        if not self._free_rows:
            rows, width = self.array.shape
            grown = np.full((2 * rows, width), NULL_BLOCK, dtype=np.int32)
            grown[:rows] = self.array
            self.array = grown
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        self.row_of[seq_id] = self._free_rows.pop()

    def remove(self, seq_id: int, length: int) -> None:
        """Forget the sequence's row, whose table held `length` entries (back to the null block first)."""
        row = self.row_of.pop(seq_id)
        self.array[row, :length] = NULL_BLOCK
        self._free_rows.append(row)

    def write(self, seq_id: int, start: int, blocks: Sequence[int]) -> None:
        """Entries start, start + 1, ... of the sequence's table are now `blocks`."""
        end = start + len(blocks)
        if end > self.array.shape[1]:
            rows, width = self.array.shape
            grown = np.full((rows, max(end, 2 * width)), NULL_BLOCK, dtype=np.int32)
            grown[:, :width] = self.array
            self.array = grown
        if end == start + 1:  # one block (a decode step's new block): a scalar store is the cheaper numpy call
            self.array[self.row_of[seq_id], start] = blocks[0]
        else:
            self.array[self.row_of[seq_id], start:end] = blocks

    def gather(self, seq_ids: Sequence[int], width: int) -> np.ndarray:
        """int32 [len(seq_ids), width]: the sequences' tables padded with the null block (every id must be live
        and width at least the longest of their tables: the caller checks)."""
        rows = np.fromiter(map(self.row_of.__getitem__, seq_ids), dtype=np.intp, count=len(seq_ids))
        have = self.array.shape[1]
        if width <= have:  # take() of the first `width` columns: a new contiguous array, cheaper than [rows, :width]
            return self.array[:, :width].take(rows, axis=0)
        out = np.full((len(rows), width), NULL_BLOCK, dtype=np.int32)
        out[:, :have] = self.array.take(rows, axis=0)
        return out

    def clear(self) -> None:
        for seq_id in list(self.row_of):
            self.remove(seq_id, self.array.shape[1])

    def check(self, tables: Mapping[int, list[int]]) -> str | None:
        """What disagrees with the tables' lists (None: nothing): the sequences with a row, a row's entries
        (the list, then the null block), and rows of no sequence (all null block)."""
        if set(self.row_of) != set(tables):
            return f"rows for sequences {sorted(self.row_of)[:10]}, tables for {sorted(tables)[:10]}"
        used = np.zeros(self.array.shape[0], dtype=bool)
        for seq_id, table in tables.items():
            row = self.array[self.row_of[seq_id]]
            used[self.row_of[seq_id]] = True
            if len(table) > row.shape[0] or row[:len(table)].tolist() != list(table) or np.any(row[len(table):] != NULL_BLOCK):
                return f"the row of sequence {seq_id} is {row[:len(table) + 1].tolist()}..., its table {list(table)[:20]}"
        if np.any(self.array[~used] != NULL_BLOCK):
            return "a row of no sequence holds blocks"
        if sorted([*self.row_of.values(), *self._free_rows]) != list(range(self.array.shape[0])):
            return "rows are shared or lost"
        return None
