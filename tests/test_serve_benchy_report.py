"""scripts/bench/serve_benchy_report.py (llama-benchy's levels beside `rocmforge bench -b 32`) and
scripts/bench/gguf_tokenizer_json.py (the tokenizer.json llama-benchy sizes its prompts with), on files written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hipcore.gguf.file import read_plan
from support.gguf_factory import write_tiny_llama

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "bench"))

import gguf_tokenizer_json  # noqa: E402
import serve_benchy_report as report  # noqa: E402


def _metric(mean: float, std: float = 0.0) -> dict:
    return {"mean": mean, "std": std, "values": [mean]}


def _run(clients: int, tg: float, prefill_phase: bool = False) -> dict:
    return {"concurrency": clients, "context_size": 0, "prompt_size": 128, "response_size": 128,
            "is_context_prefill_phase": prefill_phase, "tg_throughput": _metric(tg, tg / 100),
            "tg_req_throughput": _metric(tg / clients), "pp_throughput": _metric(9000.0), "e2e_ttft": _metric(25.0, 3.0)}


def _write(outdir: Path, runs: list[dict], bench_mean: float | None) -> None:
    (outdir / "benchy.json").write_text(json.dumps({"version": "0.4.0", "benchmarks": runs}))
    if bench_mean is not None:
        (outdir / "bench_b32.json").write_text(json.dumps({"results": [
            {"test": "pp512", "mean": 1.0, "sd": 0.0}, {"test": "b32x128", "mean": bench_mean, "sd": 2.0}]}))
    (outdir / "shutdown_line.txt").write_text("shutdown: every KV block returned\n")


def test_ratio_is_the_32_client_generation_throughput_over_bench(tmp_path):
    # a prefill-phase entry at 32 clients must not be taken for the level's figure
    _write(tmp_path, [_run(1, 400.0), _run(32, 3300.0), _run(32, 99999.0, prefill_phase=True)], 4000.0)
    text, ok = report.summary(tmp_path)
    assert ok
    assert "| 32 | 3,300 ± 33 |" in text and "| 1 | 400 ± 4 |" in text
    assert "/ rocmforge bench b32x128: 0.82 (target >= 0.80: met)" in text
    assert "every KV block returned" in text


def test_a_ratio_below_the_target_says_not_met(tmp_path):
    _write(tmp_path, [_run(32, 3000.0)], 4000.0)
    assert "/ rocmforge bench b32x128: 0.75 (target >= 0.80: NOT met)" in report.summary(tmp_path)[0]


def test_missing_bench_or_levels_fail(tmp_path):
    _write(tmp_path, [_run(32, 3000.0)], None)
    text, ok = report.summary(tmp_path)
    assert not ok and "no result" in text
    _write(tmp_path, [], 4000.0)
    assert report.summary(tmp_path)[1] is False
    assert report.main([str(tmp_path / "absent")]) == 1


def test_tokenizer_json_carries_the_files_vocabulary(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    meta = read_plan(path).metadata
    doc = gguf_tokenizer_json.tokenizer_json(meta)
    tokens = list(meta["tokenizer.ggml.tokens"])
    assert doc["model"]["type"] == "BPE"
    assert doc["model"]["vocab"] == {t: i for i, t in enumerate(tokens)}
    assert doc["model"]["merges"] == list(meta["tokenizer.ggml.merges"])
    control = [i for i, t in enumerate(meta["tokenizer.ggml.token_type"]) if t == gguf_tokenizer_json.TOKEN_TYPE_CONTROL]
    assert control and [a["id"] for a in doc["added_tokens"]] == control
    assert all(a["content"] == tokens[a["id"]] for a in doc["added_tokens"])
    out = tmp_path / "tokenizer.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "gguf_tokenizer_json.py"), str(path), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text(encoding="utf-8")) == doc


def test_tokenizer_json_refuses_other_vocabularies(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", tokenizer="llama")
    with pytest.raises(SystemExit, match="only byte-level BPE"):
        gguf_tokenizer_json.tokenizer_json(read_plan(path).metadata)


def test_llama_batched_bench_names_itself_in_the_ratio(tmp_path):
    _write(tmp_path, [_run(32, 2600.0)], None)
    (tmp_path / "bench_b32.json").write_text(json.dumps(
        {"tool": "llama-batched-bench", "results": [{"test": "b32x128", "mean": 3250.0, "sd": 20.0}]}))
    text = report.summary(tmp_path)[0]
    assert "- llama-batched-bench b32x128: 3,250.0 ± 20.0 t/s" in text
    assert "/ llama-batched-bench b32x128: 0.80 (target >= 0.80: met)" in text


def test_batched_reads_s_tg_of_the_measured_runs(tmp_path):
    # a stand-in for llama-batched-bench: one JSON line per -npl entry (the first is the warm-up, not counted)
    fake = tmp_path / "llama-batched-bench"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nnpl = sys.argv[sys.argv.index('-npl') + 1].split(',')\n"
                    "for i, b in enumerate(npl):\n"
                    "    print(json.dumps({'pl': int(b), 'speed_tg': 1000.0 if i == 0 else 3000.0 + 100 * i}))\n")
    fake.chmod(0o755)
    doc = report.batched(str(fake), str(tmp_path / "m.gguf"), 32, 128, 2)
    assert doc["tool"] == "llama-batched-bench"
    assert doc["results"] == [{"test": "b32x128", "mean": 3150.0, "sd": pytest.approx(70.7106781)}]
