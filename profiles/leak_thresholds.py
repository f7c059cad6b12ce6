"""`--fail-on` thresholds: how much each layer may leak before the leak check fails.

    --fail-on blocks=0              KV blocks not returned (count)            default 0
    --fail-on ledger=0              device bytes not returned, all tags       default 0 (byte-exact)
    --fail-on driver=4MiB           device memory outside the ledger (driver  default 0
                                    loss minus ledger growth) beyond the driver's 2 MiB granularity,
                                    after two consecutive phases (GPU backends; leak_driver_memory)
    --fail-on handles=0             streams, events, graphs, modules or file  default 0
                                    descriptors more than at the baseline, per kind (leak_handles)
    --fail-on host-growth=2MiB/1000req   host memory (RSS) growth slope,      default 1MiB/1000req
                                    judged on runs whose second half spans >= 250 requests
    --fail-on host-traced=64KiB/1000req  host memory kept since the baseline   default 128KiB/1000req
                                    by tracemalloc, judged on every run length (plus a fixed
                                    allowance for bounded caches, leak_report.HOST_TRACED_SLACK)
    --fail-on unexpected=0          requests that ended other than planned    default off: a warning

A limit is the most that is still accepted (a leak fails when it is larger); `off` turns the key into
a warning only. Broken KV invariants, requests or tables left behind, finished records past their
bound, and an engine that raised or stalled always fail: they have no amount to tolerate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from hipcore.errors import UsageError
from hipcore.runtime.ledger import format_bytes

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_PER = re.compile(r"^(.*?)/\s*(\d+)?\s*(?:req|requests?)\s*$", re.IGNORECASE)
KEYS = ("blocks", "ledger", "driver", "handles", "host-growth", "host-traced", "unexpected")


def parse_size(text: str, what: str) -> int:
    """'0', '4096', '1.5MiB', '2MB' -> bytes (binary units for K/M/G and KiB/MiB/GiB)."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise UsageError(f"--fail-on {what}: cannot read size {text!r}; use e.g. 0, 4096, 512KiB or 2MiB")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Thresholds:
    """None means off (report as a warning, never fail)."""

    blocks: int | None = 0
    ledger: int | None = 0
    driver: int | None = 0
    host_growth_per_1000: int | None = 1 << 20
    unexpected: int | None = None
    host_traced_per_1000: int | None = 128 << 10
    handles: int | None = 0

    def describe(self) -> dict[str, str]:
        def show(v: int | None, size: bool) -> str:
            return "off (warning only)" if v is None else (format_bytes(v) if size else str(v))

        return {
            "blocks": show(self.blocks, False), "ledger": show(self.ledger, True), "driver": show(self.driver, True),
            "host-growth": "off (warning only)" if self.host_growth_per_1000 is None
            else f"{format_bytes(self.host_growth_per_1000)}/1000req",
            "host-traced": "off (warning only)" if self.host_traced_per_1000 is None
            else f"{format_bytes(self.host_traced_per_1000)}/1000req",
            "unexpected": show(self.unexpected, False), "handles": show(self.handles, False),
        }

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_fail_on(specs: list[str] | None) -> Thresholds:
    """Apply `KEY=LIMIT` specs (repeatable, also comma-separated) over the defaults."""
    result = Thresholds()
    for spec in specs or ():
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not sep or key not in KEYS or not value:
                raise UsageError(f"--fail-on {part!r}: expected KEY=LIMIT with KEY one of {', '.join(KEYS)} "
                                 "(e.g. --fail-on ledger=0 --fail-on host-growth=2MiB/1000req)")
            off = value.lower() == "off"
            if key in ("blocks", "unexpected", "handles"):
                if not off and not value.isdigit():
                    raise UsageError(f"--fail-on {key}={value}: give a whole number or 'off'")
                result = replace(result, **{key: None if off else int(value)})
            elif key in ("ledger", "driver"):
                result = replace(result, **{key: None if off else parse_size(value, key)})
            elif key == "host-traced":
                result = replace(result, host_traced_per_1000=None if off else _per_thousand(value, key))
            else:
                result = replace(result, host_growth_per_1000=None if off else _per_thousand(value, key))
    return result


def _per_thousand(value: str, key: str) -> int:
    """'2MiB/1000req' -> bytes per 1000 requests; a bare size means per 1000 requests."""
    m = _PER.match(value)
    if m is None:
        return parse_size(value, key)
    size = parse_size(m.group(1), key)
    per = int(m.group(2) or 1)
    if per < 1:
        raise UsageError(f"--fail-on {key}={value}: the request count must be at least 1")
    return size * 1000 // per
