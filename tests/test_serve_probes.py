"""/health, /load and /metrics answer while the engine is busy (a long prompt step, a full queue), in both of the
server's shapes; a request that waits in the queue past its limit gets 503 with Retry-After."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import HOLD_S, HOLD_TOKEN, SHAPES, SLOW_TOKEN, live_server, metrics, wait_idle

PROBE_LIMIT_S = 1.0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module", params=SHAPES)
def http_process(request) -> bool:
    return request.param == "http process"


def timed_get(url: str) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    response = httpx.get(url, timeout=10)
    return response, time.monotonic() - t0


def test_probes_answer_within_a_second_during_a_long_prompt_step(model_path, http_process):
    """A prompt step of HOLD_S seconds (the test hook): with a lock held across the step, every probe waited for it."""
    with live_server(model_path, max_seqs=2, http_process=http_process) as live:
        done = threading.Event()

        def long_prompt():
            httpx.post(live.url + "/v1/completions", json={"prompt": [HOLD_TOKEN, 5, 6], "max_tokens": 1}, timeout=30)
            done.set()
        threading.Thread(target=long_prompt, daemon=True).start()
        deadline = time.monotonic() + 10
        while metrics(live.url)["rocmforge_requests_in_flight"] < 1:
            assert time.monotonic() < deadline
        started = time.monotonic()
        time.sleep(0.3)  # the engine's thread is inside the held step now
        for path in ("/health", "/load", "/metrics"):
            response, seconds = timed_get(live.url + path)
            assert response.status_code == 200 and seconds < PROBE_LIMIT_S, (path, seconds)
        assert not done.is_set() and time.monotonic() - started < HOLD_S  # every probe came during the step
        assert done.wait(HOLD_S + 10)


def test_health_is_liveness_and_load_is_readiness(model_path, http_process):
    with live_server(model_path, max_seqs=1, max_queue=0, http_process=http_process) as live:
        assert httpx.get(live.url + "/load").json() == {"server_load": 0, "ready": True, "limit": 1, "parallel": 1}
        with httpx.stream("POST", live.url + "/v1/completions", timeout=30,
                          json={"prompt": [SLOW_TOKEN, 5, 6], "max_tokens": 200, "stream": True, "ignore_eos": True}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data:")
            health = httpx.get(live.url + "/health")
            assert health.status_code == 200 and health.json() == {"status": "ok"}  # busy is alive
            load = httpx.get(live.url + "/load")
            assert load.status_code == 503 and load.json()["server_load"] == 1 and not load.json()["ready"]
            assert "queue is full" in load.json()["reason"]
        wait_idle(live.url)
        assert httpx.get(live.url + "/load").status_code == 200


def test_a_request_queued_past_its_limit_gets_503_with_retry_after(model_path, http_process):
    with live_server(model_path, max_seqs=1, max_queue=4, queue_timeout_s=0.5, http_process=http_process) as live:
        with httpx.stream("POST", live.url + "/v1/completions", timeout=30,
                          json={"prompt": [SLOW_TOKEN, 5, 6], "max_tokens": 200, "stream": True, "ignore_eos": True}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data:")  # it holds the only running slot for ~10 s
            t0 = time.monotonic()
            queued = httpx.post(live.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=30)
            assert time.monotonic() - t0 < 5
            assert queued.status_code == 503 and queued.headers["retry-after"]
            assert "waited in the queue for more than 0.5 s" in queued.json()["error"]["message"]
        after = wait_idle(live.url)
        assert after["rocmforge_kv_free_blocks"] == after["rocmforge_kv_total_blocks"] - after["rocmforge_kv_reserved_blocks"]


def test_the_queue_timeout_fires_while_a_long_step_runs(model_path, http_process):
    """The request behind a HOLD_S prompt step waits in the engine's inbox (the step drains it only when it ends):
    its 503 comes from the loop's watchdog, not after the step."""
    with live_server(model_path, max_seqs=1, max_queue=4, queue_timeout_s=0.5, http_process=http_process) as live:
        threading.Thread(target=httpx.post, args=(live.url + "/v1/completions",), daemon=True,
                         kwargs={"json": {"prompt": [HOLD_TOKEN, 5, 6], "max_tokens": 1}, "timeout": 30}).start()
        deadline = time.monotonic() + 10
        while metrics(live.url)["rocmforge_requests_in_flight"] < 1:
            assert time.monotonic() < deadline
        t0 = time.monotonic()
        queued = httpx.post(live.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=30)
        waited = time.monotonic() - t0
        assert queued.status_code == 503 and queued.headers["retry-after"], queued.text
        assert waited < HOLD_S - 0.5, waited  # before the held step ended
        after = wait_idle(live.url)
        assert after["rocmforge_kv_free_blocks"] == after["rocmforge_kv_total_blocks"] - after["rocmforge_kv_reserved_blocks"]
