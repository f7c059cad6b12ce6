"""Connection limits on real sockets (rocmforge_serve/connection_guard.py): a head too large or with too many
headers gets 431, a head sent too slowly 408, a body sent too slowly and an idle connection are closed, one
connection too many gets 503; each a JSON error, and the server keeps serving."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import live_server

from rocmforge_serve.connection_guard import ConnectionLimits

LIMITS = ConnectionLimits(head_bytes=4096, max_headers=20, head_timeout_s=0.6, body_timeout_s=0.6, idle_timeout_s=0.6,
                          max_connections=16)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def live(model_path):
    with live_server(model_path, limits=LIMITS) as server:
        yield server


def connect(live) -> socket.socket:
    return socket.create_connection(("127.0.0.1", live.port), timeout=5)


def read_until_closed(sock: socket.socket, limit_s: float = 5.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    t0 = time.monotonic()
    sock.settimeout(limit_s)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, socket.timeout):
        raise AssertionError(f"the server kept the connection open for {limit_s} s") from None
    except ConnectionResetError:
        pass
    return b"".join(chunks), time.monotonic() - t0


def head(*headers: str) -> bytes:
    return ("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


def still_serving(live) -> None:
    assert httpx.get(live.url + "/health", timeout=5).status_code == 200


def status_and_code(reply: bytes) -> tuple[int, str]:
    status = int(reply.split(b" ", 2)[1])
    return status, httpx.Response(status, content=reply.partition(b"\r\n\r\n")[2]).json()["error"]["code"]


@pytest.mark.parametrize("request_head", [head("X-Big: " + "a" * 8000), head(*[f"X-{i}: 1" for i in range(50)])],
                         ids=["one large header", "many headers"])
def test_a_head_too_large_gets_431_and_the_connection_closes(live, request_head):
    with connect(live) as sock:
        sock.sendall(request_head)
        reply, _ = read_until_closed(sock)
    assert status_and_code(reply) == (431, "headers_too_large")
    still_serving(live)


def test_a_head_that_never_ends_is_cut_at_the_limit_not_buffered(live):
    with connect(live) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Endless: ")
        try:
            for _ in range(64):  # 64 x 1 KiB, more than the 4 KiB limit; the server closes long before the end
                sock.sendall(b"a" * 1024)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply, _ = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 431")


def test_a_slow_head_gets_408_in_time(live):
    with connect(live) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        t0 = time.monotonic()
        try:
            for byte in b"X-Slow: " + b"a" * 40:
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply, _ = read_until_closed(sock)
    assert status_and_code(reply) == (408, "request_timeout")
    assert time.monotonic() - t0 < LIMITS.head_timeout_s + 1.5
    still_serving(live)


def test_a_slow_body_and_an_idle_connection_are_closed(live):
    with connect(live) as slow_body, connect(live) as idle:
        slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        _, seconds = read_until_closed(slow_body)
        assert seconds < LIMITS.body_timeout_s + 1.5
        reply, seconds = read_until_closed(idle)
        assert reply == b"" and seconds < LIMITS.idle_timeout_s + 1.5
    with connect(live) as kept_alive:  # after a response too (uvicorn's own keep-alive timer)
        kept_alive.sendall(head())
        reply, seconds = read_until_closed(kept_alive)
        assert reply.startswith(b"HTTP/1.1 200") and seconds < LIMITS.idle_timeout_s + 1.5
    still_serving(live)


def test_one_connection_too_many_gets_503(model_path):
    limits = ConnectionLimits(max_connections=4, idle_timeout_s=10)
    with live_server(model_path, limits=limits) as live:
        held = [connect(live) for _ in range(4)]
        try:
            time.sleep(0.2)
            with connect(live) as extra:
                reply, _ = read_until_closed(extra)
            assert status_and_code(reply) == (503, "too_many_connections")
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        still_serving(live)


def test_the_limits_reach_the_http_process(model_path):
    with live_server(model_path, limits=LIMITS, http_process=True) as live:
        with connect(live) as sock:
            sock.sendall(head("X-Big: " + "a" * 8000))
            reply, _ = read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 431")
        with connect(live) as idle:
            assert read_until_closed(idle)[0] == b""
