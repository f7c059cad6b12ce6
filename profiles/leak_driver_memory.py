"""The driver layer of leak-check: device memory taken outside the ledger (GPU backends).

The driver's free-memory figure moves in 2 MiB steps (DRIVER_GRANULARITY, measured on an H100), so
one reading cannot tell a leak from rounding, and memory the ledger already counts is judged by the
ledger. So each phase after the baseline gives the driver's loss minus the ledger's growth (the
unexplained part), and a leak is unexplained growth past one granule plus the --fail-on driver
limit after two consecutive phases: confirmed, not a one-off. Seen after one phase only, it is a
warning. On the cpu backend there is no driver: the layer is "not applicable", said so in the report.
"""

from __future__ import annotations

from hipcore.runtime.ledger import format_bytes
from profiles.leak_layers import DRIVER_GRANULARITY

NOT_APPLICABLE_CPU = "not applicable (cpu backend)"


def unexplained_loss(phase) -> int | None:
    """Bytes the driver says are in use beyond the baseline that the ledger's growth does not explain."""
    loss = phase.driver_loss
    if loss is None:
        return None
    return loss - max(0, phase.ledger.leaked_bytes)


def judge_driver(phases: list, backend: str, limit: int | None) -> list[tuple[str, str]]:
    """(severity, message) pairs over the phases read against the driver baseline (in order)."""
    read = [(p, unexplained_loss(p)) for p in phases if p.driver_loss is not None]
    if not read:
        if backend == "cpu":
            return []  # the report's driver row says "not applicable (cpu backend)"
        return [("not judged", f"the {backend} backend gave no driver free-memory reading after the baseline")]
    allowed = DRIVER_GRANULARITY + (limit or 0)
    over = [u > allowed for _, u in read]
    confirmed = next((i for i in range(len(read) - 1) if over[i] and over[i + 1]), None)
    figures = "; ".join(f"{p.name} {u:+,} B (driver {p.driver_loss:+,}, ledger {p.ledger.leaked_bytes:+,}, "
                        f"reads spread {format_bytes(p.driver.spread)})" for p, u in read)
    shown = "off" if limit is None else format_bytes(limit)
    rule = (f"allowed one granule ({format_bytes(DRIVER_GRANULARITY)}) plus the limit ({shown}); "
            "unexplained = driver loss - ledger growth")
    out: list[tuple[str, str]] = []
    if confirmed is not None:
        first, second = read[confirmed][0].name, read[confirmed + 1][0].name
        severity = "leak" if limit is not None else "warning"
        out.append((severity, f"device memory taken outside the ledger, confirmed after {first} and {second}: {figures}; "
                              f"{rule}"))
    elif any(over):
        out.append(("warning", f"device memory outside the ledger after one phase only (not confirmed by the next): "
                               f"{figures}; {rule}"))
    if any(u < -DRIVER_GRANULARITY for _, u in read):
        out.append(("warning", f"the driver reports more free memory than at the baseline (another process freed "
                               f"memory?): {figures}"))
    return out
