"""One reading of the engine between two steps, as plain data: what /metrics shows.

The engine's thread takes the reading itself (`read_engine_state`) right after a step and publishes it on
the EngineLoop; readers in other threads (the handlers, the pipe's reader in engine_bridge.py) take the
published dict as it is and add what they can read live themselves (`live_state`). No reader waits for a
step, so /health and /metrics answer while a long prompt step runs (a 4,000-token prompt step on the cpu
backend takes minutes). The reading is a dict of numbers and strings, so it reads the same whether the
HTTP layer shares the engine's process or runs in a process of its own (the reading then crosses the pipe).
"""

from __future__ import annotations

from hipcore.engine.request import Ending
from hipcore.ops.moe_expert_cache import EXPERTS
from hipcore.runtime.host_memory import anon_rss_bytes
from rocmforge_serve.metrics import PREFIX_CACHE_COUNTERS, PROFILE_GAUGES


def read_engine_state(engine, device) -> dict:
    """The engine's figures; on the engine's thread only (between two steps: never a step half done)."""
    cache, stats = engine.cache, engine.stats
    state: dict = {
        "kv_profile": None, "usable_blocks": 0, "driver_free_bytes": None,
        "endings": {ending.value: stats.endings.get(ending.value, 0) for ending in Ending},
        "waiting": len(engine.scheduler.waiting), "running_requests": len(engine.scheduler.running),
    }
    if not cache.closed:
        profile = cache.memory_profile()
        state["kv_profile"] = {name: getattr(profile, name) for name in (*PROFILE_GAUGES, *PREFIX_CACHE_COUNTERS)}
        state["usable_blocks"] = cache.num_usable_blocks
    if device is not None:
        state["driver_free_bytes"] = device.driver_free_bytes()
    state.update(generated_tokens=stats.generated_tokens, prompt_tokens=stats.prompt_tokens,
                 preemptions=stats.preemptions, steps=stats.steps, prompt_steps=stats.prompt_steps,
                 step_seconds=stats.step_seconds, device_wait_seconds=stats.device_wait_seconds,
                 queue_time=stats.queue_time.reading(), first_token_time=stats.first_token_time.reading())
    return state


def live_state(loop, published: dict) -> dict:
    """The published reading with what any thread may read now: the ledger (it has a lock of its own), the
    host's memory, the token rate and the loop's own flags."""
    state = dict(published)
    device = loop.device
    state.update(ledger_bytes=dict(device.ledger.bytes_by_tag()) if device is not None else None,
                 tokens_per_second=loop.tokens_per_second(), engine_running=loop.running, fault=loop.fault,
                 accepting=loop.accepting, host_rss_anon_bytes=anon_rss_bytes())
    if EXPERTS.peak_bytes:  # the cpu backend decoded experts: serve-leak-check takes them out of the RSS it judges
        state.update(moe_expert_cache_bytes=EXPERTS.accounted_bytes(), moe_expert_cache_peak_bytes=EXPERTS.peak_bytes,
                     moe_expert_cache_budget_bytes=EXPERTS.budget_bytes)
    return state
