"""`rocmforge serve-leak-check` on the tiny model (a pool large enough that a leaking server still answers): clean when nothing leaks, and each planted leak caught."""

from __future__ import annotations

import re

import pytest

from support.engine_testing import tiny_model

from profiles.leak_thresholds import parse_fail_on
from profiles.serve_leak_check import ServeLeakSettings, run_serve_leak_check


HOST_OFF = parse_fail_on(["host-growth=off"])  # 24 requests cannot judge host memory (it takes 1,500)


def settings(path, **overrides) -> ServeLeakSettings:
    return ServeLeakSettings(model=str(path), device="cpu", requests=24, clients=6, max_tokens=6, seed=3,
                             extra_args=("--ctx-size", "256", "--step-tokens", "16", "--kv-blocks", "400"), time_limit_s=120,
                             **{"thresholds": HOST_OFF, **overrides})


def test_a_clean_server_passes_with_disconnects_in_the_mix(tmp_path_factory):
    report = run_serve_leak_check(settings(tiny_model(tmp_path_factory)))
    assert [(f.layer, f.severity) for f in report.findings] == [("host", "warning")], report.server_tail
    assert report.verdict == "clean" and report.exit_code == 0
    assert report.requests == 24 and report.server_exit == 0
    assert report.plans["leave-mid-stream"] and report.plans["leave-in-prompt"] and report.plans["conversation"]
    assert report.final["rocmforge_kv_physical_blocks"] == 0
    # serve's prefix cache is on: conversations and the shared system prompt found their blocks, and the blocks
    # left cached at the end were no finding (the server's shutdown check evicted them and found every block free)
    assert report.final["rocmforge_prefix_cache_hits_total"] > 0
    as_json = report.to_dict()
    assert set(as_json) >= {"verdict", "exit_code", "driver_layer", "findings", "layers", "thresholds", "host", "phases"}
    assert as_json["driver_layer"] == "not applicable (cpu backend)"
    assert {row["layer"] for row in as_json["layers"]} >= {"kv blocks", "ledger: kv", "host (RssAnon+VmSwap)"}


def test_a_run_too_short_to_judge_host_memory_is_not_judged_and_exits_1(tmp_path_factory, capsys):
    from rocmforge_cli.app import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["serve-leak-check", "-m", str(tiny_model(tmp_path_factory)), "--device", "cpu",
                                      "--requests", "8", "--clients", "4", "--max-tokens", "2", "-q",
                                      "--serve-arg=--ctx-size=256", "--serve-arg=--kv-blocks=400"],
                                env={"COLUMNS": "160"})
    assert result.exit_code == 1, result.output
    assert "NOT JUDGED: nothing leaked in what was checked, but host could not be judged (exit 1)" in result.output
    assert "host memory not judged" in result.output and "{" not in result.output  # a table, no Python dicts
    assert result.stderr == ""  # -q: no progress


def test_a_log_gets_a_plain_line_for_each_phase_and_the_requests_counted(tmp_path_factory, monkeypatch):
    """stderr not a terminal: leak-check's plain progress lines, named serve-leak-check."""
    from rocmforge_cli import leak_progress_display
    from rocmforge_cli.app import app
    from typer.testing import CliRunner

    monkeypatch.setattr(leak_progress_display, "PLAIN_EVERY_SECONDS", 0.0)  # a line at every chance, not every 10 s
    result = CliRunner().invoke(app, ["serve-leak-check", "-m", str(tiny_model(tmp_path_factory)), "--device", "cpu",
                                      "--requests", "8", "--clients", "4", "--max-tokens", "2", "--json",
                                      "--fail-on", "host-growth=off", "--serve-arg=--ctx-size=256",
                                      "--serve-arg=--kv-blocks=400"])
    assert result.exit_code == 0, result.output[-3000:]
    lines = result.stderr.splitlines()
    assert all(line.startswith("serve-leak-check: ") for line in lines), lines
    phases = [line for line in lines if "requests done" not in line]
    assert [line.split(":")[1].strip() for line in phases] == [
        "starting the server on 127.0.0.1", "warm-up", "8 requests from 4 clients",
        "waiting for the server to finish its requests", "stopping the server (SIGTERM) and reading its shutdown check"]
    warm = re.findall(r"^serve-leak-check: warm-up: (\d)/4 requests done", result.stderr, re.M)
    assert sorted(map(int, warm)) == list(map(int, warm)) and set(map(int, warm)) == {1, 2, 3, 4}
    counted = re.findall(r"^serve-leak-check: 8 requests from 4 clients: (\d)/8 requests done(.*), \d+ s$", result.stderr, re.M)
    done = [int(d) for d, _ in counted]
    assert sorted(done) == done and set(done) == set(range(1, 9)), result.stderr
    blocks = [tuple(map(int, b)) for b in re.findall(r"KV blocks in use (\d+)/(\d+)", result.stderr)]
    assert blocks and all(used <= usable == 400 for used, usable in blocks), blocks  # the server's usable blocks


@pytest.mark.parametrize("bug", ["no-release-on-completion", "release-on-cancel-only", "device-leak"])
def test_a_planted_leak_is_caught(tmp_path_factory, bug):
    report = run_serve_leak_check(settings(tiny_model(tmp_path_factory), planted_bug=bug))
    assert report.exit_code == 1
    # the layer that sees it: KV blocks still held (release bugs) or ledger bytes not returned (device leak)
    expected = "ledger scratch" if bug == "device-leak" else "KV blocks not returned"
    assert any(expected in f.message and f.severity == "leak" for f in report.findings), report.findings
