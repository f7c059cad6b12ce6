"""MemoryTimeline: where the memory went over a run, as series over time and over requests.

A run (leak-check, serve-leak-check, profile-kv --workloads, serve) calls `due()` after every engine
step or request and, when it says so, `sample(...)` with what it can read cheaply: KV blocks used /
cached / free, ledger bytes by tag, the driver's free bytes (None without a driver), host RSS and the
KV fragmentation ratio. Requests are spans (`request_started` / `request_blocks` / `request_ended`);
a request whose blocks never came back is marked `held`. Phases and the verdict (with the layer and
the attribution that decided it) are markers. report_html and plot draw it; trace_events writes it
for Perfetto.

Bounded, in arrays allocated once: at most `max_samples` points; when full, every other point is dropped
and the stride doubles, so a run of any length keeps an even spread over its whole length. Closed spans
are a ring of `max_spans` (older ones dropped and counted), open ones are the requests in flight, and
held ones the ring writes over are kept (up to MAX_HELD_KEPT).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass

import numpy as np

from hipcore.runtime.ledger import TAGS

MAX_SAMPLES = 2048
MAX_SPANS = 4096
MAX_MARKERS = 256
MAX_NAMES = 64  # distinct request labels and endings
MAX_HELD_KEPT = 512
FLOAT_SERIES = ("t", "fragmentation")

SERIES = ("t", "requests", "kv_used", "kv_cached", "kv_free", "driver_free", "rss", "fragmentation") + tuple(
    f"ledger_{tag}" for tag in TAGS)
SERIES_LABELS = {
    "kv_used": "KV blocks used", "kv_cached": "KV blocks cached", "kv_free": "KV blocks free",
    "driver_free": "driver free memory", "rss": "host memory (RSS)", "fragmentation": "KV fragmentation",
    **{f"ledger_{tag}": f"ledger {tag}" for tag in TAGS},
}


@dataclass
class RequestSpan:
    request_id: int
    label: str  # the request's kind (leak-check's plan) or route
    start: float  # seconds since the timeline began
    end: float | None = None
    blocks: int = 0  # the most KV blocks its sequences held at once
    ending: str = ""
    held: bool = False  # its blocks never came back (attributed by a leak check)


@dataclass
class Marker:
    t: float
    requests: int
    kind: str  # "phase" or "verdict"
    text: str
    layer: str = ""  # verdict markers: the layer that decided it


class MemoryTimeline:
    """The recorder. Its storage is allocated once, at construction, in fixed numpy arrays: recording adds no host
    memory of its own, so leak-check's host layer (which it runs under) sees nothing of it."""

    def __init__(self, title: str = "", *, total_blocks: int | None = None, max_samples: int = MAX_SAMPLES,
                 max_spans: int = MAX_SPANS, clock=time.monotonic):
        self.title, self.total_blocks, self.clock = title, total_blocks, clock
        self.max_samples, self.max_spans = max_samples, max_spans
        self.data = np.full((len(SERIES), max_samples), np.nan)
        self.count = 0  # samples held
        self.stride = 1
        self.calls = 0
        self.open_spans: dict[int, RequestSpan] = {}  # at most the requests in flight
        # closed spans: a ring of max_spans rows (start, end, blocks, request id, label, ending, held)
        self.span_times = np.zeros((max_spans, 2))
        self.span_ints = np.zeros((max_spans, 5), dtype=np.int64)
        self.spans_written = 0
        self.dropped_before = 0  # a timeline read back by from_dict: the spans its recorder had dropped
        self.names: dict[str, int] = {}  # labels and endings, by number (a few distinct strings)
        self.held_kept: list[RequestSpan] = []  # held spans the ring wrote over (at most MAX_HELD_KEPT)
        self.markers: list[Marker] = []
        self.verdict = ""
        self.requests_done = 0
        self.started = clock()

    def now(self) -> float:
        return self.clock() - self.started

    # ---- series ---------------------------------------------------------------------------------

    def due(self) -> bool:
        """True once every `stride` calls: read the (possibly costly) figures only then."""
        self.calls += 1
        return self.calls % self.stride == 0

    def sample(self, *, kv_used: int | None = None, kv_cached: int | None = None, kv_free: int | None = None,
               ledger: dict[str, int] | None = None, driver_free: int | None = None, rss: int | None = None,
               fragmentation: float | None = None) -> None:
        if self.count >= self.max_samples:
            kept = self.data[:, ::2]  # the first point, then every other one
            self.count = kept.shape[1]
            self.data[:, :self.count] = kept.copy()
            self.data[:, self.count:] = np.nan
            self.stride *= 2
        ledger = ledger or {}
        row = (self.now(), self.requests_done, kv_used, kv_cached, kv_free, driver_free, rss, fragmentation,
               *(ledger.get(tag) for tag in TAGS))
        self.data[:, self.count] = [np.nan if v is None else v for v in row]
        self.count += 1

    def sample_cache(self, cache, ledger=None, driver_free: int | None = None, rss: int | None = None,
                     fragmentation: bool = True) -> None:
        """A sample from a KvCache and a Ledger (the usual case)."""
        cached = getattr(cache, "num_cached_blocks", 0) or 0
        free = cache.num_free_blocks
        used = cache.num_usable_blocks - free - cached
        frag = cache.memory_profile().fragmentation_ratio if fragmentation and not cache.closed else None
        self.sample(kv_used=used, kv_cached=cached, kv_free=free, ledger=None if ledger is None else ledger.bytes_by_tag(),
                    driver_free=driver_free, rss=rss, fragmentation=frag)

    def series(self, name: str) -> list:
        """The readings of one series, None where it had none."""
        values = self.data[SERIES.index(name), :self.count]
        return [None if np.isnan(v) else (float(v) if name in FLOAT_SERIES else int(v)) for v in values]

    def present(self) -> list[str]:
        """The series that hold at least one reading (a run without a driver has no driver_free)."""
        held = ~np.isnan(self.data[:, :self.count]).all(axis=1)
        return [n for k, n in enumerate(SERIES) if k >= 2 and held[k]]

    # ---- requests -------------------------------------------------------------------------------

    def request_started(self, request_id: int, label: str = "") -> None:
        self.open_spans[request_id] = RequestSpan(request_id, label, self.now())

    def request_blocks(self, request_id: int, blocks: int) -> None:
        span = self.open_spans.get(request_id)
        if span is not None and blocks > span.blocks:
            span.blocks = blocks

    def track_requests(self, cache, requests) -> None:
        """Each engine request's KV blocks now ((request id, Request) pairs; after a step)."""
        for rid, request in requests:
            if rid in self.open_spans:
                self.request_blocks(rid, sum(len(cache.block_table(seq.seq_id)) for seq in request.seqs
                                             if cache.has_sequence(seq.seq_id)))

    def _name(self, text: str) -> int:
        if text not in self.names and len(self.names) < MAX_NAMES:
            self.names[text] = len(self.names)
        return self.names.get(text, 0)

    def request_ended(self, request_id: int, ending: str = "") -> None:
        span = self.open_spans.pop(request_id, None)
        self.requests_done += 1
        if span is None:
            return
        row = self.spans_written % self.max_spans
        if self.spans_written >= self.max_spans and self.span_ints[row, 4] and len(self.held_kept) < MAX_HELD_KEPT:
            self.held_kept.append(self._span_at(row))  # a held span is the picture's point: keep it
        self.span_times[row] = (span.start, self.now())
        self.span_ints[row] = (span.blocks, request_id, self._name(span.label), self._name(ending), 0)
        self.spans_written += 1

    def _span_at(self, row: int) -> RequestSpan:
        by_number = {v: k for k, v in self.names.items()}
        blocks, rid, label, ending, held = (int(v) for v in self.span_ints[row])
        start, end = (float(v) for v in self.span_times[row])
        return RequestSpan(rid, by_number.get(label, ""), round(start, 6), round(end, 6), blocks, by_number.get(ending, ""),
                           bool(held))

    @property
    def dropped_spans(self) -> int:
        return max(0, self.spans_written - self.max_spans) + self.dropped_before

    def mark_held(self, request_ids) -> None:
        """The requests a leak check found holding blocks that never came back."""
        ids = np.fromiter(request_ids, dtype=np.int64)
        if len(ids):
            rows = min(self.spans_written, self.max_spans)
            self.span_ints[:rows, 4] |= np.isin(self.span_ints[:rows, 1], ids)
            for span in self.open_spans.values():
                span.held = span.held or span.request_id in set(ids.tolist())

    def spans(self) -> list[RequestSpan]:
        closed = [self._span_at(row) for row in range(min(self.spans_written, self.max_spans))]
        opened = [dataclasses.replace(s, start=round(s.start, 6)) for s in self.open_spans.values()]
        return sorted(self.held_kept + closed + opened, key=lambda s: (s.start, s.request_id))

    # ---- markers --------------------------------------------------------------------------------

    def mark(self, kind: str, text: str, layer: str = "", t: float | None = None, requests: int | None = None) -> None:
        if len(self.markers) >= MAX_MARKERS:
            return
        self.markers.append(Marker(round(self.now() if t is None else t, 6),
                                   self.requests_done if requests is None else requests, kind, text, layer))

    def mark_verdict(self, verdict: str, findings) -> None:
        """The verdict, and each finding at the end of the phase its message names (else at the end of the run)."""
        self.verdict = verdict
        for f in findings:
            if f.severity == "warning":
                continue
            phases = [m for m in self.markers if m.kind == "phase"]
            at = next((m for m in phases if f"after {m.text}" in f.message), None) or next(
                (m for m in sorted(phases, key=lambda m: -len(m.text)) if m.text in f.message), None)
            self.mark("verdict", f"{f.layer}: {f.message}", f.layer,
                      t=None if at is None else at.t, requests=None if at is None else at.requests)

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryTimeline":
        """A timeline read back from to_dict's output (to draw it again)."""
        series = data["series"]
        n = len(series["t"])
        spans = [RequestSpan(**s) for s in data.get("spans", [])]
        end = max(series["t"] + [s.end or s.start for s in spans], default=0.0)
        timeline = cls(data.get("title", ""), total_blocks=data.get("total_blocks"), max_samples=max(1, n),
                       max_spans=max(1, len(spans)), clock=lambda: end)
        for k, name in enumerate(SERIES):
            timeline.data[k, :n] = [np.nan if v is None else v for v in series.get(name, [None] * n)]
        timeline.count, timeline.stride, timeline.verdict = n, data.get("stride", 1), data.get("verdict", "")
        timeline.started = 0.0
        timeline.open_spans = {s.request_id: s for s in spans if s.end is None}
        timeline.held_kept = [s for s in spans if s.end is not None]  # drawn as they were recorded
        timeline.dropped_before = data.get("dropped_spans", 0)
        timeline.markers = [Marker(**m) for m in data.get("markers", [])]
        return timeline

    def to_dict(self) -> dict:
        return {
            "title": self.title, "verdict": self.verdict, "stride": self.stride, "total_blocks": self.total_blocks,
            "series": {n: self.series(n) for n in SERIES},
            "labels": {n: SERIES_LABELS[n] for n in self.present()},
            "spans": [asdict(s) for s in self.spans()], "dropped_spans": self.dropped_spans,
            "markers": [asdict(m) for m in self.markers],
        }
