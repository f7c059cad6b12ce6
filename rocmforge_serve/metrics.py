"""GET /metrics: the KV cache's MemoryProfile, the device ledger, requests and throughput, read live.

A custom prometheus_client collector reads the engine at scrape time (no counters to keep in step with
the engine by hand); each app has its own registry, so two servers in one process never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hipcore.engine.request import Ending
from hipcore.runtime.host_memory import anon_rss_bytes
from hipcore.runtime.ledger import TAGS

PREFIX = "rocmforge"

PROFILE_GAUGES = {  # MemoryProfile field -> help
    "total_blocks": "KV blocks in the pool, the reserved null block included",
    "free_blocks": "KV blocks on the free list",
    "pending_blocks": "KV blocks released but fenced until the step's device work is done",
    "physical_blocks": "KV blocks held by at least one sequence",
    "logical_blocks": "KV blocks in all block tables (a shared block counts once per holder)",
    "reserved_blocks": "KV blocks reserved (the null block)",
    "active_sequences": "sequences with a block table",
    "total_tokens": "tokens held in the KV cache over all sequences",
    "bytes_per_token": "KV bytes per token (K and V, every layer, KV heads)",
    "bytes_per_block": "KV bytes per block",
    "pool_bytes_total": "device bytes of the KV pools",
    "pool_bytes_used": "device bytes of KV blocks in use",
    "fragmentation_ratio": "token slots allocated but unused over slots allocated",
    "page_table_bytes": "host bytes of the block tables",
    "allocator_bytes": "host bytes of the block allocator's bookkeeping",
    "capacity_tokens": "tokens that still fit (free blocks x block size)",
}


class EngineCollector:
    def __init__(self, served):
        self.served = served

    def collect(self):
        with self.served.loop.state_lock:  # a consistent reading, between two steps
            return list(self._collect())

    def _collect(self):
        served = self.served
        engine, cache = served.engine, served.engine.cache
        if not cache.closed:
            profile = cache.memory_profile()
            for name, help_text in PROFILE_GAUGES.items():
                yield GaugeMetricFamily(f"{PREFIX}_kv_{name}", help_text, value=float(getattr(profile, name)))
        device = served.device
        if device is not None:
            ledger = device.ledger
            by_tag = ledger.bytes_by_tag()
            family = GaugeMetricFamily(f"{PREFIX}_ledger_bytes", "device bytes live in the ledger, by tag", labels=["tag"])
            for tag in sorted(set(TAGS) | set(by_tag)):
                family.add_metric([tag], float(by_tag.get(tag, 0)))
            yield family
            free = device.driver_free_bytes()
            if free is not None:
                yield GaugeMetricFamily(f"{PREFIX}_driver_free_bytes", "the driver's free device memory", value=float(free))
        endings = CounterMetricFamily(f"{PREFIX}_requests", "requests ended, by ending", labels=["ending"])
        for ending in Ending:
            endings.add_metric([ending.value], float(engine.stats.endings.get(ending.value, 0)))
        yield endings
        scheduler = engine.scheduler
        yield GaugeMetricFamily(f"{PREFIX}_requests_waiting", "requests queued, not yet running", value=float(len(scheduler.waiting)))
        yield GaugeMetricFamily(f"{PREFIX}_requests_running", "requests in the running batch", value=float(len(scheduler.running)))
        yield GaugeMetricFamily(f"{PREFIX}_requests_in_flight", "requests submitted over HTTP and not ended", value=float(served.loop.in_flight))
        yield GaugeMetricFamily(f"{PREFIX}_tokens_per_second", "generated tokens per second over the last 10 s",
                                value=served.loop.tokens_per_second())
        stats = engine.stats
        yield CounterMetricFamily(f"{PREFIX}_generated_tokens", "tokens generated", value=float(stats.generated_tokens))
        yield CounterMetricFamily(f"{PREFIX}_prompt_tokens", "prompt tokens computed (recomputation included)",
                                  value=float(stats.prompt_tokens))
        yield CounterMetricFamily(f"{PREFIX}_preemptions", "requests preempted for want of KV blocks", value=float(stats.preemptions))
        yield CounterMetricFamily(f"{PREFIX}_engine_steps", "engine steps run", value=float(stats.steps))
        yield CounterMetricFamily(f"{PREFIX}_engine_prompt_steps", "engine steps that evaluated prompt tokens",
                                  value=float(stats.prompt_steps))
        yield CounterMetricFamily(f"{PREFIX}_engine_step_seconds", "seconds the engine thread spent in its steps",
                                  value=stats.step_seconds)
        yield CounterMetricFamily(f"{PREFIX}_engine_device_wait_seconds",
                                  "of those, seconds spent waiting for the device to finish a launched step",
                                  value=stats.device_wait_seconds)
        yield GaugeMetricFamily(f"{PREFIX}_engine_running", "1 while the engine thread serves", value=float(served.loop.running))
        rss = anon_rss_bytes()
        if rss is not None:
            yield GaugeMetricFamily(f"{PREFIX}_host_rss_anon_bytes",
                                    "this process's anonymous resident + swapped memory (host-memory leak checks)", value=float(rss))


def make_registry(served) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(served))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def parse_metrics(text: str) -> dict[str, float]:
    """`name{labels}` -> value from Prometheus text (for the serve leak check and tests)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out
