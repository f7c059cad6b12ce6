"""`rocmforge inspect`: the demo model's summary, and bad files as one line with exit 3 / 4 / 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.gguf_factory import raw_tiny_llama, write_tiny_llama
from support.gguf_raw import STRING
from rocmforge_cli.app import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["inspect", *args])


def test_demo_model_json(demo_model_path):
    result = run(str(demo_model_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["config"]["n_layers"] == 30 and data["config"]["n_kv_heads"] == 3
    assert data["file_size"] == demo_model_path.stat().st_size
    assert data["tensors"]["count"] == 272
    by_type = data["tensors"]["by_type"]
    assert set(by_type) == {"Q4_1", "Q8_0", "F32"}
    assert sum(v["bytes"] for v in by_type.values()) == data["tensors"]["bytes"]
    assert data["tokenizer"]["kind"] == "gpt2" and data["tokenizer"]["tokens"] == 49152
    assert data["tokenizer"]["supported"] is True
    assert data["kv_bytes_per_token_f16"] == 2 * 30 * 3 * 64 * 2
    assert "header read and validated" in result.stderr


def test_default_is_the_demo_model_and_tables_name_the_types():
    result = run()
    assert result.exit_code == 0, result.output
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in result.stdout
    for text in ("Q4_1", "Q8_0", "272 tensors", "9 query, 3 KV", "gpt2"):
        assert text in result.stdout


def test_tensor_listing(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layers=1, tensor_type="Q8_0")
    result = run(str(path), "--json", "--tensors")
    listing = json.loads(result.stdout)["tensors"]["list"]
    assert [t["name"] for t in listing][:2] == ["token_embd.weight", "blk.0.attn_norm.weight"]
    assert listing[0]["type"] == "Q8_0" and listing[0]["shape"] == [384, 64]
    assert "blk.0.ffn_down.weight" in run(str(path), "--tensors").stdout


def test_truncated_file_is_one_line_exit_3(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(write_tiny_llama(tmp_path / "m.gguf").read_bytes()[:-5000])
    result = run(str(path))
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid model file")
    assert "the download is probably incomplete" in lines[0]
    assert "Traceback" not in result.output


def test_unsupported_architecture_is_exit_4(tmp_path):
    raw = raw_tiny_llama(n_layers=1)
    raw.set_kv("general.architecture", STRING, "mamba")
    path = tmp_path / "mamba.gguf"
    path.write_bytes(raw.to_bytes())
    result = run(str(path))
    assert result.exit_code == 4 and "'mamba' is not supported" in result.stderr


def test_unsupported_tokenizer_is_reported_not_fatal(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={"tokenizer.ggml.pre": "no-such-pre"})
    result = run(str(path), "--json")
    assert result.exit_code == 0
    tokenizer = json.loads(result.stdout)["tokenizer"]
    assert tokenizer["supported"] is False and "no-such-pre" in tokenizer["problem"]


@pytest.mark.parametrize("name", ["missing.gguf", ""])
def test_unopenable_path_is_exit_2(tmp_path, name):
    result = run(str(tmp_path / name))
    assert result.exit_code == 2 and "cannot open model file" in result.stderr


@pytest.mark.parametrize("architecture, words", [
    ("llama", ("NORM pairs", "plain products")),
    ("qwen2", ("NEOX pairs", "biases")),
    ("qwen3", ("NEOX pairs", "q and k normalized per head")),
    ("gemma2", ("16 keys on 1 of 2 layers", "attention 50, final logits 30")),
    ("phi3", ("NEOX pairs", "attn_qkv (q|k|v)", "ffn_up (gate|up)", "none (every layer global)")),
])
def test_the_family_traits_are_shown(tmp_path, architecture, words):
    path = write_tiny_llama(tmp_path / "m.gguf", architecture=architecture)
    result = runner.invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert architecture in result.stdout and all(w in result.stdout for w in words), result.stdout
    data = json.loads(run(str(path), "--json").stdout)
    assert data["config"]["rope_type"] == ("norm" if architecture == "llama" else "neox")
