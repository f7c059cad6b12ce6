"""`rocmforge bench` on the cpu backend with a tiny model, and the memory plan `generate` prints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model
from support.gguf_factory import write_gguf
from support.moe_models import moe_spec
from profiles.bench import BenchConfig
from rocmforge_cli.app import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def bench(*args: str):
    return runner.invoke(app, ["bench", *args], env={"COLUMNS": "200"})


def test_json_report_has_every_test_and_the_facts(tiny):
    result = bench("-m", tiny, "-d", "cpu", "-p", "8,16", "-n", "3", "-b", "2", "--batch-gen", "2", "-r", "2", "-o", "json", "-q")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["test"] for r in report["results"]] == ["pp8", "pp16", "tg3", "b2x2"]
    for r in report["results"]:
        assert len(r["tokens_per_second"]) == 2 and all(v > 0 for v in r["tokens_per_second"])
        assert r["mean"] == pytest.approx(sum(r["tokens_per_second"]) / 2)
    assert report["backend"] == "cpu" and report["kv_dtype"] == "f16" and report["quant"] == "F32"
    assert report["graphs"] is True and report["commit"] and report["model"] == "tiny.gguf"
    memory = report["memory"]  # taken while the model was loaded
    assert memory["weights"] > 0 and memory["kv_cache"] > 0 and memory["ledger"] >= memory["weights"] + memory["kv_cache"]


def test_markdown_table_and_profile(tiny):
    result = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "2", "-b", "0", "-r", "1", "--profile", "--kv-dtype", "f32", "-q")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "| model | size | params | backend | kv | test | t/s |" in out
    assert "| tg2 |" in out and "| f32 |" in out
    assert "One decode step: batch 1" in out
    for kind in ("attn_norm+qkv+rope", "kv_store", "attention", "ffn_norm+gate_up+silu", "ffn_down+residual", "sample"):
        assert f"| {kind} |" in out
    assert "graph replay (device)" in out and "floor" in out
    deep = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "0", "-b", "0", "-r", "1", "--profile", "--profile-depth", "40",
                 "--kv-dtype", "f32", "-q")
    assert deep.exit_code == 0, deep.output
    assert "One decode step: batch 1, context 40" in deep.stdout


def test_profile_deeper_than_a_window_layers_pool(tmp_path):
    """A sliding-window model profiled past what its window group holds: the profiled sequence's KV is reserved a
    chunk at a time, the blocks behind the window given back (one reserve of 1,500 tokens found no room)."""
    path = write_gguf(tmp_path / "gpt-oss-long.gguf", moe_spec("gpt-oss-mxfp4", context=2048))
    result = bench("-m", str(path), "-d", "cpu", "-p", "0", "-n", "0", "-b", "0", "-r", "1", "--profile",
                   "--profile-depth", "1500", "-q")
    assert result.exit_code == 0, result.output
    assert "One decode step: batch 1, context 1500" in result.stdout


def test_without_graphs_and_bad_options(tiny):
    result = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "2", "-b", "0", "-r", "1", "--no-graphs", "-o", "json", "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["graphs"] is False
    for args, message in ((("-p", "x"),), "whole numbers"), ((("-o", "csv"),), "md or json"), \
                         ((("-p", "0", "-n", "0", "-b", "0"),), "nothing to run"), \
                         ((("--profile", "--no-graphs"),), "--no-graphs"), \
                         ((("--profile", "--profile-depth", "0"),), "--profile-depth must be at least 1"):
        result = bench("-m", tiny, "-d", "cpu", *args[0])
        assert result.exit_code == 2 and message in result.output, (args, result.output)


def test_generate_prints_the_memory_plan_before_loading(tiny):
    result = runner.invoke(app, ["generate", "-m", tiny, "--device", "cpu", "--temp", "0", "-n", "2", "hello"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "memory plan (before anything is allocated)" in result.stderr
    assert "kv cache" in result.stderr and "scratch (step inputs, attention workspace)" in result.stderr
    quiet = runner.invoke(app, ["generate", "-m", tiny, "--device", "cpu", "--temp", "0", "-n", "2", "-q", "hello"])
    assert "memory plan" not in quiet.stderr


def test_context_holds_the_longest_prompt_and_generation():
    assert BenchConfig(model="m", prompt_tokens=(512,), gen_tokens=(128,), batches=()).context > 513
    assert BenchConfig(model="m", prompt_tokens=(), gen_tokens=(1000,), batches=()).context >= 1002
    assert BenchConfig(model="m", prompt_tokens=(), gen_tokens=(), batches=(8,), batch_gen_tokens=300).context >= 302
    assert BenchConfig(model="m", prompt_tokens=(), gen_tokens=(), batches=(), profile_batch=1,
                       profile_depth=4096).context >= 4098
    assert BenchConfig(model="m", prompt_tokens=(), gen_tokens=(8,), batches=(), profile_depth=4096).context < 4096


# ---- rows as they finish, Ctrl-C, llama.cpp side by side, host time -------------------------------


def _interrupt_batched(monkeypatch):
    """The batched test (the last) is interrupted as by Ctrl-C; pp and tg run for real."""
    from profiles import bench as bench_module

    real = bench_module.Workloads.decode

    def decode(self, batch, n, depth=0):
        if batch > 1:
            raise KeyboardInterrupt
        return real(self, batch, n, depth)

    monkeypatch.setattr(bench_module.Workloads, "decode", decode)


def test_rows_print_as_they_finish_and_ctrl_c_keeps_them(tiny, monkeypatch):
    _interrupt_batched(monkeypatch)
    result = bench("-m", tiny, "-d", "cpu", "-p", "8", "-n", "2", "-b", "2", "--batch-gen", "2", "-r", "1", "-q")
    assert result.exit_code == 130, result.output
    out = result.stdout
    assert "| model | size |" in out and "| pp8 |" in out and "| tg2 |" in out and "b2x2" not in out
    assert "interrupted after 2 of 3 tests" in out and "device: " in out
    assert "interrupted" in result.stderr


def test_ctrl_c_in_json_gives_the_partial_report(tiny, monkeypatch):
    _interrupt_batched(monkeypatch)
    result = bench("-m", tiny, "-d", "cpu", "-p", "8", "-n", "2", "-b", "2", "--batch-gen", "2", "-r", "1", "-q", "-o", "json")
    assert result.exit_code == 130, result.output
    report = json.loads(result.stdout)
    assert report["interrupted"] is True and [r["test"] for r in report["results"]] == ["pp8", "tg2"]


def test_each_row_is_on_stdout_before_the_next_test_runs(tiny, monkeypatch):
    """Rows stream: when the tg test starts, the pp row has already been written."""
    from profiles import bench as bench_module

    seen = []
    real = bench_module.Workloads.decode
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))

    def decode(self, batch, n, depth=0):
        seen.append(any("| pp8 |" in line for line in printed))
        return real(self, batch, n, depth)

    monkeypatch.setattr(bench_module.Workloads, "decode", decode)
    result = bench("-m", tiny, "-d", "cpu", "-p", "8", "-n", "2", "-b", "0", "-r", "1", "-q")
    assert result.exit_code == 0, result.output
    assert seen and all(seen)


FAKE_LLAMA_BENCH = """#!/bin/sh
echo "$@" > "$(dirname "$0")/llama-bench.args"
echo '[{"n_prompt": 8, "n_gen": 0, "avg_ts": 400.0, "stddev_ts": 4.0}, {"n_prompt": 0, "n_gen": 2, "avg_ts": 50.0, "stddev_ts": 1.0}]'
"""
# llama-batched-bench writes its jsonl through its logger; runs in the order of -npl
FAKE_BATCHED_BENCH = """#!/bin/sh
echo "$@" > "$(dirname "$0")/llama-batched-bench.args"
echo "main: loading" >&2
speed=10
for pl in $(echo "$@" | sed 's/.*-npl \\([0-9,]*\\).*/\\1/' | tr ',' ' '); do
  echo "{\\"pp\\": 1, \\"tg\\": 2, \\"pl\\": $pl, \\"speed_tg\\": $speed.0}"
  speed=$((speed + 10))
