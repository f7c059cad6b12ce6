"""leak-check's progress on stderr while it runs: requests done/total, KV blocks in use, the phase.
A log (stderr not a terminal) gets plain lines; --quiet gets none; a terminal gets a rich line."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from rocmforge_cli import leak_progress_display
from rocmforge_cli.app import app
from rocmforge_cli.leak_progress_display import RichProgress

runner = CliRunner()
ARGS = ["--device", "cpu", "--requests", "16", "--seed", "1", "--no-tracemalloc", "--json"]
LINE = re.compile(r"^leak-check: phase (\d) of 4: (\d+)/16 requests done, KV blocks in use (\d+)/(\d+), \d+ s$", re.M)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("progress") / "tiny.gguf", tokenizer="gpt2"))


def test_a_log_gets_plain_progress_lines_and_quiet_gets_none(tiny, monkeypatch):
    monkeypatch.setattr(leak_progress_display, "PLAIN_EVERY_SECONDS", 0.0)  # a line at every chance, not every 10 s
    result = runner.invoke(app, ["leak-check", "--model", tiny, *ARGS])
    lines = LINE.findall(result.stderr)
    assert result.stdout.strip() and lines, result.stderr[-2000:]
    assert {int(phase) for phase, *_ in lines} == {1, 2, 3, 4}
    done = [int(d) for _, d, _, _ in lines]
    assert done == sorted(done) and done[-1] == 16
    assert any(int(used) > 0 for _, _, used, _ in lines) and all(int(used) <= int(n) for _, _, used, n in lines)
    assert "leak-check: warm-up:" in result.stderr and "leak-check: shutdown with requests in flight" in result.stderr
    # The warm-up counts its own requests (it took 196 s with nothing on screen on the demo model).
    warm = re.findall(r"^leak-check: warm-up: .*: (\d+)/(\d+) requests done", result.stderr, re.M)
    assert warm and int(warm[-1][0]) <= int(warm[-1][1]) and int(warm[-1][1]) > 16, result.stderr[-2000:]

    quiet = runner.invoke(app, ["leak-check", "--model", tiny, *ARGS, "-q"])
    assert quiet.stdout.strip() and quiet.stderr == ""


def test_on_a_terminal_the_progress_line_shows_the_phase_requests_and_blocks():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RichProgress.bar_for(console) as bar:
        progress = RichProgress(bar)
        progress.blocks(3, 40)
        progress.start(130, "warm-up")
        progress.advance(130)
        progress.start(16, "requests")  # the same bar, counted again from 0
        progress.status("phase 2 of 4")
        progress.advance(5)
        progress.blocks(7, 40)
        bar.refresh()
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert "phase 2 of 4" in text and "5/16" in text and "KV blocks 7/40" in text
    assert "130/130" not in text.splitlines()[-1] and len(bar.tasks) == 1


def test_on_a_narrow_terminal_a_long_status_line_wraps_between_words():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=60, soft_wrap=True)  # as rocmforge_cli.common's stderr
    text = ("warm-up: 8 requests, decode batches of 1, 2, 4, 8, 17 prompts of distinct lengths, then 100 rejected "
            "ones to fill the finished records; every token's text decoded once")
    with RichProgress.bar_for(console) as bar:
        RichProgress(bar).status(text)
    lines = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue()).strip().splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= 60 and " ".join(lines).split() == text.split()
