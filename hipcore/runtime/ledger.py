"""The allocation ledger: every device allocation, tagged, counted, and traceable to where it was made.

Every Buffer of every backend is recorded here when it is allocated and removed when it is freed.
The ledger is byte-exact, so it sees leaks far smaller than the driver's free-memory figure can
(that moves in 2 MiB steps on an H100). Snapshots subtract, which is what leak checks compare.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

# moe_router / moe_experts: a mixture of experts' router logits and choices, and its experts' intermediate products
TAGS = ("weights", "kv", "activations", "scratch", "moe_router", "moe_experts", "other")

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def _call_site(skip_dirs: tuple[str, ...] = (_RUNTIME_DIR,)) -> str:
    """'file:line in function' of the first caller outside the runtime package (cheap: no traceback)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) in skip_dirs:
        frame = frame.f_back
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{os.path.relpath(code.co_filename) if not code.co_filename.startswith('<') else code.co_filename}:{frame.f_lineno} in {code.co_name}"


def format_bytes(n: int) -> str:
    """Human-readable bytes with binary units; exact below 1 KiB."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.1f} {unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Allocation:
    """One live allocation: where it is, how big, what for, and who made it."""

    serial: int
    ptr: int
    nbytes: int
    tag: str
    label: str
    site: str
    owner: str = ""  # free-form: e.g. "request 17" for per-request scratch; set by the allocator's caller


def format_allocation(a: Allocation) -> str:
    """One line for a report: 'kv 12.0 MiB "kv pool layer 3" (request 17), allocated at file:line in fn'."""
    label = f' "{a.label}"' if a.label else ""
    owner = f" ({a.owner})" if a.owner else ""
    return f"{a.tag} {format_bytes(a.nbytes)}{label}{owner}, allocated at {a.site}"


def format_allocations(allocs: Iterable[Allocation], limit: int = 20) -> list[str]:
    """Lines for the first `limit` allocations (largest first), plus one line counting the rest."""
    ordered = sorted(allocs, key=lambda a: (-a.nbytes, a.serial))
    lines = [format_allocation(a) for a in ordered[:limit]]
    if len(ordered) > limit:
        rest = ordered[limit:]
        lines.append(f"... and {len(rest)} more ({format_bytes(sum(a.nbytes for a in rest))})")
    return lines


@dataclass(frozen=True)
class LedgerSnapshot:
    """Frozen state of a ledger at one moment (plus the driver's free bytes when the backend has one)."""

    bytes_by_tag: dict[str, int]
    count_by_tag: dict[str, int]
    live: tuple[Allocation, ...]
    driver_free: int | None = None
    peak_by_tag: dict[str, int] = field(default_factory=dict)
    peak_total: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_tag.values())

    @property
    def total_count(self) -> int:
        return sum(self.count_by_tag.values())

    def __sub__(self, baseline: "LedgerSnapshot") -> "LedgerDelta":
        base_serials = {a.serial for a in baseline.live}
        now_serials = {a.serial for a in self.live}
        return LedgerDelta(
            bytes_by_tag={t: self.bytes_by_tag.get(t, 0) - baseline.bytes_by_tag.get(t, 0) for t in TAGS},
            count_by_tag={t: self.count_by_tag.get(t, 0) - baseline.count_by_tag.get(t, 0) for t in TAGS},
            new=tuple(a for a in self.live if a.serial not in base_serials),
            gone=tuple(a for a in baseline.live if a.serial not in now_serials),
            driver_free_delta=(
                None if self.driver_free is None or baseline.driver_free is None
                else self.driver_free - baseline.driver_free
            ),
        )


