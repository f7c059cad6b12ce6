"""What the engine takes from outside and gives back besides events: fault-injection hooks (leak-check and tests),
and its counters."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable

from hipcore.engine.latency import LatencyHistogram
from hipcore.engine.request import Request
from hipcore.errors import RocmforgeError

class InjectedFault(RocmforgeError):
    """Raised on purpose by fault-injection hooks (leak-check and tests), never by real work."""


@dataclass
class EngineHooks:
    """Fault injection for tests and leak-check: make chosen requests fail on purpose."""

    fail_sampling: Callable[[Request], bool] | None = None  # the sampler raises for these requests
    # the forward pass raises for this batch (asked when the step's tokens are read, for its live requests)
    fail_step: Callable[[list[Request]], bool] | None = None


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0  # tokens computed while in prompt evaluation (recomputation included)
    generated_tokens: int = 0
    preemptions: int = 0
    step_seconds: float = 0.0  # wall time inside Engine.step
    # Of that, the time spent reading launched steps' tokens: the device finishing them. Near step_seconds: the
    # device is the limit; near 0: the host is (the tokens were ready when asked for).
    device_wait_seconds: float = 0.0
    prompt_steps: int = 0  # steps that evaluated prompt tokens (never chained ahead; graphs up to 128 tokens)
    endings: collections.Counter = field(default_factory=collections.Counter)
    # Each request's submission to the scheduler's first admission of it, and to its first token read from the
    # device (hipcore/engine/latency.py; a preempted request's readmission is not timed again).
    queue_time: LatencyHistogram = field(default_factory=LatencyHistogram)
    first_token_time: LatencyHistogram = field(default_factory=LatencyHistogram)

    def note_admitted(self, requests: list[Request]) -> None:
        """The scheduler took these from its queue: time the first admission of each (queue_time)."""
        for request in requests:
            if request.admitted_at is None:
                request.admitted_at = time.perf_counter()
                self.queue_time.observe(request.admitted_at - request.submitted_at)
