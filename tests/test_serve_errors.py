"""`rocmforge serve` under bad input, full queues, faults and disconnects (httpx against a live server)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import FAULT_TOKEN, SHAPES, SLOW_TOKEN, live_server, metrics, wait_idle


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module", params=SHAPES)
def http_process(request) -> bool:
    """Each live server of this module runs in both of Server's shapes."""
    return request.param == "http process"


@pytest.fixture(scope="module")
def live(model_path, http_process):
    with live_server(model_path, max_seqs=4, max_body_bytes=64 << 10, max_step_tokens=8, http_process=http_process) as server:
        yield server


def post(live, path, **kwargs):
    return httpx.post(live.url + path, timeout=30, **kwargs)


def assert_openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


BAD_BODIES = [
    (b"{not json", 400, None),
    (b"\xff\xfe{}", 400, None),  # invalid UTF-8
    (b"[1, 2]", 400, None),
    (b'{"prompt": "hi", "max_tokens": NaN}', 400, None),
    (b"", 400, None),
    (b'{"prompt": "hi", "max_tokens": "ten"}', 400, "max_tokens"),
    (b'{"prompt": "hi", "temperature": "hot"}', 400, "temperature"),
    (b'{"prompt": "hi", "temperature": 1e9}', 400, "temperature"),
    (b'{"prompt": "hi", "stop": [1, 2]}', 400, "stop"),
    (b'{"prompt": "hi", "stream": "yes"}', 400, "stream"),
    (b'{"prompt": 42}', 400, "prompt"),
    (b'{"prompt": [1, 99999]}', 400, "prompt"),
    (b'{"prompt": "hi", "n": 17}', 400, "n"),
    (b'{"prompt": "hi", "model": "gpt-4"}', 404, "model"),
    (b"[" * 100000 + b"]" * 100000, 413, None),  # past the 64 KiB cap of this server
]


