"""Every command's tables at 80 and at 200 columns (issue 54): no line wider than the terminal, no number cut across
lines or from its unit, names wrapped between words or shortened with '…' (tests/support/output_widths.py); at 200
columns the room is used. Each command runs for real on the cpu backend with the tiny model; the two leak checks run
once and their report is printed at both widths by the command itself."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model
from support.output_widths import NARROW, NUMBER, WIDE, assert_readable_at, number_forms, words
from support.serve_testing import wait_until_up
from rocmforge_cli.app import app

runner = CliRunner()


def at(width: int, *args: str, exit_code: int = 0):
    result = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code == exit_code, result.output[-3000:]
    return result


def both(*args: str, exit_code: int = 0):
    """The command's stdout and stderr at 80 and at 200 columns, each pair checked."""
    narrow, wide = at(NARROW, *args, exit_code=exit_code), at(WIDE, *args, exit_code=exit_code)
    assert_readable_at(narrow.stdout, wide.stdout)
    assert_readable_at(narrow.stderr, wide.stderr)
    return narrow, wide


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


@pytest.fixture(scope="module")
def long_named(tmp_path_factory, tiny) -> str:
    """The tiny model under a long file name in a deep folder: what the name and path cells must fold or shorten."""
    folder = tmp_path_factory.mktemp("models") / "a folder with a long name" / "SmolLM2-135M-Instruct-GGUF"
    folder.mkdir(parents=True)
    return str(shutil.copy(tiny, folder / "SmolLM2-135M-Instruct-rocmforge-width-test.Q4_1.gguf"))


# The planted faults the checks must catch: a number cut, a number cut from its unit, a word folded, a line too long.
@pytest.mark.parametrize("narrow", ["layer  1,097,\n       048", "weights 93.8\nMiB", "ledger: activation\ns", "x" * 81])
def test_the_checks_catch_a_cut_number_a_cut_word_and_a_long_line(narrow):
    wide = "layer  1,097,048\nweights 93.8 MiB\nledger: activations\n" + "x" * 81
    with pytest.raises(AssertionError):
        assert_readable_at(narrow + "\n" + wide.split("\n", 1)[1], wide)


def test_the_checks_allow_wrapping_between_words_and_shortening():
    assert_readable_at("ledger:\nactivations  93.8 MiB\nSmolLM2-13…", "ledger: activations  93.8 MiB\nSmolLM2-135M-x")
    assert number_forms("6,413.9 tokens/s took 55.91 ms") == number_forms("999.0 tokens/s took 1.00 ms")


def prompt_eval_lines(text: str) -> list[str]:
    lines = text.splitlines()
    k = next(k for k, line in enumerate(lines) if "prompt eval time" in line)
    return lines[k:k + 2]


def test_generate(tiny):
    args = ("generate", "--model", tiny, "--device", "cpu", "-n", "4", "-p", "hello", "--seed", "1")
    narrow, wide = both(*args)
    assert "memory breakdown" in narrow.stderr
    # llama.cpp's line goes on under its '(' at 80 columns; at 200, and in a log (no terminal, no COLUMNS), it is whole
    first, second = prompt_eval_lines(narrow.stderr)
    assert first.endswith("ms per token,") and second.strip().endswith("tokens per second)")
    assert second.startswith(" " * (first.index("(") + 1))  # under the '(' (the rate right-aligned, as llama.cpp's)
    assert prompt_eval_lines(wide.stderr)[0].endswith("tokens per second)")
    log = runner.invoke(app, list(args), env={"COLUMNS": None})
    assert prompt_eval_lines(log.stderr)[0].endswith("tokens per second)")


def test_bench_and_its_breakdown(long_named):
    narrow, wide = both("bench", "--model", long_named, "--device", "cpu", "-p", "8", "-n", "4", "-b", "2", "-r", "1")
    name = "SmolLM2-135M-Instruct-rocmforge-width-test.Q4_1.gguf"
    rows = [line for line in narrow.stdout.splitlines() if line.startswith("| SmolLM2")]
    assert len(rows) == 3 and all("…" in row for row in rows)  # the model's name shortened to fit
    assert f"model: {name}" in narrow.stdout  # ... and given whole below the table
    assert sum(f"| {name} |" in line for line in wide.stdout.splitlines()) == 3
    assert "memory breakdown" in narrow.stderr


