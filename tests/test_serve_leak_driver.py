"""serve-leak-check's driver layer (profiles/serve_leak_driver.py) on readings a GPU server gives: a loss the ledger
does not explain is a leak when it grows over both halves of the requests, a warning with its numbers when it came
once; and the command prints warnings without failing."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from profiles.leak_report import Finding
from profiles.serve_leak_report import ServeLeakReport
from profiles.serve_leak_driver import DRIVER_METRIC, DriverSeries, judge_driver
from rocmforge_cli import serve_leak_check as command
from rocmforge_cli.app import app

MIB = 1 << 20
TOLERANCE = 2 * MIB
BASE = 1000 * MIB


def series(free_at) -> DriverSeries:
    """Readings once every 500 of 20,000 requests, the free bytes free_at(requests done)."""
    s = DriverSeries()
    for done in range(0, 20_000, 500):
        s.add(done, {DRIVER_METRIC: float(free_at(done)), "other": 1.0})
    return s


def test_a_steady_loss_is_a_leak():
    lost_per_request = 1024  # 1 KiB a request: 20 MiB over the run, 10 in each half
    s = series(lambda done: BASE - lost_per_request * done)
    verdict = judge_driver(s, BASE, BASE - lost_per_request * 20_000, 20_000, 0.0, TOLERANCE)
    assert len(verdict.leaks) == 1 and "kept dropping" in verdict.leaks[0] and verdict.warnings == []
    assert verdict.to_dict()["midway_free"] == BASE - lost_per_request * 10_000
    assert verdict.to_dict()["unexplained_loss"] == lost_per_request * 20_000


@pytest.mark.parametrize("warmed_up", [True, False])
def test_a_leak_from_a_server_without_its_warm_up_says_so(warmed_up):
    # The 8B run of 2026-12-02 with --no-warmup: 4 MiB over the first half, 6 over the second
    # (docs/history/2026-12-02-serve-prompt-length-warmup-soak.md).
    s = series(lambda done: BASE - (4 * MIB if done >= 2_000 else 0) - (6 * MIB if done >= 14_000 else 0))
    verdict = judge_driver(s, BASE, BASE - 10 * MIB, 20_000, 0.0, TOLERANCE, server_warmed_up=warmed_up)
    assert len(verdict.leaks) == 1 and "+4194304 over the first half" in verdict.leaks[0]
    assert ("--no-warmup" in verdict.leaks[0]) is not warmed_up


@pytest.mark.parametrize("when", [100, 15_000])  # the first half or the second
def test_a_loss_taken_once_is_a_warning(when):
    s = series(lambda done: BASE - (10 * MIB if done >= when else 0))
    verdict = judge_driver(s, BASE, BASE - 10 * MIB, 20_000, 0.0, TOLERANCE)
    assert verdict.leaks == []
    assert len(verdict.warnings) == 1 and "dropped by 10485760 bytes" in verdict.warnings[0]


def test_within_the_tolerance_or_explained_by_the_ledger_nothing_is_said():
    flat = series(lambda done: BASE)
    assert judge_driver(flat, BASE, BASE - MIB, 20_000, 0.0, TOLERANCE).warnings == []
    steady = series(lambda done: BASE - 1024 * done)  # the ledger grew by as much: its own finding, not the driver's
    verdict = judge_driver(steady, BASE, BASE - 1024 * 20_000, 20_000, 1024 * 20_000, TOLERANCE)
    assert (verdict.leaks, verdict.warnings) == ([], [])


def test_a_loss_no_reading_can_place_is_a_warning():
    verdict = judge_driver(DriverSeries(), BASE, BASE - 10 * MIB, 40, 0.0, TOLERANCE)
    assert verdict.leaks == [] and "no reading midway" in verdict.warnings[0]


def test_midway_is_the_first_reading_past_half_the_requests():
    s = series(lambda done: BASE - done)
    assert s.midway(20_000) == BASE - 10_000
    assert DriverSeries().midway(10) is None


def test_the_command_prints_a_warning_and_exits_0(monkeypatch, tmp_path):
    report = ServeLeakReport(requests=40, baseline={DRIVER_METRIC: BASE}, findings=[
        Finding("driver", "warning", "the driver's free memory dropped by 10485760 bytes")])
    monkeypatch.setattr(command, "run_serve_leak_check", lambda settings, progress, command_line: report)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    result = CliRunner().invoke(app, ["serve-leak-check", "-m", str(model), "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "CLEAN: every block and every device byte came back (1 warnings)" in result.output
    assert "the driver's free memory dropped by 10485760 bytes" in result.output and "{" not in result.output
    report.findings.append(Finding("driver", "leak", "the driver's free memory kept dropping"))
    result = CliRunner().invoke(app, ["serve-leak-check", "-m", str(model), "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "LEAK: 1 findings (exit 1)" in result.output
    assert "the driver's free memory kept dropping" in result.output
