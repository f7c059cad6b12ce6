"""MemoryTimeline: bounded series and request spans, the verdict's markers, and the HTML report and plot drawn from it."""

from __future__ import annotations

import json
import tracemalloc
from html.parser import HTMLParser

from profiles.leak_report import Finding
from profiles.memory_timeline import SERIES, MemoryTimeline
from profiles.plot import render
from profiles.report_html import DATA_ID, build_html


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(timeline: MemoryTimeline, clock: Clock, requests: int, leak_every: int = 0) -> None:
    """Requests one after another, each holding 2 blocks; every leak_every-th keeps them."""
    used = 0
    for rid in range(requests):
        timeline.request_started(rid, "chat")
        clock.t += 0.5
        timeline.request_blocks(rid, 2)
        used += 2
        if timeline.due():
            timeline.sample(kv_used=used, kv_cached=1, kv_free=100 - used, ledger={"kv": 4096, "weights": 1 << 20},
                            rss=(50 << 20) + rid, fragmentation=0.25)
        timeline.request_ended(rid, "length")
        if not (leak_every and rid % leak_every == 0):
            used -= 2


def test_series_stay_bounded_and_spread_over_the_whole_run():
    clock = Clock()
    timeline = MemoryTimeline("t", max_samples=64, max_spans=32, clock=clock)
    run(timeline, clock, 1000)
    t = timeline.series("t")
    assert len(t) <= 64 and timeline.stride >= 16
    assert t[0] == 0.5 and t[-1] > 400 and t == sorted(t)  # the first point kept, the last one recent
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert max(gaps) <= 2 * min(gaps)  # even after decimation
    assert timeline.series("driver_free") == [None] * len(t) and "driver_free" not in timeline.present()
    assert {"kv_used", "rss", "ledger_kv", "fragmentation"} <= set(timeline.present())
    assert len(timeline.spans()) == 32 and timeline.dropped_spans == 1000 - 32


def test_recording_adds_no_host_memory_once_built():
    clock = Clock()
    timeline = MemoryTimeline("t", max_samples=128, max_spans=64, clock=clock)
    run(timeline, clock, 200)  # everything allocated once is allocated now
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        run(timeline, clock, 2000)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename") if "memory_timeline" in str(s.traceback))
    assert grown < 4096, grown


def test_held_requests_are_marked_and_kept_past_the_ring():
    clock = Clock()
    timeline = MemoryTimeline("t", max_spans=8, clock=clock)
    run(timeline, clock, 6, leak_every=3)
    timeline.mark_held([0, 3])
    run(timeline, clock, 20)  # writes over the ring, the held spans too
    held = [s for s in timeline.spans() if s.held]
    assert sorted(s.request_id for s in held) == [0, 3] and all(s.blocks == 2 for s in held)
    timeline.request_started(99, "cancel")
    timeline.mark_held([99])
    assert [s for s in timeline.spans() if s.request_id == 99][0].held


def test_verdict_markers_sit_at_the_phase_their_finding_names():
    clock = Clock()
    timeline = MemoryTimeline("t", clock=clock)
    for name in ("warm-up", "phase 1", "phase 2"):
        clock.t += 10
        timeline.mark("phase", name)
    clock.t += 5
    timeline.mark_verdict("leak", [Finding("kv blocks", "leak", "after phase 1: 3 blocks not returned; first held by a "
                                                               "request of the warm-up"),
                                   Finding("host", "leak", "kept since the baseline"),
                                   Finding("requests", "warning", "no preemption")])
    verdicts = [m for m in timeline.markers if m.kind == "verdict"]
    assert [(m.layer, m.t) for m in verdicts] == [("kv blocks", 20.0), ("host", 35.0)]
    assert timeline.verdict == "leak"


def leaky_timeline() -> MemoryTimeline:
    clock = Clock()
    timeline = MemoryTimeline("leak-check tiny.gguf", total_blocks=100, clock=clock)
    run(timeline, clock, 30, leak_every=4)
    timeline.mark("phase", "phase 1")
    timeline.mark_held([0, 4, 8])
    timeline.mark_verdict("leak", [Finding("kv blocks", "leak", "after phase 1: 16 blocks not returned")])
    return timeline


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.data = ""
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_data = tag == "script" and dict(attrs).get("id") == DATA_ID

    def handle_endtag(self, tag):
        self._in_data = False

    def handle_data(self, data):
        if self._in_data:
            self.data += data
        else:
            self.text.append(data)


def test_the_html_report_is_self_contained_and_carries_the_curves_lifetimes_and_verdict():
    timeline = leaky_timeline()
    page = Page()
    text_html = build_html(timeline, [Finding("kv blocks", "leak", "after phase 1: <16> blocks not returned")],
                           ["command: rocmforge leak-check"])
    assert text_html.index("verdict: leak") < text_html.index("<svg") < text_html.index("Findings")  # curves first
    page.feed(text_html)
    tags = [t for t, _ in page.tags]
    assert tags.count("svg") == 1 and tags.count("script") == 1
    for tag, attrs in page.tags:  # nothing fetched from elsewhere: opens offline
        assert "src" not in attrs and not attrs.get("href", "").startswith(("http", "//")), (tag, attrs)
        assert tag not in ("link", "iframe", "img")
    text = " ".join(page.text)
    for label in ("KV blocks used", "KV blocks free", "ledger kv", "ledger weights", "host memory (RSS)",
                  "KV fragmentation", "requests: blocks never released", "leak: kv blocks"):
        assert label in text, label
    assert "verdict: leak" in text and "<16> blocks" in text  # the finding escaped, not markup
    assert "3 requests whose KV blocks never came back" in text
    data = json.loads(page.data)
    assert data == json.loads(json.dumps(timeline.to_dict()))
    assert set(data["series"]) == set(SERIES) and len(data["series"]["kv_used"]) == 30
    assert [s["request_id"] for s in data["spans"] if s["held"]] == [0, 4, 8]
    assert [m["layer"] for m in data["markers"] if m["kind"] == "verdict"] == ["kv blocks"]
    assert MemoryTimeline.from_dict(data).to_dict()["series"] == data["series"]


def test_the_plot_writes_png_and_svg():
    timeline = leaky_timeline()
    png = render(timeline, "png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    svg = render(timeline, "svg").decode()
    assert "<svg" in svg and "KV blocks used" in svg and "leak: kv blocks" in svg


def test_the_sparkline_follows_the_values_within_its_width():
    from profiles.sparkline import BARS, sparkline
    rising = sparkline(range(1000), width=20)
    assert len(rising) == 20 and rising[0] == BARS[0] and rising[-1] == BARS[-1] and list(rising) == sorted(rising)
    assert sparkline([5, 5, None, 5]) == BARS[0] * 3 and sparkline([None]) == ""
    assert sparkline([0, 10, 0], width=3) == BARS[0] + BARS[-1] + BARS[0]
