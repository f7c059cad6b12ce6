"""`rocmforge bench` on the cpu backend with a tiny model, and the memory plan `generate` prints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model
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


def test_without_graphs_and_bad_options(tiny):
    result = bench("-m", tiny, "-d", "cpu", "-p", "0", "-n", "2", "-b", "0", "-r", "1", "--no-graphs", "-o", "json", "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["graphs"] is False
    for args, message in ((("-p", "x"),), "whole numbers"), ((("-o", "csv"),), "md or json"), \
                         ((("-p", "0", "-n", "0", "-b", "0"),), "nothing to run"), \
                         ((("--profile", "--no-graphs"),), "--no-graphs"):
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
