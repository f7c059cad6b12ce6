"""gemma3 beside the other families: what the config reads from its files (the window, the layer pattern,
per-layer RoPE, the scales), what is refused, and `rocmforge generate` / `bench` running it on the cpu
backend with its embedded chat template. Its numbers against llama.cpp are tests/test_golden_gemma3.py's."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from hipcore.gguf.config import config_from_metadata
from hipcore.gguf.file import GGUFError, read_plan
from rocmforge_cli.app import app
from support.gguf_factory import GEMMA_TEMPLATE, tiny_llama_spec, write_tiny_llama

runner = CliRunner()


def spec_parts(**kwargs):
    spec = tiny_llama_spec(architecture="gemma3", head_dim=32, **kwargs)
    return {m.key: m.value for m in spec.metadata}, [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors]


def test_gemma3_reads_its_traits():
    config = config_from_metadata(*spec_parts(n_layers=13, rope_theta=1e6,
                                              extra_metadata={"gemma3.rope.scaling.type": "linear",
                                                              "gemma3.rope.scaling.factor": 8.0}))
    assert (config.rope_type, config.qk_norm, config.post_norms, config.activation) == ("neox", True, True, "gelu")
    assert config.embedding_scale == pytest.approx(8.0) and config.attention_scale == pytest.approx(1 / math.sqrt(32))
    # llama.cpp's pattern for gemma3: every sixth layer (5, 11, ...) global, the rest local
    assert [config.layer_window(i) for i in range(13)] == [16] * 5 + [0] + [16] * 5 + [0] + [16]
    assert config.layer_rope(0, 0.125) == (10000.0, 1.0)  # local: base 10000, no scaling
    assert config.layer_rope(5, 0.125) == (1e6, 0.125)  # global: the file's base and linear scaling
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.3.post_attention_norm.weight"] == (64,) and shapes["blk.3.post_ffw_norm.weight"] == (64,)
    assert shapes["blk.0.attn_q_norm.weight"] == (32,) and "output.weight" not in shapes


def test_other_families_have_no_local_layers_and_keep_their_scales():
    config = config_from_metadata(*(lambda s: ({m.key: m.value for m in s.metadata},
                                               [SimpleNamespace(name=t.name, shape=t.shape) for t in s.tensors]))(
        tiny_llama_spec(architecture="qwen3", head_dim=32)))
    assert [config.layer_window(i) for i in range(2)] == [0, 0]
    assert config.layer_rope(0, 0.5) == (config.rope_theta, 0.5)
    assert config.embedding_scale == 1.0 and config.attention_scale == pytest.approx(1 / math.sqrt(32))


def test_the_27b_takes_llamacpps_attention_scale():
    """llama.cpp gives the 62-layer gemma3 (27B) 1/sqrt(hidden / heads) instead of 1/sqrt(head_dim)."""
    metadata, tensors = spec_parts(n_layers=62)
    assert config_from_metadata(metadata, tensors).attention_scale == pytest.approx(1 / math.sqrt(64 / 4), rel=1e-7)


def test_the_sliding_window_key_is_required():
    metadata, tensors = spec_parts()
    del metadata["gemma3.attention.sliding_window"]
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 3 and "sliding_window" in str(info.value)


@pytest.mark.parametrize("missing", ["blk.1.post_ffw_norm.weight", "blk.0.post_attention_norm.weight",
                                     "blk.0.attn_k_norm.weight"])
def test_a_gemma3_tensor_missing_is_an_invalid_file(missing):
    metadata, tensors = spec_parts()
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, [t for t in tensors if t.name != missing])
    assert info.value.exit_code == 3 and missing in str(info.value)


def test_a_post_norm_on_a_qwen3_file_is_refused_as_unsupported_and_named():
    spec = tiny_llama_spec(architecture="qwen3", head_dim=32)
    tensors = [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors]
    tensors.append(SimpleNamespace(name="blk.0.post_ffw_norm.weight", shape=(64,)))
    with pytest.raises(GGUFError) as info:
        config_from_metadata({m.key: m.value for m in spec.metadata}, tensors)
    assert info.value.exit_code == 4 and "post_ffw_norm" in str(info.value)


@pytest.mark.parametrize("tensor_type", ["F16", "Q8_0"])
def test_generate_runs_gemma3_with_its_chat_template(tmp_path, tensor_type):
    path = write_tiny_llama(tmp_path / "gemma3.gguf", architecture="gemma3", head_dim=32, n_layers=7,
                            tensor_type=tensor_type)
    plan = read_plan(path)
    assert plan.config.architecture == "gemma3" and plan.metadata["tokenizer.chat_template"] == GEMMA_TEMPLATE
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "--temp", "0", "-n", "20",
                                 "--json", "--chat", "hello there, how are you?"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert 1 <= len(out["tokens"]) <= 20 and out["ending"] in ("length", "eos")


def test_bench_runs_gemma3(tmp_path):
    path = write_tiny_llama(tmp_path / "gemma3.gguf", architecture="gemma3", head_dim=32, n_layers=7)
    result = runner.invoke(app, ["bench", "-m", str(path), "-d", "cpu", "-p", "24", "-n", "20", "-b", "0", "-r", "1",
                                 "-o", "json", "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert [r["test"] for r in json.loads(result.stdout)["results"]] == ["pp24", "tg20"]
