"""GPU tier (`pytest -m gpu` on a GPU machine): leak-check's driver layer and a planted device leak.

On a GPU the driver's free-memory figure is a fourth reading: after a clean run it must equal the
baseline within the allocator's 2 MiB granularity, and a planted leak of a few MiB must show in the
ledger (byte-exact, with its site) and in the driver figure. scripts/bench/leak_check_gpu.sh runs the
10,000-request run and compute-sanitizer; these are the quick checks.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from profiles.leak_bugs import DEVICE_LEAK_BYTES, DEVICE_LEAK_EVERY, DRIVER_LEAK_EVERY
from profiles.leak_layers import DRIVER_GRANULARITY
from rocmforge_cli.app import app

pytestmark = pytest.mark.gpu
runner = CliRunner()
PARALLEL, PHASES = 8, 4  # leak-check's defaults
SHORT = ["--device", "auto", "--prompt-tokens", "2-10", "--max-tokens", "4", "--json", "-q"]
# A step ends at most PARALLEL requests and some of the mix end without a step (rejected, cancelled
# while waiting): 2 * PARALLEL requests per step needed is a safe bound on these short requests.
REQUESTS_PER_STEP_BOUND = 2 * PARALLEL


def requests_for(steps: int) -> int:
    return steps * REQUESTS_PER_STEP_BOUND


def leak_check(model, *args: str, requests: int = 120, env: dict | None = None) -> tuple[int, dict]:
    result = runner.invoke(app, ["leak-check", "--model", str(model), *SHORT, "--requests", str(requests), *args],
                           env=env or {})
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
    # Enough measured steps for the plant to leak past two granules: (2 granules / bytes per leak + 1)
    # leaks, one per DEVICE_LEAK_EVERY steps (120 requests gave too few steps on an H100).
    steps = DEVICE_LEAK_EVERY * (2 * DRIVER_GRANULARITY // DEVICE_LEAK_BYTES + 1)
    code, report = leak_check(demo_model_path, "--plant-bug", "device-leak", requests=requests_for(steps),
                              env={"ROCMFORGE_TESTING": "1"})
    assert code == 1 and report["verdict"] == "leak"
    assert report["requests"]["steps"] >= steps, "too few steps for the plant's rate: raise REQUESTS_PER_STEP_BOUND"
    last = [p for p in report["phases"] if p["name"] != "warm-up"][-1]
    leaked = last["ledger"]["growth_bytes"]["scratch"]
    assert leaked > 2 * DRIVER_GRANULARITY, "the plant (256 KiB every 4 steps) should leak past the driver's granularity"
    assert last["ledger"]["not_returned"][0]["label"] == "planted.step_scratch"
    # The driver sees the same memory gone, to within its granularity per allocation rounding.
    assert last["driver"]["loss"] >= leaked - DRIVER_GRANULARITY
    assert any(f["layer"] == "ledger" and f["severity"] == "leak" for f in report["findings"])


def test_device_memory_taken_outside_the_ledger_fails_the_run_by_default(demo_model_path):
    # Each phase needs DRIVER_LEAK_EVERY steps for one 4 MiB raw allocation (two granules) in it.
    code, report = leak_check(demo_model_path, "--plant-bug", "driver-leak",
                              requests=PHASES * requests_for(DRIVER_LEAK_EVERY), env={"ROCMFORGE_TESTING": "1"})
    assert code == 1 and report["verdict"] == "leak" and report["driver_layer"] == "judged"
    driver = [f for f in report["findings"] if f["layer"] == "driver"]
    assert driver and driver[0]["severity"] == "leak" and "confirmed after" in driver[0]["message"]
    measured = [p for p in report["phases"] if p["driver"] is not None]
    assert all(p["ledger"]["leaked_bytes"] == 0 for p in measured) and measured[-1]["driver"]["loss"] > 2 * DRIVER_GRANULARITY


def test_a_stream_never_destroyed_is_counted_on_the_gpu(demo_model_path):
    code, report = leak_check(demo_model_path, "--plant-bug", "stream-leak", requests=requests_for(4 * 8),
                              env={"ROCMFORGE_TESTING": "1"})
    assert code == 1 and report["verdict"] == "leak"
    assert any(f["layer"] == "handles" and f["severity"] == "leak" and " streams (" in f["message"] for f in report["findings"])
