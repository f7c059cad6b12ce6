"""leak-check can fail: each planted bug makes it exit 1 and name the leak, its owner and its site.

The bugs are planted through the hidden --plant-bug option (profiles/leak_bugs.py), which refuses
to work without ROCMFORGE_TESTING=1. Each run uses the tiny test model and a few dozen requests.
A large pool (--kv-blocks 400) keeps the leaking runs going to the end instead of stalling at once,
so requests of every ending pass through the planted bug.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from rocmforge_cli.app import app

runner = CliRunner()
TESTING = {"ROCMFORGE_TESTING": "1", "COLUMNS": "200"}
NATURAL = {"length", "eos", "stop"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("leak") / "tiny.gguf", tokenizer="gpt2"))


def leak_check(model: str, *args: str, env: dict | None = None, tracemalloc: bool = False) -> tuple[int, dict | None, str]:
    # Most planted bugs are judged without tracemalloc (faster); their runs' host layer is then
    # "not judged", which the leak they must find outranks.
    result = runner.invoke(app, ["leak-check", "--model", model, "--device", "cpu", "--requests", "40", "--seed", "3",
                                 *([] if tracemalloc else ["--no-tracemalloc"]), "--json", "-q", *args], env=env or TESTING)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = None
    return result.exit_code, report, result.stdout + result.stderr


def planted(model: str, bug: str, *args: str) -> dict:
    code, report, output = leak_check(model, "--kv-blocks", "400", "--plant-bug", bug, *args)
    assert code == 1, output[-3000:]
    assert report is not None and report["verdict"] == "leak" and report["exit_code"] == 1
    assert report["planted_bug"] == bug and f"--plant-bug {bug}" in report["command"]
    return report


def leaked_block_owners(report: dict) -> list[dict]:
    final = [p for p in report["phases"] if p["blocks"] is not None][-1]
    return [o for block in final["blocks"]["leaked"] for o in block["owners"]]


def test_blocks_not_released_on_normal_completion(tiny):
    report = planted(tiny, "no-release-on-completion")
    owners = leaked_block_owners(report)
    assert owners and {o["ending"] for o in owners} <= NATURAL
    cancelled = report["requests"]["by_ending"].get("cancelled", 0)
    assert cancelled > 0  # cancels ran and released: none of them is an owner above
    blocks = [f for f in report["findings"] if f["layer"] == "kv blocks" and f["severity"] == "leak"]
    assert any("KV blocks not returned" in f["message"] and "held by request" in f["message"] for f in blocks)
    layer = {row["layer"]: row for row in report["layers"]}["kv blocks"]
    assert layer["count"] > 0 and layer["bytes"] == layer["count"] * report["phases"][-1]["blocks"]["bytes_per_block"]


def test_blocks_released_on_cancel_only(tiny):
    report = planted(tiny, "release-on-cancel-only")
    endings = {o["ending"] for o in leaked_block_owners(report)}
    assert "cancelled" not in endings
    assert endings & NATURAL and "failed" in endings  # the fault-injected requests keep their blocks too


def test_a_free_that_keeps_the_device_buffer_alive(tiny):
    report = planted(tiny, "free-keeps-buffer")
    close = report["close"]["ledger"]
    n_layers = 2  # the tiny model's: one K and one V pool per layer
    assert close["count_by_tag"]["kv"] == 2 * n_layers and close["leaked_count"] == 2 * n_layers
    assert close["bytes_by_tag"]["kv"] > 0 and sum(v for t, v in close["bytes_by_tag"].items() if t != "kv") == 0
    first = close["not_returned"][0]
    assert first["label"].startswith("kv.layer") and "hipcore/kvcache/pools.py" in first["site"]  # allocate_pools
    row = {r["layer"]: r for r in report["layers"]}["ledger after close"]
    assert row["bytes"] == close["bytes_by_tag"]["kv"] and row["count"] == 2 * n_layers
    assert any("after closing the model" in f["message"] and f["severity"] == "leak" for f in report["findings"])


def test_finished_records_never_dropped(tiny):
    report = planted(tiny, "finished-records-kept", "--finished-bound", "10")
    over = [p for p in report["phases"] if not p["engine"]["records_within_bound"]]
    assert over and over[-1]["engine"]["finished_records"] > 10 and over[-1]["engine"]["finished_bound"] == 10
    assert any("finished records kept, past their bound of 10" in f["message"] for f in report["findings"])


def test_a_reference_count_decremented_twice(tiny):
    report = planted(tiny, "double-decrement")
    messages = " ".join(f["message"] for f in report["findings"] if f["severity"] == "leak")
    assert "reference count" in messages
    broken = [p for p in report["phases"] if p["blocks"] and p["blocks"]["invariant_error"]]
    assert broken  # the KV pool's invariants name the block whose count no longer matches its tables


def test_a_device_buffer_never_freed_is_traced_to_its_step_and_site(tiny):
    report = planted(tiny, "device-leak")
    final = report["phases"][-1]["ledger"]
    assert final["growth_bytes"]["scratch"] == final["leaked_bytes"] > 0
    assert final["leaked_bytes"] % (256 << 10) == 0 and final["growth_count"]["scratch"] == final["leaked_bytes"] // (256 << 10)
    leak = final["not_returned"][0]
    assert leak["label"] == "planted.step_scratch" and "profiles/leak_bugs.py" in leak["site"]
    assert leak["owner"].startswith("step ") and "requests" in leak["owner"]
    after_close = report["close"]["ledger"]["bytes_by_tag"]["scratch"]  # the warm-up's leaks too (before the baseline)
    assert after_close >= final["leaked_bytes"] and after_close % (256 << 10) == 0


def test_the_clean_run_of_the_same_settings_passes(tiny):
    code, report, output = leak_check(tiny, "--kv-blocks", "400", tracemalloc=True)
    assert code == 0, output[-3000:]
    assert report["verdict"] == "clean" and not [f for f in report["findings"] if f["severity"] != "warning"]
    assert report["host"]["tracemalloc_not_returned"]["traced"]


def test_host_memory_kept_per_request_is_caught_on_a_short_run(tiny):
    # 10 KiB per request over 200 requests: before, host memory was judged only on runs whose second
    # half spans 250 requests, and this run exited 0 "clean".
    code, report, output = leak_check(tiny, "--kv-blocks", "400", "--requests", "200", "--plant-bug", "host-leak",
                                      tracemalloc=True)
    assert code == 1 and report["verdict"] == "leak", output[-3000:]
    host = [f for f in report["findings"] if f["layer"] == "host" and f["severity"] == "leak"]
    assert host and "host memory kept since the baseline" in host[0]["message"]
    assert "profiles/leak_bugs.py" in host[0]["message"]  # the allocation site that grew
    kept = report["host"]["tracemalloc_not_returned"]
    assert kept["bytes"] >= 200 * 10 * 1024 and kept["top_lines"][0]["allocations"] >= 200
    row = {r["layer"]: r for r in report["layers"]}["host (tracemalloc)"]
    assert 10 * 1024 <= row["per_request"] < 12 * 1024


def test_a_run_whose_host_memory_cannot_be_judged_is_not_called_clean(tiny):
    # 40 requests without tracemalloc: too short for the RSS slope, nothing else judges the host.
    code, report, output = leak_check(tiny, "--kv-blocks", "400")
    assert code == 1 and report["verdict"] == "not judged" and report["exit_code"] == 1, output[-3000:]
    assert not [f for f in report["findings"] if f["severity"] == "leak"]
    [finding] = [f for f in report["findings"] if f["severity"] == "not judged"]
    assert finding["layer"] == "host" and "tracemalloc was off" in finding["message"]
    code, report, output = leak_check(tiny, "--kv-blocks", "400", "--fail-on", "host-growth=off,host-traced=off")
    assert code == 0 and report["verdict"] == "clean", output[-3000:]
    assert any(f["severity"] == "warning" and "host memory not judged" in f["message"] for f in report["findings"])
    table = runner.invoke(app, ["leak-check", "--model", tiny, "--device", "cpu", "--requests", "12", "--phases", "2",
                                "--no-tracemalloc", "--kv-blocks", "400", "-q"], env={"COLUMNS": "200"})
    assert table.exit_code == 1 and "NOT JUDGED" in table.stdout and "CLEAN" not in table.stdout


def test_planting_needs_the_testing_environment_and_is_hidden(tiny):
    code, report, output = leak_check(tiny, "--plant-bug", "device-leak", env={"ROCMFORGE_TESTING": "0"})
    assert code == 2 and report is None and "ROCMFORGE_TESTING=1" in output
    code, _, output = leak_check(tiny, "--plant-bug", "no-such-bug")
    assert code == 2 and "unknown planted bug" in output
    help_text = runner.invoke(app, ["leak-check", "--help"], env={"COLUMNS": "200"}).stdout
    assert "--requests" in help_text and "--plant-bug" not in help_text


def test_a_leak_that_makes_a_request_recompute_forever_ends_the_run_naming_the_lost_blocks(tiny):
    # With the default (small) pool the pinned blocks leave just enough room to admit a longer
    # request and never to let it grow: before the progress check this run never ended. (Without the prefix cache:
    # with it, the same seed's pinned blocks leave too few to admit anything, and the stall check ends each phase.)
    code, report, output = leak_check(tiny, "--plant-bug", "refcount-taken-twice", "--no-prefix-cache")
    assert code == 1, output[-3000:]
    assert report["verdict"] == "leak" and report["wall_seconds"] < 60
    failure = report["engine_failure"]
    assert failure["raised"] is False and "without keeping a new generated token" in failure["message"]
    assert "KV blocks that never came back (held by no table): " in failure["message"]
    lost = [b for p in report["phases"] if p["blocks"] for b in p["blocks"]["leaked"]]
    assert lost and all(b["refcount"] == 1 and not b["sequences"] for b in lost)
    assert f"{lost[0]['block']} (refcount 1)" in failure["message"]
    assert any(f["message"].startswith("the run was ended in") for f in report["findings"])


def test_a_run_past_its_deadline_ends_as_failed(tiny):
    code, report, output = leak_check(tiny, "--kv-blocks", "400", "--requests", "5000", "--deadline", "2")
    assert code == 1, output[-3000:]
    assert "past its deadline" in report["engine_failure"]["message"] and report["wall_seconds"] < 60
    assert "--deadline 2" in report["command"]
    code, _, output = leak_check(tiny, "--deadline", "0")
    assert code == 2 and "--deadline must be more than 0 seconds" in output
