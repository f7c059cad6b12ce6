"""The Engine: submit, step, stream, cancel — and ONE release path for every way a request ends.

An earlier implementation of this tool freed KV blocks on cancel but not on normal completion.
Here every ending (EOS, stop string, max tokens, cancelled, failed, rejected, dropped) goes through
`_end_request` -> `_release_sequence` (hipcore/engine/endings.py), the only code that gives a sequence's blocks back; finished
records are kept up to a bound; cancelling a finished or unknown request is a no-op.

Threading: one thread owns the engine state and calls step(); submit() and cancel() may be called
from any thread: they only touch an inbox under a lock, which step() drains while the device is
idle. Each request has its own event queue, so consumers on other threads can stream it.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Iterator, Sequence as Seq

import numpy as np

from hipcore.engine.endings import SequenceEndings
from hipcore.engine.hooks import EngineHooks, EngineStats, InjectedFault
from hipcore.engine.request import CancelResult, Ending, Event, FinishedRecord, Phase, Request, Sequence
from hipcore.engine.grammar import TokenConstraint, grammar_vocabulary
from hipcore.engine.sampler import Sampler, StopChecker
from hipcore.engine.scheduler import Scheduled, Scheduler
from hipcore.engine.step_launch import LaunchedStep, StepLauncher, requests_of
from hipcore.engine.steps_ahead import StepsAhead
from hipcore.errors import UsageError
from hipcore.kvcache.cache import KvCache
from hipcore.model.runner import Runner
from hipcore.ops.kernel_choice import SWITCHES
from hipcore.tokenizer.tokenizer import Tokenizer


class Engine(SequenceEndings, StepsAhead):
    def __init__(self, runner: Runner, tokenizer: Tokenizer, cache: KvCache, *, max_seqs: int = 64, max_step_tokens: int = 512,
                 max_context: int | None = None, finished_bound: int = 1000, hooks: EngineHooks | None = None,
                 overlap: bool | None = None):
        """runner executes each step's StepBatch (hipcore/model/runner.py); cache holds the sequences' KV blocks.
        overlap: launch the next decode step before handling this one's tokens where the runner can
        (step_launch.py); default kernel_choice.SWITCHES.step_overlap (off: ROCMFORGE_STEP_OVERLAP=0)."""
        if finished_bound < 0:
            raise ValueError("finished_bound must be >= 0")
        self.runner = runner
        self.tokenizer = tokenizer
        self.cache = cache
        self.scheduler = Scheduler(cache, max_seqs=max_seqs, max_step_tokens=max_step_tokens)
        self.max_context = min(max_context or runner.config.context_length, runner.config.context_length)
        self.finished_bound = finished_bound
        self.hooks = hooks or EngineHooks()
        self.stats = EngineStats()
        self._request_ids = itertools.count(1)
        self._seq_ids = itertools.count(1)
        self._active: dict[int, Request] = {}  # submitted and not ended (waiting, running, or in the inbox)
        self._finished: collections.OrderedDict[int, FinishedRecord] = collections.OrderedDict()
        self._inbox: list[tuple[str, object]] = []
        self._lock = threading.Lock()  # guards _active, _finished, _inbox between threads
        self._step_lock = threading.Lock()  # exactly one thread steps at a time
        self._closed = False
        self._launcher = StepLauncher(cache, overlap=SWITCHES.step_overlap if overlap is None else overlap)
        self._running_step: LaunchedStep | None = None  # a decode step left running; step() reads its tokens

    # ---- any thread ---------------------------------------------------------------------------

    def submit(self, prompt: str | Seq[int], params, *, tag: str = "") -> int:
        """Queue a request; returns its id. Prompt text is tokenized with the model's tokenizer."""
        if self._closed:
            raise UsageError("the engine is shut down")
        params.validate()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise UsageError("the prompt is empty: give at least one token")
        vocab = self.runner.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise UsageError(f"prompt token id out of range (vocabulary size {vocab})")
        if len(ids) >= self.max_context:
            raise UsageError(
                f"the prompt has {len(ids)} tokens but the context holds {self.max_context}: "
                "shorten the prompt or raise --ctx-size"
            )
        with self._lock:
            if self._closed:  # checked again under the lock: shutdown() may have run meanwhile
                raise UsageError("the engine is shut down")
            rid = next(self._request_ids)
            request = Request(rid, list(ids), params, arrival=rid, tag=tag)
            self._active[rid] = request
            self._inbox.append(("submit", request))
        return rid

    def cancel(self, request_id: int) -> CancelResult:
        """End a request at the start of the next step. A finished or unknown id is a clear no-op."""
        with self._lock:
            if request_id in self._active:
                self._inbox.append(("cancel", request_id))
                return CancelResult.CANCELLED
            if request_id in self._finished:
                return CancelResult.ALREADY_FINISHED
            return CancelResult.UNKNOWN

    def finished_record(self, request_id: int) -> FinishedRecord | None:
        with self._lock:
            return self._finished.get(request_id)

    def finished_records(self) -> list[FinishedRecord]:
        with self._lock:
            return list(self._finished.values())

    @property
    def active_count(self) -> int:
        with self._lock:
            return len(self._active)

    def request(self, request_id: int) -> Request | None:
        with self._lock:
            return self._active.get(request_id)

    # ---- the owner thread ---------------------------------------------------------------------

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._inbox) or self.scheduler.has_work or self._running_step is not None

    def step(self) -> list[Event]:
        """Run one iteration: drain the inbox, schedule, run the forward pass, sample, stream."""
        if not self._step_lock.acquire(blocking=False):
            raise RuntimeError("Engine.step() called from two threads at once; one thread owns the engine")
        try:
            t0 = time.perf_counter()
            events: list[Event] = []
            running = self._running_step
            if running is not None:
                # The step after it goes ahead (launched before its tokens are read) unless requests came or
                # went meanwhile; then its tokens, and only then the inbox: a cancel that came while it ran
                # loses to it, as it would have with the step done before the cancel was read.
                with self._lock:
                    quiet = not self._inbox
                self._running_step = ahead = self._chain_after(running, events) if quiet else None
                events += self._complete(running)
                if ahead is not None and ahead.awaiting_masks:  # its grammars have taken running's tokens now
                    self._running_step = ahead = self._sample_ahead(ahead, events)
                if ahead is not None:
                    self._release_settled()
                    self.stats.step_seconds += time.perf_counter() - t0
                    return events
            events += self._drain_inbox()
            plan = self.scheduler.schedule()
            self.stats.preemptions += len(plan.preempted)
            for request, message in plan.rejected:
                events += self._end_request(request, Ending.REJECTED, message)
            self.stats.note_admitted(plan.admitted)
            if plan.scheduled:
                launched = self._launch(plan.scheduled, events)
                self.stats.steps += 1
                if launched is not None and launched.pending is not None and launched.followable:
                    self._running_step = launched  # its tokens are read in the next call
                elif launched is not None:
                    events += self._complete(launched)
            self._release_settled()
            self.stats.step_seconds += time.perf_counter() - t0
            return events
        finally:
            self._step_lock.release()

    def forget_history(self) -> None:
        """Clear the counters (EngineStats), the finished records and the prefix cache (its blocks and hit counts),
        as if no request had run: a server's warm-up (hipcore/engine/warmup.py) leaves nothing of its own requests
        in what its clients read. Idle engines only."""
        with self._lock:
            if self._active or self._inbox or self._running_step is not None:
                raise ValueError("forget_history needs an idle engine")
            self._finished.clear()
        self.stats = EngineStats()
        self.cache.release_fenced()
        self.cache.flush_prefix_cache()
        self.cache.reset_prefix_counts()

    def run_until_idle(self, max_steps: int | None = None) -> list[Event]:
        events: list[Event] = []
        for _ in itertools.count() if max_steps is None else range(max_steps):
            if not self.has_work():
                break
            events += self.step()
        return events

    def generate(self, prompt: str | Seq[int], params, *, tag: str = "") -> Iterator[Event]:
        """Submit one request and step the engine until it ends, yielding its events as they come.

        A consumer that stops early (close(), break, the generator collected, an exception such as
        Ctrl-C) cancels the request, and its blocks go back to the pool before close() returns."""
        rid = self.submit(prompt, params, tag=tag)
        request = self.request(rid)
        assert request is not None
        try:
            while True:
                while not request.events.empty():
                    event = request.events.get_nowait()
                    yield event
                    if event.finished and request.phase == Phase.FINISHED and request.events.empty():
                        return
                if not self.has_work():
                    return
                self.step()
        finally:
            if request.phase != Phase.FINISHED:
                self._cancel_now(rid)

    def _cancel_now(self, request_id: int) -> None:
        """Cancel and release at once (the caller owns the engine between steps, as generate() does)."""
        if self.cancel(request_id) != CancelResult.CANCELLED:
            return
        with self._step_lock:
            self._drain_inbox()
            self._settle()

    def shutdown(self, ending: Ending = Ending.DROPPED) -> list[Event]:
        """End every request still queued or running (through the release path) and refuse new ones."""
        with self._step_lock:
            with self._lock:  # after this, no submit() can reach the inbox: the drain below sees every request
                self._closed = True
            events = self._drain_inbox()
            events += self._settle()
            for request in list(self.scheduler.running) + list(self.scheduler.waiting):
                events += self._end_request(request, ending, "the engine shut down before it finished")
            self.cache.release_fenced()
            self._launcher.clear()
            return events

    # ---- internals (owner thread only) --------------------------------------------------------

    def _drain_inbox(self) -> list[Event]:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        events: list[Event] = []
        for kind, item in inbox:
            if kind == "submit":
                request = item
                assert isinstance(request, Request)
                if request.phase == Phase.FINISHED:  # cancelled before it was ever queued
                    continue
                message = self.scheduler.never_fits(request, self._max_new_tokens(request))
                if message:
                    events += self._end_request(request, Ending.REJECTED, message)
                else:
                    request.seqs.append(self._new_sequence(request, list(request.prompt_ids)))
                    self.scheduler.add(request)
            else:
                request = self._active.get(item)  # type: ignore[arg-type]
                if request is not None:
                    events += self._end_request(request, Ending.CANCELLED)
        # Blocks of cancelled requests wait for the step running (if one is), then are safe to reuse.
        self._release_settled()
        return events

    def _release_settled(self) -> None:
        """Blocks freed since the device last finished its work become free again (the step fence): all of
        them when no step is running, else those freed before the running step was launched."""
        running = self._running_step
        if running is None:
            self.cache.release_fenced()
        elif running.fence > 1:
            self.cache.release_fenced(running.fence - 1)

    def _settle(self) -> list[Event]:
        """Wait for the step left running, if any, and take its tokens; then every freed block is free."""
        running, self._running_step = self._running_step, None
        events = self._complete(running) if running is not None else []
        self.cache.release_fenced()
        return events

    def _max_new_tokens(self, request: Request) -> int:
        return max(1, min(request.params.max_tokens, self.max_context - len(request.prompt_ids)))

    def _new_sequence(self, request: Request, tokens: list[int]) -> Sequence:
        seq = Sequence(next(self._seq_ids), request, tokens, num_prompt=len(request.prompt_ids))
        params = request.params
        seq.decoder = self.tokenizer.stream_decoder()
        seq.sampler = Sampler(params.for_sample(len(request.seqs)), constraint=self._constraint(params))
        eos_ids = () if params.ignore_eos else self.tokenizer.eot_ids
        # The checker releases the text into the sequence's output itself.
        seq.stop_checker = StopChecker(eos_ids=eos_ids, stop_strings=params.stop, max_tokens=params.max_tokens,
                                       output=seq.output)
        return seq

    def _constraint(self, params) -> TokenConstraint | None:
        """A new sequence's grammar state when its request is constrained (the vocabulary's view built once)."""
        if params.grammar is None:
            return None
        return TokenConstraint(grammar_vocabulary(self.tokenizer), params.grammar)

    def _launch(self, scheduled: list[Scheduled], events: list[Event]) -> LaunchedStep | None:
        """Launch the scheduler's step; None (its requests failed, with events) if the launch failed."""
        try:
            launched = self._launcher.launch(self.runner, scheduled)
        except Exception as exc:  # the step failed: fail its requests cleanly, keep serving the rest
            self._fail(requests_of(scheduled), f"the forward pass failed: {exc}", events)
            return None
        stats = self.stats
        prompt_tokens = stats.prompt_tokens
        for seq, num_tokens, _ in scheduled:
            seq.num_cached += num_tokens
            if seq.request.phase is Phase.PROMPT:
                stats.prompt_tokens += num_tokens
        stats.prompt_steps += stats.prompt_tokens != prompt_tokens
        return launched

    def _complete(self, launched: LaunchedStep) -> list[Event]:
        """Read the step's tokens (waiting for the device) and accept them, or fail its requests."""
        scheduled = launched.scheduled
        requests = [r for r in requests_of(scheduled) if r.phase is not Phase.FINISHED]
        events: list[Event] = []
        try:
            t0 = time.perf_counter()
            self._launcher.read(self.runner, launched)
            self.stats.device_wait_seconds += time.perf_counter() - t0
            if self.hooks.fail_step is not None and requests and self.hooks.fail_step(requests):
                raise InjectedFault("injected forward-pass failure (fault-injection hook)")
        except Exception as exc:  # the step failed: fail its requests cleanly, keep serving the rest
            self._fail(requests, f"the forward pass failed: {exc}", events)
            return events
        logits, picked, host_rows = launched.logits, launched.picked, launched.host_rows
        row = 0
        for seq, _, samples in scheduled:  # `samples` was decided before num_cached advanced
            if samples:
                if picked is None:
                    self._sample(seq, events, logits[row])
                elif host_rows is not None and row in host_rows:
                    self._sample(seq, events, logits[host_rows[row]])
                else:
                    self._sample(seq, events, None, picked=picked[row])
                row += 1
        return events

    def _fail(self, requests: list[Request], message: str, events: list[Event]) -> None:
        for request in requests:
            events += self._end_request(request, Ending.FAILED, message)

    def _sample(self, seq: Sequence, events: list[Event], logits: np.ndarray | None, picked: int | None = None) -> None:
        """Accept the step's token for `seq` (`picked` on the device, or sampled here from `logits`), adding its
        events to `events`."""
        request = seq.request
        phase = request.phase
        if phase is Phase.FINISHED or seq.finished:
            return
        mark = len(events)
        try:
            if self.hooks.fail_sampling is not None and self.hooks.fail_sampling(request):
                raise InjectedFault("injected sampler failure (fault-injection hook)")
            targets: Seq[Sequence] = (seq,)
            if phase is not Phase.DECODE:  # its first token (a decoding request has one, and first_token_at)
                if phase is Phase.PROMPT and len(request.seqs) == 1 and request.params.n > 1:
                    self._fork_samples(request)  # every sample draws its first token from these logits
                    targets = list(request.seqs)
                request.phase = Phase.DECODE
                # Its prompt's K/V are written (this step finished): later prompts that start alike may share them.
                self.cache.register_computed(seq.seq_id, seq.tokens[:seq.num_prompt], seq.block_keys)
                if request.first_token_at is None:
                    request.first_token_at = time.perf_counter()
                    self.stats.first_token_time.observe(request.first_token_at - request.submitted_at)
            for target in targets:
                if picked is not None:
                    token = picked
                    target.sampler.accept_picked(token)
                else:
                    token = target.sampler.sample(logits, target.tokens)
                self._accept_token(target, token, events)
        except Exception as exc:
            # The events of this request made before the failure stay in its queue but not in the step's list.
            del events[mark:]
            events += self._end_request(request, Ending.FAILED, f"sampling failed: {exc}")

    def _fork_samples(self, request: Request) -> None:
        """n parallel samples: children share every prompt block of the first sequence (no copy)."""
        parent = request.seqs[0]
        for _ in range(request.params.n - 1):
            child = self._new_sequence(request, list(parent.tokens))
            child.copy_block_keys(parent)  # the prompt's blocks hashed once for all the samples
            child.num_cached = parent.num_cached
            self.cache.fork(parent.seq_id, child.seq_id)
            request.seqs.append(child)
