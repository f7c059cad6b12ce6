"""Record an Engine's run into a MemoryTimeline (and a TraceRecorder) without touching the code that drives it:
the engine object's submit and step are wrapped (the instance's, not the class's), so every step, wherever it
is called from (run_until_idle included), samples the timeline and notes each request's blocks and ending."""

from __future__ import annotations

import threading
import time

from hipcore.engine.request import Phase
from hipcore.runtime.host_memory import anon_rss_bytes
from profiles.memory_timeline import MemoryTimeline
from profiles.trace_events import TraceRecorder, graph_replays


def record_engine(engine, cache, timeline: MemoryTimeline, ledger=None, trace: TraceRecorder | None = None,
                  driver_free=lambda: None):
    """Wrap `engine`'s submit and step; returns a function that unwraps them."""
    submit, step = engine.submit, engine.step
    live: dict[int, object] = {}
    lock = threading.Lock()  # serve submits from its HTTP threads while its engine thread steps

    def recorded_submit(prompt, params, **kwargs):
        rid = submit(prompt, params, **kwargs)
        label = kwargs.get("tag", "") or "request"
        with lock:
            timeline.request_started(rid, label)
            if trace is not None:
                trace.request_started(rid, label)
            live[rid] = engine.request(rid)
        return rid

    def recorded_step():
        started, replays = time.perf_counter(), graph_replays(engine)
        events = step()
        with lock:
            _after_step(started, replays)
        return events

    def _after_step(started, replays):
        if trace is not None:
            trace.step(started, time.perf_counter(), len(live), graph_replays(engine) - replays)
        timeline.track_requests(cache, ((rid, r) for rid, r in live.items() if r is not None))
        for rid, request in list(live.items()):
            if request is None or request.phase == Phase.FINISHED:
                ending = "" if request is None or request.ending is None else request.ending.value
                timeline.request_ended(rid, ending)
                if trace is not None:
                    trace.request_ended(rid, ending)
                del live[rid]
        if timeline.due() and not cache.closed:
            timeline.sample_cache(cache, ledger, driver_free(), anon_rss_bytes())

    engine.submit, engine.step = recorded_submit, recorded_step
    if trace is not None and ledger is not None:
        trace.seed(ledger.live())
        ledger.observer = trace.ledger_event

    def unwrap() -> None:
        del engine.submit, engine.step  # the class's methods again
        if ledger is not None and trace is not None:
            ledger.observer = None

    return unwrap