done
"""


def _fake_llama_cpp(tmp_path, batched: bool = True):
    for name, text in (("llama-bench", FAKE_LLAMA_BENCH), ("llama-batched-bench", FAKE_BATCHED_BENCH))[:2 if batched else 1]:
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
    return tmp_path / "llama-bench"


def test_every_row_has_llama_cpp_figures_and_a_ratio(tiny, tmp_path):
    exe = _fake_llama_cpp(tmp_path)
    result = bench("-m", tiny, "-d", "cpu", "-p", "8", "-n", "2", "-b", "2,3", "--batch-gen", "2", "-r", "2", "-q",
                   "--llama-bench", str(exe))
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("| tiny.gguf")]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[7] != "-" and float(cells[8]) > 0, row
    # batched: warm-up b2, then each B twice; the warm-up (10) is left out: b2 = mean(20, 30), b3 = mean(40, 50)
    assert "| b2x2 |" in result.stdout and "25.00 ± 7.07" in result.stdout and "45.00 ± 7.07" in result.stdout
    args = (tmp_path / "llama-batched-bench.args").read_text().split()
    assert args[args.index("-npp") + 1] == "1" and args[args.index("-ntg") + 1] == "2"
    assert args[args.index("-npl") + 1] == "2,2,2,3,3" and int(args[args.index("-c") + 1]) >= 3 * 3
    report = json.loads(bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "0", "-b", "2", "--batch-gen", "2", "-r", "2",
                              "-q", "-o", "json", "--llama-bench", str(exe)).stdout)
    assert [r["test"] for r in report["llama_batched_bench"]] == ["b2x2"] and report["llama_bench"] == []


def test_missing_batched_bench_is_said_not_hidden(tiny, tmp_path):
    exe = _fake_llama_cpp(tmp_path, batched=False)
    result = bench("-m", tiny, "-d", "cpu", "-p", "8", "-n", "0", "-b", "2", "--batch-gen", "2", "-r", "1", "-q",
                   "--llama-bench", str(exe))
    assert result.exit_code == 0, result.output
    assert "no llama-batched-bench beside llama-bench" in result.stdout
    assert "| b2x2 | " in result.stdout and "| - | - |" in result.stdout
    bad = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "0", "-b", "2", "-q", "--llama-batched-bench", str(tmp_path / "nope"))
    assert bad.exit_code == 2 and "not an executable file" in bad.output


def test_profile_never_reports_negative_host_time():
    from profiles.decode_profile import DecodeProfile, KernelKind
    from rocmforge_cli.bench import profile_markdown

    # the engine's steps (short contexts) measured faster than the replay timed at context 128
    p = DecodeProfile(batch=1, context=128, device="cpu", launches=10, graph_us=900.0, eager_us=950.0,
                      kernels=[KernelKind("attention", 10, 800.0)], runner_us=1000.0, runner_split_us={},
                      engine_step_us=700.0, weight_bytes=1 << 20, copy_bandwidth=1e10)
    text = profile_markdown(p)
    assert p.host_us is None and "host work could not be told apart" in text
    assert "host work is -" not in text and "(-" not in text
    assert p.to_dict()["host_us"] is None
    p.engine_step_us = 1200.0
    assert p.host_us == 300.0 and "host work is 300 us of the 1,200 us step (25%)" in profile_markdown(p)


def test_a_batched_bench_that_prints_no_results_is_refused(tiny, tmp_path):
    exe = tmp_path / "llama-batched-bench"
    exe.write_text("#!/bin/sh\necho 'main: unknown argument: -npl' >&2\necho 'no jsonl here'\n")
    exe.chmod(0o755)
    result = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "0", "-b", "2", "--batch-gen", "2", "-r", "1", "-q",
                   "--llama-batched-bench", str(exe))
    assert result.exit_code == 2 and "printed 0 results for 2 runs" in result.output, result.output


FAKE_LLAMA_BENCH_DEPTH = """#!/bin/sh
echo "$@" > "$(dirname "$0")/llama-bench.args"
echo '[{"n_prompt": 0, "n_gen": 2, "n_depth": 0, "avg_ts": 50.0, "stddev_ts": 1.0}, {"n_prompt": 0, "n_gen": 2, "n_depth": 6, "avg_ts": 40.0, "stddev_ts": 1.0}]'
"""


def test_depth_decodes_after_a_context_of_that_many_tokens_beside_llama_bench_d(tiny, tmp_path, monkeypatch):
    """--n-depth 0,6: tg2 after a one-token prompt and tg2 @ d6 after a six-token one (prompts not timed),
    each beside llama-bench's record of the same depth (it gets -d 0,6)."""
    from profiles import bench as bench_module

    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_LLAMA_BENCH_DEPTH)
    exe.chmod(0o755)
    prompts = []
    real = bench_module.Workloads._prompt
    monkeypatch.setattr(bench_module.Workloads, "_prompt", lambda self, n: prompts.append(n) or real(self, n))
    result = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "2", "-b", "0", "--n-depth", "0,6", "-r", "1", "-q",
                   "--llama-bench", str(exe))
    assert result.exit_code == 0, result.output
    rows = {c[5]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in result.stdout.splitlines()
                              if line.startswith("| tiny.gguf"))}
    assert set(rows) == {"tg2", "tg2 @ d6"}
    assert rows["tg2"][7].startswith("50.00") and rows["tg2 @ d6"][7].startswith("40.00")
    assert set(prompts) == {1, 6}
    args = (tmp_path / "llama-bench.args").read_text().split()
    assert args[args.index("-d") + 1] == "0,6"


def test_depth_values_are_checked():
    for bad in ("-1", "x", ","):
        result = bench("-d", "cpu", "-p", "0", "-n", "2", "-b", "0", "--n-depth", bad, "-q")
        assert result.exit_code == 2 and "--n-depth" in result.output, (bad, result.output)


def test_bench_says_each_test_with_the_tests_left_and_ends_with_the_memory_breakdown(tiny):
    result = bench("-m", tiny, "-d", "cpu", "-p", "8", "-n", "2", "-b", "2", "--batch-gen", "2", "-r", "1")
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if line.startswith("test ")]
    assert said == ["test 1 of 3: pp8 (2 left after it)", "test 2 of 3: tg2 (1 left after it)",
                    "test 3 of 3: b2x2 (0 left after it)"], result.stderr
    assert "memory breakdown" in result.stderr and "this process (the ledger)" in result.stderr
