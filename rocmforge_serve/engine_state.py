"""One reading of the engine between two steps, as plain data: what /metrics and /health show.

The reading is a dict of numbers and strings, so it reads the same whether the HTTP layer shares the
engine's process (it takes the reading under the engine loop's state lock) or runs in a process of its
own (the engine's process takes it and sends it over the pipe, engine_bridge.py).
"""

from __future__ import annotations

from hipcore.engine.request import Ending
from hipcore.runtime.host_memory import anon_rss_bytes
from rocmforge_serve.metrics import PROFILE_GAUGES


def read_engine_state(loop) -> dict:
    """The engine behind an EngineLoop, read under its state lock (never a step half done)."""
    with loop.state_lock:
        engine, cache, device = loop.engine, loop.engine.cache, loop.device
        state: dict = {
            "kv_profile": None, "usable_blocks": 0, "ledger_bytes": None, "driver_free_bytes": None,
            "endings": {ending.value: engine.stats.endings.get(ending.value, 0) for ending in Ending},
            "waiting": len(engine.scheduler.waiting), "running_requests": len(engine.scheduler.running),
        }
        if not cache.closed:
            profile = cache.memory_profile()
            state["kv_profile"] = {name: getattr(profile, name) for name in PROFILE_GAUGES}
            state["usable_blocks"] = cache.num_usable_blocks
        if device is not None:
            state["ledger_bytes"] = dict(device.ledger.bytes_by_tag())
            state["driver_free_bytes"] = device.driver_free_bytes()
        stats = engine.stats
        state.update(generated_tokens=stats.generated_tokens, prompt_tokens=stats.prompt_tokens,
                     preemptions=stats.preemptions, steps=stats.steps, prompt_steps=stats.prompt_steps,
                     step_seconds=stats.step_seconds, device_wait_seconds=stats.device_wait_seconds,
                     queue_time=stats.queue_time.reading(), first_token_time=stats.first_token_time.reading())
    state.update(tokens_per_second=loop.tokens_per_second(), engine_running=loop.running, fault=loop.fault,
                 accepting=loop.accepting, host_rss_anon_bytes=anon_rss_bytes())
    return state
