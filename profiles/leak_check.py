"""`rocmforge leak-check`: prove that every KV block and every device byte comes back.

The run: load the model through the normal loader, warm up (modules, kernels, one batch of the
same mix), take the baseline, then run the seeded workload (leak_workload) in phases through the
real engine (leak_driver). After every phase the engine is idle and each layer is read (leak_layers):
engine state, the ledger against the baseline, the KV pool, the driver's free memory, host memory.
At the end a few requests are left in flight and the engine is shut down (they are dropped), and
the model is closed: the ledger must then be empty. leak_report judges the readings.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections import Counter
from typing import Protocol

from hipcore.engine.engine import EngineHooks
from hipcore.errors import RocmforgeError
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.engine.request import Ending, Phase
from hipcore.engine.warmup import batch_ladder
from hipcore.model.forward import PROMPT_PLAN_CACHE_SIZE
from profiles import leak_bugs
from profiles.leak_handles import read_handles
from profiles.leak_driver import ENDINGS, PHASES, EngineFailure, Outcomes, WorkloadDriver
from profiles.leak_layers import (
    HostMonitor, read_blocks, read_driver, read_engine_state, read_ledger, read_rss, step_invariant_error, BlockReading,
)
from profiles.leak_report import HostFit, HostResult, LeakReport, PhaseResult, judge
from profiles.leak_settings import LeakCheckSettings
from profiles.memory_timeline import MemoryTimeline
from profiles.leak_workload import Plan, Workload, text_prompts

HOST_SAMPLES = 200  # host-memory samples over the run (plus one per phase end)
SHUTDOWN_STEPS = 2  # steps the final requests run before the engine is shut down under them
MAX_STALL_MESSAGES = 10


class ProgressSink(Protocol):
    def status(self, text: str) -> None: ...
    def start(self, total: int, description: str) -> None: ...
    def advance(self, n: int) -> None: ...
    def blocks(self, used: int, usable: int) -> None: ...  # KV blocks in use, after every engine step


def run_leak_check(settings: LeakCheckSettings, progress: ProgressSink | None = None, trace=None) -> LeakReport:
    """`trace`: a TraceRecorder (profiles/trace_events.py) to record allocations, steps and requests into."""
    settings.validate()
    started = time.perf_counter()
    say = progress.status if progress is not None else (lambda _text: None)
    shape = settings.shape()
    kv_blocks = settings.kv_blocks if settings.kv_blocks is not None else shape.default_kv_blocks()
    hooks = EngineHooks()  # filled in once the driver exists; the engine keeps this object
    options = LoadOptions(device=settings.device, max_seqs=settings.parallel, max_step_tokens=settings.step_tokens,
                          kv_dtype=settings.kv_dtype, block_size=shape.block_size, kv_blocks=kv_blocks,
                          finished_bound=settings.finished_bound, hooks=hooks, prefix_caching=settings.prefix_caching)
    loaded = load_model(settings.model, options, status=say)
    started_tracing = False
    try:
        run = _Run(settings, loaded, hooks, kv_blocks, progress)
        if trace is not None:
            trace.seed(loaded.device.ledger.live())
            loaded.device.ledger.observer, run.driver.trace = trace.ledger_event, trace
        if settings.planted_bug:
            leak_bugs.plant(settings.planted_bug, loaded)
            say(f"planted bug: {settings.planted_bug} ({leak_bugs.BUGS[settings.planted_bug].description})")
        if settings.tracemalloc and not tracemalloc.is_tracing():
            tracemalloc.start(1)
            started_tracing = True
        report = run.execute(started)
    finally:
        if not loaded.closed:  # an unexpected error: still give everything back
            try:
                loaded.close()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        loaded.device.close()
        if started_tracing:
            tracemalloc.stop()
    report.findings = judge(report)
    report.timeline = run.timeline
    run.timeline.mark_verdict(report.verdict, report.findings)
    return report


class _Run:
    """One leak-check run over a loaded model (split from run_leak_check to keep each step short)."""

    def __init__(self, settings: LeakCheckSettings, loaded, hooks: EngineHooks, kv_blocks: int, progress):
        self.s = settings
        self.loaded = loaded
        self.engine = loaded.engine
        self.cache = loaded.cache
        self.device = loaded.device
        self.progress = progress
        self.kv_blocks = kv_blocks
        shape = settings.shape()
        text, chat = text_prompts(loaded)
        self.workload = Workload(shape, loaded.config.vocab_size, loaded.cache.num_usable_blocks,
                                 self.engine.max_context, text, chat)
        # Request indices: warm-up mix, batch-size ladder, record fillers, the measured requests, the tail.
        self.ladder = batch_ladder(settings.parallel) if settings.warmup_requests else []
        self.prompt_lengths = (prompt_shape_lengths(settings.step_tokens, self.engine.max_context,
                                                    loaded.cache.num_usable_blocks * shape.block_size)
                               if settings.warmup_requests else [])
        self.fillers = settings.finished_bound
        self.first = (settings.warmup_requests + sum(self.ladder) + len(self.prompt_lengths)
                      + self.fillers)  # the first measured request
        self.tail = settings.parallel
        self.outcomes = Outcomes(self.first + settings.requests + self.tail)
        self.driver = WorkloadDriver(self.engine, self.workload, self.outcomes, parallel=settings.parallel,
                                     ledger=self.device.ledger, on_step=self._on_step)
        driver_hooks = self.driver.hooks()
        hooks.fail_sampling, hooks.fail_step = driver_hooks.fail_sampling, driver_hooks.fail_step
        self.monitor = HostMonitor()
        self.sample_every = max(1, settings.requests // HOST_SAMPLES)
        self.next_sample = 0
        self.measuring = False
        self.peak_blocks = 0
        self.step_error: str | None = None  # the first KV invariant a step broke in the phase under way
        self.peak_driver_used: int | None = None
        self.total_memory = self.device.memory_info().total
        self.device_description = self.device.describe()
        self.phases: list[PhaseResult] = []
        self.timeline = MemoryTimeline(f"leak-check {settings.model}", total_blocks=loaded.cache.num_usable_blocks)
        self.driver.timeline = self.timeline
        self.phase_names = ["warm-up"] + [f"phase {k}" for k in range(1, settings.phases + 1)] + ["shutdown"]

    # ---- the run --------------------------------------------------------------------------------

    def execute(self, started: float) -> LeakReport:
        """Run every phase; Ctrl-C stops the run where it is and the report says "interrupted"."""
        self.base: dict = {}
        self.stats_base = (self.engine.stats.preemptions, self.engine.stats.prompt_tokens, self.engine.stats.generated_tokens)
        self.interrupted = False
        try:
            self._run_phases()
        except KeyboardInterrupt:
            self.interrupted = True
            self._status("interrupted: closing the model and reporting what was read so far")
            try:
                self.engine.shutdown()  # drops the requests in flight, so that closing the model can free everything
            except Exception:  # noqa: BLE001 - an interrupted run concludes nothing; close() still runs
                pass
        return self._report(started)

    def _run_phases(self) -> None:
        s, driver = self.s, self.driver
        self._status(f"warm-up: {s.warmup_requests} requests, decode batches of {', '.join(map(str, self.ladder))}, "
                     f"{len(self.prompt_lengths)} prompts of distinct lengths, then {self.fillers} rejected ones to "
                     "fill the finished records; every token's text decoded once")
        before_warmup = self.device.ledger.snapshot()
        driver.deadline = time.monotonic() + s.deadline_seconds()
        t0 = time.perf_counter()
        if self.progress is not None:  # the warm-up's requests counted too: on the cpu backend it takes minutes
            self.progress.start(self.first, "warm-up")
        driver.run(range(s.warmup_requests), run_phase=0, progress=self._advance)
        start = s.warmup_requests
        for size in self.ladder:  # every decode batch-size class once: graphs or plans made per size exist now
            driver.run(range(start, start + size), run_phase=0, plan_for=self.workload.ladder_plan, progress=self._advance)
            start += size
        # Prompts one at a time, each of its own length: the runner keeps the launch plans of a bounded number of
        # prompt-step shapes, now at that bound (on an NVIDIA H200 the GPU tier's run, with 2-10 token prompts,
        # filled it during phase 1 instead: +289 KB of plans, judged a host leak).
        for length in self.prompt_lengths:
            driver.run(range(start, start + 1), run_phase=0, progress=self._advance,
                       plan_for=lambda index, n=length: self.workload.prompt_shape_plan(index, n))
            start += 1
        # The runner's prompt-step plans and graphs (padded shapes, captured at a shape's second step) at their
        # bound too: which padded shapes phase 1's mixed steps take depends on how the requests meet.
        fill_prompt_caches = getattr(self.engine.runner, "fill_prompt_caches", None)
        if fill_prompt_caches is not None:
            fill_prompt_caches()
        driver.run(range(start, self.first), run_phase=0, plan_for=self.workload.filler_plan, progress=self._advance)
        # The tokenizer's per-token caches, bounded by the vocabulary, at their bound: a random-weights model's
        # tokens spread over the whole vocabulary and filled them during the measured phases (H100, the demo's
        # random twin, 4,000 requests: 576 KiB of tracemalloc's 1.2 MB, judged a leak with overlap on or off).
        self.engine.tokenizer.fill_piece_caches()
        warmup = self._check("warm-up", self.first, time.perf_counter() - t0, before_warmup)
        warmup.ledger_judged = False  # first-use allocations belong to the warm-up (RELIABILITY, leak checks 6)
        self.phases.append(warmup)
        gc.collect()
        baseline = self.device.ledger.snapshot()
        driver_base = read_driver(self.device)
        self.device.ledger.reset_peaks()
        self.monitor.take_baseline()
        self.measuring = True
        self.monitor.sample(0)
        self.stats_base = (self.engine.stats.preemptions, self.engine.stats.prompt_tokens, self.engine.stats.generated_tokens)
        self.base = {
            "ledger_bytes": dict(baseline.bytes_by_tag), "ledger_count": dict(baseline.count_by_tag),
            "blocks_used": self.cache.num_usable_blocks - self.cache.num_available_blocks,
            "driver_free": None if driver_base is None else driver_base.free,
            "driver_used": None if driver_base is None else self.total_memory - driver_base.free,
            "rss": read_rss(),
            "handles": read_handles(self.device),
        }
        if self.progress is not None:
            self.progress.start(s.requests, "requests")
        bounds = [self.first + s.requests * k // s.phases for k in range(s.phases + 1)]
        for k in range(1, s.phases + 1):
            if driver.failure is not None:
                break
            t0 = time.perf_counter()
            self._status(f"phase {k} of {s.phases}")
            driver.run(range(bounds[k - 1], bounds[k]), run_phase=k, progress=self._advance)
            gc.collect()
            self.phases.append(self._check(f"phase {k}", bounds[k] - bounds[k - 1], time.perf_counter() - t0, baseline, driver_base))
            self.monitor.sample(self._done_measured())
            driver.forget_freed_owners()
        if driver.failure is None:
            self.phases.append(self._shutdown_with_requests_in_flight(baseline, driver_base))

    def _report(self, started: float) -> LeakReport:
        s, driver = self.s, self.driver
        stats_base, base = self.stats_base, self.base
        host = self._host_result()
        stats_now = (self.engine.stats.preemptions, self.engine.stats.prompt_tokens, self.engine.stats.generated_tokens)
        prefix = None if self.cache.closed else self.cache.memory_profile()  # its hit counts, warm-up included
        close_ledger, close_error = self._close()
        peaks = {"blocks_used": self.peak_blocks, "ledger_bytes": self.device.ledger.peak_by_tag(),
                 "driver_used": self.peak_driver_used, "rss": host.peak_rss}
        requests = self._request_summary()
        requests.update(preemptions=stats_now[0] - stats_base[0], prompt_tokens=stats_now[1] - stats_base[1],
                        generated_tokens=stats_now[2] - stats_base[2], steps=driver.steps, injected=dict(driver.injected))
        if prefix is not None and prefix.prefix_caching:
            requests.update(prefix_query_tokens=prefix.prefix_query_tokens, prefix_hit_tokens=prefix.prefix_hit_tokens)
        failure = driver.failure
        stalls = driver.stalls[:MAX_STALL_MESSAGES] + (
            [f"... and {len(driver.stalls) - MAX_STALL_MESSAGES} more stalls"] if len(driver.stalls) > MAX_STALL_MESSAGES else [])
        return LeakReport(
            command=s.command_line(), settings=s.to_dict() | {"kv_blocks_used": self.kv_blocks}, model=self.loaded.path,
            device=self.device_description,
            backend=self.device.backend, thresholds=s.thresholds, phases=self.phases, close_ledger=close_ledger,
            close_error=close_error, host=host, requests=requests,
            engine_failure=None if failure is None else {"where": failure.where, "message": failure.message,
                                                         "traceback": failure.traceback_tail, "raised": failure.raised},
            stalls=stalls, peaks=peaks, baseline=base, wall_seconds=time.perf_counter() - started,
            load_seconds=self.loaded.load_seconds, planted_bug=s.planted_bug, interrupted=self.interrupted,
        )

    def _shutdown_with_requests_in_flight(self, baseline, driver_base) -> PhaseResult:
        """Leave a few requests mid-prompt / mid-decode, then shut the engine down under them."""
        t0 = time.perf_counter()
        self._status("shutdown with requests in flight")
        driver, start = self.driver, self.first + self.s.requests
        driver.run_phase = len(self.phase_names) - 1
        driver.dropping_expected = True
        driver.submit_tail([self.workload.plan(i) for i in range(start, start + self.tail)])
        driver.finish_in_flight(SHUTDOWN_STEPS)
        try:
            self.engine.shutdown()
        except Exception as exc:  # noqa: BLE001 - reported as an engine failure
            driver.failure = EngineFailure("engine.shutdown()", f"{type(exc).__name__}: {exc}", "")
        driver.record_shutdown()
        gc.collect()
        return self._check("shutdown", self.tail, time.perf_counter() - t0, baseline, driver_base)

    def _close(self):
        self._status("closing the model")
        error = None
        try:
            self.loaded.close()
        except Exception as exc:  # noqa: BLE001 - a close that raises is itself a finding
            error = f"{type(exc).__name__}: {exc}"
            self.loaded.closed = True
        return read_ledger(self.device.ledger, None, self.driver.step_owner), error

    # ---- readings -------------------------------------------------------------------------------

    def _check(self, name: str, requests: int, seconds: float, baseline, driver_base=None) -> PhaseResult:
        engine_state = read_engine_state(self.engine, self.s.finished_bound)
        try:
            blocks = read_blocks(self.cache, self._owner_of_sequence)
            if self.step_error is not None and blocks.invariant_error is None:
                blocks.invariant_error = f"between two steps of {name}: {self.step_error}"
            self.step_error = None
        except RocmforgeError as exc:
            blocks = BlockReading(self.cache.num_usable_blocks, self.cache.num_free_blocks, self.cache.num_pending_blocks,
                                  self.cache.config.bytes_per_block, f"the KV cache could not be read: {exc}")
        ledger = read_ledger(self.device.ledger, baseline, self.driver.step_owner)
        driver = read_driver(self.device) if driver_base is not None else None
        self.timeline.mark("phase", name)
        self.timeline.mark_held(o["request_id"] for b in blocks.leaked for o in b["owners"])
        self._sample()
        return PhaseResult(name, requests, seconds, engine_state, blocks, ledger, driver,
                           None if driver_base is None else driver_base.free, handles=read_handles(self.device))

    def _owner_of_sequence(self, seq_id: int) -> dict | None:
        index = self.outcomes.index_of_sequence(seq_id)
        if index is None:
            return None
        return self.outcomes.describe(index, self.phase_names)

    def _on_step(self) -> None:
        if self.step_error is None:
            self.step_error = step_invariant_error(self.engine)
        used = self.cache.num_usable_blocks - self.cache.num_available_blocks  # (cached blocks are not used)
        self.peak_blocks = max(self.peak_blocks, used)
        if self.progress is not None:
            self.progress.blocks(used, self.cache.num_usable_blocks)
        self.timeline.track_requests(self.cache, ((rid, e.request) for rid, e in self.driver.inflight.items()))
        if self.timeline.due():
            self._sample()
        if not self.measuring:
            return
        done = self._done_measured()
        if done >= self.next_sample:
            self.next_sample = done + self.sample_every
            self.monitor.sample(done)
            free = self.device.driver_free_bytes()
            if free is not None:
                used_driver = self.total_memory - int(free)
                self.peak_driver_used = max(self.peak_driver_used or 0, used_driver)

    def _sample(self) -> None:
        if not self.cache.closed:
            self.timeline.sample_cache(self.cache, self.device.ledger, self.device.driver_free_bytes(), read_rss())

    def _done_measured(self) -> int:
        return int(self.outcomes.done()[self.first:self.first + self.s.requests].sum())

    def _advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.advance(n)

    def _status(self, text: str) -> None:
        if self.progress is not None:
            self.progress.status(text)

    def _host_result(self) -> HostResult:
        m = self.monitor
        tracing = tracemalloc.is_tracing()

        def fit(start: int) -> HostFit:
            rss_slope, samples, span = m.slope("rss", start)
            traced_slope = m.slope("traced", start)[0] if tracing else None
            return HostFit(rss_slope, traced_slope, start, span, samples)

        # The warm-up filled the finished records to their bound: no legitimate growth is left.
        t_bytes, t_count, top = m.tracemalloc_growth()
        traced = tracing and m.baseline_snapshot is not None
        rss = m.values("rss")
        return HostResult(
            available=m.rss_available, baseline_rss=rss[0] if rss else None, peak_rss=max(rss) if rss else None,
            final_rss=rss[-1] if rss else None, whole=fit(0), judged=fit(self.s.requests // 2),
            tracemalloc_bytes=t_bytes, tracemalloc_count=t_count, tracemalloc_top=top,
            series={"requests": m.values("requests"), "rss": rss, "traced": m.values("traced")},
            traced=traced, traced_requests=self._done_measured() + self._done_tail(), expert_cache=m.expert_cache,
        )

    def _done_tail(self) -> int:
        return int(self.outcomes.done()[self.first + self.s.requests:].sum())

    def _request_summary(self) -> dict:
        o, lo, hi = self.outcomes, self.first, self.first + self.s.requests
        endings = Counter(ENDINGS[e].value for e in o.ending[lo:hi] if e >= 0)
        by_plan: dict[str, dict] = {}
        for kind, ending in zip(o.kind[lo:hi], o.ending[lo:hi]):
            if kind < 0:
                continue
            entry = by_plan.setdefault(Plan(int(kind)).label, {"count": 0, "endings": Counter()})
            entry["count"] += 1
            entry["endings"][ENDINGS[ending].value if ending >= 0 else "not finished"] += 1
        cancelled = Ending.CANCELLED
        cancel_phases = Counter(PHASES[p].value for e, p in zip(o.ending[lo:hi], o.phase_at_end[lo:hi])
                                if e >= 0 and ENDINGS[e] == cancelled)
        tail = Counter(ENDINGS[e].value for e in o.ending[hi:] if e >= 0)
        measured = o.ending[lo:hi] >= 0
        return {
            "total": self.s.requests, "finished": int(measured.sum()), "by_ending": dict(endings),
            "by_plan": {k: {"count": v["count"], "endings": dict(v["endings"])} for k, v in sorted(by_plan.items())},
            "cancelled_by_phase": dict(cancel_phases), "collateral_failures": int(o.collateral[lo:hi].sum()),
            "preempted_requests": int((o.preemptions[lo:hi] > 0).sum()),
            "parallel_sample_requests": int((o.samples[lo:hi] > 1).sum()),
            "unexpected": int((measured & ~o.expected[lo:hi]).sum()) + int(((o.ending[hi:] >= 0) & ~o.expected[hi:]).sum()),
            "unexpected_notes": list(self.driver.notes), "warmup": self.s.warmup_requests, "shutdown_tail": dict(tail),
            "cancelled_waiting": cancel_phases.get(Phase.WAITING.value, 0), "record_fillers": self.fillers,
        }


def prompt_shape_lengths(step_tokens: int, max_context: int, pool_tokens: int) -> list[int]:
    """Prompt lengths for the warm-up's prompt shapes: PROMPT_PLAN_CACHE_SIZE + 1 distinct ones (the most the
    runner keeps plans for, and one more) up to a step's tokens, each leaving room for one new token in the
    context and in the KV pool."""
    top = max(1, min(step_tokens, max_context - 2, pool_tokens - 2))
    return list(range(max(1, top - PROMPT_PLAN_CACHE_SIZE), top + 1))
