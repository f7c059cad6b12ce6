"""Where a request's wait goes, kept the way Prometheus keeps a histogram: fixed bucket bounds, a count a bucket,
the sum and the number of observations.

The engine times two stages of every request (EngineStats): from its submission to the scheduler's first
admission (the queue), and from its submission to its first token read from the device (time to first token
inside the engine). The server adds its own two (rocmforge_serve): the prompt's preparation (chat template and
tokenizer) and its time to first token as a handler sees it. /metrics exports all four, so a slow first token
can be split between the HTTP layer, the queue and the prompt's step. Observing costs a bisect and three adds.
"""

from __future__ import annotations

import bisect

# Upper bounds in seconds (each bucket holds observations <= its bound and > the one before; a last bucket,
# +Inf, holds the rest). Fine below 0.1 s, where a streaming server's first token should fall, coarse above.
BOUNDS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25,
                             0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class LatencyHistogram:
    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)  # a clock read on two threads can come out a hair negative
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self.total += seconds
        self.count += 1

    def reading(self) -> dict:
        """Plain data (it crosses the pipe to the HTTP process): cumulative counts as Prometheus gives them,
        one per bound and +Inf last, the sum and the count."""
        cumulative, running = [], 0
        for n in self.counts:
            running += n
            cumulative.append(running)
        return {"bounds": list(BOUNDS), "cumulative": cumulative, "sum": self.total, "count": self.count}


def quantile(reading: dict, q: float) -> float | None:
    """The q-quantile of a reading, by linear interpolation inside its bucket as Prometheus's histogram_quantile
    does (None with no observations; the last finite bound when it falls in +Inf)."""
    count = reading["count"]
    if count <= 0:
        return None
    bounds, cumulative = reading["bounds"], reading["cumulative"]
    rank = q * count
    below, lower = 0, 0.0
    for i, upper in enumerate(bounds):
        if cumulative[i] >= rank:
            inside = cumulative[i] - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        below, lower = cumulative[i], upper
    return bounds[-1]
