"""--report FILE.html and --plot FILE.png|.svg: the options and their writing, shared by the commands that record a
MemoryTimeline (leak-check, serve-leak-check, profile-kv --workloads, serve)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from profiles.plot import check_plot_path, write_plot
from profiles.report_html import check_report_path, write_report
from profiles.trace_events import TraceRecorder, check_trace_path
from rocmforge_cli.common import stderr

ReportFile = Annotated[Optional[str], typer.Option(
    "--report", metavar="FILE.html", show_default=False,
    help="Write a self-contained HTML page (opens offline) of memory over the run: KV blocks used/cached/free, "
         "ledger bytes by tag, host and driver memory, fragmentation, each request's lifetime, the verdict.")]
TraceFile = Annotated[Optional[str], typer.Option(
    "--trace", metavar="FILE.json", show_default=False,
    help="Write the run in the Chrome trace event format for Perfetto (ui.perfetto.dev): device allocations and "
         "frees with their ledger tags and sizes, a ledger bytes counter, engine steps with graph replays, requests.")]
PlotFile = Annotated[Optional[str], typer.Option(
    "--plot", metavar="FILE.png|.svg", show_default=False, help="Write the same curves as a PNG or SVG image.")]


def check_picture_paths(report: str | None, plot: str | None, trace: str | None = None) -> TraceRecorder | None:
    """Before the run: a wrong suffix is a usage error, not a surprise at the end. The recorder for --trace."""
    check_report_path(report)
    check_plot_path(plot)
    check_trace_path(trace)
    return None if trace is None else TraceRecorder()


def write_trace(recorder: TraceRecorder | None, path: str | None, metadata: dict | None = None) -> None:
    if recorder is not None and path is not None:
        recorder.write(path, metadata)
        stderr.print(f"trace: {path} (open it in ui.perfetto.dev)", highlight=False)


def write_pictures(timeline, report: str | None, plot: str | None, findings=(), summary: list[str] | None = None) -> None:
    if timeline is None:
        return
    if report is not None:
        write_report(timeline, report, findings, summary)
        stderr.print(f"report: {report}", highlight=False)
    if plot is not None:
        write_plot(timeline, plot)
        stderr.print(f"plot: {plot}", highlight=False)