@dataclass(frozen=True)
class LedgerDelta:
    """What changed between two snapshots: per-tag bytes/counts, allocations made and not freed."""

    bytes_by_tag: dict[str, int]
    count_by_tag: dict[str, int]
    new: tuple[Allocation, ...]
    gone: tuple[Allocation, ...]
    driver_free_delta: int | None = None

    @property
    def clean(self) -> bool:
        return not self.new and all(v == 0 for v in self.bytes_by_tag.values())

    def describe(self, limit: int = 20) -> list[str]:
        """The allocations made since the baseline and still alive, with where each was made."""
        return format_allocations(self.new, limit)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_tag.values())


@dataclass
class Ledger:
    """Thread-safe record of every live allocation of one device."""

    _live: dict[int, Allocation] = field(default_factory=dict)  # ptr -> allocation
    _bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TAGS, 0))
    _count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TAGS, 0))
    _peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TAGS, 0))
    _peak_total: int = 0
    _serials: itertools.count = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Told of every record ("alloc", allocation) and release ("free", allocation), after the ledger is updated:
    # a trace of the run (profiles/trace_events.py). None costs nothing.
    observer: Callable[[str, Allocation], None] | None = None

    def record(self, ptr: int, nbytes: int, tag: str, label: str = "", owner: str = "", site: str | None = None) -> Allocation:
        if tag not in TAGS:
            raise ValueError(f"unknown allocation tag {tag!r}; expected one of {', '.join(TAGS)}")
        alloc = Allocation(next(self._serials), ptr, nbytes, tag, label, site or _call_site(), owner)
        with self._lock:
            if ptr in self._live:
                raise RuntimeError(f"ledger: address {ptr:#x} handed out twice (still held by {self._live[ptr].label!r})")
            self._live[ptr] = alloc
            self._bytes[tag] += nbytes
            self._count[tag] += 1
            self._peak[tag] = max(self._peak[tag], self._bytes[tag])
            self._peak_total = max(self._peak_total, sum(self._bytes.values()))
        if self.observer is not None:
            self.observer("alloc", alloc)
        return alloc

    def release(self, ptr: int) -> Allocation:
        with self._lock:
            alloc = self._live.pop(ptr, None)
            if alloc is None:
                raise KeyError(f"ledger: no live allocation at {ptr:#x}")
            self._bytes[alloc.tag] -= alloc.nbytes
            self._count[alloc.tag] -= 1
        if self.observer is not None:
            self.observer("free", alloc)
        return alloc

    def find(self, ptr: int) -> Allocation | None:
        with self._lock:
            return self._live.get(ptr)

    def live(self, tag: str | None = None) -> list[Allocation]:
        with self._lock:
            allocs = list(self._live.values())
        return sorted((a for a in allocs if tag is None or a.tag == tag), key=lambda a: a.serial)

    def bytes_by_tag(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bytes)

    def count_by_tag(self) -> dict[str, int]:
        with self._lock:
            return dict(self._count)

    def peak_by_tag(self) -> dict[str, int]:
        with self._lock:
            return dict(self._peak)

    @property
    def peak_total(self) -> int:
        """The most bytes live at once, all tags together, since the ledger began or reset_peaks()."""
        return self._peak_total

    def reset_peaks(self) -> None:
        """Start peak tracking afresh from what is live now (to measure one phase's peak)."""
        with self._lock:
            self._peak = dict(self._bytes)
            self._peak_total = sum(self._bytes.values())

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    def snapshot(self, driver_free: int | None = None) -> LedgerSnapshot:
        with self._lock:
            return LedgerSnapshot(dict(self._bytes), dict(self._count),
                                  tuple(sorted(self._live.values(), key=lambda a: a.serial)), driver_free,
                                  dict(self._peak), self._peak_total)

    def summary(self, tags: Iterable[str] = TAGS) -> str:
        """One line: 'weights 92.1 MiB (301), kv 12.0 MiB (60), ...' (tags with nothing live are left out)."""
        b, c = self.bytes_by_tag(), self.count_by_tag()
        parts = [f"{t} {format_bytes(b[t])} ({c[t]})" for t in tags if c[t]]
        return ", ".join(parts) if parts else "nothing"
