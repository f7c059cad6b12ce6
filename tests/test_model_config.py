"""ModelConfig from GGUF metadata: derived sizes, defaults, RoPE scaling, per-layer arrays, and the
tensor-shape contract; metadata given as a plain dict (no GGUF type table) works too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from support.gguf_factory import Meta, tiny_llama_spec, write_tiny_llama
from support.gguf_raw import ARRAY, FLOAT32, STRING, UINT32
from hipcore.gguf.file import GGUFError, read_plan
from hipcore.gguf.config import ModelConfig, check_tensor_shapes, config_from_metadata


def fake_tensors(config: ModelConfig, **overrides):
    shapes = {**config.expected_tensor_shapes(), **overrides}
    return [SimpleNamespace(name=name, shape=shape) for name, shape in shapes.items() if shape is not None]


def metadata_of(**kwargs) -> dict:
    return {m.key: m.value for m in tiny_llama_spec(**kwargs).metadata}


def tensors_of(**kwargs):
    return [SimpleNamespace(name=t.name, shape=t.shape) for t in tiny_llama_spec(**kwargs).tensors]


def test_demo_model_shapes_and_kv_bytes(demo_model_path):
    config = read_plan(demo_model_path).config
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.0.attn_q.weight"] == (576, 576)
    assert shapes["blk.0.attn_k.weight"] == (192, 576)      # 3 KV heads x 64
    assert shapes["blk.29.ffn_down.weight"] == (576, 1536)
    assert "output.weight" not in shapes                    # tied
    # K and V, 30 layers, 3 KV heads (not the 9 query heads), head_dim 64
    assert config.kv_bytes_per_token(2) == 2 * 30 * 3 * 64 * 2


def test_plain_dict_metadata_is_accepted():
    config = config_from_metadata(metadata_of(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=96),
                                  tensors_of(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=96))
    assert (config.n_layers, config.hidden_size, config.ffn_size, config.head_dim) == (2, 64, 96, 16)
    assert config.q_size == 64 and config.kv_size == 32
    assert config.vocab_size == 384 and config.name == "tiny-llama-test"


def test_untied_model_expects_output_weight():
    config = config_from_metadata(metadata_of(tied=False), tensors_of(tied=False))
    assert not config.tie_embeddings
    assert config.expected_tensor_shapes()["output.weight"] == (384, 64)


def test_defaults_when_optional_keys_are_absent():
    metadata = metadata_of()
    for key in ("llama.attention.head_count_kv", "llama.rope.freq_base", "llama.rope.dimension_count",
                "llama.vocab_size", "general.name", "general.file_type"):
        del metadata[key]
    base = config_from_metadata(metadata_of(n_kv_heads=4), tensors_of(n_kv_heads=4))
    config = config_from_metadata(metadata, fake_tensors(base))
    assert config.n_kv_heads == config.n_heads == 4          # no GQA unless declared
    assert config.rope_theta == 10000.0 and config.rope_dim == config.head_dim
    assert config.name == "" and config.file_type is None
    assert config.rope_scaling == "none" and config.rope_scaling_factor == 1.0
    assert config.rope_original_context == config.context_length


def test_key_length_sets_the_head_size():
    metadata = metadata_of(hidden=64, n_heads=4, n_kv_heads=2)
    metadata["llama.attention.key_length"] = 32
    metadata["llama.rope.dimension_count"] = 32
    probe = config_from_metadata(metadata_of(), tensors_of())
    config = config_from_metadata(metadata, fake_tensors(probe, **{
        f"blk.{i}.{part}.weight": shape for i in range(2) for part, shape in
        (("attn_q", (128, 64)), ("attn_k", (64, 64)), ("attn_v", (64, 64)), ("attn_output", (64, 128)))}))
    assert config.head_dim == 32 and config.q_size == 128


@pytest.mark.parametrize("extra,kind,factor", [
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}, "linear", 4.0),
    ({"llama.rope.scale_linear": 2.0}, "linear", 2.0),
    ({"llama.rope.scaling.type": "none"}, "none", 1.0),
])
def test_rope_scaling(extra, kind, factor):
    metadata = {**metadata_of(context=256), **extra, "llama.rope.scaling.original_context_length": 128}
    config = config_from_metadata(metadata, tensors_of())
    assert (config.rope_scaling, config.rope_scaling_factor, config.rope_original_context) == (kind, factor, 128)


@pytest.mark.parametrize("extra,fragment", [
    ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 2.0}, "contradicts"),
    ({"llama.rope.scaling.type": "longrope"}, "longrope"),
    ({"llama.rope.scaling.original_context_length": 100_000}, "original_context_length"),
    ({"llama.attention.value_length": 8}, "value head sizes"),
])
def test_rope_and_head_size_errors(extra, fragment):
    with pytest.raises(GGUFError, match=fragment):
        config_from_metadata({**metadata_of(), **extra}, tensors_of())


def test_uniform_per_layer_arrays_are_accepted(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layers=3, extra_metadata={
        "llama.feed_forward_length": Meta("llama.feed_forward_length", ARRAY, (128, 128, 128), UINT32),
        "llama.attention.head_count_kv": Meta("llama.attention.head_count_kv", ARRAY, (2, 2, 2), UINT32)})
    config = read_plan(path).config
    assert config.ffn_size == 128 and config.n_kv_heads == 2


def test_per_layer_array_of_the_wrong_length_is_invalid(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layers=3, extra_metadata={
        "llama.feed_forward_length": Meta("llama.feed_forward_length", ARRAY, (128, 128), UINT32)})
    with pytest.raises(GGUFError) as info:
        read_plan(path)
    assert info.value.exit_code == 3 and "per-layer values for 3 layers" in str(info.value)


def test_no_vocab_model_takes_its_size_from_the_embedding():
    metadata = metadata_of(tokenizer=None)
    del metadata["llama.vocab_size"]
    config = config_from_metadata(metadata, tensors_of(tokenizer=None, vocab=500))
    assert config.vocab_size == 500


def test_rope_freqs_is_the_one_optional_tensor():
    config = config_from_metadata(metadata_of(), tensors_of())
    tensors = fake_tensors(config) + [SimpleNamespace(name="rope_freqs.weight", shape=(config.rope_dim // 2,))]
    check_tensor_shapes(config, tensors)
    tensors[-1].shape = (config.rope_dim,)
    with pytest.raises(GGUFError, match="rope_freqs.weight"):
        check_tensor_shapes(config, tensors)


def test_wrong_python_type_in_a_plain_dict_is_rejected():
    metadata = metadata_of()
    metadata["llama.block_count"] = 2.0
    with pytest.raises(GGUFError, match="has type float"):
        config_from_metadata(metadata, tensors_of())
    metadata["llama.block_count"] = True  # bool is not an int here
    with pytest.raises(GGUFError, match="has type bool"):
        config_from_metadata(metadata, tensors_of())


def test_mistral_style_llama_file_is_accepted(tmp_path):
    """Mistral GGUFs are llama architecture with GQA 32/8, a 1e6 RoPE base and no biases."""
    path = write_tiny_llama(tmp_path / "m.gguf", n_heads=8, n_kv_heads=2, hidden=64, tokenizer="llama",
                            tied=False, rope_theta=1_000_000.0, extra_metadata={"general.name": "mistral-tiny"})
    config = read_plan(path).config
    assert config.rope_theta == 1_000_000.0 and config.n_heads // config.n_kv_heads == 4
    assert config.name == "mistral-tiny"


def test_float_keys_stored_as_float32_round_trip(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", rms_eps=1e-6,
                            extra_metadata={"llama.rope.freq_base": Meta("llama.rope.freq_base", FLOAT32, 5e5),
                                            "general.name": Meta("general.name", STRING, "x")})
    config = read_plan(path).config
    assert config.rms_norm_eps == pytest.approx(1e-6, rel=1e-6) and config.rope_theta == 5e5


def test_supported_sizes_are_what_the_kv_cache_holds():
    # The config refuses (exit 4) what the KV cache would refuse later (exit 2): the same limits.
    from hipcore.gguf import config
    from hipcore.kvcache import config as kv

    assert (config.SUPPORTED_MAX_LAYERS, config.SUPPORTED_MAX_KV_HEADS, config.SUPPORTED_MAX_HEAD_DIM) == \
        (kv.MAX_LAYERS, kv.MAX_KV_HEADS, kv.MAX_HEAD_DIM)
