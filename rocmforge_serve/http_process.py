"""The HTTP layer in a process of its own: uvicorn and the app, talking to the engine over a pipe.

`rocmforge serve` starts this process (server.Server with http_process=True; the spawn start method: the
engine's process holds a GPU context and threads, which a fork would copy half-made). The engine stays in
the first process with its stepping thread and engine_bridge.py's reader at the pipe's other end; here an
EngineClient stands in for the EngineLoop: the handlers submit, cancel and read state() through it alike.

The pipe's reader is the event loop itself (add_reader on the pipe's descriptor: no thread, no wake-up
call), and one message carries a step's events for every request of this process. Ctrl-C reaches both
processes (one process group); this one ignores SIGINT and shuts down on the SIGTERM the engine's process
sends it, so there is one shutdown, run by the engine's side, with uvicorn's graceful period here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal

from hipcore.engine.request import Ending, Event
from hipcore.runtime.host_memory import anon_rss_bytes
from rocmforge_serve.app import attach, create_app
from rocmforge_serve.engine_loop import AsyncSink, EngineStopped
from rocmforge_serve.generation import ServedModel
from rocmforge_serve.uvicorn_stack import SignalledUvicorn, uvicorn_config

log = logging.getLogger("rocmforge.serve")


class EngineClient:
    """EngineLoop's interface for the handlers, over the pipe to the engine's process (engine_bridge.py)."""

    def __init__(self, conn):
        self.conn = conn
        self.fault: str | None = None  # set when the engine's process is gone
        self.on_lost = lambda: None  # serve_http: stop serving then
        self._open = True
        self._gone = False  # the pipe to the engine's process broke (_lost ran)
        self._accepting = True
        self._sinks: dict[int, AsyncSink] = {}
        self._ids = itertools.count(1)
        self._states: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- the event loop's thread (every method: the handlers and the pipe's reader share it) ---------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.conn.fileno(), self._on_readable)
        self._send(("started",))

    @property
    def running(self) -> bool:
        return self._open and self.fault is None

    @property
    def accepting(self) -> bool:
        return self._accepting and self.running

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    def submit(self, prompt_ids: list[int], params, sink: AsyncSink, *, tag: str = "") -> int:
        if not self.accepting:
            raise EngineStopped(self.fault or "the server is shutting down")
        client_id = next(self._ids)
        self._sinks[client_id] = sink  # before the send: its events cannot come back before it exists
        self._send(("submit", client_id, list(prompt_ids), params, tag))
        return client_id

    def cancel(self, client_id: int, reason: str | None = None) -> None:
        """The engine ends the request at its next step and sends its final event (a no-op if it ended)."""
        if self._open and client_id in self._sinks:
            self._send(("cancel", client_id, reason))

    def stop_intake(self) -> None:
        self._accepting = False

    def cancel_all(self, reason: str) -> int:
        ids = list(self._sinks)
        for client_id in ids:
            self.cancel(client_id, reason)
        return len(ids)

    async def state(self) -> dict:
        """The engine's reading (engine_state.py), taken between two steps in its process; host memory is
        the two processes' together."""
        if not self._open:
            raise EngineStopped(self.fault or "the engine's process is gone")
        token = next(self._ids)
        future = self._loop.create_future()
        self._states[token] = future
        self._send(("state", token))
        try:
            state = await future
        finally:
            self._states.pop(token, None)  # a reader that gave up (a timeout) leaves no future behind
        if "error" in state:
            raise RuntimeError(f"reading the engine's state failed: {state['error']}")
        own = anon_rss_bytes()
        if state["host_rss_anon_bytes"] is not None and own is not None:
            state["host_rss_anon_bytes"] += own
        return state

    def close(self) -> None:
        """At the app's shutdown: no more requests; closing the pipe tells the engine's side we are done."""
        self._accepting = False
        if self._open:
            self._open = False
            if self._loop is not None:
                self._loop.remove_reader(self.conn.fileno())
            self.conn.close()

    # ---- the pipe ------------------------------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (OSError, ValueError):
            self._lost("the engine's process closed the pipe")

    def _on_readable(self) -> None:
        try:
            while self._open and self.conn.poll():
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            self._lost("the engine's process closed the pipe")

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "events":
            sinks = self._sinks
            for client_id, seq_index, token_ids, text, finished, ending, error, cached, logprobs in message[1]:
                sink = sinks.pop(client_id, None) if finished else sinks.get(client_id)
                if sink is not None:
                    sink.put(Event(client_id, seq_index, token_ids, text, finished,
                                   Ending(ending) if ending is not None else None, error, cached, logprobs))
        elif kind == "refused":  # the engine would not take it: 400 (its rules) or 503 (not serving)
            _, client_id, status, text = message
            sink = self._sinks.pop(client_id, None)
            if sink is not None:
                ending = Ending.REJECTED if status == 400 else Ending.CANCELLED
                sink.put(Event(client_id, 0, finished=True, ending=ending, error=text))
        elif kind == "state":
            future = self._states.pop(message[1], None)
            if future is not None and not future.done():
                future.set_result(message[2])
        elif kind == "fault":  # the engine's loop stopped: refuse requests, /health says why
            self.fault = message[1]
        else:
            log.error("the engine's process sent an unknown message %r", kind)

    def _lost(self, reason: str) -> None:
        """The engine's process is gone: every request fails, every reading too, and the server stops."""
        if self._gone:
            return
        self._gone = True
        self.fault = reason
        was_open, self._open = self._open, False
        if self._loop is not None and was_open:  # a closed Connection has no fileno (OSError: handle is closed)
            self._loop.remove_reader(self.conn.fileno())
        sinks, self._sinks = self._sinks, {}
        for client_id, sink in sinks.items():
            sink.put(Event(client_id, 0, finished=True, ending=Ending.FAILED, error=reason))
        states, self._states = self._states, {}
        for future in states.values():
            if not future.done():
                future.set_exception(EngineStopped(reason))
        self.on_lost()


def serve_http(served: ServedModel, conn, sock, settings: dict) -> None:
    """The HTTP process's main: the app on `sock` (or settings' host and port), until SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine's process turns Ctrl-C into our SIGTERM
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    client = EngineClient(conn)
    served = attach(served, client)

    def stopped() -> None:
        client.close()
        if served.templates is not None:
            served.templates.close()

    app = create_app(served, api_key=settings["api_key"], max_body_bytes=settings["max_body_bytes"], policy=settings["policy"],
                     access_log=settings.get("access_log", False), on_startup=lambda: client.attach(asyncio.get_running_loop()), on_shutdown=stopped)
    server = SignalledUvicorn(uvicorn_config(app, **settings["uvicorn"]), signals=(signal.SIGTERM,), served=served,
                              grace_s=settings["grace_s"])
    client.on_lost = lambda: setattr(server, "should_exit", True)
    server.run(sockets=[sock] if sock is not None else None)
