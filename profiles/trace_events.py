"""`--trace FILE.json`: a run in the Chrome trace event format, which Perfetto (ui.perfetto.dev) and
chrome://tracing open, beside a rocprofv3 or Nsight Systems trace of the same run.

On one timeline (microseconds from the start of the recording, this process's pid):
  thread "ledger"       an instant event per device allocation and free ("alloc kv", args: tag, bytes,
                        label, address) and a counter "ledger bytes" with every tag's live bytes after it;
  thread "engine steps" a complete event per engine step (args: requests in the step, graph replays);
  "requests"            an async span per request, from submit to its ending (args: kind, ending).

The events go into fixed numpy arrays allocated (and touched) when the recorder is made, so that
recording adds no host memory under leak-check's host layer; past `max_events` the rest are counted
as dropped, and the file says so in its metadata.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from hipcore.errors import UsageError
from hipcore.runtime.ledger import TAGS

MAX_EVENTS = 200_000
MAX_NAMES = 4096  # distinct allocation labels and request kinds/endings kept; more are written as "?"
ALLOC, FREE, STEP, REQUEST_BEGIN, REQUEST_END = range(5)
LEDGER_TID, STEPS_TID = 1, 2


def graph_replays(engine) -> int:
    """Decode and prompt graphs replayed so far by the engine's runner (0 where it keeps none)."""
    runner = getattr(engine, "runner", None)
    return sum(getattr(getattr(runner, name, None), "replays", 0) for name in ("graphs", "prompt_graphs"))


def check_trace_path(path: str | None) -> None:
    if path is not None and Path(path).suffix.lower() != ".json":
        raise UsageError(f"--trace {path}: the file must end in .json")


class TraceRecorder:
    def __init__(self, max_events: int = MAX_EVENTS, clock=time.perf_counter):
        self.clock, self.max_events = clock, max_events
        self.started = clock()
        self.ts = np.full(max_events, -1.0)  # microseconds; np.full touches every page now
        self.dur = np.full(max_events, -1.0)
        self.kind = np.full(max_events, -1, dtype=np.int8)
        self.ints = np.full((max_events, 4), -1, dtype=np.int64)  # per kind: see _event
        self.count = 0
        self.dropped = 0
        self.names: dict[str, int] = {}
        self._lock = threading.Lock()  # allocations may come from several threads (serve)

    def _us(self, t: float | None = None) -> float:
        return ((self.clock() if t is None else t) - self.started) * 1e6

    def _name(self, text: str) -> int:
        if text not in self.names and len(self.names) < MAX_NAMES:
            self.names[text] = len(self.names)
        return self.names.get(text, -1)

    def _add(self, kind: int, ts: float, ints: tuple, dur: float = -1.0) -> None:
        with self._lock:
            if self.count >= self.max_events:
                self.dropped += 1
                return
            k = self.count
            self.ts[k], self.dur[k], self.kind[k], self.ints[k] = ts, dur, kind, ints
            self.count += 1

    # ---- what is recorded -----------------------------------------------------------------------

    def ledger_event(self, what: str, alloc) -> None:
        """A Ledger observer: ints = (tag, bytes, label, address)."""
        self._add(ALLOC if what == "alloc" else FREE, self._us(),
                  (TAGS.index(alloc.tag), alloc.nbytes, self._name(alloc.label), alloc.ptr))

    def seed(self, live) -> None:
        """The allocations already live when the trace begins (the model's weights, the KV pools), at its start."""
        for alloc in live:
            self.ledger_event("alloc", alloc)

    def step(self, start: float, end: float, requests: int, graph_replays: int) -> None:
        """An engine step between two clock readings: ints = (requests, graph replays, -, -)."""
        self._add(STEP, self._us(start), (requests, graph_replays, -1, -1), dur=(end - start) * 1e6)

    def request_started(self, request_id: int, label: str) -> None:
        self._add(REQUEST_BEGIN, self._us(), (request_id, self._name(label), -1, -1))

    def request_ended(self, request_id: int, ending: str) -> None:
        self._add(REQUEST_END, self._us(), (request_id, self._name(ending), -1, -1))

    # ---- the file -------------------------------------------------------------------------------

    def events(self, pid: int | None = None) -> list[dict]:
        pid = os.getpid() if pid is None else pid
        by_number = {v: k for k, v in self.names.items()}
        live = dict.fromkeys(TAGS, 0)
        out: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0, "args": {"name": "rocmforge"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": LEDGER_TID, "ts": 0, "args": {"name": "ledger"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": STEPS_TID, "ts": 0, "args": {"name": "engine steps"}},
        ]
        for k in range(self.count):
            kind, ts = int(self.kind[k]), round(float(self.ts[k]), 3)
            a, b, c, d = (int(v) for v in self.ints[k])
            if kind in (ALLOC, FREE):
                tag = TAGS[a]
                live[tag] += b if kind == ALLOC else -b
                what = "alloc" if kind == ALLOC else "free"
                out.append({"name": f"{what} {tag}", "cat": "ledger", "ph": "i", "s": "t", "pid": pid, "tid": LEDGER_TID,
                            "ts": ts, "args": {"tag": tag, "bytes": b, "label": by_number.get(c, "?"), "address": hex(d)}})
                out.append({"name": "ledger bytes", "ph": "C", "pid": pid, "tid": LEDGER_TID, "ts": ts, "args": dict(live)})
            elif kind == STEP:
                out.append({"name": "engine step", "cat": "engine", "ph": "X", "pid": pid, "tid": STEPS_TID, "ts": ts,
                            "dur": round(float(self.dur[k]), 3), "args": {"requests": a, "graph_replays": b}})
            else:
                begin = kind == REQUEST_BEGIN
                out.append({"name": "request", "cat": "request", "ph": "b" if begin else "e", "id": a, "pid": pid,
                            "tid": STEPS_TID, "ts": ts, "args": {"kind" if begin else "ending": by_number.get(b, "?")}})
        return out

    def to_json(self, metadata: dict | None = None) -> dict:
        return {"traceEvents": self.events(), "displayTimeUnit": "ms",
                "metadata": {**(metadata or {}), "events": self.count, "dropped_events": self.dropped}}

    def write(self, path: str, metadata: dict | None = None) -> None:
        check_trace_path(path)
        Path(path).write_text(json.dumps(self.to_json(metadata), separators=(",", ":")), encoding="utf-8")
