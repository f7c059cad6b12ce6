"""The host-memory judgement of `rocmforge serve-leak-check` (profiles.serve_leak_host): a planted growth
of the server's RSS is caught, a flat or merely warming-up series passes, a short run is not judged (and a
soak that cannot judge it fails), and the live server publishes the figure it is judged on."""

from __future__ import annotations

import httpx
import pytest

from support.engine_testing import tiny_model
from support.moe_models import write_moe_model
from support.serve_testing import live_server, metrics

from hipcore.ops.moe_expert_cache import EXPERTS
from profiles.leak_thresholds import Thresholds
from profiles.serve_leak_check import ServeLeakSettings, run_serve_leak_check
from profiles.serve_leak_report import ServeLeakReport
from profiles.serve_leak_host import (
    CACHE_BUDGET_METRIC, CACHE_METRIC, CACHE_PEAK_METRIC, CONFIRM_REQUESTS, RSS_METRIC, HostSeries, judge_host,
)

MIB = 1 << 20


def series(requests: int, rss_of, every: int = 10) -> HostSeries:
    s = HostSeries()
    for done in range(0, requests + 1, every):
        s.add(done, {RSS_METRIC: float(rss_of(done))})
    return s


def test_a_planted_slope_is_caught():
    # 10 KiB kept per request (profiles.leak_bugs' host-leak) over 3,000 requests, on top of 200 MiB
    verdict = judge_host(series(3000, lambda n: 200 * MIB + n * 10_240))
    assert verdict.judged and verdict.leaked
    assert verdict.growth_per_1000 == 10_240_000
    assert "GROWING" in verdict.line()


def test_growth_on_a_run_shorter_than_the_settling_says_how_to_confirm_it():
    short = judge_host(series(1500, lambda n: 100 * MIB + n * 2048))
    assert short.leaked and "--requests 12000 tells a bound from a leak" in short.line()
    long = judge_host(series(CONFIRM_REQUESTS, lambda n: 100 * MIB + n * 2048))
    assert long.leaked and "GROWING" in long.line() and "tells a bound" not in long.line()


