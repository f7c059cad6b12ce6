"""`rocmforge serve-leak-check` on the tiny model (a pool large enough that a leaking server still answers): clean when nothing leaks, and each planted leak caught."""

from __future__ import annotations

import pytest

from support.engine_testing import tiny_model

from profiles.serve_leak_check import ServeLeakSettings, run_serve_leak_check


def settings(path, **overrides) -> ServeLeakSettings:
    return ServeLeakSettings(model=str(path), device="cpu", requests=24, clients=6, max_tokens=6, seed=3,
                             extra_args=("--ctx-size", "256", "--step-tokens", "16", "--kv-blocks", "400"), time_limit_s=120, **overrides)


def test_a_clean_server_passes_with_disconnects_in_the_mix(tmp_path_factory):
    report = run_serve_leak_check(settings(tiny_model(tmp_path_factory)))
    assert report.findings == [], report.server_tail
    assert report.requests == 24 and report.server_exit == 0
    assert report.plans["leave-mid-stream"] and report.plans["leave-in-prompt"]
    assert report.final["rocmforge_kv_physical_blocks"] == 0


@pytest.mark.parametrize("bug", ["no-release-on-completion", "release-on-cancel-only", "device-leak"])
def test_a_planted_leak_is_caught(tmp_path_factory, bug):
    report = run_serve_leak_check(settings(tiny_model(tmp_path_factory), planted_bug=bug))
    assert report.exit_code == 1
    # the layer that sees it: KV blocks still held (release bugs) or ledger bytes not returned (device leak)
    expected = "ledger scratch" if bug == "device-leak" else "KV blocks not returned"
    assert any(expected in f for f in report.findings), report.findings
