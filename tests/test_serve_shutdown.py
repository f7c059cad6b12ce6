"""Shutdown with requests that cannot finish within the grace (real sockets, both shapes): new requests get a JSON
503 while the server drains, every stream ends with a final event and [DONE], every whole request gets a JSON
body, nothing logs a traceback, every block comes back; and `rocmforge serve` exits 0 on SIGTERM in both
process modes, its summary saying what was cancelled."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import SHAPES, SLOW_TOKEN, live_server, metrics, wait_until_up


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@contextlib.contextmanager
def stderr_to(path):
    """fd 2 to a file while a server starts: the HTTP process keeps writing its log there."""
    with open(path, "w") as log_file:
        saved = os.dup(2)
        os.dup2(log_file.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def stream_lines(url: str, results: list, body: dict) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            results.append((response.status_code, [line for line in response.iter_lines() if line]))
    except httpx.HTTPError as exc:
        results.append(("transport error", repr(exc)))


def whole(url: str, results: list, body: dict) -> None:
    try:
        response = httpx.post(url + "/v1/completions", json=body, timeout=30)
        results.append((response.status_code, response.headers.get("content-type"), response.text))
    except httpx.HTTPError as exc:
        results.append(("transport error", repr(exc)))


LONG = {"prompt": [SLOW_TOKEN, 5, 6], "max_tokens": 200, "ignore_eos": True}  # ~10 s at 50 ms a step


@pytest.mark.parametrize("shape", SHAPES)
def test_requests_past_the_grace_all_get_an_answer(model_path, shape, tmp_path, caplog):
    streams, wholes = [], []
    with stderr_to(tmp_path / "stderr.txt"):
        server_cm = live_server(model_path, max_seqs=2, max_queue=4, grace_s=0.5, http_process=shape == "http process")
        live = server_cm.__enter__()
    try:
        clients = [threading.Thread(target=stream_lines, args=(live.url, streams, {**LONG, "stream": True}))
                   for _ in range(3)] + [threading.Thread(target=whole, args=(live.url, wholes, LONG)) for _ in range(1)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 20
        while metrics(live.url)["rocmforge_requests_in_flight"] < 4:  # 2 running, 2 queued
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stopping = threading.Thread(target=live.stop)
        stopping.start()
        time.sleep(0.2)  # draining now, still listening
        refused = httpx.post(live.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=10)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        assert httpx.get(live.url + "/health", timeout=10).status_code == 200  # alive while it drains
        stopping.join(60)
        for client in clients:
            client.join(30)
    finally:
        server_cm.__exit__(None, None, None)
    assert len(streams) == 3 and len(wholes) == 1
    started = [lines for status, lines in streams if status == 200]
    assert started  # a running one (a queued stream has sent no status line yet)
    for lines in started:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        final = json.loads(lines[-2].removeprefix("data: "))
        assert "cancelled after the 0.5 s shutdown grace" in final["error"]["message"]
    for status, lines in streams:
        if status != 200:  # queued when cancelled: its answer is the whole JSON error
            assert status == 503 and "shutdown grace" in json.loads(lines[0])["error"]["message"]
    status, content_type, text = wholes[0]
    assert status == 503 and content_type == "application/json" and "shutdown grace" in json.loads(text)["error"]["message"]
    report = live.server.report
    assert report is not None and report.clean, report.line()
    logged = (tmp_path / "stderr.txt").read_text() + "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback" not in logged and "Exception in ASGI" not in logged and "Cancel" not in logged, logged
    if shape == "one process":
        assert live.server.uvicorn.drained.startswith("draining: 4 requests in flight at the signal, 0 ended within "
                                                      "the 0.5 s grace, 4 cancelled at its end")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode,signals", [([], 1), (["--one-process"], 1), ([], 2)],
                         ids=["two processes", "one process", "two processes, SIGTERM twice"])
def test_sigterm_mid_stream_exits_0_and_the_stream_gets_its_done(model_path, mode, signals):
    """A repeated SIGTERM (a supervisor's) does not cut the shutdown short; only a second Ctrl-C does."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", str(model_path),
                               "--device", "cpu", "--port", str(port), "--shutdown-grace", "0", *mode],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(server, url)
        lines: list[str] = []
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"prompt": [SLOW_TOKEN, 5], "max_tokens": 250, "stream": True, "ignore_eos": True}) as response:
            for line in response.iter_lines():
                if line and not lines:
                    for _ in range(signals):
                        server.send_signal(signal.SIGTERM)
                        time.sleep(0.05)
                if line:
                    lines.append(line)
        output, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert lines[-1] == "data: [DONE]" and "shutdown grace" in lines[-2]
    assert server.returncode == 0, output
    assert "1 requests in flight at the signal, 0 ended within the 0 s grace, 1 cancelled" in output, output
    assert "every KV block returned" in output and "Traceback" not in output and "Exception" not in output
