"""One reading per leak-check layer (RELIABILITY "Leak checks, layered"), strictest first.

  engine state  no request, queue entry, inbox item or cache table left; finished records bounded
  ledger        every device allocation by tag, byte-exact, against the baseline; each one not
                returned with the call site that made it and the step (requests) it was made in
  KV pool       every usable block free with reference count 0; the cache's invariants (quiescent)
  driver        the driver's free-memory figure (GPU backends), read several times after a synchronize
  host          anonymous RSS (RssAnon + VmSwap) and tracemalloc, sampled over the run for a slope

Each reading is a plain dataclass with `to_dict()`; judging them against thresholds is
leak_report's business.
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import asdict, dataclass, field

from hipcore.kvcache import KvInvariantError
from hipcore.ops.moe_expert_cache import EXPERTS
from hipcore.runtime.host_memory import anon_rss_bytes
from hipcore.runtime.ledger import TAGS, Allocation, LedgerSnapshot

DRIVER_GRANULARITY = 2 << 20  # the driver's free-memory figure moves in 2 MiB steps (measured on an H100)
DRIVER_READS = 3
ITEMS_KEPT = 200  # leaked blocks / allocations listed one by one in a report; the rest are counted


@dataclass
class EngineState:
    active_requests: int
    waiting: int
    running: int
    inbox: int
    cache_sequences: int
    finished_records: int
    finished_bound: int

    @property
    def empty(self) -> bool:
        return not (self.active_requests or self.waiting or self.running or self.inbox or self.cache_sequences)

    @property
    def records_within_bound(self) -> bool:
        return self.finished_records <= self.finished_bound

    def to_dict(self) -> dict:
        return asdict(self) | {"empty": self.empty, "records_within_bound": self.records_within_bound}


def read_engine_state(engine, finished_bound: int) -> EngineState:
    """`finished_bound` is the bound the run was configured with (not the engine's own attribute,
    which is what a bug would change)."""
    return EngineState(
        active_requests=engine.active_count, waiting=len(engine.scheduler.waiting), running=len(engine.scheduler.running),
        inbox=len(engine._inbox), cache_sequences=len(engine.cache.sequences()),
        finished_records=len(engine.finished_records()), finished_bound=finished_bound,
    )


@dataclass
class BlockReading:
    usable: int
    free: int
    pending: int
    bytes_per_block: int
    invariant_error: str | None
    leaked: list[dict] = field(default_factory=list)  # one entry per block that is not free, with its group
    # layer group -> (usable, free, bytes per block): a cache with sliding-window layers has two pools
    groups: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    cached: int = 0  # prefix-cache blocks (every group) before the reading evicted them: accounted, not leaked

    @property
    def not_free(self) -> int:
        return self.usable - self.free

    @property
    def leaked_bytes(self) -> int:
        if self.groups:  # a local block holds fewer layers than a global one
            return sum((usable - free) * bpb for usable, free, bpb in self.groups.values())
        return self.not_free * self.bytes_per_block

    def to_dict(self) -> dict:
        return {
            "usable": self.usable, "free": self.free, "pending": self.pending, "cached": self.cached,
            "not_free": self.not_free,
            "leaked_bytes": self.leaked_bytes, "bytes_per_block": self.bytes_per_block,
            "invariant_error": self.invariant_error, "leaked": self.leaked[:ITEMS_KEPT],
            "leaked_not_listed": max(0, len(self.leaked) - ITEMS_KEPT),
            "groups": {name: {"usable": u, "free": f, "not_free": u - f, "bytes_per_block": b}
                       for name, (u, f, b) in self.groups.items()},
        }


def read_blocks(cache, owner_of_sequence) -> BlockReading:
    """Every block of every layer group that is not on the free list, with its group, the sequences whose
    tables hold it and their requests (`owner_of_sequence(seq_id) -> dict | None`).

    Prefix caching: a cached block is neither held nor free. It is not a leak, and it is accounted: the
    invariants (each cached block unreferenced, each hash entry keyed on its tokens and on a block that is
    not free) are checked while the blocks are cached, then the cache is flushed, and every block must be
    free. A block whose reference is never dropped, or an entry left on a freed block, shows either way."""
    cfg = cache.config
    cached = cache.num_cached_blocks
    try:
        cache.check_invariants(quiescent=True)
        cached_error = None
    except KvInvariantError as exc:
        cached_error = f"with {cached} blocks cached: {exc}"
    cache.flush_prefix_cache()
    leaked, groups = [], {}
    for group in cache.groups:
        holders: dict[int, list[int]] = {}
        for seq_id in cache.sequences():
            for block in cache.block_table(seq_id, group):
                if block:  # 0: the null block, a position released out of the window
                    holders.setdefault(block, []).append(seq_id)
        for block in range(1, cfg.group_blocks(group)):
            count = cache.refcount(block, group)
            seqs = holders.get(block, [])
            if count or seqs:
                owners = [o for o in (owner_of_sequence(s) for s in seqs) if o is not None]
                leaked.append({"group": group, "block": block, "refcount": count, "sequences": seqs, "owners": owners})
        groups[group] = (cache.num_usable_blocks_in(group), cache.num_free_blocks_in(group),
                         cfg.group_bytes_per_block(group))
    try:
        cache.check_invariants(quiescent=True)
        error = cached_error
    except KvInvariantError as exc:
        error = cached_error or str(exc)
    return BlockReading(usable=sum(u for u, _, _ in groups.values()), free=sum(f for _, f, _ in groups.values()),
                        pending=cache.num_pending_blocks, bytes_per_block=cfg.bytes_per_block, invariant_error=error,
                        leaked=leaked, groups=groups, cached=cached)


def step_invariant_error(engine) -> str | None:
    """The KV cache's invariants between two steps, the prefix cache's hash entries checked against every live
    sequence's tokens (leak-check runs it after every step: a cached block evicted while a sequence holds it, say,
    shows only while it is held). None when they hold."""
    cache = engine.cache
    tokens = {seq.seq_id: seq.tokens for request in engine.scheduler.running for seq in request.seqs
              if not seq.finished and cache.has_sequence(seq.seq_id)}
    try:
        cache.check_invariants(sequence_tokens=tokens)
    except KvInvariantError as exc:
        return str(exc)
    return None


@dataclass
class LedgerReading:
    bytes_by_tag: dict[str, int]
    count_by_tag: dict[str, int]
    growth_bytes: dict[str, int]  # against the baseline
    growth_count: dict[str, int]
    not_returned: list[dict]  # allocations made since the baseline and still live

    @property
    def leaked_bytes(self) -> int:
        return sum(b for b in self.growth_bytes.values() if b > 0)

    @property
    def leaked_count(self) -> int:
        return len(self.not_returned)

    @property
    def clean(self) -> bool:
        return all(v == 0 for v in self.growth_bytes.values()) and all(v == 0 for v in self.growth_count.values())

    def to_dict(self) -> dict:
        return {
            "bytes_by_tag": self.bytes_by_tag, "count_by_tag": self.count_by_tag, "growth_bytes": self.growth_bytes,
            "growth_count": self.growth_count, "leaked_bytes": self.leaked_bytes, "leaked_count": self.leaked_count,
            "not_returned": self.not_returned[:ITEMS_KEPT],
            "not_returned_not_listed": max(0, len(self.not_returned) - ITEMS_KEPT),
        }


def describe_allocation(a: Allocation, step_owner: dict[int, str]) -> dict:
    owner = step_owner.get(a.serial) or a.owner or "made outside the workload's steps (load, warm-up or close)"
    return {"tag": a.tag, "bytes": a.nbytes, "label": a.label, "site": a.site, "owner": owner, "serial": a.serial}


def read_ledger(ledger, baseline: LedgerSnapshot | None, step_owner: dict[int, str]) -> LedgerReading:
    """Against `baseline`; with baseline None every live allocation counts (the check after close)."""
    snap = ledger.snapshot()
    base_bytes = baseline.bytes_by_tag if baseline else {}
    base_count = baseline.count_by_tag if baseline else {}
    base_serials = {a.serial for a in baseline.live} if baseline else set()
    new = sorted((a for a in snap.live if a.serial not in base_serials), key=lambda a: (-a.nbytes, a.serial))
    return LedgerReading(
        bytes_by_tag=dict(snap.bytes_by_tag), count_by_tag=dict(snap.count_by_tag),
        growth_bytes={t: snap.bytes_by_tag.get(t, 0) - base_bytes.get(t, 0) for t in TAGS},
        growth_count={t: snap.count_by_tag.get(t, 0) - base_count.get(t, 0) for t in TAGS},
        not_returned=[describe_allocation(a, step_owner) for a in new],
    )


@dataclass
class DriverReading:
    reads: list[int]  # free bytes, one per read

    @property
    def free(self) -> int:
        return sorted(self.reads)[len(self.reads) // 2]

    @property
    def spread(self) -> int:
        return max(self.reads) - min(self.reads)


def read_driver(device) -> DriverReading | None:
    """None on backends without a driver figure (the cpu backend)."""
    if device.driver_free_bytes() is None:
        return None
    device.synchronize()
    reads = []
    for i in range(DRIVER_READS):
        if i:
            time.sleep(0.05)
        reads.append(int(device.driver_free_bytes()))
    return DriverReading(reads)


def read_rss() -> int | None:
    """Anonymous resident + swapped bytes of this process (Linux); None elsewhere."""
    return anon_rss_bytes()


class HostMonitor:
    """Samples host memory against requests completed, into fixed arrays (no growth of its own)."""

    def __init__(self, capacity: int = 4096):
        import numpy as np

        self._np = np
        self.requests = np.zeros(capacity, dtype=np.int64)
        self.rss = np.zeros(capacity, dtype=np.int64)
        self.traced = np.zeros(capacity, dtype=np.int64)
        self.count = 0
        self.rss_available = read_rss() is not None
        self.baseline_snapshot: tracemalloc.Snapshot | None = None
        self._objects_emptied = self._objects_high = 0  # the entries' Python objects when the baseline emptied them, most since
        self.expert_cache: dict | None = None  # expert_cache_reading() before the final snapshot emptied it

    def sample(self, requests_done: int) -> None:
        """Host memory now, less the cpu backend's cache of decoded experts (its own layer: expert_cache_reading)."""
        if self.count == len(self.requests):  # keep every other sample: the slope needs the span, not density
            keep = slice(0, self.count, 2)
            for arr in (self.requests, self.rss, self.traced):
                arr[: (self.count + 1) // 2] = arr[keep]
            self.count = (self.count + 1) // 2
        i = self.count
        self.requests[i] = requests_done
        mapped, objects, rss = EXPERTS.held_bytes, EXPERTS.traced_bytes(), read_rss()
        # The entries' mappings are in the RSS exactly while held (unmapped by the baseline's emptying); their Python
        # objects' memory is kept by the allocator when emptied and reused: the RSS grows by them past that.
        self._objects_high = max(self._objects_high, objects)
        self.rss[i] = rss - mapped - max(0, self._objects_high - self._objects_emptied) if rss else 0
        self.traced[i] = tracemalloc.get_traced_memory()[0] - objects if tracemalloc.is_tracing() else 0
        self.count += 1

    def take_baseline(self) -> None:
        # The decoded experts' cache fills as experts are first used, after the warm-up too (a model with more
        # experts than the warm-up routes to): emptied here and before the final snapshot, it is no host growth,
        # and whatever an eviction or clear() does not free still is.
        self._objects_emptied = self._objects_high = EXPERTS.traced_bytes()
        EXPERTS.clear()
        if tracemalloc.is_tracing():
            self.baseline_snapshot = tracemalloc.take_snapshot()

    def slope(self, series: str, from_requests: int = 0) -> tuple[float | None, int, int]:
        """(bytes per request by least squares, samples used, requests spanned) from `from_requests` on."""
        np = self._np
        x = self.requests[: self.count].astype(np.float64)
        y = getattr(self, series)[: self.count].astype(np.float64)
        keep = x >= from_requests
        x, y = x[keep], y[keep]
        if len(x) < 3 or x.max() == x.min():
            return None, int(len(x)), int(x.max() - x.min()) if len(x) else 0
        return float(np.polyfit(x, y, 1)[0]), int(len(x)), int(x.max() - x.min())

    def values(self, series: str) -> list[int]:
        return [int(v) for v in getattr(self, series)[: self.count]]

    def tracemalloc_growth(self, limit: int = 10) -> tuple[int, int, list[dict]]:
        """(bytes, allocations) still live that were made since the baseline, by tracemalloc, and the
        source lines that grew most."""
        self.expert_cache = expert_cache_reading()
        rss = read_rss()
        EXPERTS.clear()
        if self.expert_cache is not None and rss is not None:  # tracemalloc does not see the mappings: the RSS does
            self.expert_cache["rss_given_back"] = rss - read_rss()
        if self.baseline_snapshot is None or not tracemalloc.is_tracing():
            return 0, 0, []
        now = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        stats = now.compare_to(self.baseline_snapshot, "lineno")
        grown = [s for s in stats if s.size_diff > 0]
        lines = [{"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}", "bytes": s.size_diff,
                  "allocations": s.count_diff} for s in grown[:limit]]
        return sum(s.size_diff for s in stats), sum(s.count_diff for s in stats), lines


def expert_cache_reading() -> dict | None:
    """The cpu backend's decoded experts (hipcore/ops/moe_expert_cache.py) since the baseline: their most bytes
    (past the budget: the cache does not evict, a leak), held now, entries; None when no expert was decoded."""
    if not EXPERTS.peak_bytes:
        return None
    return {"peak_bytes": EXPERTS.peak_bytes, "budget_bytes": EXPERTS.budget_bytes, "held_bytes": EXPERTS.held_bytes,
            "entries": EXPERTS.entries}
