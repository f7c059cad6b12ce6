"""`rocmforge bench --prefix-reuse` on the cpu backend with a tiny model: the multi-turn chat load with and without
the prefix cache (profiles/bench_prefix.py), its hit counts checked by hand."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model
from rocmforge_cli.app import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def bench(*args: str):
    return runner.invoke(app, ["bench", *args], env={"COLUMNS": "200"})


def test_json_report_of_both_runs(tiny):
    result = bench("-m", tiny, "-d", "cpu", "--prefix-reuse", "--conversations", "2", "--turns", "3", "--turn-tokens",
                   "20", "--reply-tokens", "4", "-o", "json", "-q")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    on, off = report["with_cache"], report["without_cache"]
    assert on["prefix_caching"] and not off["prefix_caching"]
    # prompts: 20, 44, 68 tokens; turn t + 1 finds the full 16-token blocks of turn t's computed tokens (its prompt
    # and all but its reply's last token): 23 -> 16, 47 -> 32
    assert [t["prompt_tokens"] for t in on["turns"]] == [20, 44, 68]
    assert [t["hit_rate"] for t in on["turns"]] == pytest.approx([0, 16 / 44, 32 / 68])
    assert all(t["hit_rate"] == 0 for t in off["turns"])
    assert on["prompt_tokens"] == off["prompt_tokens"] == off["computed_prompt_tokens"] == 2 * (20 + 44 + 68)
    assert on["computed_prompt_tokens"] == on["prompt_tokens"] - 2 * (16 + 32)
    assert on["generated_tokens"] == off["generated_tokens"] == 2 * 3 * 4
    assert all(t["ttft_p50"] > 0 and t["ttft_p99"] >= t["ttft_p50"] for t in on["turns"] + off["turns"])
    assert report["throughput_ratio"] == pytest.approx(on["tokens_per_second"] / off["tokens_per_second"])
    assert report["device"].startswith("cpu") and report["commit"]


def test_markdown_table(tiny):
    result = bench("-m", tiny, "-d", "cpu", "--prefix-reuse", "--conversations", "2", "--turns", "2", "-q")
    assert result.exit_code == 0, result.output
    assert "| turn | prompt | TTFT p50 cached | TTFT p50 uncached |" in result.stdout
    assert "| prefix cache |" in result.stdout and "| no prefix cache |" in result.stdout


def test_chat_options_need_prefix_reuse(tiny):
    result = bench("-m", tiny, "-d", "cpu", "--turns", "2")
    assert result.exit_code == 2 and "--turns only applies to --prefix-reuse" in result.output
