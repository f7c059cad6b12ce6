"""leak-check under Ctrl-C and on a narrow terminal: a partial report marked "interrupted, no
verdict" (exit 130), and tables that never break a number across lines at 80 columns."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from profiles.leak_driver import WorkloadDriver
from rocmforge_cli.app import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("leak-interrupt") / "tiny.gguf", tokenizer="gpt2"))


def interrupt_in_phase(monkeypatch, phase: int) -> None:
    original = WorkloadDriver.run

    def run(self, indices, run_phase, *args, **kwargs):
        if run_phase == phase:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main thread
        return original(self, indices, run_phase, *args, **kwargs)

    monkeypatch.setattr(WorkloadDriver, "run", run)


def test_ctrl_c_prints_a_partial_report_with_no_verdict(tiny, monkeypatch):
    interrupt_in_phase(monkeypatch, 2)
    args = ["leak-check", "--model", tiny, "--device", "cpu", "--requests", "24", "--kv-blocks", "400", "-q"]
    result = runner.invoke(app, [*args, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 130, result.output[-3000:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "interrupted, no verdict" and report["interrupted"] and report["exit_code"] == 130
    assert [p["name"] for p in report["phases"]] == ["warm-up", "phase 1"]  # what was read before Ctrl-C
    assert report["close"]["error"] is None and sum(report["close"]["ledger"]["bytes_by_tag"].values()) == 0
    table = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 130 and "INTERRUPTED, NO VERDICT" in table.stdout
    assert "CLEAN" not in table.stdout and "LEAK:" not in table.stdout


NUMBER = re.compile(r"-?\d[\d,.]*(?: (?:B|KiB|MiB|GiB|blocks|allocs|allocations|req))?")


def test_no_table_breaks_a_number_across_lines_at_80_columns(tiny):
    from profiles.leak_check import run_leak_check
    from profiles.leak_render import render
    from profiles.leak_settings import LeakCheckSettings

    report = run_leak_check(LeakCheckSettings(model=tiny, device="cpu", requests=24, kv_blocks=400, tracemalloc=True))
    console = Console(width=80, record=True, color_system=None)
    console.print(render(report))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    wide = Console(width=400, record=True, color_system=None)
    wide.print(render(report))
    # Every number a cell shows at full width appears whole at 80 columns too.
    numbers = {n for n in NUMBER.findall(wide.export_text()) if len(n) >= 3}
    narrow = set(NUMBER.findall("\n".join(lines)))
    assert numbers <= narrow, sorted(numbers - narrow)[:10]
    # The layer names wrap between words: "ledger: activations" never becomes "activation / s".
    words = {w for row in report.layer_totals() for w in row["layer"].split() if len(w) <= 12}
    narrow_words = set("\n".join(lines).split())
    assert "activations" in words and words <= narrow_words, sorted(words - narrow_words)
    assert "KV blocks in use" in lines[1] and "host memory (RSS)" in lines[2]  # the sparklines under the verdict


def test_the_warm_up_fills_the_tokenizer_caches_before_the_baseline(tiny, monkeypatch):
    """The tokenizer's per-token caches reach their bound during the warm-up, before the host layer's baseline,
    so that their filling is never counted as growth (a leak in the measured phases still is)."""
    from hipcore.tokenizer.tokenizer import _UNSEEN, Tokenizer
    from profiles.leak_check import run_leak_check
    from profiles.leak_layers import HostMonitor
    from profiles.leak_settings import LeakCheckSettings

    seen = []
    fill, take_baseline = Tokenizer.fill_piece_caches, HostMonitor.take_baseline

    def recording_fill(self):
        fill(self)
        seen.append(("filled", all(t is not _UNSEEN for t in self._piece_texts[True] + self._piece_texts[False])))

    def recording_baseline(self):
        seen.append(("baseline", None))
        take_baseline(self)

    monkeypatch.setattr(Tokenizer, "fill_piece_caches", recording_fill)
    monkeypatch.setattr(HostMonitor, "take_baseline", recording_baseline)
    report = run_leak_check(LeakCheckSettings(model=tiny, device="cpu", requests=24, kv_blocks=400, tracemalloc=True))
    assert seen == [("filled", True), ("baseline", None)]
    assert report.verdict == "clean"