def test_bench_profile_of_a_mixture(tmp_path):
    from support.moe_models import write_moe_model

    """The profile's kernel table, with its weights read and GB/s columns, within each width (its advice depends on
    timings, so that the two runs' figures are not compared)."""
    moe = str(write_moe_model("qwen3moe-q4km", tmp_path))
    for width in (NARROW, WIDE):
        out = at(width, "bench", "--model", moe, "--device", "cpu", "-p", "0", "-n", "2", "-b", "0", "-r", "1",
                 "--profile", "-q").stdout
        assert max(len(line) for line in out.splitlines()) <= width
        assert "moe_gate_up" in out and "GB/s" in out and "of each MoE layer's 8 experts" in " ".join(out.split())


FAKE_LLAMA_BENCH = """#!/bin/sh
echo '[{"n_prompt": 8, "n_gen": 0, "avg_ts": 41234.56, "stddev_ts": 1234.5}, {"n_prompt": 0, "n_gen": 4, "avg_ts": 1450.25, "stddev_ts": 3.5}]'
"""


def test_bench_beside_llama_cpp(long_named, tmp_path):
    """With llama.cpp's columns a row is too wide for 80 columns even with the name shortened: its figures and the
    ratio go to a table of their own below, every figure kept; at 200 columns they stay in the rows."""
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_LLAMA_BENCH)
    exe.chmod(0o755)
    narrow, wide = both("bench", "--model", long_named, "--device", "cpu", "-p", "8", "-n", "4", "-b", "0", "-r", "1",
                        "--llama-bench", str(exe))
    assert "| test | llama.cpp t/s | ratio |" in narrow.stdout and "41234.56 ± 1234.50" in narrow.stdout
    assert "| test | llama.cpp t/s | ratio |" not in wide.stdout
    assert sum("41234.56 ± 1234.50" in line and "| pp8 |" in line for line in wide.stdout.splitlines()) == 1


def test_bench_prefix_reuse(tiny):
    """Markdown as written at 200 columns (and in a file); drawn by rich at 80, where its header is 116 wide."""
    narrow, wide = both("bench", "--model", tiny, "--device", "cpu", "--prefix-reuse", "--conversations", "2",
                        "--turns", "2")
    assert "| turn | prompt | TTFT p50 cached |" in wide.stdout
    assert not any(line.startswith("|") for line in narrow.stdout.splitlines()) and "hit" in narrow.stdout


@pytest.mark.parametrize("args", [[], ["--plan"], ["--workloads"]], ids=["capacity", "plan", "workloads"])
def test_profile_kv(long_named, args):
    narrow, wide = both("profile-kv", "--model", long_named, "--device", "cpu", *args)
    assert "SmolLM2-135M-Instruct-rocmforge-width-test.Q4_1.gguf" in wide.stdout  # the path whole at 200
    assert any(len(line) > 100 for line in wide.stdout.splitlines())  # the room used


def test_profile_kv_presets():
    both("profile-kv", "--list-presets")
    both("profile-kv", "--preset", "Gemma-3-27B", "--plan", "--memory", "24GiB")


def test_inspect(long_named):
    narrow, wide = both("inspect", long_named)
    assert "SmolLM2-135M-Instruct-rocmforge-width-test.Q4_1.gguf" in wide.stdout


def test_inspect_the_demo_models_tensors(demo_model_path):
    narrow, wide = both("inspect", str(demo_model_path), "--tensors")
    assert "blk.29.ffn_down.weight" in narrow.stdout and "Q4_1" in narrow.stdout


def test_devices():
    both("devices")


