"""qwen2 and qwen3 beside llama: what the config reads from their files, what is refused (and with which exit
code), and the CLI commands running them on the cpu backend. Their numbers against llama.cpp are
tests/test_golden_families.py's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from hipcore.gguf.config import config_from_metadata
from hipcore.gguf.file import GGUFError, read_plan
from hipcore.model.families import FAMILIES, family_for
from hipcore.errors import UnsupportedModelError
from rocmforge_cli.app import app
from support.gguf_factory import tiny_llama_spec, write_tiny_llama

runner = CliRunner()


def spec_parts(**kwargs):
    spec = tiny_llama_spec(**kwargs)
    return {m.key: m.value for m in spec.metadata}, [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors]


def test_qwen2_reads_biases_and_neox_rope():
    config = config_from_metadata(*spec_parts(architecture="qwen2"))
    assert (config.architecture, config.rope_type, config.qkv_bias, config.qk_norm) == ("qwen2", "neox", True, False)
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.1.attn_q.bias"] == (64,) and shapes["blk.1.attn_k.bias"] == (32,)
    assert "blk.0.attn_q_norm.weight" not in shapes


def test_qwen3_reads_its_own_head_size_and_per_head_norms():
    config = config_from_metadata(*spec_parts(architecture="qwen3", head_dim=32))
    assert (config.rope_type, config.qkv_bias, config.qk_norm) == ("neox", False, True)
    assert config.head_dim == 32 and config.q_size == 128 and config.kv_size == 64  # not hidden / heads = 16
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.0.attn_q_norm.weight"] == (32,) and shapes["blk.0.attn_q.weight"] == (128, 64)
    assert shapes["blk.0.attn_output.weight"] == (64, 128)
    assert config.kv_bytes_per_token(2) == 2 * 2 * 2 * 32 * 2


def test_llama_keeps_norm_rope_and_no_extra_tensors():
    config = config_from_metadata(*spec_parts())
    assert (config.rope_type, config.qkv_bias, config.qk_norm) == ("norm", False, False)


@pytest.mark.parametrize("architecture, missing", [("qwen2", "blk.1.attn_v.bias"), ("qwen3", "blk.0.attn_k_norm.weight")])
def test_a_family_tensor_missing_is_an_invalid_file(architecture, missing):
    metadata, tensors = spec_parts(architecture=architecture)
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, [t for t in tensors if t.name != missing])
    assert info.value.exit_code == 3 and missing in str(info.value)


def test_a_bias_on_a_llama_file_is_refused_as_unsupported_and_named():
    metadata, tensors = spec_parts()
    tensors.append(SimpleNamespace(name="blk.0.attn_q.bias", shape=(64,)))
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 4 and "blk.0.attn_q.bias" in str(info.value) and "llama" in str(info.value)


def test_rope_freqs_belongs_to_llama_only():
    metadata, tensors = spec_parts(architecture="qwen2")
    tensors.append(SimpleNamespace(name="rope_freqs.weight", shape=(8,)))
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 4 and "rope_freqs.weight" in str(info.value)


def test_every_architecture_the_reader_accepts_has_a_forward_pass():
    from hipcore.gguf.architectures import ARCHITECTURES
    assert set(ARCHITECTURES) == set(FAMILIES)
    with pytest.raises(UnsupportedModelError, match="falcon"):
        family_for("falcon")


def test_an_unsupported_family_exits_4_naming_it(tmp_path):
    path = write_tiny_llama(tmp_path / "g.gguf", extra_metadata={"general.architecture": "falcon"})
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "-n", "2", "hi"])
    assert result.exit_code == 4, result.stderr
    assert "falcon" in result.stderr and "not supported" in result.stderr


@pytest.mark.parametrize("architecture, extra", [("qwen2", {}), ("qwen3", {"head_dim": 32})])
def test_generate_runs_the_family_with_its_chat_template(tmp_path, architecture, extra):
    path = write_tiny_llama(tmp_path / f"{architecture}.gguf", architecture=architecture, tensor_type="Q8_0", **extra)
    assert read_plan(path).config.architecture == architecture
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "--temp", "0", "-n", "6",
                                 "--json", "--chat", "hello"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["tokens"]) <= 6 and out["ending"] in ("length", "eos")


def test_bench_runs_qwen3(tmp_path):
    path = write_tiny_llama(tmp_path / "qwen3.gguf", architecture="qwen3", head_dim=32)
    result = runner.invoke(app, ["bench", "-m", str(path), "-d", "cpu", "-p", "8", "-n", "3", "-b", "0", "-r", "1",
                                 "-o", "json", "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert [r["test"] for r in json.loads(result.stdout)["results"]] == ["pp8", "tg3"]
