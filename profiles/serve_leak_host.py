"""Host memory of the server under `rocmforge serve-leak-check`: is it flat over a long run?

The server publishes its anonymous resident memory (RssAnon + VmSwap, /proc/self/status) on /metrics as
rocmforge_host_rss_anon_bytes. While the clients run, a sampler reads it against the requests done; the
judgement is the engine-level check's (profiles.leak_thresholds): the least-squares slope over the second
half of the run (the first half is warm-up for allocator arenas, connection pools and caches that grow to
a bound), at most 1 MiB per 1,000 requests, judged only when that half spans at least 250 requests (a
shorter span cannot tell a slope from noise). The judged part also starts no earlier than request 1,000:
the engine keeps the records of its last 1,000 finished requests (Engine.finished_bound), so up to there
memory grows by design (measured on the cpu backend over HTTP: about +2 MiB per 1,000 requests before it).
Past it the server's memory still settles for a while. On the cpu backend, a qwen3moe of 256 experts (its
decoded experts' cache off or on): the HTTP process +1.6 MiB and the engine's memory outside malloc's heap +0.8
to +1.0 MiB from request 1,000 to 6,000, flat after; runs of 1,500 requests judged +0.96 to +2.5 MiB per 1,000
on it and on the tiny dense model (17 of 18 runs over the limit), runs of 12,000 +24 to +107 KiB on either.
A verdict of growth on a shorter run than CONFIRM_REQUESTS says so (still a leak: never called clean).
On the cpu backend the server also publishes its cache of decoded experts (rocmforge_moe_expert_cache_*): it
fills as experts are first used, so its bytes (its entries' own mappings and their Python objects, exact:
hipcore/ops/moe_expert_cache.py) are taken out of the RSS judged and its peak is judged against its budget
instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from profiles.leak_report import MIN_HOST_SPAN

RSS_METRIC = "rocmforge_host_rss_anon_bytes"
CACHE_METRIC = "rocmforge_moe_expert_cache_bytes"
CACHE_PEAK_METRIC = "rocmforge_moe_expert_cache_peak_bytes"
CACHE_BUDGET_METRIC = "rocmforge_moe_expert_cache_budget_bytes"
DEFAULT_GROWTH_PER_1000 = 1 << 20
WARM_REQUESTS = 1000  # hipcore.engine.engine.Engine's default finished_bound
CONFIRM_REQUESTS = 12_000  # a second half past the settling measured above (flat from about request 6,000)


@dataclass
class MetricSeries:
    """(requests done, the server's `metric` from /metrics) samples in the order they were read; readings without
    it (another backend) add nothing."""

    metric: ClassVar[str]
    samples: list[tuple[int, int]] = field(default_factory=list)

    def add(self, requests_done: int, metrics: dict[str, float]) -> None:
        if self.metric in metrics:
            self.samples.append((int(requests_done), int(metrics[self.metric])))


@dataclass
class HostSeries(MetricSeries):
    """The server's RSS bytes against requests done, less its cache of decoded experts (cpu backend: it fills as
    experts are first used, bounded by its budget, which is judged apart: expert_cache_past_budget)."""

    metric: ClassVar[str] = RSS_METRIC
    cache_peak: int = 0
    cache_budget: int | None = None
    cache_first: int | None = None  # the cache's bytes taken out of the first sample and of the last
    cache_last: int = 0

    def add(self, requests_done: int, metrics: dict[str, float]) -> None:
        if self.metric not in metrics:
            return
        self.cache_last = int(metrics.get(CACHE_METRIC, 0))
        self.cache_first = self.cache_last if self.cache_first is None else self.cache_first
        self.samples.append((int(requests_done), int(metrics[self.metric]) - self.cache_last))
        if CACHE_BUDGET_METRIC in metrics:
            self.cache_peak = max(self.cache_peak, int(metrics[CACHE_PEAK_METRIC]))
            self.cache_budget = int(metrics[CACHE_BUDGET_METRIC])

    def expert_cache(self) -> dict | None:
        """The decoded experts' cache as the samples saw it (bytes taken out at the first and last, most data bytes,
        budget), or None when the server published none (no expert decoded, or another backend)."""
        if self.cache_budget is None:
            return None
        return {"first_bytes": self.cache_first, "last_bytes": self.cache_last, "peak_bytes": self.cache_peak,
                "budget_bytes": self.cache_budget}

    def expert_cache_past_budget(self) -> str | None:
        if self.cache_budget is None or self.cache_peak <= self.cache_budget:
            return None
        return (f"the decoded experts' cache held {self.cache_peak:,} bytes, past its budget of {self.cache_budget:,} "
                "(hipcore/ops/moe_expert_cache.py): it did not evict")

    def second_half_slope(self, warm_requests: int = WARM_REQUESTS) -> tuple[float | None, int]:
        """(bytes per request by least squares over the samples of the second half of the requests, and past
        `warm_requests`; the requests that part spans); None when fewer than 3 samples or no span."""
        if not self.samples:
            return None, 0
        start = max(self.samples[-1][0] / 2, warm_requests)
        points = [(x, y) for x, y in self.samples if x >= start]
        xs = [x for x, _ in points]
        span = (max(xs) - min(xs)) if xs else 0
        if len(points) < 3 or span == 0:
            return None, span
        mean_x = sum(xs) / len(xs)
        mean_y = sum(y for _, y in points) / len(points)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
        return sxy / sxx, span


@dataclass
class HostVerdict:
    judged: bool
    growth_per_1000: int | None  # bytes per 1,000 requests over the second half
    span: int  # requests the second half spans
    first: int | None  # RSS at the first and last sample
    last: int | None
    samples: int
    limit_per_1000: int
    cache_past_budget: str | None = None  # HostSeries.expert_cache_past_budget()
    requests: int = 0  # done at the last sample
    expert_cache: dict | None = None  # HostSeries.expert_cache()

    @property
    def grows(self) -> bool:
        return self.judged and self.growth_per_1000 is not None and self.growth_per_1000 > self.limit_per_1000

    @property
    def leaked(self) -> bool:
        return self.grows or self.cache_past_budget is not None

    def line(self) -> str:
        if self.cache_past_budget is not None:
            return f"host memory: {self.cache_past_budget}; {self._rss_line()}"
        return self._rss_line()

    def _rss_line(self) -> str:
        if self.growth_per_1000 is None and not self.samples:
            return "host memory: not measured (the server publishes no RSS on this platform)"
        rss = f"RSS {_mib(self.first)} -> {_mib(self.last)} over {self.samples} samples"
        if self.growth_per_1000 is None:
            return (f"host memory: not judged ({rss}; too few samples past request {WARM_REQUESTS:,} and the "
                    f"first half, where the engine's records of finished requests fill to their bound)")
        slope = f"{self.growth_per_1000 / (1 << 10):+.0f} KiB per 1,000 requests over the second half ({self.span} requests)"
        if not self.judged:
            return f"host memory: not judged ({slope}, fewer than {MIN_HOST_SPAN}); {rss}"
        verdict = "GROWING" if self.grows else "flat"
        line = f"host memory: {verdict}: {slope}, limit {self.limit_per_1000 >> 10} KiB; {rss}"
        if self.expert_cache is not None:
            c = self.expert_cache
            line += (f"; less the decoded experts' cache, {_mib(c['first_bytes'])} -> {_mib(c['last_bytes'])} (its most "
                     f"{_mib(c['peak_bytes'])} of a {_mib(c['budget_bytes'])} budget)")
        if self.grows and self.requests < CONFIRM_REQUESTS:
            line += (f"; a server's memory can settle for thousands of requests past the first {WARM_REQUESTS:,} (the "
                     f"cpu backend's up to about request 6,000): --requests {CONFIRM_REQUESTS} tells a bound from a leak")
        return line

    def to_dict(self) -> dict:
        return {"judged": self.judged, "growth_per_1000_requests": self.growth_per_1000, "span_requests": self.span,
                "rss_first": self.first, "rss_last": self.last, "samples": self.samples,
                "limit_per_1000_requests": self.limit_per_1000, "leaked": self.leaked,
                "expert_cache_past_budget": self.cache_past_budget, "expert_cache": self.expert_cache}


def judge_host(series: HostSeries, limit_per_1000: int = DEFAULT_GROWTH_PER_1000) -> HostVerdict:
    slope, span = series.second_half_slope()
    samples = series.samples
    return HostVerdict(judged=slope is not None and span >= MIN_HOST_SPAN,
                       growth_per_1000=None if slope is None else round(slope * 1000), span=span,
                       first=samples[0][1] if samples else None, last=samples[-1][1] if samples else None,
                       samples=len(samples), limit_per_1000=limit_per_1000,
                       cache_past_budget=series.expert_cache_past_budget(), requests=samples[-1][0] if samples else 0,
                       expert_cache=series.expert_cache())


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 20):.1f} MiB"
