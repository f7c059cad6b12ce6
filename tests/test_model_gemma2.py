"""gemma2 beside gemma3: what its config reads (the soft caps and their defaults, the alternating window and
its pattern key, the local layers' RoPE, the 27B's attention scale), what is refused (and with which exit
code), and the CLI commands running it on the cpu backend. Its numbers against llama.cpp are
tests/test_golden_gemma2.py's."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from hipcore.gguf.config import config_from_metadata
from hipcore.gguf.file import GGUFError
from rocmforge_cli.app import app
from support.gguf_factory import tiny_llama_spec, write_tiny_llama

runner = CliRunner()


def spec_parts(**kwargs):
    spec = tiny_llama_spec(architecture="gemma2", head_dim=32, **kwargs)
    return {m.key: m.value for m in spec.metadata}, [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors]


def config(extra=None, **kwargs):
    metadata, tensors = spec_parts(**kwargs)
    return config_from_metadata({**metadata, **(extra or {})}, tensors)


def test_defaults_are_llamacpps():
    metadata, tensors = spec_parts(n_layers=4)
    del metadata["gemma2.attention.sliding_window"]
    c = config_from_metadata(metadata, tensors)
    assert (c.attn_softcap, c.final_softcap, c.sliding_window, c.swa_period) == (50.0, 30.0, 4096, 2)
    assert [c.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    assert not c.qk_norm and c.post_norms and c.activation == "gelu" and c.embedding_scale == pytest.approx(8.0)
    assert c.attention_scale == pytest.approx(1 / math.sqrt(32))


def test_the_files_caps_pattern_and_local_rope_base_are_read():
    c = config({"gemma2.attn_logit_softcapping": 20.0, "gemma2.final_logit_softcapping": 10.0,
                "gemma2.attention.sliding_window_pattern": 3, "gemma2.rope.freq_base_swa": 5000.0}, n_layers=6,
               rope_theta=1e6)
    assert (c.attn_softcap, c.final_softcap) == (20.0, 10.0)
    assert [c.layer_window(i) for i in range(6)] == [16, 16, 0, 16, 16, 0]
    assert c.layer_rope(0, 0.5) == (5000.0, 0.5) and c.layer_rope(2, 0.5) == (1e6, 0.5)


def test_the_27b_scales_queries_by_hidden_over_heads():
    """llama.cpp: 1/sqrt(n_embd / n_head) for the 46-layer model (its head size differs from that)."""
    c = config(n_layers=46)
    assert c.attention_scale == pytest.approx(1 / math.sqrt(64 // 4)) and c.attention_scale != 1 / math.sqrt(32)


@pytest.mark.parametrize("value, problem", [((1, 0, 1, 0), "per-layer"), (0, "every layer")])
def test_pattern_forms_we_do_not_implement_are_refused_with_exit_4(value, problem):
    metadata, tensors = spec_parts(n_layers=4)
    metadata["gemma2.attention.sliding_window_pattern"] = value
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 4 and problem in str(info.value) and "sliding_window_pattern" in str(info.value)


def test_an_output_matrix_is_refused_as_llamacpp_reads_none_for_gemma2():
    metadata, tensors = spec_parts()
    tensors.append(SimpleNamespace(name="output.weight", shape=(384, 64)))
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 4 and "output.weight" in str(info.value) and "gemma2" in str(info.value)


def test_a_zero_cap_is_an_invalid_file():
    metadata, tensors = spec_parts()
    metadata["gemma2.final_logit_softcapping"] = 0.0
    with pytest.raises(GGUFError) as info:
        config_from_metadata(metadata, tensors)
    assert info.value.exit_code == 3 and "final_logit_softcapping" in str(info.value)


@pytest.mark.parametrize("tensor_type", ["Q8_0", "Q5_0"])
def test_generate_runs_gemma2_with_its_chat_template(tmp_path, tensor_type):
    path = write_tiny_llama(tmp_path / "gemma2.gguf", architecture="gemma2", head_dim=32, n_layers=4,
                            tensor_type=tensor_type)
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "--temp", "0", "-n", "24",
                                 "--json", "--chat", "hello there, a prompt longer than the window"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert 1 <= len(out["tokens"]) <= 24 and out["ending"] in ("length", "eos")


def test_bench_runs_gemma2(tmp_path):
    path = write_tiny_llama(tmp_path / "gemma2.gguf", architecture="gemma2", head_dim=32, n_layers=4)
    result = runner.invoke(app, ["bench", "-m", str(path), "-d", "cpu", "-p", "32", "-n", "3", "-b", "0", "-r", "1",
                                 "-o", "json", "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert [r["test"] for r in json.loads(result.stdout)["results"]] == ["pp32", "tg3"]
