"""The HTTP stack `rocmforge serve` runs on: httptools and uvloop where installed (the project's dependencies),
h11 and asyncio's loop otherwise, and the live server really on the one it names."""

from __future__ import annotations

import importlib.util
import sys

import httpx
import pytest

from rocmforge_serve import uvicorn_stack
from support.engine_testing import tiny_model
from support.serve_testing import live_server


def test_the_fast_stack_where_installed_and_the_plain_one_where_not(monkeypatch):
    expected_loop = "asyncio" if sys.platform == "win32" else "uvloop"
    assert uvicorn_stack.http_stack() == ("httptools", expected_loop)  # both are dependencies (pyproject.toml)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("httptools", "uvloop") else real(name, *a))
    assert uvicorn_stack.http_stack() == ("h11", "asyncio")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a))
    assert uvicorn_stack.http_stack() == ("httptools", "asyncio")


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop does not exist on Windows")
def test_the_live_server_runs_on_the_stack_it_names(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), max_queue=4) as live:
        server = live.server
        assert (server.http, server.loop) == ("httptools", "uvloop")
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        assert issubclass(server.uvicorn.config.http_protocol_class, HttpToolsProtocol)  # under connection_guard
        # ignore_eos: the tiny model samples its end-of-text token now and then, first too (no token to count)
        response = httpx.post(live.url + "/v1/completions",
                              json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True}, timeout=30)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
        import uvloop
        assert server.uvicorn.config.get_loop_factory() is uvloop.new_event_loop
