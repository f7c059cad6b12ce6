"""The driver layer of serve-leak-check: device memory the server's process holds outside the ledger (GPU backends).

The ledger counts every byte rocmforge allocates; the driver's free-memory figure also moves for what the driver
allocates on its own, once, on first use (a step graph instantiated, a kernel's code loaded lazily, the context's
per-thread local memory grown for a kernel that needs more), in 2 MiB steps. As in leak-check's driver layer
(profiles/leak_driver_memory.py; RELIABILITY "Leak checks, layered", 3), a loss the ledger does not explain is a
leak only when it is confirmed: seen over the first half of the requests and again over the second. A loss in one
half only is a warning with its numbers, and so is one that no reading mid-run can place. A 240 s run of 64 clients
on the Llama-3.1-8B shape ended 10 MiB lower than its baseline with every ledger byte back
(docs/history/2026-12-02-serve-prompt-length-warmup-soak.md), which the baseline-to-end comparison before this
called a leak. Those were first uses the load met over both halves of its requests: with serve's warm-up
(hipcore/engine/warmup.py) the same run ends with the driver's free bytes at their baseline, and with `--no-warmup`
it loses the 10 MiB again, 4 in the first half and 6 in the second (the same note), which this judge still calls a
leak; the finding then says that the warm-up was off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from profiles.serve_leak_host import MetricSeries

DRIVER_METRIC = "rocmforge_driver_free_bytes"


@dataclass
class DriverSeries(MetricSeries):
    """The driver's free bytes against requests done, read while the clients ran."""

    metric: ClassVar[str] = DRIVER_METRIC

    def midway(self, requests_done: int) -> int | None:
        """The free bytes read first once half of `requests_done` requests were done (None: no such reading)."""
        half = requests_done / 2
        return next((free for done, free in self.samples if 0 < done and half <= done < requests_done), None)


@dataclass
class DriverVerdict:
    leaks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    readings: dict = field(default_factory=dict)  # the figures judged (bytes), for the report

    def to_dict(self) -> dict:
        return self.readings


def judge_driver(series: DriverSeries, baseline_free: float, final_free: float, requests_done: int,
                 ledger_growth: float, tolerance: int, *, server_warmed_up: bool = True) -> DriverVerdict:
    """The server's driver-side loss from its baseline to its end, less the ledger's growth (judged by the ledger
    itself), split at the reading midway through the requests. server_warmed_up False (serve ran with --no-warmup):
    a leak's finding says so, since the server's first uses then fall inside the requests."""
    verdict = DriverVerdict()
    explained = max(0.0, ledger_growth)
    lost = baseline_free - final_free - explained
    mid = series.midway(requests_done)
    verdict.readings = {"baseline_free": baseline_free, "midway_free": mid, "final_free": final_free,
                        "ledger_growth": ledger_growth, "unexplained_loss": lost, "tolerance": tolerance,
                        "readings": len(series.samples)}
    if lost <= tolerance:
        return verdict
    outside = f"beyond the ledger's {explained:+.0f}: device memory outside rocmforge's allocations"
    if mid is None:
        verdict.warnings.append(f"the driver's free memory dropped by {lost:.0f} bytes ({outside}); no reading midway "
                                "through the requests tells a one-off from growth")
        return verdict
    first, second = baseline_free - mid, mid - final_free - explained
    halves = f"{first:+.0f} over the first half of the requests, {second:+.0f} over the second"
    if first > tolerance and second > tolerance:
        cold = ("" if server_warmed_up else "; the server ran with --no-warmup, so its decode batch classes' "
                "first uses (step graphs, kernel code) fell inside the requests: run it with its warm-up to tell "
                "those from a leak")
        verdict.leaks.append(f"the driver's free memory kept dropping: {halves} ({outside}){cold}")
    else:
        verdict.warnings.append(f"the driver's free memory dropped by {lost:.0f} bytes, {halves}, not in both "
                                f"({outside}, taken once: what the driver allocates on a first use, a graph or "
                                "kernel code, or another process)")
    return verdict
