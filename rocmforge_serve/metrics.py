"""GET /metrics: the KV cache's MemoryProfile, the device ledger, requests and throughput, read live.

Each scrape renders one reading of the engine taken between two steps (engine_state.py), so there are no
counters to keep in step with the engine by hand, and the reading is the same whether the engine shares the
HTTP layer's process or not.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from hipcore.engine.request import Ending
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
    "capacity_tokens": "tokens that still fit ((free + cached) blocks x block size)",
    "cached_blocks": "KV blocks kept by the prefix cache: no sequence holds them, evicted least recently used first",
    "pool_bytes_cached": "device bytes of the prefix cache's blocks",
}
# vLLM's prefix-cache counters (vllm:prefix_cache_queries / prefix_cache_hits), in prompt tokens, with our prefix
PREFIX_CACHE_COUNTERS = {
    "prefix_query_tokens": ("prefix_cache_queries", "prompt tokens looked up in the prefix cache"),
    "prefix_hit_tokens": ("prefix_cache_hits", "prompt tokens found in the prefix cache (not computed)"),
}


# Where a first token's wait goes (hipcore/engine/latency.py): (name, help, whose reading: the engine's
# state or the HTTP layer's ServeLatency, its key there)
LATENCY_HISTOGRAMS = (
    ("request_prepare_seconds", "from a generation request's parsed body to its prompt token ids (chat template "
     "and tokenizer)", "http", "prepare_time"),
    ("request_queue_seconds", "from a request's submission to the engine to the scheduler's first admission of it",
     "engine", "queue_time"),
    ("engine_time_to_first_token_seconds", "from a request's submission to the engine to its first token read from "
     "the device (its queue and its prompt's step)", "engine", "first_token_time"),
    ("time_to_first_token_seconds", "from a generation request's parsed body to its first token in the handler's "
     "hands (preparation, the engine's share, and the pipe between the processes)", "http", "first_token_time"),
)


def histogram_family(name: str, help_text: str, reading: dict) -> HistogramMetricFamily:
    buckets = [(repr(float(bound)), float(n)) for bound, n in zip(reading["bounds"], reading["cumulative"])]
    buckets.append(("+Inf", float(reading["cumulative"][-1])))
    return HistogramMetricFamily(f"{PREFIX}_{name}", help_text, buckets=buckets, sum_value=float(reading["sum"]))


class StateCollector:
    """The families of one engine reading (engine_state.read_engine_state) plus what the HTTP side counts."""

    def __init__(self, state: dict, in_flight: int, http_latency=None):
        self.state, self.in_flight, self.http_latency = state, in_flight, http_latency

    def collect(self):
        state = self.state
        profile = state["kv_profile"]
        if profile is not None:  # None once the KV cache is closed
            for name, help_text in PROFILE_GAUGES.items():
                yield GaugeMetricFamily(f"{PREFIX}_kv_{name}", help_text, value=float(profile[name]))
            for field_name, (name, help_text) in PREFIX_CACHE_COUNTERS.items():
                yield CounterMetricFamily(f"{PREFIX}_{name}", help_text, value=float(profile[field_name]))
        by_tag = state["ledger_bytes"]
        if by_tag is not None:
            family = GaugeMetricFamily(f"{PREFIX}_ledger_bytes", "device bytes live in the ledger, by tag", labels=["tag"])
            for tag in sorted(set(TAGS) | set(by_tag)):
                family.add_metric([tag], float(by_tag.get(tag, 0)))
            yield family
        if state["driver_free_bytes"] is not None:
            yield GaugeMetricFamily(f"{PREFIX}_driver_free_bytes", "the driver's free device memory",
                                    value=float(state["driver_free_bytes"]))
        endings = CounterMetricFamily(f"{PREFIX}_requests", "requests ended, by ending", labels=["ending"])
        for ending in Ending:
            endings.add_metric([ending.value], float(state["endings"].get(ending.value, 0)))
        yield endings
        yield GaugeMetricFamily(f"{PREFIX}_requests_waiting", "requests queued, not yet running", value=float(state["waiting"]))
        yield GaugeMetricFamily(f"{PREFIX}_requests_running", "requests in the running batch",
                                value=float(state["running_requests"]))
        yield GaugeMetricFamily(f"{PREFIX}_requests_in_flight", "requests submitted over HTTP and not ended", value=float(self.in_flight))
        yield GaugeMetricFamily(f"{PREFIX}_tokens_per_second", "generated tokens per second over the last 10 s",
                                value=state["tokens_per_second"])
        yield CounterMetricFamily(f"{PREFIX}_generated_tokens", "tokens generated", value=float(state["generated_tokens"]))
        yield CounterMetricFamily(f"{PREFIX}_prompt_tokens", "prompt tokens computed (recomputation included)",
                                  value=float(state["prompt_tokens"]))
        yield CounterMetricFamily(f"{PREFIX}_preemptions", "requests preempted for want of KV blocks", value=float(state["preemptions"]))
        yield CounterMetricFamily(f"{PREFIX}_engine_steps", "engine steps run", value=float(state["steps"]))
        yield CounterMetricFamily(f"{PREFIX}_engine_prompt_steps", "engine steps that evaluated prompt tokens",
                                  value=float(state["prompt_steps"]))
        yield CounterMetricFamily(f"{PREFIX}_engine_step_seconds", "seconds the engine thread spent in its steps",
                                  value=state["step_seconds"])
        yield CounterMetricFamily(f"{PREFIX}_engine_device_wait_seconds",
                                  "of those, seconds spent waiting for the device to finish a launched step",
                                  value=state["device_wait_seconds"])
        yield GaugeMetricFamily(f"{PREFIX}_engine_running", "1 while the engine thread serves", value=float(state["engine_running"]))
        for name, help_text, side, key in LATENCY_HISTOGRAMS:
            if side == "engine":
                reading = state[key]
            elif self.http_latency is not None:
                reading = getattr(self.http_latency, key).reading()
            else:
                continue
            yield histogram_family(name, help_text, reading)
        if state["host_rss_anon_bytes"] is not None:
            yield GaugeMetricFamily(f"{PREFIX}_host_rss_anon_bytes",
                                    "the server's anonymous resident + swapped memory, the engine's process and the "
                                    "HTTP process together when they are two (host-memory leak checks)",
                                    value=float(state["host_rss_anon_bytes"]))
        if state.get("moe_expert_cache_bytes") is not None:
            for key, help_text in EXPERT_CACHE_GAUGES:
                yield GaugeMetricFamily(f"{PREFIX}_{key}", help_text, value=float(state[key]))


# The cpu backend's decoded experts (hipcore/ops/moe_expert_cache.py), in the RSS above: a bounded cache.
EXPERT_CACHE_GAUGES = (
    ("moe_expert_cache_bytes", "bytes the cpu backend's cache of decoded experts holds (data and bookkeeping)"),
    ("moe_expert_cache_peak_bytes", "the most data bytes that cache held"),
    ("moe_expert_cache_budget_bytes", "that cache's budget: it evicts past it"),
)


def render(state: dict, in_flight: int, http_latency=None) -> bytes:
    """Prometheus text of one engine reading, with the HTTP layer's latency histograms (a ServeLatency) if given."""
    registry = CollectorRegistry(auto_describe=False)  # one per reading: nothing carries over between scrapes
    registry.register(StateCollector(state, in_flight, http_latency))
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
