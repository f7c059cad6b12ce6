"""leak-check end to end: a clean run covers every ending and reads zero leaks on every layer.

The tiny test model runs the full mix in seconds (and twice, to show a seed reproduces the run);
the demo model runs a few hundred short requests through the real forward pass on the cpu
backend (the same command CI runs as its smoke test, at a smaller size).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from rocmforge_cli.app import app

runner = CliRunner()
ENV = {"COLUMNS": "200"}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("leak-clean") / "tiny.gguf", tokenizer="gpt2"))


def leak_check(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["leak-check", "--device", "cpu", *args], env=ENV)
    return result.exit_code, result.stdout, result.stderr


def assert_clean(report: dict) -> None:
    assert report["verdict"] == "clean" and report["exit_code"] == 0, report["findings"]
    assert not [f for f in report["findings"] if f["severity"] == "leak"]
    assert report["engine_failure"] is None and not report["stalls"]
    names = [p["name"] for p in report["phases"]]
    assert names[0] == "warm-up" and names[-1] == "shutdown" and len(names) == report["settings"]["phases"] + 2
    for phase in report["phases"]:
        assert phase["engine"]["empty"] and phase["engine"]["records_within_bound"], phase["name"]
        assert phase["blocks"]["not_free"] == 0 and phase["blocks"]["invariant_error"] is None, phase["name"]
        assert phase["blocks"]["free"] == phase["blocks"]["usable"] == report["settings"]["kv_blocks_used"]
        if phase["ledger_judged"]:
            assert phase["ledger"]["leaked_bytes"] == 0 and phase["ledger"]["not_returned"] == []
            assert phase["ledger"]["bytes_by_tag"] == report["baseline"]["ledger_bytes"]
    close = report["close"]
    assert close["error"] is None and sum(close["ledger"]["bytes_by_tag"].values()) == 0
    assert sum(close["ledger"]["count_by_tag"].values()) == 0
    layers = {row["layer"]: row for row in report["layers"]}
    assert layers["kv blocks"]["bytes"] == layers["kv blocks"]["count"] == 0
    assert all(row["bytes"] == 0 for name, row in layers.items() if name.startswith("ledger"))
    assert layers["ledger: kv"]["final"] == layers["ledger: kv"]["baseline"] > 0
    assert report["peaks"]["blocks_used"] > 0


def test_a_clean_run_covers_every_ending_and_reads_zero_on_every_layer(tiny):
    # Seed 2's 160 requests hold every plan, fail-step (2% of the mix) included.
    code, out, err = leak_check("--model", tiny, "--requests", "160", "--seed", "2", "--json", "-q")
    assert code == 0, out[-2000:] + err
    report = json.loads(out)
    assert_clean(report)
    r = report["requests"]
    assert r["total"] == r["finished"] == 160 and sum(r["by_ending"].values()) == 160
    assert {"length", "stop", "cancelled", "failed", "rejected"} <= set(r["by_ending"])
    assert {"waiting", "prompt", "decode"} <= set(r["cancelled_by_phase"])
    assert r["injected"]["fail_sampling"] > 0 and r["injected"]["final_step_cancels"] > 0
    assert r["preempted_requests"] > 0 and r["preemptions"] >= r["preempted_requests"]
    assert r["parallel_sample_requests"] > 0
    assert r["shutdown_tail"].get("dropped", 0) > 0  # requests in flight when the engine shut down
    assert r["unexpected"] == 0, r["unexpected_notes"]
    assert set(r["by_plan"]) == {"length", "stop", "eos", "cancel-waiting", "cancel-prompt", "cancel-decode",
                                 "cancel-final", "fail-sampling", "fail-step", "parallel", "parallel-cancel", "reject"}
    assert r["by_plan"]["reject"]["endings"] == {"rejected": r["by_plan"]["reject"]["count"]}
    assert report["host"]["available"] and report["host"]["whole_run"]["samples"] >= 5
    assert report["host"]["judged"]["from_request"] == 80  # the second half of the run
    assert report["command"].startswith("rocmforge leak-check --model ") and "--seed 2" in report["command"]


def test_the_same_seed_reproduces_the_run_and_another_seed_changes_it(tiny):
    def summary(seed: str) -> dict:
        code, out, _ = leak_check("--model", tiny, "--requests", "48", "--seed", seed, "--json", "-q")
        assert code == 0
        r = json.loads(out)["requests"]
        return {k: r[k] for k in ("by_plan", "by_ending", "cancelled_by_phase", "preemptions", "generated_tokens")}

    first = summary("11")
    assert summary("11") == first
    assert summary("12") != first


def test_tables_on_stdout_name_the_verdict_and_the_command_to_reproduce(tiny):
    code, out, _ = leak_check("--model", tiny, "--requests", "24", "--phases", "2", "-q")
    assert code == 0
    for text in ("CLEAN", "Not returned, per layer", "After each phase", "kv blocks", "ledger: kv", "phase 2",
                 "shutdown", "reproduce: rocmforge leak-check", "--phases 2"):
        assert text in out, text


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "--requests must be at least 1"),
    (["--prompt-tokens", "ten"], "--prompt-tokens"),
    (["--prompt-tokens", "9-3"], "--prompt-tokens needs 1 <= MIN <= MAX"),
    (["--fail-on", "ledger=lots"], "cannot read size"),
    (["--phases", "5", "--requests", "4"], "--phases must be between 1 and --requests"),
    (["--device", "tpu"], "tpu"),
])
def test_bad_options_are_usage_errors(tiny, args, message):
    code, out, err = leak_check("--model", tiny, *args)
    assert code == 2 and message in err and "Traceback" not in err + out


def test_the_demo_model_ends_a_few_hundred_mixed_requests_with_zero_leaks(demo_model_path):
    # The real forward pass of 30 layers costs ~0.6 s of CPU per step here, so: short requests, 16
    # sequences per step, blocks of 4 tokens (so that short requests grow into new blocks and get
    # preempted). A child process with single-threaded BLAS: on two busy cores OpenBLAS's spinning
    # threads made each step ~6x slower (measured), and the host-memory readings stay the run's own.
    command = [sys.executable, "-m", "rocmforge_cli.app", "leak-check", "--device", "cpu", "--model", str(demo_model_path),
               "--requests", "200", "--parallel", "16", "--prompt-tokens", "2-8", "--max-tokens", "3",
               "--step-tokens", "24", "--block-size", "4", "--json", "-q"]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "COLUMNS": "200"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert_clean(report)
    r = report["requests"]
    assert r["finished"] == 200 and {"length", "stop", "cancelled", "failed", "rejected"} <= set(r["by_ending"])
    assert {"waiting", "prompt", "decode"} <= set(r["cancelled_by_phase"])
    assert r["preempted_requests"] > 0 and r["parallel_sample_requests"] > 0 and r["unexpected"] == 0
    assert r["injected"]["fail_sampling"] > 0 and r["injected"]["fail_step"] > 0
