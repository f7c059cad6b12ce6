"""serve-leak-check's result, judged as leak-check's (profiles/leak_report.py): findings of severity "leak",
"warning" or "not judged" per layer; the verdict "not judged" (exit 1) when a layer could not be judged and its
limit is not turned off, never "clean"; `to_dict()` is the `--json` output, with leak-check's keys (verdict,
exit_code, driver_layer, findings, layers, thresholds, ...; phases: one, the requests), and
serve_leak_render prints the same as leak-check's tables.

Layers, read from the server's /metrics after a warm-up (the baseline) and once it is idle again (final):
kv blocks (none held, every usable block free), ledger (byte for byte per tag), driver (GPU: the driver's
free memory beyond the ledger's growth over both halves of the requests, serve_leak_driver), host (the
server's RSS slope, serve_leak_host: judged from request 1,000 on, over a second half of >= 250 requests),
and the server itself (it exits 0 on SIGTERM only when its own shutdown check found every block back).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from profiles.leak_driver_memory import NOT_APPLICABLE_CPU
from profiles.leak_findings import LEAK, NOT_JUDGED, WARNING, Finding, FindingsVerdict
from profiles.leak_thresholds import Thresholds
from profiles.serve_leak_driver import DRIVER_METRIC
from profiles.serve_leak_host import WARM_REQUESTS
from profiles.leak_report import MIN_HOST_SPAN

SERVE_FAIL_ON_KEYS = ("blocks", "ledger", "driver", "host-growth")  # the --fail-on keys this check has layers for
KV_KEYS = ("rocmforge_kv_physical_blocks", "rocmforge_kv_pending_blocks", "rocmforge_kv_free_blocks",
           "rocmforge_kv_total_blocks", "rocmforge_kv_reserved_blocks", "rocmforge_kv_bytes_per_block",
           "rocmforge_kv_cached_blocks", "rocmforge_prefix_cache_queries_total", "rocmforge_prefix_cache_hits_total")


def ledger_of(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("rocmforge_ledger_bytes")}


def tag_of(key: str) -> str:
    return key.partition("=")[2].strip('"}')


@dataclass
class ServeLeakReport(FindingsVerdict):
    command: str = ""
    settings: dict = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    planted_bug: str | None = None
    requests: int = 0
    plans: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    baseline: dict = field(default_factory=dict)  # the /metrics readings judged (ledger, KV, driver)
    final: dict = field(default_factory=dict)
    server_exit: int | None = None
    server_tail: str = ""
    findings: list[Finding] = field(default_factory=list)
    driver: dict = field(default_factory=dict)  # the driver layer's figures (serve_leak_driver), GPU only
    host: dict = field(default_factory=dict)  # serve_leak_host.HostVerdict.to_dict()
    host_line: str = ""
    seconds: float = 0.0
    interrupted: bool = False  # leak_render's verdict reads it; this check has no partial report

    @property
    def backend(self) -> str:
        """What the server ran on, as far as its metrics tell: a GPU publishes the driver's free memory."""
        if not self.baseline:
            return "unknown"
        return "gpu" if DRIVER_METRIC in self.baseline else "cpu"

    @property
    def driver_layer(self) -> str:
        if self.driver:
            return "judged"
        return NOT_APPLICABLE_CPU if self.backend == "cpu" else "no reading"

    def layer_totals(self) -> list[dict]:
        """leak-check's layer rows: not returned (bytes, count), baseline / peak / final, per request."""
        rows = []
        base, final = self.baseline, self.final
        per_block = final.get("rocmforge_kv_bytes_per_block", 0)
        if "rocmforge_kv_physical_blocks" in final:
            held = int(final["rocmforge_kv_physical_blocks"] + final["rocmforge_kv_pending_blocks"])
            rows.append({"layer": "kv blocks", "bytes": int(held * per_block), "count": held, "unit": "blocks",
                         "baseline": int(base.get("rocmforge_kv_physical_blocks", 0) * per_block), "peak": None,
                         "final": int(held * per_block)})
        for key, before in ledger_of(base).items():
            after = final.get(key, 0.0)
            rows.append({"layer": f"ledger: {tag_of(key)}", "bytes": int(max(0.0, after - before)), "count": None,
                         "unit": "", "baseline": int(before), "peak": None, "final": int(after)})
        if self.driver:
            d = self.driver
            rows.append({"layer": "driver", "bytes": int(max(0.0, d["unexplained_loss"])), "count": None, "unit": "",
                         "baseline": int(d["baseline_free"]), "peak": None, "final": int(d["final_free"])})
        requests = max(1, self.requests)
        for row in rows:
            row["per_request"] = round(row["bytes"] / requests, 3)
        if self.driver_layer == NOT_APPLICABLE_CPU:
            rows.append({"layer": f"driver: {NOT_APPLICABLE_CPU}", "bytes": None, "count": None, "unit": "",
                         "baseline": None, "peak": None, "final": None, "per_request": None})
        h = self.host
        if h.get("samples"):
            growth = h.get("growth_per_1000_requests")
            rows.append({"layer": "host (RssAnon+VmSwap)", "bytes": max(0, (h["rss_last"] or 0) - (h["rss_first"] or 0)),
                         "count": None, "unit": "", "baseline": h["rss_first"], "peak": None, "final": h["rss_last"],
                         "per_request": None if growth is None else round(growth / 1000, 3)})
        cache = h.get("expert_cache")
        if cache:  # taken out of the row above; bounded, judged against its budget
            rows.append({"layer": "host (decoded experts' cache)", "bytes": None, "count": None, "unit": "",
                         "baseline": cache["first_bytes"], "peak": cache["peak_bytes"], "final": cache["last_bytes"],
                         "per_request": None})
        return rows

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict, "exit_code": self.exit_code, "driver_layer": self.driver_layer,
            "interrupted": self.interrupted, "command": self.command, "settings": self.settings,
            "planted_bug": self.planted_bug, "model": self.settings.get("model"), "device": self.settings.get("device"),
            "backend": self.backend, "wall_seconds": round(self.seconds, 3), "load_seconds": None,
            "requests": {"total": self.requests, "by_plan": dict(self.plans), "by_answer": dict(self.statuses)},
            "findings": [f.to_dict() for f in self.findings], "layers": self.layer_totals(),
            "thresholds": self.thresholds.to_dict(), "baseline": self.baseline, "peaks": {},
            "phases": [{"name": "requests", "requests": self.requests, "seconds": round(self.seconds, 3),
                        "final": self.final}],
            "close": None, "host": self.host, "driver": self.driver, "engine_failure": None, "stalls": [],
            "server": {"exit_code": self.server_exit, "tail": self.server_tail},
        }