@pytest.mark.parametrize("body,status,param", BAD_BODIES, ids=[repr(b[:24]) for b, _, _ in BAD_BODIES])
def test_bad_input_gets_a_clear_openai_error_and_the_server_keeps_serving(live, body, status, param):
    assert_openai_error(post(live, "/v1/completions", content=body, headers={"Content-Type": "application/json"}),
                        status, param)
    ok = post(live, "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_chat_message_errors_name_the_field(live):
    error = assert_openai_error(post(live, "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}), 400)
    assert error["param"] == "messages[0].role"
    assert_openai_error(post(live, "/v1/chat/completions", json={"messages": []}), 400, "messages")


def test_prompt_plus_max_tokens_beyond_the_context_names_the_limit(live):
    error = assert_openai_error(post(live, "/v1/completions", json={"prompt": "hi", "max_tokens": 10**12}), 400, "max_tokens")
    assert "256" in error["message"] and error["code"] == "context_length_exceeded"
    error = assert_openai_error(post(live, "/v1/completions", json={"prompt": list(range(3, 300))}), 400)
    assert "256" in error["message"]


def test_unknown_route_and_method_answer_in_the_same_shape(live):
    assert_openai_error(httpx.get(live.url + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(live.url + "/v1/completions"), 405)


def test_an_engine_fault_fails_that_request_only(live):
    results = {}

    def normal():
        results["normal"] = post(live, "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 12, "temperature": 0})

    thread = threading.Thread(target=normal)
    thread.start()
    faulty = post(live, "/v1/completions", json={"prompt": [FAULT_TOKEN, 5, 6], "max_tokens": 12})
    thread.join()
    error = assert_openai_error(faulty, 500)
    assert "injected" in error["message"]
    assert results["normal"].status_code == 200, results["normal"].text
    assert results["normal"].json()["usage"]["completion_tokens"] == 12
    wait_idle(live.url)


def test_disconnect_mid_stream_cancels_and_returns_the_blocks(live):
    before = metrics(live.url)
    # A slow request (50 ms a step): a fast one could finish its 200 tokens before this client, starved of the
    # interpreter on a loaded machine, reads its first chunk (seen on a 2-core machine).
    with httpx.stream("POST", live.url + "/v1/completions", timeout=30,
                      json={"prompt": [SLOW_TOKEN, 5, 6], "max_tokens": 200, "stream": True,
                            "temperature": 0}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert metrics(live.url)["rocmforge_kv_physical_blocks"] > 0
    after = wait_idle(live.url, timeout_s=5)
    cancelled = after['rocmforge_requests_total{ending="cancelled"}'] - before['rocmforge_requests_total{ending="cancelled"}']
    assert cancelled == 1
    generated = after["rocmforge_generated_tokens_total"] - before["rocmforge_generated_tokens_total"]
    assert generated < 100  # cancelled, not run to its 200 tokens


def test_disconnect_during_the_prompt_cancels_it(live):
    before = metrics(live.url)
    # 240 prompt tokens at 8 per step, 50 ms a step: 1.5 s of prompt; the client gives up long before.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/v1/completions", json={"prompt": [SLOW_TOKEN] + list(range(3, 242)), "max_tokens": 4},
                   timeout=0.3)
    after = wait_idle(live.url, timeout_s=5)
    assert after['rocmforge_requests_total{ending="cancelled"}'] - before['rocmforge_requests_total{ending="cancelled"}'] == 1
    assert after["rocmforge_generated_tokens_total"] == before["rocmforge_generated_tokens_total"]


def test_a_full_queue_gets_429_with_retry_after_not_a_hang(model_path, http_process):
    with live_server(model_path, max_seqs=1, max_queue=0, http_process=http_process) as live:
        with httpx.stream("POST", live.url + "/v1/completions", timeout=30,
                          json={"prompt": [SLOW_TOKEN, 5, 6, 7], "max_tokens": 200, "stream": True,
                                "temperature": 0}) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the stream (a real disconnect)
            assert next(lines).startswith("data:")
            assert metrics(live.url)["rocmforge_requests_in_flight"] == 1  # it holds the only slot
            t0 = time.monotonic()
            full = httpx.post(live.url + "/v1/completions", json={"prompt": "b", "max_tokens": 2}, timeout=30)
            assert time.monotonic() - t0 < 5
            assert_openai_error(full, 429)
            assert full.headers["retry-after"] == "1"
            assert httpx.get(live.url + "/health").status_code == 200  # liveness: busy is alive
            assert httpx.get(live.url + "/load").status_code == 503  # readiness: full
        wait_idle(live.url)
        assert httpx.get(live.url + "/load").status_code == 200


def test_an_engine_that_stopped_is_unhealthy_and_refuses_requests(model_path, http_process):
    """A fault outside any request stops the engine loop: /health says why with 503 and new requests get 503,
    in both shapes (with two processes only the engine's side knows it stopped)."""
    with live_server(model_path, http_process=http_process) as live:
        def broken_step():
            raise RuntimeError("planted: the engine's step broke")
        live.server.engine_loop.engine.step = broken_step
        failed = post(live, "/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert failed.status_code >= 500
        health = httpx.get(live.url + "/health", timeout=10)
        assert health.status_code == 503 and "planted: the engine's step broke" in health.json()["reason"]
        refused = post(live, "/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert_openai_error(refused, 503)


def test_api_key_guards_every_v1_route(model_path, http_process):
    with live_server(model_path, api_key="s3cret", http_process=http_process) as live:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                response = httpx.request(method, live.url + path, headers=headers, json={"prompt": "a"})
                assert_openai_error(response, 401)
                assert response.headers["www-authenticate"] == "Bearer"  # RFC 6750
        good = httpx.post(live.url + "/v1/completions", headers={"Authorization": "Bearer s3cret"},
                          json={"prompt": "a", "max_tokens": 2}, timeout=30)
        assert good.status_code == 200
        assert httpx.get(live.url + "/health").status_code == 200  # probes need no key


def test_shutdown_with_requests_in_flight_returns_every_block(model_path, http_process):
    with live_server(model_path, grace_s=0.2, http_process=http_process) as live:
        def stream():
            try:
                with httpx.stream("POST", live.url + "/v1/completions", timeout=30,
                                  json={"prompt": "a", "max_tokens": 200, "stream": True, "ignore_eos": True}) as response:
                    for _ in response.iter_lines():
                        pass
            except httpx.HTTPError:
                pass

        clients = [threading.Thread(target=stream) for _ in range(3)]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 10
        while metrics(live.url)["rocmforge_requests_running"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        report = live.stop()
        for c in clients:
            c.join(timeout=10)
    assert report.clean, report.line()
    assert not any(c.is_alive() for c in clients)


def test_the_shutdown_check_catches_a_planted_leak(model_path, http_process):
    """The bug this project exists to prevent: a request that completes without its blocks being freed."""
    with live_server(model_path, http_process=http_process) as live:
        live.server.loaded.cache.free_sequence = lambda seq_id: None  # planted: completion forgets the blocks
        assert httpx.post(live.url + "/v1/completions", json={"prompt": "a", "max_tokens": 3}, timeout=30).status_code == 200
        report = live.stop()
    assert not report.clean and "LEAK" in report.line()