def test_flat_memory_after_a_warm_up_passes():
    # grows 30 MiB over the first 1,000 requests (finished records to their bound, arenas, pools), then
    # flat with +-256 KiB of noise: judged from request 1,500 (the second half) on
    def rss(n):
        return 200 * MIB + min(n, 1000) * 30 * 1024 + (256 << 10) * (1 if (n // 10) % 2 else -1)
    verdict = judge_host(series(3000, rss))
    assert verdict.judged and not verdict.leaked, verdict.line()
    assert "flat" in verdict.line()


def test_growth_just_over_the_limit_is_caught_and_just_under_passes():
    over = judge_host(series(4000, lambda n: 100 * MIB + n * 1100))  # 1.1 MB per 1,000 > 1 MiB
    under = judge_host(series(4000, lambda n: 100 * MIB + n * 1000))  # 1.0 MB per 1,000 < 1 MiB
    assert over.leaked and not under.leaked


def test_a_short_run_is_not_judged():
    verdict = judge_host(series(400, lambda n: 100 * MIB + n * 50_000))  # all of it before request 1,000
    assert not verdict.judged and not verdict.leaked
    assert "not judged" in verdict.line()
    past_the_records = judge_host(series(1200, lambda n: 100 * MIB + n * 50_000))  # spans 200 < 250 past 1,000
    assert not past_the_records.judged and past_the_records.span == 200


def test_growth_while_the_finished_records_fill_is_not_a_leak():
    # +2 MiB per 1,000 requests up to request 1,000 (as measured on the cpu backend), flat after
    verdict = judge_host(series(2400, lambda n: 64 * MIB + min(n, 1000) * 2 * 1024))
    assert verdict.judged and verdict.growth_per_1000 == 0


def cache_series(requests: int, cache_of, budget: int, every: int = 10) -> HostSeries:
    """RSS of 200 MiB plus the decoded experts' cache, as the server publishes them (the peak: the most so far)."""
    s, peak = HostSeries(), 0
    for done in range(0, requests + 1, every):
        cache = cache_of(done)
        peak = max(peak, cache)
        s.add(done, {RSS_METRIC: float(200 * MIB + cache), CACHE_METRIC: float(cache), CACHE_PEAK_METRIC: float(peak),
                     CACHE_BUDGET_METRIC: float(budget)})
    return s


def test_the_experts_cache_filling_is_not_host_growth_and_past_its_budget_is_a_leak():
    # experts first used all run long: 10 KiB more cached per request, under a 256 MiB budget
    filling = cache_series(3000, lambda n: n * 10_240, 256 * MIB)
    verdict = judge_host(filling)
    assert verdict.judged and not verdict.leaked and verdict.growth_per_1000 == 0, verdict.line()
    # the report says what was taken out: the cache at the first and last sample, its most, its budget
    assert verdict.expert_cache == {"first_bytes": 0, "last_bytes": 3000 * 10_240, "peak_bytes": 3000 * 10_240,
                                    "budget_bytes": 256 * MIB}
    assert "less the decoded experts' cache, 0.0 MiB -> 29.3 MiB (its most 29.3 MiB of a 256.0 MiB budget)" in verdict.line()
    report = ServeLeakReport(command="", settings={}, thresholds=Thresholds())
    report.host = verdict.to_dict()
    rows = {row["layer"]: row for row in report.layer_totals()}
    assert rows["host (decoded experts' cache)"]["final"] == 3000 * 10_240 and rows["host (RssAnon+VmSwap)"]["bytes"] == 0
    # planted revert: the same server judged on its whole RSS
    whole = series(3000, lambda n: 200 * MIB + n * 10_240)
    assert judge_host(whole).leaked
    # planted fault: a cache that does not evict past its budget (1 MiB here)
    past = judge_host(cache_series(3000, lambda n: n * 10_240, MIB))
    assert past.leaked and "past its budget of 1,048,576" in past.line() and "flat" in past.line()


def test_a_planted_host_leak_beside_a_filling_cache_is_caught():
    # profiles.leak_bugs' host-leak (10 KiB a request) in a server whose decoded experts fill all run long
    s, peak = HostSeries(), 0
    for done in range(0, 3001, 10):
        cache = min(done, 2000) * 10_240
        peak = max(peak, cache)
        s.add(done, {RSS_METRIC: float(200 * MIB + cache + done * 10_240), CACHE_METRIC: float(cache),
                     CACHE_PEAK_METRIC: float(peak), CACHE_BUDGET_METRIC: float(256 * MIB)})
    verdict = judge_host(s)
    assert verdict.leaked and verdict.growth_per_1000 == 10_240_000 and "GROWING" in verdict.line()


def test_the_server_publishes_its_anonymous_rss(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), max_seqs=2) as live:
        before = metrics(live.url)[RSS_METRIC]
        assert httpx.post(live.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=30).status_code == 200
        after = metrics(live.url)[RSS_METRIC]
    assert 1 * MIB < before and 1 * MIB < after  # a live Python process with numpy holds far more than 1 MiB


def test_a_cpu_server_of_a_mixture_of_experts_publishes_its_decoded_experts(tmp_path_factory):
    EXPERTS.clear()
    with live_server(write_moe_model("qwen3moe-f32", tmp_path_factory.mktemp("moe")), max_seqs=2) as live:
        assert CACHE_METRIC not in metrics(live.url)  # nothing decoded yet
        assert httpx.post(live.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=30).status_code == 200
        published = metrics(live.url)
    assert published[CACHE_METRIC] >= EXPERTS.held_bytes > 0 and published[CACHE_PEAK_METRIC] > 0
    assert published[CACHE_BUDGET_METRIC] == EXPERTS.budget_bytes


def test_a_soak_too_short_to_judge_host_memory_is_never_called_clean(tmp_path_factory):
    settings = ServeLeakSettings(model=str(tiny_model(tmp_path_factory)), device="cpu", requests=None, clients=4,
                                 max_tokens=4, seed=5, duration_s=3.0, sample_interval_s=0.2,
                                 extra_args=("--ctx-size", "256", "--step-tokens", "16", "--kv-blocks", "400"))
    report = run_serve_leak_check(settings)
    assert report.requests > 0 and report.server_exit == 0, report.server_tail
    assert report.host["samples"] >= 3 and not report.host["judged"]
    assert report.exit_code == 1 and report.verdict == "not judged"
    assert [(f.layer, f.severity) for f in report.findings] == [("host", "not judged")], report.findings
    assert "--requests 1500 or more" in report.findings[0].message


@pytest.mark.parametrize("text,seconds", [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0)])
def test_durations_read_as_seconds(text, seconds):
    from rocmforge_cli.serve_leak_check import parse_duration
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["abc", "-5m", "0s", "5d", ""])
def test_a_bad_duration_is_a_usage_error(text):
    from hipcore.errors import UsageError
    from rocmforge_cli.serve_leak_check import parse_duration
    with pytest.raises(UsageError, match="--duration"):
        parse_duration(text)
