"""leak-check --report and --plot: the page and the image of a run with a planted KV leak show the leak.

The requests whose blocks never came back are the red spans of the lifetimes, the verdict's layer is
marked on the curves, and the KV blocks in use climb from phase to phase.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from profiles.report_html import DATA_ID
from rocmforge_cli.app import app

runner = CliRunner()
TESTING = {"ROCMFORGE_TESTING": "1", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("leak-report") / "tiny.gguf", tokenizer="gpt2"))


class Data(HTMLParser):
    def __init__(self):
        super().__init__()
        self.inside, self.text = False, ""

    def handle_starttag(self, tag, attrs):
        self.inside = dict(attrs).get("id") == DATA_ID

    def handle_endtag(self, tag):
        self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.text += data


def test_a_planted_kv_leak_is_red_in_the_report_and_climbs_on_the_curve(tiny, tmp_path):
    page, image = tmp_path / "leak.html", tmp_path / "leak.png"
    result = runner.invoke(app, ["leak-check", "--model", tiny, "--device", "cpu", "--requests", "40", "--seed", "3",
                                 "--no-tracemalloc", "--kv-blocks", "400", "--plant-bug", "release-on-cancel-only", "-q",
                                 "--report", str(page), "--plot", str(image)], env=TESTING)
    assert result.exit_code == 1, result.output[-2000:]
    assert image.read_bytes().startswith(b"\x89PNG")
    parser = Data()
    parser.feed(page.read_text())
    data = json.loads(parser.text)
    assert data["verdict"] == "leak"
    held = [s for s in data["spans"] if s["held"]]
    assert held and all(s["ending"] != "cancelled" for s in held)  # the bug releases only cancelled requests
    assert "kv blocks" in {m["layer"] for m in data["markers"] if m["kind"] == "verdict"}
    phases = [m for m in data["markers"] if m["kind"] == "phase"]
    used, t = data["series"]["kv_used"], data["series"]["t"]
    at = [max(u for u, x in zip(used, t) if x <= m["t"]) for m in phases[:-1]]
    assert at == sorted(at) and at[-1] > at[0]  # the blocks in use climb phase after phase


def test_a_clean_run_has_no_held_request_and_no_verdict_marker(tiny, tmp_path):
    page = tmp_path / "clean.html"
    result = runner.invoke(app, ["leak-check", "--model", tiny, "--device", "cpu", "--requests", "40", "--seed", "3",
                                 "-q", "--report", str(page)], env=TESTING)
    assert result.exit_code == 0, result.output[-2000:]
    parser = Data()
    parser.feed(page.read_text())
    data = json.loads(parser.text)
    assert data["verdict"] == "clean" and not [s for s in data["spans"] if s["held"]]
    assert not [m for m in data["markers"] if m["kind"] == "verdict"]
    assert len(data["spans"]) > 40 and all(s["end"] is not None for s in data["spans"])


@pytest.mark.parametrize("option, name", [("--report", "leak.png"), ("--plot", "leak.html")])
def test_a_wrong_suffix_is_a_usage_error_before_the_run(tiny, option, name):
    result = runner.invoke(app, ["leak-check", "--model", tiny, "--device", "cpu", option, name])
    assert result.exit_code == 2 and option in result.output and "must end in" in result.output
