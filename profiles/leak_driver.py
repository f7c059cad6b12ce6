"""Drives planned requests through the real engine and records how each one ended.

The driver is the engine's owner thread: it submits requests while fewer than `parallel` sequence
slots are taken, steps the engine, fires the planned cancels between steps, and answers the
engine's fault-injection hooks (EngineHooks.fail_sampling / fail_step) for the requests planned to
fail. A cancel planned for the final step is sent from inside the fail_step hook, i.e. while that
step is running, exactly like a client whose cancel arrives too late.

What it remembers per request lives in preallocated numpy arrays (Outcomes), so the bookkeeping of
the leak check itself does not grow host memory while the host-growth slope is being measured.
It also notes which requests were in the step during which each device allocation that outlived
its step was made, so a leaked allocation can be traced to its owners.
"""

from __future__ import annotations

import itertools
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from hipcore.engine.engine import EngineHooks
from hipcore.engine.request import CancelResult, Ending, Phase, Request
from profiles.trace_events import graph_replays
from profiles.leak_progress import PreemptionProgress, blocks_not_back, fruitless_preemption
from profiles.leak_workload import MAX_SAMPLES, Plan, RequestPlan, Workload, ACCEPTED_ENDINGS

ENDINGS = tuple(Ending)
PHASES = tuple(Phase)
STALL_STEPS = 3  # steps in a row with nothing computed and nothing ended while work is queued
MAX_NOTES = 20  # unexpected endings and cancel anomalies kept verbatim for the report
OWNER_REQUESTS_SHOWN = 8


