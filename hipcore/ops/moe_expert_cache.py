"""The cpu backend's decoded experts: each expert matrix moe_experts' host kernels multiply, decoded to float64 once
and kept while it fits, so that a decode step does not decode the same K-quant or MXFP4 rows again.

An entry is keyed by where the expert's bytes lie (device, pointer, type, rows, cols) and keeps a copy of those
bytes: a hit is used only when the bytes are still the same (a buffer freed and another allocated at its address,
weights written again, another device at the same id: decoded afresh), so the cache never changes a result. One
cache a process, the least recently used out past BUDGET_BYTES, so that the experts of models closed (or of
devices kept alive) hold at most that. float64 is what the products take (the decoding is exact in it): 8 bytes a
weight, 14x a Q4_K expert's bytes, plus the copy of the raw bytes.

Each entry's matrix and raw copy live in an anonymous mapping of their own (mmap), not in malloc's heap, so that
what the cache costs the process's RSS is exactly its mappings (held_bytes) plus each entry's Python objects: in
the heap, entries placed between the engine's short-lived arrays left free holes behind them as the cache filled
(a qwen3moe of 256 experts under `serve`: the heap's free bytes grew +1.3 to +2.0 MiB per 1,000 requests beside
the cache's +2.0 to +2.5, read by the host leak checks as growth), and an eviction returned nothing to the system.
An eviction or clear() unmaps. leak-check (profiles/leak_layers.py) and serve-leak-check (profiles/serve_leak_host.py)
take accounted_bytes() out of the RSS they judge (traced_bytes() out of tracemalloc's figure: it does not see the
mappings) and judge peak_bytes against the budget.
"""

from __future__ import annotations

import collections
import mmap
import threading

import numpy as np

from hipcore.ops.weight_formats import dequantize_rows

BUDGET_BYTES = 256 << 20
# An entry is a mapping of its own; Linux allows a process 65,530 (vm.max_map_count), shared with everything else.
MAX_ENTRIES = 16_384
# Python's bytes per entry beside its mapping (the mmap and array objects, the key tuples, the dict's node):
# 1,092-1,115 by tracemalloc over F16, F32, MXFP4 and Q4_K experts.
ENTRY_BOOKKEEPING_BYTES = 1104
# Private: Python's anonymous mmap is shared by default, which Linux counts as RssShmem, outside the RssAnon the
# host checks read (and Windows has no flags: its anonymous mappings are private).
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


def mapped_bytes(matrix_bytes: int, raw_bytes: int) -> int:
    """The mapping an entry takes: its float64 matrix, then the raw copy, in whole pages."""
    return -(-(matrix_bytes + raw_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE


class ExpertCache:
    """Decoded expert matrices by (where, type, rows, cols), least recently used out past budget_bytes."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES, max_entries: int = MAX_ENTRIES) -> None:
        self.budget_bytes, self.max_entries = budget_bytes, max_entries
        self.held_bytes = 0  # the entries' mappings
        self.peak_bytes = 0  # most held_bytes since made or cleared: never past budget_bytes
        self.hits = self.misses = 0
        # key -> (mapping, matrix viewing it, the raw copy's end in it; the copy starts where the matrix ends)
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def matrix(self, where: tuple, raw_rows: np.ndarray, weight_type: str, cols: int) -> np.ndarray:
        """float64 [rows, cols]: raw_rows uint8 [rows, row_bytes] (the expert's bytes, found `where`: a device's
        id and the address) decoded; read-only, shared with later calls."""
        key = (where, weight_type, raw_rows.shape, cols)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0][entry[1].nbytes:entry[2]] == raw_rows.tobytes():  # copies, a memcmp
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[1]
        decoded = dequantize_rows(raw_rows, weight_type, cols, np.float64)
        size = mapped_bytes(decoded.nbytes, raw_rows.nbytes)
        entry = self._mapped(decoded, raw_rows, size) if size <= self.budget_bytes else None
        with self._lock:
            self.misses += 1
            old = self._entries.pop(key, None)
            if old is not None:
                self.held_bytes -= len(old[0])
            if entry is not None:
                self._entries[key] = entry
                self.held_bytes += size
                self._evict_past_budget()
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        if entry is None:
            decoded.flags.writeable = False
            return decoded
        return entry[1]

    @staticmethod
    def _mapped(decoded: np.ndarray, raw_rows: np.ndarray, size: int) -> tuple | None:
        """(mapping, the matrix in it, the raw copy's end) or None when the system gives no mapping (the map count:
        the expert is then decoded on every use, as one past the budget)."""
        try:
            region = mmap.mmap(-1, size, **_PRIVATE)
        except OSError:
            return None
        matrix = np.frombuffer(region, np.float64, decoded.size).reshape(decoded.shape)
        matrix[...] = decoded
        matrix.flags.writeable = False
        end = decoded.nbytes + raw_rows.nbytes
        region[decoded.nbytes:end] = raw_rows.tobytes()
        return region, matrix, end

    def _evict_past_budget(self) -> None:
        # unmapped once the last array viewing the mapping (a product in flight) is gone
        while self.held_bytes > self.budget_bytes or len(self._entries) > self.max_entries:
            _, (region, _, _) = self._entries.popitem(last=False)
            self.held_bytes -= len(region)

    @property
    def entries(self) -> int:
        return len(self._entries)

    def traced_bytes(self) -> int:
        """What tracemalloc sees of the entries: their Python objects (ENTRY_BOOKKEEPING_BYTES each), not the mappings."""
        with self._lock:
            return len(self._entries) * ENTRY_BOOKKEEPING_BYTES

    def accounted_bytes(self) -> int:
        """What the entries cost the process's RSS: their mappings and each one's Python objects."""
        with self._lock:
            return self.held_bytes + len(self._entries) * ENTRY_BOOKKEEPING_BYTES

    def clear(self) -> None:
        """Drop every entry (a result never depends on the cache: later calls decode afresh)."""
        with self._lock:
            self._entries.clear()
            self.held_bytes = self.peak_bytes = 0


EXPERTS = ExpertCache()  # the process's
