"""phi3 beside llama: the fused layout its config expects, what is refused (and with which exit code), and the
CLI commands running it on the cpu backend. Its numbers against llama.cpp are tests/test_golden_phi3.py's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from hipcore.gguf.config import config_from_metadata
from hipcore.gguf.file import GGUFError
from rocmforge_cli.app import app
from support.gguf_factory import tiny_llama_spec, write_tiny_llama

runner = CliRunner()


def spec_parts(**kwargs):
    spec = tiny_llama_spec(architecture="phi3", **kwargs)
    return {m.key: m.value for m in spec.metadata}, [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors]


def test_phi3_expects_fused_qkv_and_gate_up_with_neox_rope():
    config = config_from_metadata(*spec_parts())
    assert (config.rope_type, config.qkv_bias, config.qk_norm, config.sliding_window) == ("neox", False, False, 0)
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.1.attn_qkv.weight"] == (64 + 2 * 32, 64) and shapes["blk.1.ffn_up.weight"] == (256, 64)
    assert not {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight"} & set(shapes)


def test_separate_q_k_v_in_a_phi3_file_are_refused_and_named():
    """llama.cpp would take them too; we implement Phi-3's fused layout only (its converter's), and say so."""
    metadata, tensors = spec_parts()
    tensors.append(SimpleNamespace(name="blk.0.attn_q.weight", shape=(64, 64)))
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 4 and "blk.0.attn_q.weight" in str(info.value) and "phi3" in str(info.value)


@pytest.mark.parametrize("tensor", ["rope_factors_long.weight", "rope_factors_short.weight"])
def test_long_rope_is_refused_with_exit_4_naming_it(tensor):
    metadata, tensors = spec_parts()
    tensors.append(SimpleNamespace(name=tensor, shape=(8,)))
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 4 and "LongRoPE" in str(info.value) and tensor in str(info.value)


def test_a_wrong_fused_height_is_an_invalid_file():
    metadata, tensors = spec_parts()
    tensors = [SimpleNamespace(name=t.name, shape=(128, 64)) if t.name == "blk.0.ffn_up.weight" else t for t in tensors]
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 3 and "blk.0.ffn_up.weight" in str(info.value)


@pytest.mark.parametrize("tensor_type", ["Q8_0", "Q4_0"])
def test_generate_runs_phi3_on_the_cpu(tmp_path, tensor_type):
    path = write_tiny_llama(tmp_path / "phi3.gguf", architecture="phi3", tensor_type=tensor_type)
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "--temp", "0", "-n", "6",
                                 "--json", "hello"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert 1 <= len(out["tokens"]) <= 6 and out["ending"] in ("length", "eos")


def test_bench_runs_phi3(tmp_path):
    path = write_tiny_llama(tmp_path / "phi3.gguf", architecture="phi3")
    result = runner.invoke(app, ["bench", "-m", str(path), "-d", "cpu", "-p", "8", "-n", "3", "-b", "0", "-r", "1",
                                 "-o", "json", "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert [r["test"] for r in json.loads(result.stdout)["results"]] == ["pp8", "tg3"]


def test_a_long_rope_file_exits_4_from_the_cli(tmp_path):
    import numpy as np
    from support.gguf_factory import _encode, write_gguf
    spec = tiny_llama_spec(architecture="phi3")
    extra = _encode("rope_factors_long.weight", np.ones(8, np.float32), "F32")
    path = write_gguf(tmp_path / "long.gguf", type(spec)(spec.metadata, (*spec.tensors, extra)))
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "-n", "2", "hi"])
    assert result.exit_code == 4, result.stderr
    assert "LongRoPE" in result.stderr
