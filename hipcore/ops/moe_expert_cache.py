"""The cpu backend's decoded experts: each expert matrix moe_experts' host kernels multiply, decoded to float64 once
and kept while it fits, so that a decode step does not decode the same K-quant or MXFP4 rows again.

An entry is keyed by where the expert's bytes lie (device, pointer, type, rows, cols) and keeps a copy of those
bytes: a hit is used only when the bytes are still the same (a buffer freed and another allocated at its address,
weights written again, another device at the same id: decoded afresh), so the cache never changes a result. One
cache a process, the least recently used out past BUDGET_BYTES, so that the experts of models closed (or of
devices kept alive) hold at most that. float64 is what the products take (the decoding is exact in it): 8 bytes a
weight, 14x a Q4_K expert's bytes, plus the copy of the raw bytes.

The cache fills as experts are first used, so leak-check (profiles/leak_layers.py) accounts for it as its own host
layer: it empties the cache at its baseline and before its final tracemalloc snapshot, subtracts
accounted_bytes() from the host samples in between, and judges peak_bytes against the budget.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from hipcore.ops.weight_formats import dequantize_rows

BUDGET_BYTES = 256 << 20
# Python's bytes per entry beside the two arrays' data (key tuples, the dict's node, the array and bytes headers):
# 675-873 by tracemalloc over F16, F32 and Q4_K experts.
ENTRY_BOOKKEEPING_BYTES = 768


class ExpertCache:
    """Decoded expert matrices by (where, type, rows, cols), least recently used out past budget_bytes."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.held_bytes = 0
        self.peak_bytes = 0  # most held_bytes since made or cleared: never past budget_bytes
        self.hits = self.misses = 0
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def matrix(self, where: tuple, raw_rows: np.ndarray, weight_type: str, cols: int) -> np.ndarray:
        """float64 [rows, cols]: raw_rows uint8 [rows, row_bytes] (the expert's bytes, found `where`: a device's
        id and the address) decoded; read-only, shared with later calls."""
        key = (where, weight_type, raw_rows.shape, cols)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == raw_rows.tobytes():  # a copy and a memcmp: ~3x np.array_equal's speed
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[1]
        matrix = dequantize_rows(raw_rows, weight_type, cols, np.float64)
        matrix.flags.writeable = False
        size = matrix.nbytes + raw_rows.nbytes
        with self._lock:
            self.misses += 1
            old = self._entries.pop(key, None)
            if old is not None:
                self.held_bytes -= len(old[0]) + old[1].nbytes
            if size <= self.budget_bytes:
                self._entries[key] = (raw_rows.tobytes(), matrix)
                self.held_bytes += size
                self._evict_past_budget()
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return matrix

    def _evict_past_budget(self) -> None:
        while self.held_bytes > self.budget_bytes:
            _, (raw, decoded) = self._entries.popitem(last=False)
            self.held_bytes -= len(raw) + decoded.nbytes

    @property
    def entries(self) -> int:
        return len(self._entries)

    def accounted_bytes(self) -> int:
        """What the entries cost the process: their data and each one's bookkeeping (ENTRY_BOOKKEEPING_BYTES)."""
        with self._lock:
            return self.held_bytes + len(self._entries) * ENTRY_BOOKKEEPING_BYTES

    def clear(self) -> None:
        """Drop every entry (a result never depends on the cache: later calls decode afresh)."""
        with self._lock:
            self._entries.clear()
            self.held_bytes = self.peak_bytes = 0


EXPERTS = ExpertCache()  # the process's
