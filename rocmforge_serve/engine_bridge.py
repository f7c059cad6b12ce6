"""The engine's end of the pipe to the HTTP process (http_process.py is the other end).

Why two processes: one interpreter means one GIL, and on a small model the engine's thread waited for the
event loop's turn more than for the device (docs/history/2026-11-27-serve-gil-soak-attention-split.md: the demo
model's engine waited for the device 28% of a 32-client run, the rest mostly for the interpreter). With
the HTTP layer in a process of its own, the engine's process runs its stepping thread and this bridge's
reader, which sleeps in the pipe's recv until a message comes (a submit, a cancel, a state request).

Messages, each a tuple whose first item names it (pickled by multiprocessing's Connection):
  HTTP -> engine: ("submit", id, prompt_ids, params, tag), ("cancel", id, reason or None), ("state", token),
  ("started",)
  engine -> HTTP: ("events", [(id, seq_index, token_ids, text, finished, ending value, error, cached tokens, logprobs), ...]) once a
  step for every request of the HTTP process, ("refused", id, status, message), ("state", token, dict),
  ("fault", message) when the engine's loop stopped on a fault (the HTTP side's /health needs no round trip).
Ids are the HTTP process's own; the bridge keeps each one's BridgeSink, which holds the engine's id. When
the pipe closes (the HTTP process ended, or died) every request it left is cancelled, so its blocks come
back at the next step like any disconnected client's.

Neither the engine's thread nor the reader writes to the pipe: they queue, and a sender thread writes. A
write blocks while the other side is not reading, and the HTTP process's event loop, which reads, also
writes (submits carry whole prompts); if this side's reader could block in a write, a full pipe each way
would stop both processes for good. So this side always reads, and the engine never waits for the pipe.
"""

from __future__ import annotations

import logging
import queue
import threading

from hipcore.engine.request import Event
from hipcore.errors import UsageError
from rocmforge_serve.engine_loop import EngineLoop, EngineStopped

log = logging.getLogger("rocmforge.serve")


def event_fields(client_id: int, event: Event) -> tuple:
    """An Event as plain data for the pipe (a tuple pickles in a fraction of a dataclass's time)."""
    ending = event.ending.value if event.ending is not None else None
    return (client_id, event.seq_index, event.token_ids, event.text, event.finished, ending, event.error,
            event.cached_tokens, event.logprobs)


class BridgeSink:
    """One HTTP-process request in the engine loop; its events go out through the bridge, a step at a time."""

    __slots__ = ("channel", "client_id", "request_id")

    def __init__(self, bridge: "EngineBridge", client_id: int):
        self.channel = bridge
        self.client_id = client_id
        self.request_id: int | None = None  # the engine's, once submit returns

    def __call__(self, event: Event) -> None:  # the loop's fault path calls sinks one by one
        self.channel.deliver([(self, event)])


class EngineBridge:
    def __init__(self, loop: EngineLoop, conn):
        self.loop = loop
        self.conn = conn
        self.started = threading.Event()  # the HTTP process's server is up
        self.closed = threading.Event()  # the pipe closed: the HTTP process is gone
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # messages for the sender; None ends it
        self._sinks_lock = threading.Lock()
        self._sinks: dict[int, BridgeSink] = {}
        self._reader = threading.Thread(target=self._read, name="rocmforge-bridge-in", daemon=True)
        self._sender = threading.Thread(target=self._write, name="rocmforge-bridge-out", daemon=True)
        loop.fault_listeners.append(lambda fault: self._send(("fault", fault)))

    def start(self) -> None:
        self._reader.start()
        self._sender.start()

    def join(self, timeout: float | None = None) -> None:
        """Until the pipe closed (the reader's end) and the sender stopped."""
        self._reader.join(timeout)
        self._outbox.put(None)
        self._sender.join(timeout)

    @property
    def in_flight(self) -> int:
        with self._sinks_lock:
            return len(self._sinks)

    # ---- the engine thread (EngineLoop._dispatch), once a step ---------------------------------

    def deliver(self, deliveries: list[tuple[BridgeSink, Event]]) -> None:
        batch = [event_fields(sink.client_id, event) for sink, event in deliveries]
        with self._sinks_lock:
            for sink, event in deliveries:
                if event.finished:
                    self._sinks.pop(sink.client_id, None)
        self._send(("events", batch))

    # ---- the sender thread, and the reader thread ------------------------------------------------

    def _send(self, message: tuple) -> None:
        self._outbox.put(message)

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the HTTP process is gone; the reader cancels what it left
                return

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    return
                self._handle(message)
        finally:
            self._abandon()
            self.closed.set()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "submit":
            _, client_id, prompt_ids, params, tag = message
            sink = BridgeSink(self, client_id)
            with self._sinks_lock:  # before submit: the engine may end the request before submit returns
                self._sinks[client_id] = sink
            try:
                sink.request_id = self.loop.submit(prompt_ids, params, sink, tag=tag)
            except (EngineStopped, UsageError) as exc:
                with self._sinks_lock:
                    self._sinks.pop(client_id, None)
                self._send(("refused", client_id, 503 if isinstance(exc, EngineStopped) else 400, str(exc)))
        elif kind == "cancel":
            with self._sinks_lock:
                sink = self._sinks.get(message[1])
            if sink is not None and sink.request_id is not None:
                self.loop.cancel(sink.request_id, message[2] if len(message) > 2 else None)
        elif kind == "state":
            try:
                state = self.loop.state_now()
            except Exception as exc:  # noqa: BLE001 - a reading that failed is the HTTP side's 500, not ours
                log.exception("reading the engine's state failed")
                state = {"error": f"{type(exc).__name__}: {exc}"}
            self._send(("state", message[1], state))
        elif kind == "started":
            self.started.set()
            if self.loop.fault:  # stopped before the HTTP process listened
                self._send(("fault", self.loop.fault))
        else:
            log.error("the HTTP process sent an unknown message %r", kind)

    def _abandon(self) -> None:
        """The pipe closed: cancel every request the HTTP process left (their blocks come back next step)."""
        with self._sinks_lock:
            left, self._sinks = list(self._sinks.values()), {}
        for sink in left:
            if sink.request_id is not None:
                self.loop.cancel(sink.request_id)
