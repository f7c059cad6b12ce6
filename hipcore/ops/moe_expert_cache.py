"""The cpu backend's decoded experts: each expert matrix moe_experts' host kernels multiply, decoded to float64 once
and kept while it fits, so that a decode step does not decode the same K-quant or MXFP4 rows again.

An entry is keyed by where the expert's bytes lie (device, pointer, type, rows, cols) and keeps a copy of those
bytes: a hit is used only when the bytes are still the same (a buffer freed and another allocated at its address,
weights written again, another device at the same id: decoded afresh), so the cache never changes a result. One
cache a process, the least recently used out past BUDGET_BYTES, so that the experts of models closed (or of
devices kept alive) hold at most that. float64 is what the products take (the decoding is exact in it): 8 bytes a
weight, 14x a Q4_K expert's bytes, plus the copy of the raw bytes.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from hipcore.ops.weight_formats import dequantize_rows

BUDGET_BYTES = 256 << 20


class ExpertCache:
    """Decoded expert matrices by (where, type, rows, cols), least recently used out past budget_bytes."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.held_bytes = 0
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
                while self.held_bytes > self.budget_bytes:
                    _, (raw, decoded) = self._entries.popitem(last=False)
                    self.held_bytes -= len(raw) + decoded.nbytes
        return matrix


EXPERTS = ExpertCache()  # the process's
