"""The server's own figures in serve_bench_report.py's summary: the CPU seconds of each of its threads (from /proc),
its engine's counters and its request latency stages (from /metrics scraped before and after each level)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for hipcore.engine.latency (stdlib)
from hipcore.engine.latency import quantile  # noqa: E402


def thread_cpu(pid: int) -> dict[str, float]:
    """{thread name: CPU seconds} of one process; threads of the same name are summed, and child processes
    (the chat-template workers) are read the same way and filed under "children"."""
    clock = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}

    def cpu(stat: str) -> tuple[str, float]:
        name, rest = stat.rsplit(")", 1)
        fields = rest.split()
        return name.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / clock

    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        try:
            name, seconds = cpu((task / "stat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between the listing and the read
        out[name] = out.get(name, 0.0) + seconds
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for child in (children.read_text().split() if children.exists() else []):
        try:
            out["children"] = out.get("children", 0.0) + cpu(Path(f"/proc/{child}/stat").read_text())[1]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def cpu_lines(outdir: Path, rows: list[dict]) -> list[str]:
    """Server CPU per generated token at each level, by thread (from OUT/level_<C>.cpu_before/.cpu_after)."""
    lines = []
    for r in rows:
        before, after = (outdir / f"level_{r['clients']}.cpu_before"), (outdir / f"level_{r['clients']}.cpu_after")
        if not (before.exists() and after.exists()):
            continue
        a, b = json.loads(before.read_text()), json.loads(after.read_text())
        tokens = r["server_tokens_per_request"] * r["requests"] if r["server_tokens_per_request"] else 0
        if not tokens:
            continue
        spent = {name: b[name] - a.get(name, 0.0) for name in b}
        parts = ", ".join(f"{name} {1e6 * sec / tokens:.1f}" for name, sec in sorted(spent.items(), key=lambda kv: -kv[1])
                          if sec > 0)
        lines.append(f"- server CPU at {r['clients']} clients, us per generated token by thread: "
                     f"{1e6 * sum(spent.values()) / tokens:.1f} in all ({parts})")
    return lines


ENGINE_COUNTERS = ("rocmforge_engine_steps_total", "rocmforge_engine_prompt_steps_total",
                   "rocmforge_engine_step_seconds_total", "rocmforge_engine_device_wait_seconds_total")


def _counters(text: str) -> dict[str, float]:
    """ENGINE_COUNTERS from Prometheus text (rocmforge_serve.metrics.parse_metrics does this for every name, but
    its module needs prometheus_client, and this script runs on the standard library alone)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name in ENGINE_COUNTERS:
            out[name] = float(value)
    return out


def engine_lines(outdir: Path, rows: list[dict]) -> list[str]:
    """rocmforge serve's engine during each level (its /metrics before and after): steps, those that evaluated
    prompts, and the share of the level's wall time spent in steps and, of that, waiting for the device. Little
    waiting means the host's work (the engine's and the event loop's) set the pace, not the device."""
    lines = []
    for r in rows:
        paths = [outdir / f"level_{r['clients']}.metrics_{when}" for when in ("before", "after")]
        if not all(p.exists() for p in paths) or r["wall"] <= 0:
            continue
        before, after = (_counters(p.read_text()) for p in paths)
        if set(after) != set(ENGINE_COUNTERS) or set(before) != set(ENGINE_COUNTERS):
            continue  # another server, or an older rocmforge without these counters
        d = {name: after[name] - before[name] for name in ENGINE_COUNTERS}
        steps, prompt_steps, in_steps, waiting = (d[name] for name in ENGINE_COUNTERS)
        lines.append(f"- engine at {r['clients']} clients: {steps:.0f} steps ({prompt_steps:.0f} evaluated prompts), "
                     f"in steps {100 * in_steps / r['wall']:.0f}% of the level's wall time, waiting for the device "
                     f"{100 * waiting / r['wall']:.0f}%")
    return lines


# rocmforge serve's first-token stages (rocmforge_serve/metrics.py's LATENCY_HISTOGRAMS), in the order a request
# meets them: label, histogram name
LATENCY_STAGES = (("prepare", "rocmforge_request_prepare_seconds"), ("queue", "rocmforge_request_queue_seconds"),
                  ("engine first token", "rocmforge_engine_time_to_first_token_seconds"),
                  ("handler first token", "rocmforge_time_to_first_token_seconds"))


def _histograms(text: str) -> dict[str, dict]:
    """LATENCY_STAGES' histograms from Prometheus text: name -> {bounds, cumulative (+Inf last), sum, count}."""
    wanted = {name for _, name in LATENCY_STAGES}
    out: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        base, _, label = key.partition("{")
        for suffix in ("_bucket", "_sum", "_count"):
            name = base[:-len(suffix)]
            if base.endswith(suffix) and name in wanted:
                h = out.setdefault(name, {"bounds": [], "cumulative": [], "sum": 0.0, "count": 0.0})
                if suffix == "_bucket":
                    bound = label.split('"')[1]
                    if bound != "+Inf":
                        h["bounds"].append(float(bound))
                    h["cumulative"].append(float(value))
                else:
                    h[suffix[1:]] = float(value)
    return out


def latency_lines(outdir: Path, rows: list[dict]) -> list[str]:
    """Where each level's first tokens waited, as the server timed them (its /metrics before and after the
    level): mean / p50 / p99 ms of each stage. The load generator's TTFT minus the handler's is the client's
    side and the network."""
    lines = []
    for r in rows:
        paths = [outdir / f"level_{r['clients']}.metrics_{when}" for when in ("before", "after")]
        if not all(p.exists() for p in paths):
            continue
        before, after = (_histograms(p.read_text()) for p in paths)
        parts = []
        for label, name in LATENCY_STAGES:
            if name not in before or name not in after:
                break
            a, b = after[name], before[name]
            d = {"bounds": a["bounds"], "cumulative": [x - y for x, y in zip(a["cumulative"], b["cumulative"])],
                 "sum": a["sum"] - b["sum"], "count": a["count"] - b["count"]}
            if d["count"] <= 0:
                break
            p50, p99 = quantile(d, 0.5), quantile(d, 0.99)
            parts.append(f"{label} {1e3 * d['sum'] / d['count']:.1f} / {1e3 * p50:.1f} / {1e3 * p99:.1f}")
        if len(parts) == len(LATENCY_STAGES):
            lines.append(f"- first token at {r['clients']} clients, server side (mean / p50 / p99 ms): " + "; ".join(parts))
    return lines
