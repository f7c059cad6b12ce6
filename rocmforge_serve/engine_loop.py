"""The one thread that steps the Engine for the server, and the bridge from its events to asyncio.

Continuous batching: every request the handlers submit joins the same engine, so concurrent requests
share decode steps. The thread sleeps while the engine has no work and wakes on submit or cancel.
Each request's events go to a sink (a callable) registered atomically with the submit, so no event can
arrive before its sink exists; a handler whose client went away calls cancel(), and the engine ends the
request (blocks back to the pool) at the start of the next step.

Host cost per token is the server's throughput limit (a demo-model step on an H100 takes ~3 ms for 32
tokens), so the hand-off is per step, not per token: a sink with a `channel` (an AsyncSink: its event
loop; a BridgeSink: the pipe to the HTTP process) gets the step's events through ONE `channel.deliver`
for all the channel's sinks (one wake-up of the loop, one write to its self-pipe; one message on the pipe),
and each AsyncSink keeps them in a deque that its handler drains without a task or a queue per event.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import ctypes
import sys
import threading
import time
from typing import Callable

from hipcore.engine.engine import Engine
from hipcore.engine.request import Ending, Event
from hipcore.engine.grammar import grammar_vocabulary
from rocmforge_serve.engine_state import live_state, read_engine_state

Sink = Callable[[Event], None]
RATE_WINDOW_S = 10.0  # tokens/s is measured over this trailing window
# The engine publishes its reading after a step at most this often while it has work (a reading took 0.3-0.65 ms
# of the engine thread on the cpu backend's test model, on a loaded 2-core machine: under 1% at this interval, where
# every 3 ms decode step would pay 10-20%), and always when it runs out of work, so an idle server's reading is
# never older than its last step.
PUBLISH_INTERVAL_S = 0.1
ENGINE_THREAD_NAME = "rf-engine"  # as the OS shows it (top -H, /proc/PID/task/*/comm; 15 bytes at most)
PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Best effort, Linux only: the calling thread's name as the OS shows it (Python's own thread names stay
    inside the interpreter), so per-thread CPU figures tell the engine's thread from the event loop's."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


class EngineStopped(Exception):
    """The engine is not taking requests (shutting down, or a fault stopped it)."""


class EngineLoop:
    def __init__(self, engine: Engine, *, device=None, idle_wait_s: float = 0.5, queue_timeout_s: float | None = None):
        self.engine = engine
        self.device = device  # hipcore.runtime.device.Device, for the ledger and the driver's figures
        self._cond = threading.Condition()
        self._sinks: dict[int, Sink] = {}
        self._accepting = True
        self._stop = False
        self.fault: str | None = None  # why the loop stopped on its own (an exception outside any request)
        self._idle_wait_s = idle_wait_s
        self._rate: collections.deque[tuple[float, int]] = collections.deque()
        self.queue_timeout_s = queue_timeout_s  # a request not admitted within it ends with 503 (None: no limit)
        self._reasons: dict[int, str] = {}  # request id -> why it was cancelled, for its final event (under _cond)
        self.fault_listeners: list[Callable[[str], None]] = []  # told the fault, on the engine's thread
        self._published = read_engine_state(engine, device)  # replaced whole by the engine's thread, never edited
        self._published_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rocmforge-engine", daemon=True)
        self._stopped = threading.Event()
        self._watchdog = threading.Thread(target=self._watch_queue, name="rocmforge-queue-watch", daemon=True)

    # ---- any thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if self.queue_timeout_s is not None:
            self._watchdog.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and self.fault is None and not self._stop

    @property
    def accepting(self) -> bool:
        return self._accepting and self.running

    def submit(self, prompt_ids: list[int], params, sink: Sink, *, tag: str = "") -> int:
        if params.grammar is not None:
            # The grammar's view of the vocabulary (0.6 s for 49k tokens, once) built here, on the caller's thread
            # (the pipe's reader with two processes; one process built it with the grammar), never on the engine's.
            grammar_vocabulary(self.engine.tokenizer)
        with self._cond:
            if not self.accepting:
                raise EngineStopped(self.fault or "the server is shutting down")
            rid = self.engine.submit(prompt_ids, params, tag=tag)
            self._sinks[rid] = sink
            self._cond.notify()
        return rid

    def cancel(self, request_id: int, reason: str | None = None) -> None:
        """End the request at the next step; `reason`, if given, is its final event's error (a 503's message)."""
        with self._cond:
            if reason is not None and request_id in self._sinks:
                self._reasons.setdefault(request_id, reason)
        self.engine.cancel(request_id)
        with self._cond:
            self._cond.notify()

    def stop_intake(self) -> None:
        """Refuse new requests (the server is draining); the ones in flight go on."""
        with self._cond:
            self._accepting = False

    def cancel_all(self, reason: str) -> int:
        """Cancel every request in flight with this reason; how many there were."""
        with self._cond:
            ids = list(self._sinks)
        for rid in ids:
            self.cancel(rid, reason)
        return len(ids)

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._sinks)

    def state_now(self) -> dict:
        """The engine's last published reading with the live figures (engine_state.py); never waits for a step."""
        return live_state(self, self._published)

    async def state(self) -> dict:
        """state_now() for the handlers, async as EngineClient's (a round trip to the engine's process) is."""
        return self.state_now()

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the trailing window (0 when idle)."""
        with self._cond:
            now = time.monotonic()
            while self._rate and self._rate[0][0] < now - RATE_WINDOW_S:
                self._rate.popleft()
            return sum(n for _, n in self._rate) / RATE_WINDOW_S

    def stop(self, grace_s: float = 0.0) -> list[Event]:
        """Refuse new requests, let in-flight ones run up to grace_s, cancel the rest, stop the thread.
        Returns the events of the requests shut down under it (through the engine's release path)."""
        with self._cond:
            self._accepting = False
        deadline = time.monotonic() + grace_s
        while self._thread.is_alive() and self.engine.active_count and time.monotonic() < deadline:
            time.sleep(0.02)
        for rid in list(self._sinks):
            self.engine.cancel(rid)
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._stopped.set()
        self._thread.join()
        events = self.engine.shutdown(Ending.CANCELLED)
        self._dispatch(events)
        self.publish()
        return events

    # ---- the engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread(ENGINE_THREAD_NAME)
        while True:
            with self._cond:
                while not self._stop and not self.engine.has_work():
                    self._cond.wait(self._idle_wait_s)
                if self._stop and not self.engine.has_work():
                    return
            before = self.engine.stats.generated_tokens
            try:
                events = self.engine.step()
            except BaseException as exc:  # noqa: BLE001 - outside any one request: stop serving, say why
                self.fault = f"the engine stopped: {type(exc).__name__}: {exc}"
                self._fail_all(self.fault)
                for listener in self.fault_listeners:
                    listener(self.fault)
                return
            made = self.engine.stats.generated_tokens - before
            now = time.monotonic()
            with self._cond:
                if made:
                    self._rate.append((now, made))
            self._dispatch(events)
            if now - self._published_at >= PUBLISH_INTERVAL_S or not self.engine.has_work():
                self.publish()

    def publish(self) -> None:
        """On the engine's thread (or before it starts, or after it stopped): a new reading for the readers."""
        self._published = read_engine_state(self.engine, self.device)
        self._published_at = time.monotonic()

    # ---- the queue's watchdog (its own thread: the engine's may be inside a long prompt step) -----------

    def _watch_queue(self) -> None:
        """Every request not admitted within queue_timeout_s (still in the engine's inbox or its queue; a preempted
        one was admitted once and keeps its place) gets its final event now, a 503 with the reason, and is
        cancelled; the engine ends it at its next step, whose own final event then finds no sink."""
        interval = min(1.0, max(0.05, self.queue_timeout_s / 4))
        while not self._stopped.wait(interval):
            limit = time.perf_counter() - self.queue_timeout_s
            with self._cond:
                ids = list(self._sinks)
            for rid in ids:
                request = self.engine.request(rid)
                if request is not None and request.admitted_at is None and request.submitted_at < limit:
                    self._expire(rid)

    def _expire(self, rid: int) -> None:
        with self._cond:
            sink = self._sinks.pop(rid, None)
        if sink is None:  # it ended meanwhile
            return
        self.engine.cancel(rid)
        with self._cond:
            self._cond.notify()
        event = Event(rid, 0, finished=True, ending=Ending.CANCELLED,
                      error=f"the request waited in the queue for more than {self.queue_timeout_s:g} s "
                            "(--queue-timeout) without starting; retry later")
        channel = getattr(sink, "channel", None)
        if channel is not None:
            channel.deliver([(sink, event)])
        else:
            sink(event)

    def _dispatch(self, events: list[Event]) -> None:
        by_channel: dict[object, list[tuple[Sink, Event]]] = {}
        with self._cond:
            for event in events:
                if event.finished and self._reasons:
                    reason = self._reasons.pop(event.request_id, None)
                    if reason is not None and event.ending == Ending.CANCELLED:
                        event = dataclasses.replace(event, error=reason)
                sink = self._sinks.get(event.request_id)
                if sink is None:
                    continue
                if event.finished:
                    del self._sinks[event.request_id]
                channel = getattr(sink, "channel", None)
                if channel is not None:
                    by_channel.setdefault(channel, []).append((sink, event))
                else:
                    sink(event)
        for channel, deliveries in by_channel.items():
            channel.deliver(deliveries)  # in step order: no sink sees its events reordered

    def _fail_all(self, message: str) -> None:
        with self._cond:
            sinks, self._sinks = self._sinks, {}
        for rid, sink in sinks.items():
            sink(Event(rid, 0, (), "", finished=True, ending=Ending.FAILED, error=message))


class LoopChannel:
    """The AsyncSinks of one event loop: a step's events for all of them in one call_soon_threadsafe."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def deliver(self, deliveries: list[tuple["AsyncSink", Event]]) -> None:
        try:  # call_soon callbacks run first in first out, so the steps stay in order
            self.loop.call_soon_threadsafe(_deliver, deliveries)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass

    def __eq__(self, other) -> bool:
        return isinstance(other, LoopChannel) and other.loop is self.loop

    def __hash__(self) -> int:
        return id(self.loop)


def _deliver(deliveries: list[tuple["AsyncSink", Event]]) -> None:
    """On the event loop: one step's events into their sinks."""
    for sink, event in deliveries:
        sink.put(event)


class AsyncSink:
    """Events of one request, handed from the engine thread to the handler's event loop.

    EngineLoop delivers them a step at a time (put() on the loop's thread); the handler takes them with
    take_all() and sleeps in wait() when there are none. wake() ends a wait without an event (the client
    went away), so waiting for "an event or a disconnect" needs no task per event."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.channel = LoopChannel(loop)
        self.events: collections.deque[Event] = collections.deque()
        self._waiter: asyncio.Future | None = None

    def __call__(self, event: Event) -> None:
        """From any thread (EngineLoop hands AsyncSinks their events through their channel, not here)."""
        try:
            self.loop.call_soon_threadsafe(self.put, event)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass

    def put(self, event: Event) -> None:
        """On the loop's thread."""
        self.events.append(event)
        self.wake()

    def wake(self) -> None:
        """On the loop's thread: end the current wait(), if any."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until put() or wake(); returns at once if events are already here."""
        if self.events:
            return
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take_all(self) -> list[Event]:
        events = list(self.events)
        self.events.clear()
        return events
