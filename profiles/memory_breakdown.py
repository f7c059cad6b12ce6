"""The memory breakdown printed at the end of generate (as llama.cpp prints one at exit): per device, the driver's
total and free, what this process holds by the ledger's tags (weights, KV cache, activations, scratch), and the
unaccounted rest (the driver's used minus the ledger's bytes: other processes, the context, allocator granules)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from hipcore.runtime.host_memory import anon_rss_bytes
from hipcore.runtime.ledger import format_bytes

ACTIVATIONS = ("activations", "moe_router", "moe_experts")


def memory_breakdown(device) -> dict:
    """The figures, in bytes; `unaccounted` is None on the cpu backend (its free figure is the ledger's own)."""
    info = device.memory_info()
    tags = device.ledger.bytes_by_tag()
    ledger = sum(tags.values())
    has_driver = device.driver_free_bytes() is not None
    used = info.total - info.free
    return {
        "device": device.describe(), "total": info.total, "free": info.free,
        "used": used if has_driver else None, "ledger": ledger,
        "weights": tags.get("weights", 0), "kv_cache": tags.get("kv", 0),
        "activations": sum(tags.get(t, 0) for t in ACTIVATIONS), "scratch": tags.get("scratch", 0),
        "other": tags.get("other", 0),
        "unaccounted": used - ledger if has_driver else None,
        "host_rss": anon_rss_bytes(),
    }


def breakdown_table(figures: dict) -> Table:
    """One row a figure (a column per device would not fit 80 columns): the driver's view, then this process's."""
    def b(n):
        return "-" if n is None else format_bytes(n)

    t = Table(title=f"memory breakdown: {figures['device']}", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, collapse_padding=True, show_header=False)
    t.add_column("what", overflow="fold")
    t.add_column("bytes", justify="right", no_wrap=True)
    for name, n in (("total", figures["total"]), ("free", figures["free"]),
                    ("used (the driver's view)", figures["used"]), ("this process (the ledger)", figures["ledger"]),
                    ("  weights", figures["weights"]), ("  KV cache", figures["kv_cache"]),
                    ("  activations", figures["activations"]), ("  scratch", figures["scratch"] + figures["other"]),
                    ("unaccounted (used minus the ledger)", figures["unaccounted"])):
        t.add_row(name, b(n))
    return t
