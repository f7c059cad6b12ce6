"""GPU tier (`pytest -m gpu` on a GPU machine): leak-check's driver layer and a planted device leak.

On a GPU the driver's free-memory figure is a fourth reading: after a clean run it must equal the
baseline within the allocator's 2 MiB granularity, and a planted leak of a few MiB must show in the
ledger (byte-exact, with its site) and in the driver figure. scripts/gpu/leak_check_gpu.sh runs the
10,000-request run and compute-sanitizer; these are the quick checks.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from profiles.leak_layers import DRIVER_GRANULARITY
from rocmforge_cli.app import app

pytestmark = pytest.mark.gpu
runner = CliRunner()
SHORT = ["--device", "auto", "--requests", "120", "--prompt-tokens", "2-10", "--max-tokens", "4", "--json", "-q"]


def leak_check(model, *args: str, env: dict | None = None) -> tuple[int, dict]:
    result = runner.invoke(app, ["leak-check", "--model", str(model), *SHORT, *args], env=env or {})
    assert result.stdout.strip(), result.stderr
    return result.exit_code, json.loads(result.stdout)


def test_a_clean_gpu_run_returns_every_byte_to_the_driver(demo_model_path):
    code, report = leak_check(demo_model_path)
    assert report["backend"] in ("cuda", "hip"), report["device"]
    assert code == 0 and report["verdict"] == "clean", report["findings"]
    for phase in report["phases"][1:]:
        driver = phase["driver"]
        assert driver is not None and len(driver["reads"]) == 3
        assert abs(driver["loss"]) <= DRIVER_GRANULARITY, phase["name"]
    assert report["baseline"]["driver_free"] > 0 and report["peaks"]["driver_used"] >= report["baseline"]["driver_used"]
    assert sum(report["close"]["ledger"]["bytes_by_tag"].values()) == 0


def test_a_planted_device_leak_shows_in_the_ledger_and_the_driver(demo_model_path):
    code, report = leak_check(demo_model_path, "--plant-bug", "device-leak", env={"ROCMFORGE_TESTING": "1"})
    assert code == 1 and report["verdict"] == "leak"
    last = [p for p in report["phases"] if p["name"] != "warm-up"][-1]
    leaked = last["ledger"]["growth_bytes"]["scratch"]
    assert leaked > 2 * DRIVER_GRANULARITY, "the plant (256 KiB every 4 steps) should leak past the driver's granularity"
    assert last["ledger"]["not_returned"][0]["label"] == "planted.step_scratch"
    # The driver sees the same memory gone, to within its granularity per allocation rounding.
    assert last["driver"]["loss"] >= leaked - DRIVER_GRANULARITY
    assert any(f["layer"] == "driver" for f in report["findings"])
