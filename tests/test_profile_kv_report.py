"""profile-kv --workloads --report/--plot/--trace: every workload is a phase on the timeline, every request a span
that ended, the trace's allocations balance (the pools are freed at the end); progress names each workload."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from typer.testing import CliRunner

from profiles.report_html import DATA_ID
from rocmforge_cli.app import app
from test_trace_events import validate

runner = CliRunner()


class Data(HTMLParser):
    inside, text = False, ""

    def handle_starttag(self, tag, attrs):
        self.inside = dict(attrs).get("id") == DATA_ID

    def handle_endtag(self, tag):
        self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.text += data


def test_the_workloads_report_plot_and_trace(tmp_path):
    page, image, trace = tmp_path / "kv.html", tmp_path / "kv.svg", tmp_path / "kv.json"
    result = runner.invoke(app, ["profile-kv", "--workloads", "--preset", "Llama-2-7B", "--report", str(page),
                                 "--plot", str(image), "--trace", str(trace)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output[-2000:]
    assert [line for line in result.stderr.splitlines() if "profile-kv: workload" in line] == [
        f"profile-kv: workload {k} of 6: {name}" for k, name in enumerate(
            ["single sequences", "concurrent sequences", "appends vs batched", "shared prefix forks", "multi turn chat",
             "shared system prompt"], 1)]
    parser = Data()
    parser.feed(page.read_text())
    data = json.loads(parser.text)
    assert [m["text"] for m in data["markers"]] == ["single", "concurrent", "appends", "forks", "chat", "system"]
    assert data["verdict"] == "quiescent" and data["spans"] and all(s["end"] is not None for s in data["spans"])
    assert max(s["blocks"] for s in data["spans"]) > 1 and max(v for v in data["series"]["kv_used"] if v) > 1
    assert "<svg" in image.read_text()
    assert validate(json.loads(trace.read_text())) == {}  # the pools freed at the end


def test_the_picture_options_need_workloads():
    result = runner.invoke(app, ["profile-kv", "--preset", "Llama-2-7B", "--report", "kv.html"])
    assert result.exit_code == 2 and "--report only applies to --workloads" in result.output


def test_the_workloads_output_fits_80_columns_and_uses_200():
    for width in (80, 200):
        result = runner.invoke(app, ["profile-kv", "--workloads", "--preset", "Llama-2-7B"], env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output[-2000:]
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= width, max(lines, key=len)
        # every figure of the single-sequence table whole: "264.0 MiB /" and "528 tokens" may take two lines
        assert any("93.8% (15 slots)" in line for line in lines)
    assert any(len(line) > 100 for line in lines)  # at 200 columns the room is used
