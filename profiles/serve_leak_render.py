"""Rich tables of a ServeLeakReport, as leak-check prints its own (leak_render): verdict, layers, requests,
findings, and the line that reproduces the run."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from profiles.breakable_text import BreakableText, ShellCommandText
from profiles.leak_render import _table, findings_table, keep_figures_whole, layers_table, verdict_text
from profiles.serve_leak_report import ServeLeakReport


def requests_table(report: ServeLeakReport) -> Table:
    t = _table(f"Requests: {report.requests:,} after the warm-up, in {report.seconds:.1f} s", ["plan or answer", "requests"])
    for plan, n in sorted(report.plans.items(), key=lambda kv: -kv[1]):
        t.add_row(plan, f"{n:,}")
    for status, n in sorted(report.statuses.items(), key=lambda kv: -kv[1]):
        t.add_row(f"  answered {status}", f"{n:,}")
    t.add_row("server exit code after SIGTERM", "-" if report.server_exit is None else str(report.server_exit))
    return t


def render(report: ServeLeakReport) -> Group:
    parts = [verdict_text(report), layers_table(report), requests_table(report)]
    findings = findings_table(report)
    if findings is not None:
        parts.append(findings)
    parts = [keep_figures_whole(p) if isinstance(p, Table) else p for p in parts]
    if report.host_line:
        parts.append(BreakableText(report.host_line))
    if report.command:
        parts.append(ShellCommandText("reproduce: ", report.command, style="dim"))
    return Group(*parts)
