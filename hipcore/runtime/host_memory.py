"""This process's host memory as the leak checks judge it: leak-check's host layer (profiles/leak_layers.py)
and the server's /metrics (rocmforge_serve/metrics.py) both read it here."""

from __future__ import annotations


def anon_rss_bytes() -> int | None:
    """RssAnon + VmSwap of this process from /proc/self/status (Linux); None elsewhere. Anonymous memory only:
    file-backed pages (the memory-mapped model) come and go with the page cache, not with leaks."""
    try:
        with open("/proc/self/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return sum(int(fields[key].split()[0]) * 1024 for key in (b"RssAnon", b"VmSwap") if key in fields)
    except (OSError, ValueError, KeyError):
        return None
