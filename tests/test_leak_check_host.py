"""The host layer's verdict on hand-made readings: tracemalloc judges every run length, the RSS
slope only long runs, and a run that neither judges is "not judged" (exit 1), never "clean"."""

from __future__ import annotations

import pytest

from profiles.leak_report import HOST_TRACED_SLACK, HostFit, HostResult, LeakReport, judge
from profiles.leak_thresholds import Thresholds, parse_fail_on

# What tracemalloc found kept by clean 200-request runs of the test model (bounded caches turning over).
CLEAN_NOISE = 82_000


def host(kept: int, requests: int, *, traced: bool = True, rss_span: int = 0) -> HostResult:
    fit = HostFit(rss_slope=0.0 if rss_span else None, traced_slope=None, start=0, span=rss_span, samples=5)
    return HostResult(available=True, baseline_rss=1 << 30, peak_rss=1 << 30, final_rss=1 << 30, whole=fit, judged=fit,
                      tracemalloc_bytes=kept, tracemalloc_count=requests, tracemalloc_top=[], traced=traced,
                      traced_requests=requests)


def report(h: HostResult, thresholds: Thresholds = Thresholds()) -> LeakReport:
    r = LeakReport(command="", settings={}, model="", device="", backend="cpu", thresholds=thresholds, phases=[],
                   close_ledger=None, close_error=None, host=h, requests={"total": h.traced_requests}, engine_failure=None,
                   stalls=[], peaks={}, baseline={}, wall_seconds=0, load_seconds=0)
    r.findings = judge(r)
    return r


@pytest.mark.parametrize("per_request, requests", [(10 * 1024, 200), (300, 3000), (100 * 1024, 200)])
def test_a_per_request_host_leak_fails_short_and_long_runs(per_request, requests):
    r = report(host(CLEAN_NOISE + per_request * requests, requests))
    assert r.verdict == "leak" and r.exit_code == 1
    assert any(f.layer == "host" and "kept since the baseline" in f.message for f in r.findings)


@pytest.mark.parametrize("requests", [40, 200, 3000])
def test_bounded_cache_noise_is_clean(requests):
    r = report(host(CLEAN_NOISE, requests))
    assert r.verdict == "clean" and r.exit_code == 0 and not [f for f in r.findings if f.layer == "host"]


def test_the_allowance_is_the_slack_plus_the_limit_per_request():
    limit = Thresholds().host_traced_per_1000
    allowed = HOST_TRACED_SLACK + limit * 1000 // 1000
    assert report(host(allowed, 1000)).verdict == "clean"
    assert report(host(allowed + 1, 1000)).verdict == "leak"
    assert report(host(allowed + 1, 1000), parse_fail_on(["host-traced=off"])).verdict == "clean"  # a warning only


def test_without_tracemalloc_a_short_run_is_not_judged_and_a_long_one_is_judged_by_rss():
    short = report(host(0, 200, traced=False, rss_span=100))
    assert short.verdict == "not judged" and short.exit_code == 1
    [f] = [f for f in short.findings if f.layer == "host"]
    assert f.severity == "not judged" and "RSS slope needs a second half of at least 250" in f.message
    assert report(host(0, 1000, traced=False, rss_span=500)).verdict == "clean"
    waived = report(host(0, 200, traced=False, rss_span=100), parse_fail_on(["host-growth=off", "host-traced=off"]))
    assert waived.verdict == "clean" and [f.severity for f in waived.findings if f.layer == "host"] == ["warning"]
