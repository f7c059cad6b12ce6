"""A live server on a free loopback port, over the tiny test model on the cpu backend (not a test module).

    with live_server(path, max_queue=0) as live:       # rocmforge_serve.server.ServerThread
        httpx.post(live.url + "/v1/completions", json={...})
"""

from __future__ import annotations

import contextlib
import time

import httpx

from support.engine_testing import load_tiny

from hipcore.engine.engine import EngineHooks
from rocmforge_serve.metrics import parse_metrics
from rocmforge_serve.server import Server, ServerThread

MODEL_NAME = "tiny"
SHAPES = ["one process", "http process"]  # a module's live server in each shape of rocmforge_serve.server.Server
FAULT_TOKEN = 383  # a prompt that starts with this token id fails in the sampler (an engine fault in one request)
SLOW_TOKEN = 382  # each step that computes a prompt starting with this id takes 50 ms more (a slow prompt, on purpose)
HOLD_TOKEN = 381  # ... and each step of a request whose prompt starts with this id takes HOLD_S (a long prompt step)
HOLD_S = 3.0


def _slow_steps(requests) -> bool:
    if any(r.prompt_ids[:1] == [HOLD_TOKEN] for r in requests):
        time.sleep(HOLD_S)
    elif any(r.prompt_ids[:1] == [SLOW_TOKEN] for r in requests):
        time.sleep(0.05)
    return False  # never fails the step


def fault_hooks() -> EngineHooks:
    return EngineHooks(fail_sampling=lambda request: request.prompt_ids[:1] == [FAULT_TOKEN], fail_step=_slow_steps)


@contextlib.contextmanager
def live_server(model_path, *, api_key=None, max_queue=16, max_body_bytes=None, grace_s=2.0, ignore_eos=False,
                http_process=False, queue_timeout_s=300.0, allowed_hosts=(), cors_origins=(),
                limits=None, access_log=False, **load_options):
    """http_process: the HTTP layer in a spawned process of its own, as `rocmforge serve` runs it (the engine
    and its fault hooks stay in this process)."""
    loaded = load_tiny(model_path, hooks=fault_hooks(), **load_options)
    try:
        server = Server(loaded, name=MODEL_NAME, max_queue=max_queue, api_key=api_key, grace_s=grace_s,
                        max_body_bytes=max_body_bytes, ignore_eos=ignore_eos, http_process=http_process,
                        queue_timeout_s=queue_timeout_s, allowed_hosts=allowed_hosts, cors_origins=cors_origins,
                        limits=limits, access_log=access_log)
        with ServerThread(server) as live:
            yield live
    finally:
        loaded.close()


def metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def wait_idle(url: str, timeout_s: float = 20.0) -> dict[str, float]:
    """Poll /metrics until no request is in flight and no KV block is held; return the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(url)
        if m["rocmforge_requests_in_flight"] == 0 and m["rocmforge_kv_physical_blocks"] == 0 \
                and m["rocmforge_kv_pending_blocks"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not come back to idle: {m}")
        time.sleep(0.02)


def wait_until_up(server, url: str, timeout_s: float = 60.0) -> None:
    """Until a `rocmforge serve` started as a subprocess answers /health with 200; fails if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.1)


def tool_round(call, result: str) -> list[dict]:
    """The messages a client adds after the model's tool call `call` (an openai ChatCompletionMessageToolCall): the
    assistant's turn carrying the call, then the tool's result as role "tool"."""
    return [{"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                                 "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": result}]
