"""Running the app under uvicorn, and the shutdown check: every block and every KV byte back.

SIGTERM or Ctrl-C: uvicorn stops accepting, lets in-flight requests finish for up to `grace_s`, then
cancels what is left (each handler's `finally` cancels its request); the app's lifespan then stops the
engine loop, which ends anything still queued through the engine's release path. The check that follows
reads the KV cache's quiescence invariants and the ledger's kv bytes against the figure at start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import signal
import socket
import sys
import threading
from dataclasses import dataclass

import uvicorn

from rocmforge_serve.app import create_app, served_model

log = logging.getLogger("rocmforge.serve")


@dataclass
class ShutdownReport:
    ended_at_shutdown: int  # requests the engine still held when the loop stopped
    kv_bytes_at_start: int
    kv_bytes_at_end: int
    invariant_error: str | None

    @property
    def clean(self) -> bool:
        return self.invariant_error is None and self.kv_bytes_at_end == self.kv_bytes_at_start

    def line(self) -> str:
        if self.clean:
            return (f"shutdown: every KV block returned (KV cache quiescent), ledger kv bytes unchanged "
                    f"({self.kv_bytes_at_end}); {self.ended_at_shutdown} requests ended at shutdown")
        problems = [p for p in (self.invariant_error,) if p]
        if self.kv_bytes_at_end != self.kv_bytes_at_start:
            problems.append(f"ledger kv bytes {self.kv_bytes_at_start} at start, {self.kv_bytes_at_end} at shutdown")
        return "shutdown: LEAK: " + "; ".join(problems)


def http_stack() -> tuple[str, str]:
    """(uvicorn's `http`, its `loop`): httptools' C parser and uvloop where they are installed (they are the
    project's dependencies; uvloop not on Windows), else h11 and asyncio's own loop, which work the same but
    cost more host time per token. Measured with scripts/serve_overhead.py (32 streaming clients, the demo
    model's tokenizer, on a 2-core CPU machine): the event loop's CPU per generated token 15.9-17.1 -> 11.6-12.2
    us, the server's 26.2 -> 20.8-22.0 us, median time to first token 50-52 -> 14-17 ms."""
    http = "httptools" if importlib.util.find_spec("httptools") is not None else "h11"
    loop = "uvloop" if sys.platform != "win32" and importlib.util.find_spec("uvloop") is not None else "asyncio"
    return http, loop


class Server:
    def __init__(self, loaded, *, name: str, host: str = "127.0.0.1", port: int = 8080, max_queue: int = 64,
                 api_key: str | None = None, grace_s: float = 10.0, max_body_bytes: int | None = None,
                 log_level: str = "warning", ignore_eos: bool = False):
        self.loaded = loaded
        self.served = served_model(loaded, name=name, max_queue=max_queue, ignore_eos=ignore_eos)
        self.report: ShutdownReport | None = None
        self._kv_at_start = loaded.device.ledger.bytes_by_tag().get("kv", 0)
        extra = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
        self.app = create_app(self.served, api_key=api_key, on_shutdown=self.shutdown_check, **extra)
        self.http, self.loop = http_stack()
        self.config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level, lifespan="on",
                                     timeout_graceful_shutdown=grace_s, access_log=False, http=self.http,
                                     loop=self.loop)
        self.uvicorn = _Uvicorn(self.config)

    def shutdown_check(self) -> ShutdownReport:
        if self.report is not None:
            return self.report
        ended = self.served.loop.stop(grace_s=0.0)
        if self.served.templates is not None:
            self.served.templates.close()
        error = None
        try:
            self.loaded.cache.check_invariants(quiescent=True)
        except Exception as exc:  # noqa: BLE001 - the invariant's message is the finding
            error = f"{type(exc).__name__}: {exc}"
        kv_now = self.loaded.device.ledger.bytes_by_tag().get("kv", 0)
        self.report = ShutdownReport(sum(1 for e in ended if e.finished), self._kv_at_start, kv_now, error)
        (log.info if self.report.clean else log.error)(self.report.line())
        return self.report

    def run(self, sockets: list[socket.socket] | None = None) -> ShutdownReport:
        """Serve until SIGTERM / Ctrl-C (or should_exit); returns the shutdown check."""
        self.served.loop.start()
        try:
            self.uvicorn.run(sockets=sockets)
        finally:
            report = self.shutdown_check()  # a no-op when the lifespan already ran it
        return report


class _Uvicorn(uvicorn.Server):
    """uvicorn re-raises the caught SIGTERM / SIGINT after its shutdown, which would end the process by the
    signal (exit 143 / 130) and skip our check's verdict; here the signal only starts the shutdown, and the
    exit code says whether every block came back. A second signal still forces the exit (uvicorn's rule)."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signals are the main thread's; a server in a thread is stopped through should_exit
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def bound_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket (port 0: a free port, no race between finding it and binding it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


class ServerThread:
    """A server on a free loopback port in a background thread (tests and the serve leak check)."""

    def __init__(self, server: Server):
        self.server = server
        self.socket = bound_socket()
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        import time
        deadline = time.monotonic() + 30
        while not self.server.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> ShutdownReport:
        self.server.uvicorn.should_exit = True
        self.thread.join(timeout=60)
        self.socket.close()
        return self.server.shutdown_check()

    def __exit__(self, *exc) -> None:
        self.stop()
