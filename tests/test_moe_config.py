"""A mixture-of-experts file's keys and tensors (hipcore/gguf/moe_keys.py, architectures.py): what a qwen3moe file
reads as, and the clear exit-4 refusals of the MoE architectures and features rocmforge does not implement."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hipcore.errors import UnsupportedModelError
from hipcore.gguf.config import config_from_metadata
from hipcore.gguf.errors import GGUFError
from hipcore.model.families import gpt_oss
from support.gguf_factory import tiny_llama_spec
from support.moe_models import N_EXPERTS, N_USED, moe_spec


def _parts(name="qwen3moe-f32"):
    spec = moe_spec(name)
    return ({m.key: m.value for m in spec.metadata}, [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors])


def test_qwen3moe_reads_its_experts():
    metadata, tensors = _parts()
    config = config_from_metadata(metadata, tensors)
    assert (config.n_experts, config.n_experts_used, config.expert_ffn_size) == (N_EXPERTS, N_USED, 64)
    assert config.is_moe and config.expert_gating == "softmax_topk" and config.expert_weights_norm
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.0.ffn_gate_inp.weight"] == (N_EXPERTS, 64)
    assert shapes["blk.2.ffn_gate_exps.weight"] == (N_EXPERTS, 64, 64)
    assert shapes["blk.1.ffn_down_exps.weight"] == (N_EXPERTS, 64, 64)
    assert shapes["blk.0.attn_q_norm.weight"] == (32,) and "blk.0.ffn_gate.weight" not in shapes


def test_keys_llamacpp_ignores_for_these_architectures_change_nothing():
    """llama.cpp fixes the gating per architecture (qwen3moe.cpp passes softmax and norm_w = true), whatever they say."""
    metadata, tensors = _parts()
    metadata.update({"qwen3moe.expert_gating_func": 2, "qwen3moe.expert_weights_norm": False,
                     "qwen3moe.expert_weights_scale": 2.5})
    config = config_from_metadata(metadata, tensors)
    assert (config.expert_gating, config.expert_weights_norm) == ("softmax_topk", True)


def test_qwen3moe_expert_width_falls_back_as_llamacpp():
    """Without expert_feed_forward_length llama.cpp takes feed_forward_length / expert_used_count."""
    metadata, tensors = _parts()
    del metadata["qwen3moe.expert_feed_forward_length"]
    metadata["qwen3moe.feed_forward_length"] = 64 * N_USED
    assert config_from_metadata(metadata, tensors).expert_ffn_size == 64


def _refusal(metadata, tensors) -> GGUFError:
    with pytest.raises(GGUFError) as caught:
        config_from_metadata(metadata, tensors)
    return caught.value


@pytest.mark.parametrize("change, unsupported, words", [
    (lambda m: m.update({"qwen3moe.expert_shared_count": 1}), True, "shared experts"),
    (lambda m: m.update({"qwen3moe.expert_group_count": 4}), True, "expert groups"),
    (lambda m: m.update({"qwen3moe.expert_used_count": (2, 2, 2)}), True, "per-layer count"),
    (lambda m: m.update({"qwen3moe.expert_used_count": N_EXPERTS + 1}), False, "expert_used_count"),
    (lambda m: m.pop("qwen3moe.expert_count"), False, "expert_count"),
])
def test_qwen3moe_features_it_lacks_are_refused(change, unsupported, words):
    metadata, tensors = _parts()
    change(metadata)
    error = _refusal(metadata, tensors)
    assert error.unsupported == unsupported and words in str(error)
    assert error.exit_code == (4 if unsupported else 3)


def test_a_dense_file_declaring_experts_is_refused_as_a_mixture():
    spec = tiny_llama_spec()
    metadata = {m.key: m.value for m in spec.metadata} | {"llama.expert_count": 8, "llama.expert_used_count": 2}
    error = _refusal(metadata, [SimpleNamespace(name=t.name, shape=t.shape) for t in spec.tensors])
    assert error.exit_code == 4 and "Mixtral" in str(error) and "qwen3moe" in str(error)


@pytest.mark.parametrize("arch", ["olmoe", "deepseek2", "mixtral"])
def test_unsupported_moe_architectures_are_named(arch):
    metadata, tensors = _parts()
    metadata = {k.replace("qwen3moe.", f"{arch}.", 1): v for k, v in metadata.items()}
    metadata["general.architecture"] = arch
    error = _refusal(metadata, tensors)
    assert error.exit_code == 4 and f"mixture-of-experts architecture '{arch}'" in str(error)


def test_expert_tensors_of_the_wrong_shape_are_invalid():
    metadata, tensors = _parts()
    for t in tensors:
        if t.name == "blk.1.ffn_up_exps.weight":
            t.shape = (N_EXPERTS - 1, 64, 64)
    error = _refusal(metadata, tensors)
    assert error.exit_code == 3 and "ffn_up_exps" in str(error)


def test_gpt_oss_reads_its_traits():
    metadata, tensors = _parts("gpt-oss-mxfp4")
    config = config_from_metadata(metadata, tensors)
    assert (config.expert_gating, config.expert_weights_norm, config.expert_activation) == ("topk_softmax", False,
                                                                                             "swiglu_oai")
    assert config.moe_biases and config.qkv_bias and not config.qk_norm and config.rope_type == "neox"
    assert (config.rope_scaling, config.rope_scaling_factor, config.rope_original_context) == ("yarn", 4.0, 64)
    assert [config.layer_window(i) for i in range(3)] == [16, 0, 16]  # llama.cpp's set_swa_pattern(2): even layers
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.0.attn_sinks.weight"] == (4,) and shapes["blk.0.attn_output.bias"] == (64,)
    assert shapes["blk.1.ffn_up_exps.bias"] == (N_EXPERTS, 64) and shapes["blk.1.ffn_down_exps.bias"] == (N_EXPERTS, 64)
    assert "blk.0.post_attention_norm.weight" in shapes and "blk.0.ffn_norm.weight" not in shapes


def test_yarn_is_read_for_gpt_oss_only():
    """YaRN is checked against llama.cpp on gpt-oss (tests/test_golden_moe.py); elsewhere it stays refused."""
    metadata, tensors = _parts("qwen3moe-f32")
    metadata.update({"qwen3moe.rope.scaling.type": "yarn", "qwen3moe.rope.scaling.factor": 4.0})
    error = _refusal(metadata, tensors)
    assert error.exit_code == 4 and "yarn" in str(error)


def test_gpt_oss_is_refused_where_attention_has_no_sinks(monkeypatch):
    for backend in ("cpu", "hip", "cuda"):  # every backend has the sink entries
        gpt_oss.check_backend(SimpleNamespace(backend=backend))
    monkeypatch.setattr(gpt_oss.paged_attention, "takes_sinks", lambda device: False)  # a backend without them
    with pytest.raises(UnsupportedModelError, match="attention with sinks") as caught:
        gpt_oss.check_backend(SimpleNamespace(backend="hip"))
    assert caught.value.exit_code == 4


def test_qwen2moe_reads_its_shared_expert():
    metadata, tensors = _parts("qwen2moe-f32")
    config = config_from_metadata(metadata, tensors)
    assert (config.shared_ffn_size, config.expert_ffn_size, config.expert_weights_norm) == (96, 64, False)
    shapes = config.expected_tensor_shapes()
    assert shapes["blk.0.ffn_gate_inp_shexp.weight"] == (64,) and shapes["blk.2.ffn_down_shexp.weight"] == (64, 96)
    assert config.qkv_bias and config.rope_type == "neox"
    del metadata["qwen2moe.expert_shared_feed_forward_length"]  # llama.cpp then takes feed_forward_length
    metadata["qwen2moe.feed_forward_length"] = 96
    assert config_from_metadata(metadata, tensors).shared_ffn_size == 96