def test_kernels_list(tmp_path):
    """Seven targets and every op, a third of them stale: no target's name shortened ('gfx1…' could be three)."""
    from hipcore.runtime.kernels import MANIFEST_FORMAT, op_names, source_digest, write_manifest

    targets = ["gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1201", "sm_80", "sm_90"]
    write_manifest({"format": MANIFEST_FORMAT, "objects": {target: {
        op: {"source_sha256": source_digest(op) if k % 3 else "older", "kernels": {"k": {"registers": 40 + k}}}
        for k, op in enumerate(op_names())} for target in targets}}, tmp_path)
    narrow, wide = both("kernels", "list", "--dir", str(tmp_path))
    assert all(target in narrow.stdout for target in targets) and "…" not in narrow.stdout
    assert "paged_attention" in narrow.stdout and "stale" in narrow.stdout


@pytest.fixture(scope="module", params=[None, "device-leak"], ids=["clean", "planted-leak"])
def leak_report(tiny, request):
    """A clean run, and one with a planted leak: what a user reads first then (findings, where each byte was made)."""
    from profiles.leak_check import run_leak_check
    from profiles.leak_settings import LeakCheckSettings

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROCMFORGE_TESTING", "1")
        return run_leak_check(LeakCheckSettings(model=tiny, device="cpu", requests=24, kv_blocks=400, tracemalloc=True,
                                                planted_bug=request.param))


def test_leak_check_summary(tiny, leak_report, monkeypatch):
    from rocmforge_cli import leak_check

    monkeypatch.setattr(leak_check, "run_leak_check", lambda settings, progress, trace: leak_report)
    narrow, wide = both("leak-check", "--model", tiny, "--device", "cpu", "-q", exit_code=leak_report.exit_code)
    assert "Not returned, per layer" in narrow.stdout
    assert exact_numbers(narrow.stdout) == exact_numbers(wide.stdout)  # one report: the same figures, not only forms
    # the reproduce line is a command a shell takes as it is printed: wrapped after ' \\' at 80 columns
    command = " ".join(part.rstrip(" \\").strip() for part in narrow.stdout.split("reproduce: ")[1].splitlines())
    assert command.split() == leak_report.command.split()
    if leak_report.leaked:
        assert "LEAK:" in narrow.stdout and "Not returned (" in narrow.stdout and "leak_bugs.py:" in wide.stdout


def test_serve_leak_check_summary(tmp_path_factory, tiny, monkeypatch):
    from profiles.leak_thresholds import parse_fail_on
    from profiles.serve_leak_check import ServeLeakSettings, run_serve_leak_check
    from rocmforge_cli import serve_leak_check

    report = run_serve_leak_check(ServeLeakSettings(
        model=tiny, device="cpu", requests=8, clients=4, max_tokens=2, thresholds=parse_fail_on(["host-growth=off"]),
        extra_args=("--ctx-size", "256", "--kv-blocks", "400")), command_line="rocmforge serve-leak-check " + "-x " * 40)
    monkeypatch.setattr(serve_leak_check, "run_serve_leak_check", lambda settings, progress, command_line: report)
    narrow, wide = both("serve-leak-check", "--model", tiny, "--device", "cpu", "-q")
    assert exact_numbers(narrow.stdout) == exact_numbers(wide.stdout) and "CLEAN" in narrow.stdout


def exact_numbers(text: str) -> Counter:
    return Counter(NUMBER.findall(text))


def serve_exit_output(model: str, width: int) -> str:
    from test_serve_shutdown import free_port

    port = free_port()
    # --one-process: the breakdown is the engine's, and a second process only slows the test
    server = subprocess.Popen([sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", model, "--device", "cpu",
                               "--port", str(port), "--one-process"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "COLUMNS": str(width)})
    try:
        wait_until_up(server, f"http://127.0.0.1:{port}")
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err
    return err[err.index("memory breakdown"):]


def test_serve_exit_breakdown(tiny):
    narrow, wide = serve_exit_output(tiny, NARROW), serve_exit_output(tiny, WIDE)
    assert "this process (the ledger)" in narrow
    assert_readable_at(narrow, wide)
    assert words(narrow) == words(wide)
    assert re.search(r"KV cache +\d", narrow)