def judge_pool_and_ledger(baseline: dict, final: dict, t: Thresholds) -> list[Finding]:
    """The KV pool's and the ledger's findings (the driver's: serve_leak_driver; the host's: judge_host_layer)."""
    out = []
    held = int(final["rocmforge_kv_physical_blocks"] + final["rocmforge_kv_pending_blocks"])
    if held:
        severity = LEAK if t.blocks is not None and held > t.blocks else WARNING
        out.append(Finding("kv blocks", severity, f"{held} KV blocks not returned with every request ended"))
    usable = final["rocmforge_kv_total_blocks"] - final["rocmforge_kv_reserved_blocks"]
    cached = final.get("rocmforge_kv_cached_blocks", 0.0)  # the prefix cache's: evictable, not held, no leak
    if final["rocmforge_kv_free_blocks"] + cached != usable:
        out.append(Finding("kv blocks", LEAK, f"{final['rocmforge_kv_free_blocks']:.0f} free and {cached:.0f} cached KV "
                                              f"blocks, {usable:.0f} expected"))
    for key, before in ledger_of(baseline).items():
        grown = final.get(key, 0.0) - before
        if grown:
            severity = LEAK if t.ledger is not None and (grown > t.ledger or t.ledger == 0) else WARNING
            out.append(Finding("ledger", severity, f"ledger {tag_of(key)}: {grown:+.0f} bytes against the baseline"))
    return out


def judge_host_layer(verdict, t: Thresholds) -> Finding | None:
    """The host layer: a slope past the limit is a leak; a run too short to judge is "not judged", never clean,
    unless --fail-on host-growth=off (then a warning)."""
    if verdict.leaked:
        return Finding("host", LEAK if t.host_growth_per_1000 is not None else WARNING, verdict.line())
    if verdict.judged:
        return None
    why = (f"the RSS slope is judged from request {WARM_REQUESTS:,} on, over a second half of at least "
           f"{MIN_HOST_SPAN} requests and 3 readings: send --requests {WARM_REQUESTS + 2 * MIN_HOST_SPAN} or more "
           "(or a --duration long enough)")
    if not verdict.samples:
        why = "the server publishes no RSS on this platform"
    off = t.host_growth_per_1000 is None
    return Finding("host", WARNING if off else NOT_JUDGED,
                   f"host memory not judged: {why}" + (" (host-growth turned off by --fail-on)" if off else
                                                       "; --fail-on host-growth=off makes this a warning"))
