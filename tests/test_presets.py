"""Model presets: shapes from the published configs, checked through the parameter counts the model
cards publish, and the demo GGUF read into the same shape."""

from __future__ import annotations

import pytest

from hipcore.errors import RocmforgeError, UsageError
from profiles.presets import PRESETS, get_preset, llama_parameter_count, resolve_shape, shape_from_gguf

# Parameter counts published with each checkpoint (Hugging Face safetensors metadata / model cards).
PUBLISHED_PARAMETERS = {
    "SmolLM2-135M": 134_515_008,
    "Llama-3.2-1B": 1_235_814_400,
    "Llama-3.1-8B": 8_030_261_248,
    "Llama-2-7B": 6_738_415_616,
    "Llama-2-13B": 13_015_864_320,
    "Llama-2-70B": 68_976_648_192,
    "Qwen2.5-7B": 7_615_616_512,
    "Mistral-7B": 7_241_732_096,
}


def test_every_required_preset_exists():
    assert set(PUBLISHED_PARAMETERS) <= set(PRESETS)


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMETERS))
def test_parameter_count_from_the_shape_equals_the_published_count(name):
    shape = PRESETS[name]
    assert shape.n_params == PUBLISHED_PARAMETERS[name]
    assert shape.n_heads * shape.head_dim == shape.hidden_size
    assert shape.n_heads % shape.n_kv_heads == 0
    assert shape.source.startswith("https://huggingface.co/") and shape.weight_bytes is None


def test_parameter_count_formula_by_hand():
    # 1 layer, hidden 8, 2 heads of 4, 1 KV head, ffn 16, vocab 10, untied, no bias:
    # embeddings 2 * 80; attention 8*8 + 2*8*4 + 8*8 = 192; mlp 3*8*16 = 384; norms 2*8; final norm 8.
    assert llama_parameter_count(1, 2, 1, 4, 8, 16, 10, tie_embeddings=False) == 160 + 192 + 384 + 16 + 8
    assert llama_parameter_count(1, 2, 1, 4, 8, 16, 10, tie_embeddings=True, qkv_bias=True) == 80 + 192 + 16 + 384 + 16 + 8


def test_the_demo_model_file_has_the_smollm2_preset_shape(demo_model_path):
    shape = shape_from_gguf(demo_model_path)
    preset = PRESETS["SmolLM2-135M"]
    fields = ("n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_size", "ffn_size", "vocab_size",
              "context_length", "n_params")
    assert {f: getattr(shape, f) for f in fields} == {f: getattr(preset, f) for f in fields}
    assert shape.weight_type == "Q4_1"
    assert 0 < shape.weight_bytes < demo_model_path.stat().st_size


def test_presets_are_found_whatever_the_case():
    assert get_preset("llama-2-70b") is PRESETS["Llama-2-70B"]
    with pytest.raises(UsageError, match="unknown preset 'gpt-5'; presets: SmolLM2-135M, "):
        get_preset("gpt-5")


def test_exactly_one_of_model_or_preset(demo_model_path):
    for args in ((None, None), (str(demo_model_path), "Llama-2-7B")):
        with pytest.raises(UsageError, match="either --model PATH or --preset NAME"):
            resolve_shape(*args)


def test_a_file_that_is_not_gguf_is_an_invalid_model(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(RocmforgeError) as info:
        shape_from_gguf(bad)
    assert info.value.exit_code == 3
