"""uvicorn as both of the server's shapes run it: the HTTP stack, the config, and signals that only start
the shutdown (server.py runs it in the engine's process, http_process.py in a process of its own)."""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import sys
import threading

import uvicorn

from rocmforge_serve.connection_guard import ConnectionLimits, guarded_protocol
from rocmforge_serve.drain import TAIL_S, drain


def http_stack() -> tuple[str, str]:
    """(uvicorn's `http`, its `loop`): httptools' C parser and uvloop where they are installed (they are the
    project's dependencies; uvloop not on Windows), else h11 and asyncio's own loop, which work the same but
    cost more host time per token. Measured with scripts/bench/serve_overhead.py (32 streaming clients, the demo
    model's tokenizer, on a 2-core CPU machine): the event loop's CPU per generated token 15.9-17.1 -> 11.6-12.2
    us, the server's 26.2 -> 20.8-22.0 us, median time to first token 50-52 -> 14-17 ms."""
    http = "httptools" if importlib.util.find_spec("httptools") is not None else "h11"
    loop = "uvloop" if sys.platform != "win32" and importlib.util.find_spec("uvloop") is not None else "asyncio"
    return http, loop


def uvicorn_config(app, *, host: str, port: int, log_level: str,
                   limits: ConnectionLimits | None = None) -> uvicorn.Config:
    """limits: connection_guard.py's, on httptools (h11, the fallback, bounds the head's size alone, with a 400)."""
    http, loop = http_stack()
    limits = limits or ConnectionLimits()
    protocol = guarded_protocol(limits) if http == "httptools" else http
    # the grace is drain.py's (before uvicorn's shutdown); uvicorn's own timeout then only covers the tail
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=TAIL_S, access_log=False, http=protocol, loop=loop,
                          timeout_keep_alive=limits.idle_timeout_s, h11_max_incomplete_event_size=limits.head_bytes)


class SignalledUvicorn(uvicorn.Server):
    """uvicorn re-raises the caught SIGTERM / SIGINT after its shutdown, which would end the process by the
    signal (exit 143 / 130) and skip our check's verdict; here the signal only starts the shutdown, and the
    exit code says whether every block came back. A second signal still forces the exit (uvicorn's rule).
    `signals`: the ones it handles (the HTTP process takes only SIGTERM, from the engine's process).
    `served` and `grace_s`: the shutdown drains the served model's requests first (drain.py)."""

    def __init__(self, config: uvicorn.Config, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM), *,
                 served=None, grace_s: float = 0.0):
        super().__init__(config)
        self.signals = signals
        self.served = served
        self.grace_s = grace_s
        self.drained: str | None = None  # drain's line

    async def shutdown(self, sockets=None) -> None:
        if self.served is not None and self.served.loop is not None and not self.force_exit:
            self.drained = await drain(self.served, self, self.grace_s)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signals are the main thread's; a server in a thread is stopped through should_exit
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in self.signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
