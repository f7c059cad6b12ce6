"""generate's stream never writes a model's control codes raw: rocmforge_cli/stream_text.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model

from rocmforge_cli.app import app
from rocmforge_cli.stream_text import stream_text

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def test_control_codes_are_escaped_and_layout_and_text_kept():
    assert stream_text("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    assert stream_text("a\nb\tc") == "a\nb\tc"
    assert stream_text("\x1b[31mred\x07") == "\\x1b[31mred\\x07"
    assert stream_text("line\roverwritten") == "line\\roverwritten"
    assert stream_text("\u202eevil\x00") == "\\u202eevil\\x00"


def _generate(tiny, *extra):
    # temperature sampling over the tiny vocabulary's 256 byte tokens: control bytes come up within 200 tokens
    return runner.invoke(app, ["generate", "--model", tiny, "--device", "cpu", "--temp", "2", "--seed", "5", "-n", "200",
                               "-q", *extra, "hello"], env={"COLUMNS": "200"})


def test_generated_control_codes_reach_stdout_escaped(tiny):
    exact = json.loads(_generate(tiny, "--json").stdout)["text"]
    controls = {c for c in exact if not c.isprintable() and c not in "\n\t"}
    assert controls, "the run must generate control characters for this test to mean anything"
    streamed = _generate(tiny).stdout
    assert not any(c in streamed for c in controls)
    assert streamed.rstrip("\n") == stream_text(exact)