class Outcomes:
    """Per-request results in fixed arrays, indexed by the workload's request index."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.kind = np.full(capacity, -1, dtype=np.int8)
        self.samples = np.zeros(capacity, dtype=np.int16)  # n <= 1024 (rejected requests ask for many)
        self.run_phase = np.full(capacity, -1, dtype=np.int16)  # the leak check's phase (0 = warm-up)
        self.request_id = np.full(capacity, -1, dtype=np.int64)
        self.ending = np.full(capacity, -1, dtype=np.int8)  # index into ENDINGS
        self.phase_at_end = np.full(capacity, -1, dtype=np.int8)  # index into PHASES
        self.preemptions = np.zeros(capacity, dtype=np.int32)
        self.seq_ids = np.full((capacity, MAX_SAMPLES), -1, dtype=np.int64)
        self.collateral = np.zeros(capacity, dtype=bool)  # failed with a batch whose step was made to fail
        self.expected = np.zeros(capacity, dtype=bool)
        self.cancel_sent = np.zeros(capacity, dtype=bool)
        self._by_request: dict[int, int] | None = None

    def done(self) -> np.ndarray:
        return self.ending >= 0

    def index_of_request(self, request_id: int) -> int | None:
        hits = np.nonzero(self.request_id == request_id)[0]
        return int(hits[0]) if len(hits) else None

    def index_of_sequence(self, seq_id: int) -> int | None:
        hits = np.nonzero((self.seq_ids == seq_id).any(axis=1))[0]
        return int(hits[0]) if len(hits) else None

    def describe(self, index: int, phase_names: list[str]) -> dict:
        """The owner of a leaked resource, as the report prints it."""
        ending = ENDINGS[self.ending[index]].value if self.ending[index] >= 0 else "still running"
        phase = PHASES[self.phase_at_end[index]].value if self.phase_at_end[index] >= 0 else "-"
        run_phase = int(self.run_phase[index])
        return {
            "request_id": int(self.request_id[index]), "plan": Plan(int(self.kind[index])).label,
            "ending": ending, "phase_at_end": phase,
            "run_phase": phase_names[run_phase] if 0 <= run_phase < len(phase_names) else str(run_phase),
            "collateral": bool(self.collateral[index]), "preemptions": int(self.preemptions[index]),
        }


@dataclass
class _InFlight:
    plan: RequestPlan
    request: Request
    phase_before_step: Phase
    progress: PreemptionProgress = field(default_factory=PreemptionProgress)


@dataclass
class EngineFailure:
    """The engine raised out of step() or shutdown(): the run stops and the checks report it."""

    where: str
    message: str
    traceback_tail: str
    raised: bool = True  # False: the driver ended the run (no progress, or past the deadline)


class WorkloadDriver:
    def __init__(self, engine, workload: Workload, outcomes: Outcomes, *, parallel: int, ledger,
                 on_step: Callable[[], None] | None = None, deadline: float | None = None):
        self.engine = engine
        self.deadline = deadline  # time.monotonic() after which the run ends as failed
        self.workload = workload
        self.outcomes = outcomes
        self.parallel = parallel
        self.ledger = ledger
        self.on_step = on_step
        self.timeline = None  # a MemoryTimeline: each request's span
        self.trace = None  # a TraceRecorder: each step and request
        self.inflight: dict[int, _InFlight] = {}
        self.run_phase = 0
        self.dropping_expected = False  # set for the requests left in flight when the engine is shut down
        self.steps = 0
        self.failure: EngineFailure | None = None
        self.stalls: list[str] = []
        self.notes: list[str] = []  # unexpected endings and cancel anomalies (first MAX_NOTES)
        self.note_count = 0
        self.injected = {"fail_sampling": 0, "fail_step": 0, "final_step_cancels": 0}
        self.step_owner: dict[int, str] = {}  # allocation serial -> who was in the step that made it
        self._last_batch: list[int] = []
        self._ledger_counts = ledger.count_by_tag()
        self._ledger_serial = max((a.serial for a in ledger.live()), default=0)

    # ---- the engine's fault-injection hooks -----------------------------------------------------

    def hooks(self) -> EngineHooks:
        return EngineHooks(fail_sampling=self._fail_sampling, fail_step=self._fail_step)

    def _fail_sampling(self, request: Request) -> bool:
        entry = self.inflight.get(request.request_id)
        if entry is None or entry.plan.kind != Plan.FAIL_SAMPLING or _generated(request) < entry.plan.trigger:
            return False
        self.injected["fail_sampling"] += 1
        return True

    def _fail_step(self, requests: list[Request]) -> bool:
        self._last_batch = [r.request_id for r in requests]
        fail = False
        for request in requests:
            entry = self.inflight.get(request.request_id)
            if entry is None:
                continue
            plan = entry.plan
            if plan.kind == Plan.FAIL_STEP and _generated(request) >= plan.trigger:
                fail = True
            elif (plan.kind == Plan.CANCEL_FINAL and not self.outcomes.cancel_sent[plan.index]
                  and request.seqs and not request.seqs[0].in_prompt and _generated(request) == plan.params.max_tokens - 1):
                # This step samples its last token: the cancel arrives while it runs, and must lose.
                self.outcomes.cancel_sent[plan.index] = True
                self.injected["final_step_cancels"] += 1
                self.engine.cancel(request.request_id)
        if fail:
            self.injected["fail_step"] += 1
            for request in requests:
                entry = self.inflight.get(request.request_id)
                if entry is not None and entry.plan.kind != Plan.FAIL_STEP:
                    self.outcomes.collateral[entry.plan.index] = True
        return fail

    # ---- running a phase ------------------------------------------------------------------------

    def run(self, indices: Iterable[int], run_phase: int, progress: Callable[[int], None] | None = None,
            plan_for: Callable[[int], RequestPlan] | None = None) -> None:
        """Run the requests `indices` (planned by `plan_for`, default the workload's mix) to completion,
        or until the engine fails or stalls for good."""
        self.run_phase = run_phase
        plan_for = plan_for or self.workload.plan
        queue = iter(indices)
        upcoming: RequestPlan | None = None
        idle_steps = 0
        while self.failure is None:
            if upcoming is None:
                index = next(queue, None)
                upcoming = None if index is None else plan_for(index)
            while upcoming is not None and self._slots_taken() + upcoming.slots <= self.parallel:
                self._submit(upcoming)
                index = next(queue, None)
                upcoming = None if index is None else plan_for(index)
            if not self.inflight and upcoming is None:
                self._drain_inbox()
                return
            steps_before, finished_before = self.engine.stats.steps, int(self.outcomes.done().sum())
            if not self._step():
                return
            finished = self._collect()
            if progress is not None and finished:
                progress(finished)
            progressed = self.engine.stats.steps != steps_before or int(self.outcomes.done().sum()) != finished_before
            idle_steps = 0 if progressed else idle_steps + 1
            if idle_steps >= STALL_STEPS:
                self._break_stall()
                idle_steps = 0
            if self._end_if_no_progress():
                return
            self._fire_cancels()

    def finish_in_flight(self, max_steps: int) -> None:
        """Step at most max_steps times without submitting anything (used before a shutdown)."""
        for _ in range(max_steps):
            if self.failure is not None or not self.inflight:
                return
            if not self._step():
                return
            self._collect()

    def _drain_inbox(self) -> None:
        """Step until the engine has nothing left, e.g. a cancel that arrived during a request's
        final step and is processed (as a no-op) at the start of the next one."""
        for _ in range(STALL_STEPS):
            if self.failure is not None or not self.engine.has_work():
                return
            if not self._step():
                return
        if self.engine.has_work():
            self.stalls.append(f"run phase {self.run_phase}: with no request in flight the engine still has work after "
                               f"{STALL_STEPS} steps ({len(self.engine.scheduler.waiting)} waiting, "
                               f"{len(self.engine.scheduler.running)} running)")

    def submit_tail(self, plans: list[RequestPlan]) -> None:
        for plan in plans:
            if self._slots_taken() + plan.slots <= self.parallel:
                self._submit(plan)

    def record_shutdown(self) -> None:
        """After Engine.shutdown(): every request still in flight has ended (dropped)."""
        self._collect()

    # ---- internals ------------------------------------------------------------------------------

    def _slots_taken(self) -> int:
        return sum(entry.plan.slots for entry in self.inflight.values())

    def _submit(self, plan: RequestPlan) -> None:
        out, i = self.outcomes, plan.index
        rid = self.engine.submit(plan.prompt, plan.params, tag=plan.kind.label)
        request = self.engine.request(rid)
        out.kind[i], out.samples[i], out.run_phase[i], out.request_id[i] = int(plan.kind), plan.params.n, self.run_phase, rid
        self.inflight[rid] = _InFlight(plan, request, Phase.WAITING)
        if self.timeline is not None:
            self.timeline.request_started(rid, plan.kind.label)
        if self.trace is not None:
            self.trace.request_started(rid, plan.kind.label)
        if plan.cancel_at_once:
            self._cancel(rid, plan)

    def _step(self) -> bool:
        for entry in self.inflight.values():
            entry.phase_before_step = entry.request.phase
        self._last_batch = []
        started, replays = time.perf_counter(), graph_replays(self.engine)
        try:
            self.engine.step()
        except Exception as exc:  # the run cannot go on: report what the engine said, then check
            self.failure = EngineFailure(f"engine.step() in run phase {self.run_phase}", f"{type(exc).__name__}: {exc}",
                                         "".join(traceback.format_exc(limit=6).splitlines(keepends=True)[-12:]))
            self._collect()
            return False
        self.steps += 1
        if self.trace is not None:
            self.trace.step(started, time.perf_counter(), len(self.inflight), graph_replays(self.engine) - replays)
        self._note_new_allocations()
        if self.on_step is not None:
            self.on_step()
        return True

    def _collect(self) -> int:
        """Record the requests that ended; returns how many."""
        ended = [rid for rid, entry in self.inflight.items() if entry.request.phase == Phase.FINISHED]
        for rid in ended:
            self._record(self.inflight.pop(rid))
        return len(ended)

    def _record(self, entry: _InFlight) -> None:
        out, plan, request = self.outcomes, entry.plan, entry.request
        i = plan.index
        ending = request.ending or Ending.DROPPED
        record = self.engine.finished_record(request.request_id)
        phase = record.phase_at_end if record is not None else entry.phase_before_step
        out.ending[i] = ENDINGS.index(ending)
        if self.timeline is not None:
            self.timeline.request_ended(request.request_id, ending.value)
        if self.trace is not None:
            self.trace.request_ended(request.request_id, ending.value)
        out.phase_at_end[i] = PHASES.index(phase)
        out.preemptions[i] = request.preemptions
        for k, seq in enumerate(request.seqs[:MAX_SAMPLES]):
            out.seq_ids[i, k] = seq.seq_id
        accepted = ending.value in ACCEPTED_ENDINGS[plan.kind] or (ending == Ending.FAILED and out.collateral[i])
        accepted = accepted or (ending == Ending.DROPPED and self.dropping_expected)  # the shutdown tail drops on purpose
        out.expected[i] = accepted
        if not accepted:
            self._note(f"request {request.request_id} ({plan.kind.label}) ended {ending.value} in {phase.value}"
                       + (f": {request.error}" if request.error else ""))
        if plan.kind == Plan.CANCEL_FINAL and out.cancel_sent[i]:
            # Cancelling a request that has ended is a clear no-op, never a second ending.
            result = self.engine.cancel(request.request_id)
            if result == CancelResult.CANCELLED:
                self._note(f"cancel of request {request.request_id} after it ended returned {result.value}")

    def _fire_cancels(self) -> None:
        for rid, entry in list(self.inflight.items()):
            plan, request = entry.plan, entry.request
            if self.outcomes.cancel_sent[plan.index] or request.phase == Phase.FINISHED:
                continue
            kind = plan.kind
            if kind == Plan.CANCEL_WAITING:
                fire = True
            elif kind == Plan.CANCEL_PROMPT:
                # Between two chunks of its prompt; if the whole prompt went in one step, now.
                fire = request.phase != Phase.WAITING and bool(request.seqs) and request.seqs[0].num_cached > 0
            elif kind in (Plan.CANCEL_DECODE, Plan.PARALLEL_CANCEL):
                fire = _generated(request) >= plan.trigger
            else:
                fire = False
            if fire:
                self._cancel(rid, plan)

    def _cancel(self, rid: int, plan: RequestPlan) -> None:
        self.outcomes.cancel_sent[plan.index] = True
        result = self.engine.cancel(rid)
        if result != CancelResult.CANCELLED:
            self._note(f"cancel of live request {rid} ({plan.kind.label}) returned {result.value}")

    def _break_stall(self) -> None:
        """Nothing ran and nothing ended for several steps although requests are queued: blocks are
        not coming back. Cancel everything in flight so the run can reach its checks."""
        engine = self.engine
        self.stalls.append(
            f"run phase {self.run_phase}: the engine made no progress for {STALL_STEPS} steps with "
            f"{len(engine.scheduler.waiting)} requests waiting, {len(engine.scheduler.running)} running and "
            f"{engine.cache.num_free_blocks} of {engine.cache.num_usable_blocks} KV blocks free; "
            f"cancelled the {len(self.inflight)} requests in flight"
        )
        for rid, entry in list(self.inflight.items()):
            self.outcomes.cancel_sent[entry.plan.index] = True
            engine.cancel(rid)
        for _ in range(STALL_STEPS):
            if not self.inflight or not self._step():
                break
            self._collect()
        if self.inflight and self.failure is None:
            self.failure = EngineFailure(f"run phase {self.run_phase}", "the engine stalled and did not end the "
                                         f"{len(self.inflight)} requests cancelled to break the stall", "")

    # ---- progress: tokens that stay generated, not steps ------------------------------------------

    def _end_if_no_progress(self) -> bool:
        """End the run (as a failure) when a request keeps being preempted without keeping a new
        token, or when the run is past its deadline: steps that compute and throw their work away
        are not progress, and a leak that causes them must end the run, not hang it."""
        reason = fruitless_preemption(self.inflight.items())
        if reason is None and self.deadline is not None and time.monotonic() > self.deadline:
            reason = "the run is past its deadline (--deadline)"
        if reason is None:
            return False
        engine = self.engine
        self.stalls.append(f"run phase {self.run_phase}: no progress: {reason}; {engine.cache.num_free_blocks} of "
                           f"{engine.cache.num_usable_blocks} KV blocks free; cancelled the {len(self.inflight)} "
                           "requests in flight and ended the run")
        for rid, entry in list(self.inflight.items()):
            self.outcomes.cancel_sent[entry.plan.index] = True
            engine.cancel(rid)
        for _ in range(STALL_STEPS):
            if not self.inflight or not self._step():
                break
            self._collect()
        self.failure = EngineFailure(f"run phase {self.run_phase}", f"no progress: {reason}; {blocks_not_back(engine.cache)}",
                                     "", raised=False)
        return True

    def _note_new_allocations(self) -> None:
        """Attribute device allocations that outlived this step to the requests in it."""
        counts = self.ledger.count_by_tag()
        if counts == self._ledger_counts:
            return
        self._ledger_counts = counts
        owners = self._last_batch or []
        names = ", ".join(str(r) for r in owners[:OWNER_REQUESTS_SHOWN]) + (" ..." if len(owners) > OWNER_REQUESTS_SHOWN else "")
        owner = f"step {self.steps} of run phase {self.run_phase}" + (f", requests {names}" if owners else "")
        live = self.ledger.live()
        for alloc in live:
            if alloc.serial > self._ledger_serial:
                self.step_owner[alloc.serial] = owner
        self._ledger_serial = max(itertools.chain((self._ledger_serial,), (a.serial for a in live)))

    def forget_freed_owners(self) -> None:
        live = {a.serial for a in self.ledger.live()}
        for serial in [s for s in self.step_owner if s not in live]:
            del self.step_owner[serial]

    def _note(self, text: str) -> None:
        self.note_count += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)


def _generated(request: Request) -> int:
    if not request.seqs:
        return 0
    seq = request.seqs[0]
    return len(seq.tokens) - seq.num_prompt
