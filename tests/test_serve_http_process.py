"""The server in two processes (rocmforge_serve.http_process and engine_bridge): the engine's side gets back
the blocks of an HTTP process that dies, the shutdown check says so, and Ctrl-C to the process group of
`rocmforge serve` shuts both processes down with every block returned."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from support.engine_testing import load_tiny, tiny_model
from support.serve_testing import SLOW_TOKEN, live_server, metrics, wait_until_up

from rocmforge_serve.engine_bridge import EngineBridge
from rocmforge_serve.engine_loop import EngineLoop


def stream_until_gone(url: str, prompt=(SLOW_TOKEN, 5, 6), streaming: threading.Event | None = None) -> None:
    """A streamed request that lasts (with the test hooks, each step with SLOW_TOKEN's prompt takes 50 ms);
    `streaming` is set at its first chunk."""
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"prompt": list(prompt), "max_tokens": 200, "stream": True, "ignore_eos": True}) as response:
            for _ in response.iter_lines():
                if streaming is not None:
                    streaming.set()
    except httpx.HTTPError:
        pass


def test_a_dead_http_process_leaves_no_block_behind_and_fails_the_check(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), max_seqs=4, http_process=True) as live:
        clients = [threading.Thread(target=stream_until_gone, args=(live.url,)) for _ in range(3)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 10
        while metrics(live.url)["rocmforge_requests_running"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metrics(live.url)["rocmforge_kv_physical_blocks"] > 0  # the requests hold blocks now
        os.kill(live.server.http_pid, signal.SIGKILL)  # no handler runs: only the pipe's close tells the engine
        deadline = time.monotonic() + 3  # the requests would run ~10 s more if nothing cancelled them
        while live.server.engine_loop.engine.active_count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live.server.engine_loop.engine.active_count == 0  # ended by the engine's side: no handler ran
        report = live.stop()
        for client in clients:
            client.join(timeout=10)
    assert report.invariant_error is None and report.kv_bytes_at_end == report.kv_bytes_at_start
    assert not report.clean and "exit code -9" in report.line()
    assert report.line().startswith("shutdown: FAILED:")  # not called a leak: every block and byte came back


def test_the_engine_side_keeps_reading_while_its_replies_wait(tmp_path_factory):
    """The HTTP process writes (submits) on the loop that also reads; if the engine's side could block in a
    write while the HTTP side is not reading, a full pipe each way would stop both for good. Here the HTTP
    side asks for 2,000 readings (megabytes of replies, more than the pipe holds) and reads none, then writes
    a megabyte of cancels: every write must go through, and every reply come after, in order."""
    import multiprocessing

    loaded = load_tiny(tiny_model(tmp_path_factory))
    loop = EngineLoop(loaded.engine, device=loaded.device)
    loop.start()
    ours, theirs = multiprocessing.Pipe()
    bridge = EngineBridge(loop, ours)
    bridge.start()
    written = threading.Event()

    def flood():
        for token in range(2000):
            theirs.send(("state", token))
        for client_id in range(50_000):
            theirs.send(("cancel", client_id))  # ids never submitted: no-ops, but bytes the pipe must take
        written.set()
    threading.Thread(target=flood, daemon=True).start()
    try:
        assert written.wait(60), "the HTTP side's writes stopped: the engine's side no longer reads"
        replies = [theirs.recv() for _ in range(2000)]
        assert [(kind, token) for kind, token, _ in replies] == [("state", t) for t in range(2000)]
        assert all("usable_blocks" in state for _, _, state in replies)
    finally:
        theirs.close()
        bridge.join(timeout=10)
        loop.stop()
        loaded.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ctrl_c_to_the_process_group_stops_both_processes_cleanly(tmp_path_factory):
    port = free_port()
    command = [sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", str(tiny_model(tmp_path_factory)),
               "--device", "cpu", "--port", str(port), "--parallel", "2", "--shutdown-grace", "0.2"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)  # its own process group: Ctrl-C reaches both processes
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(server, url)
        streaming = threading.Event()
        client = threading.Thread(target=stream_until_gone, args=(url, (5, 6, 7), streaming))
        client.start()
        assert streaming.wait(30), "the request did not start streaming"
        os.killpg(server.pid, signal.SIGINT)
        output, _ = server.communicate(timeout=60)
        client.join(timeout=10)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    assert server.returncode == 0, output
    assert "in a process of its own" in output
    assert "every KV block returned" in output and "LEAK" not in output


def test_a_port_in_use_is_said_before_the_model_loads(tmp_path_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "rocmforge_cli.app", "serve", "--model",
                                 str(tiny_model(tmp_path_factory)), "--device", "cpu", "--port", str(port)],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "memory plan" not in result.stderr + result.stdout  # nothing was loaded
