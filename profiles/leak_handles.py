"""The handle layer of leak-check: what the byte ledger does not hold.

The device's streams, events, graphs and modules (Device.handle_counts(), counted by the runtime)
and the process's open file descriptors (/proc/self/fd) are read after the warm-up (the baseline)
and after every phase; growth at the end is a leak, named by kind. A stream made per step and
never destroyed costs the driver a handle and some memory each time, and a file opened per request
runs the process out of descriptors: neither shows in the ledger.

Modules are counted beyond the kernel cache's (hipcore/runtime/kernels.py: one module an op, loaded at the
op's first launch and kept while the device is open): an op first launched after the warm-up (on an NVIDIA
H200, a prompt longer than any of the warm-up's took prompt_attention in phase 1) fills the cache, which is
no leak, while a module loaded outside the cache (a launcher loading its code again) grows the count.
"""

from __future__ import annotations

import os

from hipcore.runtime.kernels import cached_module_count

FILE_DESCRIPTORS = "file descriptors"
_FD_DIR = "/proc/self/fd"


def open_file_descriptors() -> int | None:
    """Open descriptors of this process (Linux); None where /proc/self/fd cannot be read. The one
    the listing itself opens is there at every reading, so it cancels out."""
    try:
        return len(os.listdir(_FD_DIR))
    except OSError:
        return None


def read_handles(device) -> dict[str, int | None]:
    """{kind: live count}: the device's handle kinds (modules: those outside the kernel cache), then file
    descriptors (None: not readable)."""
    counts: dict[str, int | None] = dict(device.handle_counts())
    if counts.get("modules") is not None:
        counts["modules"] -= cached_module_count(device)
    counts[FILE_DESCRIPTORS] = open_file_descriptors()
    return counts


def handle_growth(baseline: dict[str, int | None], now: dict[str, int | None]) -> dict[str, int]:
    """Growth by kind, for the kinds read both times."""
    return {kind: now[kind] - base for kind, base in baseline.items()  # type: ignore[operator]
            if base is not None and now.get(kind) is not None}


def judge_handles(baseline: dict | None, final: dict | None, final_name: str, limit: int | None) -> list[tuple[str, str]]:
    """(severity, message) pairs: "leak" for growth past `limit` (None: warnings only), "not judged"
    for kinds that could not be read."""
    if not baseline or final is None:
        return [("not judged", "handles not judged: the run ended before the baseline was taken")]
    out: list[tuple[str, str]] = []
    unread = [kind for kind in baseline if baseline[kind] is None or final.get(kind) is None]
    if unread:
        out.append(("not judged", f"{', '.join(unread)} could not be counted on this system"))
    if not any(kind != FILE_DESCRIPTORS for kind in baseline):
        out.append(("not judged", "the device counts no streams, events, graphs or modules (Device.handle_counts)"))
    grown = {kind: n for kind, n in handle_growth(baseline, final).items() if n > 0}
    if grown:
        severity = "leak" if limit is not None and max(grown.values()) > limit else "warning"
        what = ", ".join(f"{n:+,} {kind} ({baseline[kind]:,} -> {final[kind]:,})" for kind, n in grown.items())
        shown = "off" if limit is None else str(limit)
        out.append((severity, f"after {final_name}: handles not returned since the baseline: {what} (limit {shown})"))
    return out


def handle_rows(baseline: dict | None, final: dict | None) -> list[dict]:
    """The layer table's rows: the device's handles together, file descriptors apart (counts, no bytes)."""
    if not baseline or final is None:
        return []
    grown = handle_growth(baseline, final)
    device_kinds = [k for k in grown if k != FILE_DESCRIPTORS]
    rows = []
    for name, kinds in ((f"handles ({', '.join(device_kinds)})", device_kinds), (FILE_DESCRIPTORS, [FILE_DESCRIPTORS])):
        if kinds and all(k in grown for k in kinds):
            rows.append({"layer": name, "bytes": None, "count": sum(max(0, grown[k]) for k in kinds), "unit": "handles",
                         "baseline": None, "peak": None, "final": None, "per_request": None,
                         "counts": {k: {"baseline": baseline[k], "final": final[k]} for k in kinds}})
    return rows
