"""The leak check's result: what each layer read after each phase, judged against the thresholds.

`LeakReport.to_dict()` is the `--json` output (exact integers, stable keys); leak_render prints the
same content as rich tables. `judge()` turns the readings into findings: a finding of severity
"leak" fails the run (exit 1), a "warning" is reported and does not. A layer that could not be
judged gets a finding of severity "not judged": the verdict is then "not judged" (never "clean"
for what was not checked) and the exit code 1, unless the user turned that layer's limits off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hipcore.runtime.ledger import format_bytes
from profiles.leak_driver_memory import NOT_APPLICABLE_CPU, judge_driver
from profiles.leak_findings import (  # noqa: F401 (re-exported: the checks import them from here)
    EXIT_CLEAN, EXIT_INTERRUPTED, EXIT_LEAK, INTERRUPTED, LEAK, NOT_JUDGED, WARNING, Finding, FindingsVerdict)
from profiles.leak_handles import handle_rows, judge_handles
from profiles.leak_layers import BlockReading, DriverReading, EngineState, LedgerReading
from profiles.leak_thresholds import Thresholds

# Requests the judged (second-half) RSS fit must span: over fewer, the slope's noise (malloc arenas,
# page-granular RSS; measured 0 to 11 MiB/1000 req between seeds of 300-request runs) exceeds the
# 1 MiB/1000 req threshold, so RSS is reported and not judged; tracemalloc judges such runs.
MIN_HOST_SPAN = 250
# What tracemalloc may find kept since the baseline beyond the per-request limit: bounded caches
# that turn over during the measured phases (finished records of other sizes than the warm-up's,
# tokenizer caches). Measured 76-82 KB over 200-request runs of the test model.
HOST_TRACED_SLACK = 256 << 10
# Emptying the decoded experts' cache unmaps its entries: the RSS drops by their bytes, less at most this (pages
# another thread touches meanwhile); tracemalloc does not see the mappings, so this reading is what would.
EXPERT_MAPPINGS_SLACK = 1 << 20


@dataclass
class PhaseResult:
    name: str
    requests: int
    seconds: float
    engine: EngineState
    blocks: BlockReading | None
    ledger: LedgerReading
    driver: DriverReading | None
    driver_baseline: int | None = None
    ledger_judged: bool = True  # the warm-up's ledger growth is shown, not judged
    handles: dict | None = None  # live streams, events, graphs, modules and file descriptors (leak_handles)

    @property
    def driver_loss(self) -> int | None:
        """Bytes the driver says are in use beyond the baseline (negative: more free than then)."""
        if self.driver is None or self.driver_baseline is None:
            return None
        return self.driver_baseline - self.driver.free

    def to_dict(self) -> dict:
        return {
            "name": self.name, "requests": self.requests, "seconds": round(self.seconds, 3),
            "engine": self.engine.to_dict(), "blocks": None if self.blocks is None else self.blocks.to_dict(),
            "ledger": self.ledger.to_dict(), "ledger_judged": self.ledger_judged,
            "driver": None if self.driver is None else {
                "free": self.driver.free, "reads": self.driver.reads, "spread": self.driver.spread,
                "baseline_free": self.driver_baseline, "loss": self.driver_loss,
            },
            "handles": self.handles,
        }


@dataclass
class HostFit:
    """A least-squares slope of host memory against requests completed, over [start, end]."""

    rss_slope: float | None  # bytes per request
    traced_slope: float | None
    start: int
    span: int  # requests between the first and the last sample used
    samples: int

    def per_1000(self, slope: float | None) -> int | None:
        return None if slope is None else int(round(slope * 1000))

    def to_dict(self) -> dict:
        return {"rss_per_1000_requests": self.per_1000(self.rss_slope),
                "tracemalloc_per_1000_requests": self.per_1000(self.traced_slope),
                "from_request": self.start, "span_requests": self.span, "samples": self.samples}


@dataclass
class HostResult:
    """Host memory over the run. The whole-run fit is reported; the judged fit is the second half
    of the run, where bounded caches that fill up early have flattened and a per-request leak
    still grows at its full rate."""

    available: bool
    baseline_rss: int | None
    peak_rss: int | None
    final_rss: int | None
    whole: HostFit
    judged: HostFit
    tracemalloc_bytes: int
    tracemalloc_count: int
    tracemalloc_top: list[dict]
    series: dict[str, list[int]] = field(default_factory=dict)
    traced: bool = False  # tracemalloc ran from the baseline to the end
    traced_requests: int = 0  # requests run between the tracemalloc baseline and its final snapshot
    expert_cache: dict | None = None  # the cpu backend's decoded experts, apart (leak_layers.expert_cache_reading)

    def to_dict(self) -> dict:
        return {
            "available": self.available, "baseline_rss": self.baseline_rss, "peak_rss": self.peak_rss,
            "final_rss": self.final_rss, "whole_run": self.whole.to_dict(), "judged": self.judged.to_dict(),
            "judged_min_span_requests": MIN_HOST_SPAN,
            "tracemalloc_not_returned": {"bytes": self.tracemalloc_bytes, "allocations": self.tracemalloc_count,
                                         "top_lines": self.tracemalloc_top, "traced": self.traced,
                                         "requests": self.traced_requests, "allowance_bytes": HOST_TRACED_SLACK},
            "series": self.series, "expert_cache": self.expert_cache,
        }


@dataclass
class LeakReport(FindingsVerdict):
    command: str
    settings: dict
    model: str
    device: str
    backend: str
    thresholds: Thresholds
    phases: list[PhaseResult]
    close_ledger: LedgerReading | None
    close_error: str | None
    host: HostResult
    requests: dict  # counts by ending, by plan, cancels by phase, unexpected notes ...
    engine_failure: dict | None
    stalls: list[str]
    peaks: dict  # blocks used, ledger bytes by tag, driver used
    baseline: dict
    wall_seconds: float
    load_seconds: float
    planted_bug: str | None = None
    interrupted: bool = False  # Ctrl-C: what was read is reported, nothing is concluded
    findings: list[Finding] = field(default_factory=list)
    timeline: object = None  # a MemoryTimeline of the run (not in to_dict: --report and --plot draw it)

    @property
    def final(self) -> PhaseResult | None:
        return self.phases[-1] if self.phases else None

    def layer_totals(self) -> list[dict]:
        """Per layer: 'N bytes in M allocations not returned', baseline / peak / final."""
        final = self._last_with_blocks()
        rows = []
        if final is not None and final.blocks is not None:
            b = final.blocks
            rows.append({"layer": "kv blocks", "bytes": b.leaked_bytes, "count": b.not_free, "unit": "blocks",
                         "baseline": self.baseline.get("blocks_used", 0) * b.bytes_per_block,
                         "peak": self.peaks.get("blocks_used", 0) * b.bytes_per_block, "final": b.not_free * b.bytes_per_block})
        last = self.final
        if last is not None:
            for tag, grown in last.ledger.growth_bytes.items():
                base = self.baseline.get("ledger_bytes", {}).get(tag, 0)
                if grown or base or self.peaks.get("ledger_bytes", {}).get(tag, 0):
                    count = sum(1 for a in last.ledger.not_returned if a["tag"] == tag)
                    rows.append({"layer": f"ledger: {tag}", "bytes": max(0, grown), "count": count, "unit": "allocations",
                                 "baseline": base, "peak": self.peaks.get("ledger_bytes", {}).get(tag, 0),
                                 "final": last.ledger.bytes_by_tag.get(tag, 0)})
        if self.close_ledger is not None:
            c = self.close_ledger
            rows.append({"layer": "ledger after close", "bytes": sum(c.bytes_by_tag.values()), "count": c.leaked_count,
                         "unit": "allocations", "baseline": None, "peak": None, "final": sum(c.bytes_by_tag.values())})
        if last is not None and last.driver is not None:
            loss = last.driver_loss or 0
            rows.append({"layer": "driver", "bytes": max(0, loss), "count": None, "unit": "",
                         "baseline": self.baseline.get("driver_used"), "peak": self.peaks.get("driver_used"),
                         "final": None if self.baseline.get("driver_used") is None else self.baseline["driver_used"] + loss})
        h = self.host
        requests = max(1, self.requests.get("total", 0))
        for row in rows:  # growth per measured request, as the issue asks of every layer
            row["per_request"] = round(row["bytes"] / requests, 3)
        if self.driver_layer == NOT_APPLICABLE_CPU:
            rows.append({"layer": f"driver: {NOT_APPLICABLE_CPU}", "bytes": None, "count": None, "unit": "",
                         "baseline": None, "peak": None, "final": None, "per_request": None})
        rows.extend(handle_rows(self.baseline.get("handles"), self.final.handles if self.final is not None else None))
        if h.available:
            rows.append({"layer": "host (RssAnon+VmSwap)", "bytes": max(0, (h.final_rss or 0) - (h.baseline_rss or 0)),
                         "count": None, "unit": "", "baseline": h.baseline_rss, "peak": h.peak_rss, "final": h.final_rss})
        if h.traced:
            rows.append({"layer": "host (tracemalloc)", "bytes": max(0, h.tracemalloc_bytes),
                         "count": max(0, h.tracemalloc_count), "unit": "allocations", "baseline": None, "peak": None, "final": None,
                         "per_request": round(max(0, h.tracemalloc_bytes) / max(1, h.traced_requests), 3)})
        if h.expert_cache is not None:
            rows.append({"layer": "host (decoded experts' cache)", "bytes": None,  # bounded, emptied: not kept
                         "count": h.expert_cache["entries"], "unit": "entries", "baseline": 0,
                         "peak": h.expert_cache["peak_bytes"], "final": h.expert_cache["held_bytes"], "per_request": None})
        for row in rows:
            if "per_request" not in row:  # host rows: the fitted slope is the per-request figure
                slope = h.judged.rss_slope if row["layer"].startswith("host (Rss") else h.judged.traced_slope
                row["per_request"] = None if slope is None else round(slope, 3)
        return rows

    @property
    def driver_layer(self) -> str:
        """'judged', or why not: the cpu backend has no driver figure."""
        if any(p.driver_loss is not None for p in self.phases):
            return "judged"
        return NOT_APPLICABLE_CPU if self.backend == "cpu" else "no reading"

    def _last_with_blocks(self) -> PhaseResult | None:
        return next((p for p in reversed(self.phases) if p.blocks is not None), None)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict, "exit_code": self.exit_code, "driver_layer": self.driver_layer, "interrupted": self.interrupted, "command": self.command, "settings": self.settings,
            "planted_bug": self.planted_bug, "model": self.model, "device": self.device, "backend": self.backend,
            "wall_seconds": round(self.wall_seconds, 3), "load_seconds": round(self.load_seconds, 3),
            "requests": self.requests, "findings": [f.to_dict() for f in self.findings],
            "layers": self.layer_totals(), "thresholds": self.thresholds.to_dict(),
            "baseline": self.baseline, "peaks": self.peaks, "phases": [p.to_dict() for p in self.phases],
            "close": None if self.close_ledger is None else {"ledger": self.close_ledger.to_dict(), "error": self.close_error},
            "host": self.host.to_dict(), "engine_failure": self.engine_failure, "stalls": self.stalls,
        }


def judge(report: LeakReport) -> list[Finding]:
    """The findings, strictest layer first."""
    t = report.thresholds
    out: list[Finding] = []
    if report.engine_failure:
        failure = report.engine_failure
        what = "the engine raised in" if failure.get("raised", True) else "the run was ended in"
        out.append(Finding("engine", "leak", f"{what} {failure['where']}: {failure['message']}"))
    for stall in report.stalls:
        out.append(Finding("engine", "leak", f"stalled: {stall}"))
    for phase in report.phases:
        e = phase.engine
        if not e.empty:
            out.append(Finding("engine", "leak", f"after {phase.name}: {e.active_requests} requests still active, "
                                                 f"{e.waiting} waiting, {e.running} running, {e.inbox} inbox items, "
                                                 f"{e.cache_sequences} KV cache tables left"))
        if not e.records_within_bound:
            out.append(Finding("engine", "leak", f"after {phase.name}: {e.finished_records} finished records kept, "
                                                 f"past their bound of {e.finished_bound}"))
        if phase.blocks is not None:
            _judge_blocks(out, phase, t)
        if phase.ledger_judged:
            _judge_ledger(out, phase, t)
    out.extend(Finding("driver", severity, message) for severity, message in judge_driver(report.phases, report.backend, t.driver))
    final = report.final
    if final is not None:  # with no phase read there is no layer reading at all (as for the ledger and blocks)
        out.extend(Finding("handles", severity, message) for severity, message in judge_handles(
            report.baseline.get("handles"), final.handles, final.name, t.handles))
    if report.close_error:
        out.append(Finding("ledger", "leak", f"closing the model raised: {report.close_error}"))
    if report.close_ledger is not None and (report.close_ledger.leaked_count or sum(report.close_ledger.bytes_by_tag.values())):
        c = report.close_ledger
        total = sum(c.bytes_by_tag.values())
        severity = "leak" if t.ledger is not None and total > t.ledger else "warning"
        by_tag = ", ".join(f"{tag} {format_bytes(b)}" for tag, b in c.bytes_by_tag.items() if b)
        out.append(Finding("ledger", severity, f"after closing the model: {total:,} bytes in {c.leaked_count} allocations "
                                               f"not returned ({by_tag}); first: {_first_allocation(c)}"))
    _judge_host(out, report, t)
    unexpected = report.requests.get("unexpected", 0)
    if unexpected:
        severity = "leak" if t.unexpected is not None and unexpected > t.unexpected else "warning"
        notes = report.requests.get("unexpected_notes", [])
        out.append(Finding("requests", severity, f"{unexpected} requests ended other than planned"
                                                 + (f"; first: {notes[0]}" if notes else "")))
    if report.requests.get("preempted_requests", 0) == 0 and report.requests.get("total", 0) >= 50:
        out.append(Finding("requests", "warning", "no request was preempted: lower --kv-blocks to exercise preemption"))
    return out


def _judge_blocks(out: list[Finding], phase: PhaseResult, t: Thresholds) -> None:
    b = phase.blocks
    assert b is not None
    if b.invariant_error:
        out.append(Finding("kv blocks", "leak", f"after {phase.name}: KV invariant broken: {b.invariant_error}"))
    if b.not_free:
        severity = "leak" if t.blocks is not None and b.not_free > t.blocks else "warning"
        first = b.leaked[0] if b.leaked else None
        owner = ""
        if first is not None:
            who = first["owners"][0] if first["owners"] else None
            group = f"{first['group']} " if len(b.groups) > 1 else ""  # a model with sliding-window layers
            owner = (f"; first: {group}block {first['block']} (refcount {first['refcount']}) held by "
                     + (f"request {who['request_id']} ({who['plan']}, ended {who['ending']} in {who['phase_at_end']}, "
                        f"{who['run_phase']})" if who else "no block table"))
        cached = f" once {b.cached} cached were evicted" if b.cached else ""
        out.append(Finding("kv blocks", severity, f"after {phase.name}: {b.leaked_bytes:,} bytes in {b.not_free} KV blocks "
                                                  f"not returned ({b.pending} pending, {b.free} of {b.usable} free{cached}){owner}"))


def _judge_ledger(out: list[Finding], phase: PhaseResult, t: Thresholds) -> None:
    led = phase.ledger
    if led.clean:
        return
    grown = {tag: b for tag, b in led.growth_bytes.items() if b or led.growth_count[tag]}
    # Byte-exact by default: with a zero limit a changed count alone (same bytes) fails too.
    severity = "leak" if t.ledger is not None and (led.leaked_bytes > t.ledger or t.ledger == 0) else "warning"
    by_tag = ", ".join(f"{tag} {b:+,} B / {led.growth_count[tag]:+d}" for tag, b in grown.items())
    out.append(Finding("ledger", severity, f"after {phase.name}: {led.leaked_bytes:,} bytes in {led.leaked_count} allocations "
                                           f"not returned ({by_tag}); first: {_first_allocation(led)}"))


def _first_allocation(led: LedgerReading) -> str:
    if not led.not_returned:
        return "-"
    a = led.not_returned[0]
    label = f' "{a["label"]}"' if a["label"] else ""
    return f"{a['tag']} {a['bytes']:,} B{label} allocated at {a['site']} ({a['owner']})"


def _judge_host(out: list[Finding], report: LeakReport, t: Thresholds) -> None:
    """tracemalloc judges every run length; the RSS slope judges long runs too (it also sees memory
    that Python does not allocate). With neither, the host layer is "not judged"."""
    h = report.host
    cache = h.expert_cache
    if cache is not None and cache["peak_bytes"] > cache["budget_bytes"]:
        out.append(Finding("host", LEAK, f"the decoded experts' cache held {cache['peak_bytes']:,} bytes, past its budget "
                                         f"of {cache['budget_bytes']:,} (hipcore/ops/moe_expert_cache.py): it did not evict"))
    given_back = cache.get("rss_given_back") if cache is not None else None
    if given_back is not None and given_back < cache["held_bytes"] - EXPERT_MAPPINGS_SLACK:
        out.append(Finding("host", LEAK, f"emptying the decoded experts' cache gave back {given_back:,} bytes of RSS of "
                                         f"the {cache['held_bytes']:,} its entries held (hipcore/ops/moe_expert_cache.py): "
                                         "their mappings are kept elsewhere"))
    judged = []
    if h.traced:
        _judge_traced(out, h, t)
        judged.append("tracemalloc")
    fit = h.judged
    if h.available and fit.rss_slope is not None and fit.span >= MIN_HOST_SPAN:
        _judge_rss(out, h, t)
        judged.append("RSS")
    if judged:
        return
    reasons = []
    if not h.traced:
        reasons.append("tracemalloc was off (--no-tracemalloc)")
    reasons.append("no RSS reading on this system" if not h.available else
                   f"the RSS slope needs a second half of at least {MIN_HOST_SPAN} requests (this run's spans {fit.span})")
    off = t.host_traced_per_1000 is None and t.host_growth_per_1000 is None
    out.append(Finding("host", WARNING if off else NOT_JUDGED,
                       f"host memory not judged: {' and '.join(reasons)}; run with tracemalloc (the default) or "
                       f"--requests {2 * MIN_HOST_SPAN} or more" + (" (host limits turned off by --fail-on)" if off else "")))


def _largest_growth(h: HostResult) -> str:
    top = h.tracemalloc_top[0] if h.tracemalloc_top else None
    return f"; tracemalloc's largest growth: {format_bytes(top['bytes'])} at {top['where']}" if top else ""


def _judge_traced(out: list[Finding], h: HostResult, t: Thresholds) -> None:
    """What tracemalloc finds still allocated since the baseline, against the per-request limit
    times the requests run, plus the allowance for bounded caches."""
    n = max(1, h.traced_requests)
    limit = t.host_traced_per_1000
    allowed = HOST_TRACED_SLACK + (limit if limit is not None else Thresholds().host_traced_per_1000) * n // 1000
    grown = h.tracemalloc_bytes
    if grown <= allowed:
        return
    severity = LEAK if limit is not None else WARNING
    shown_limit = f"{format_bytes(limit)}/1000req" if limit is not None else "off"
    out.append(Finding("host", severity, f"host memory kept since the baseline: {grown:,} bytes in {h.tracemalloc_count:,} "
                                         f"allocations over {n:,} requests ({grown / n:,.0f} B per request) by tracemalloc; "
                                         f"allowed {allowed:,} (limit {shown_limit} plus {format_bytes(HOST_TRACED_SLACK)} "
                                         f"for bounded caches){_largest_growth(h)}"))


def _judge_rss(out: list[Finding], h: HostResult, t: Thresholds) -> None:
    fit = h.judged
    rss, traced = fit.per_1000(fit.rss_slope), fit.per_1000(fit.traced_slope)
    limit = t.host_growth_per_1000
    worst = max(rss, traced or 0)
    if limit is not None and worst > limit:
        severity = LEAK
    elif worst > (limit if limit is not None else 1 << 20):
        severity = WARNING
    else:
        return
    out.append(Finding("host", severity, f"host memory grows {format_bytes(rss)} per 1000 requests by RSS"
                                         + (f", {format_bytes(traced)} by tracemalloc" if traced is not None else "")
                                         + f" over the second half of the run (requests {fit.start:,} on, "
                                         + f"{fit.span:,} spanned; limit "
                                         + (f"{format_bytes(limit)}/1000req" if limit is not None else "off") + f"){_largest_growth(h)}"))
