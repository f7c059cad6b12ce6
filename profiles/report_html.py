"""`--report FILE.html`: one self-contained page of a MemoryTimeline that opens offline.

The page holds the verdict, the figure of profiles/plot.py right under it (the curves are what a reader
looks at first) as inline SVG (no script, no external resource), the findings, and the timeline's data as
JSON in a <script type="application/json"> element (id "memory-timeline") for the numbers behind the curves.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from hipcore.errors import UsageError
from profiles.memory_timeline import MemoryTimeline
from profiles.plot import render

DATA_ID = "memory-timeline"
STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.3em}.verdict{font-weight:bold}.leak{color:#c00}.clean{color:#070}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}
figure{margin:0}svg{max-width:100%;height:auto}code{font-size:.9em}"""


def check_report_path(path: str | None) -> None:
    if path is not None and Path(path).suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--report {path}: the file must end in .html")


def _svg(timeline: MemoryTimeline) -> str:
    text = render(timeline, "svg").decode("utf-8")
    return text[text.index("<svg"):]  # the XML declaration and doctype belong to a file, not to a page


def _findings_table(findings) -> str:
    if not findings:
        return "<p>No findings.</p>"
    rows = "".join(f"<tr><td>{html.escape(f.severity)}</td><td>{html.escape(f.layer)}</td>"
                   f"<td>{html.escape(f.message)}</td></tr>" for f in findings)
    return f"<table><tr><th>severity</th><th>layer</th><th>finding</th></tr>{rows}</table>"


def build_html(timeline: MemoryTimeline, findings=(), summary: list[str] | None = None) -> str:
    verdict = timeline.verdict or "no verdict"
    css = "leak" if verdict == "leak" else "clean" if verdict == "clean" else ""
    data = json.dumps(timeline.to_dict(), separators=(",", ":")).replace("</", "<\\/")
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in summary or [])
    spans = timeline.spans()
    held = [s for s in spans if s.held]
    held_text = (f"<p class='leak'>{len(held):,} requests whose KV blocks never came back (red in the lifetimes), "
                 f"first: request {held[0].request_id} ({html.escape(held[0].label)}).</p>" if held else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(timeline.title)}</title><style>{STYLE}</style></head>
<body>
<h1>{html.escape(timeline.title)}</h1>
<p class="verdict {css}">verdict: {html.escape(verdict)}</p>
{held_text}
<figure>{_svg(timeline)}</figure>
<p>{len(timeline.series("t")):,} samples (one every {timeline.stride} steps), {len(spans):,} request lifetimes
({timeline.dropped_spans:,} older ones dropped). The data: the JSON in the element <code>#{DATA_ID}</code>.</p>
<h2>Findings</h2>
{_findings_table([f for f in findings if f.severity != "warning"] + [f for f in findings if f.severity == "warning"])}
<ul>{lines}</ul>
<script type="application/json" id="{DATA_ID}">{data}</script>
</body></html>
"""


def write_report(timeline: MemoryTimeline, path: str, findings=(), summary: list[str] | None = None) -> None:
    check_report_path(path)
    Path(path).write_text(build_html(timeline, findings, summary), encoding="utf-8")
