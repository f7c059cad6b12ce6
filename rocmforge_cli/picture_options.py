"""--report FILE.html and --plot FILE.png|.svg: the options and their writing, shared by the commands that record a
MemoryTimeline (leak-check, serve-leak-check, profile-kv --workloads, serve)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from profiles.plot import check_plot_path, write_plot
from profiles.report_html import check_report_path, write_report
from rocmforge_cli.common import stderr

ReportFile = Annotated[Optional[str], typer.Option(
    "--report", metavar="FILE.html", show_default=False,
    help="Write a self-contained HTML page (opens offline) of memory over the run: KV blocks used/cached/free, "
         "ledger bytes by tag, host and driver memory, fragmentation, each request's lifetime, the verdict.")]
PlotFile = Annotated[Optional[str], typer.Option(
    "--plot", metavar="FILE.png|.svg", show_default=False, help="Write the same curves as a PNG or SVG image.")]


def check_picture_paths(report: str | None, plot: str | None) -> None:
    """Before the run: a wrong suffix is a usage error, not a surprise at the end."""
    check_report_path(report)
    check_plot_path(plot)


def write_pictures(timeline, report: str | None, plot: str | None, findings=(), summary: list[str] | None = None) -> None:
    if timeline is None:
        return
    if report is not None:
        write_report(timeline, report, findings, summary)
        stderr.print(f"report: {report}", highlight=False)
    if plot is not None:
        write_plot(timeline, plot)
        stderr.print(f"plot: {plot}", highlight=False)
