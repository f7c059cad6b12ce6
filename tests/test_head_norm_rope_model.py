"""qwen3's attention input as the fused q|k|v products without RoPE and one head_norm_rope launch (the per-head norms,
RoPE, and the store of k and v: hipcore/model/blocks.py head_normed_attention_input), on the cpu backend with a
small model of the Qwen3-4B shape (scripts/models/synthetic_models.py; heads of 128 on a 256-wide model): the same logits
as the single ops it replaces (the norms and RoPE as their own launches); the same logits and cache bytes whether
head_norm_rope stores k and v or kv_store's launch does (kernel_choice.stores_kv_in_epilogue planted False); and
the launches a step takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hipcore.model.blocks import Family, compose, pre_norm_layer, qk_head_norm, qkv_products, rope_qk
from hipcore.ops import kernel_choice
from support.model_steps import keep_gpu_formats, prompt_then_decode
from test_synthetic_models import SMALL, write_reduced, write_tiktoken  # also puts scripts/models/ on sys.path

PROMPT = [260, 259, 32, 104, 101, 108]
LAYERS = SMALL["layers"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("head_norm_rope")
    return write_reduced(work, write_tiktoken(work / "tokenizer.model"), "Qwen3-4B", 6)


@pytest.fixture
def weights_as_a_gpu_holds_them(monkeypatch):
    """support.model_steps.keep_gpu_formats: fused_qmatvec makes q, k and v on the cpu backend too."""
    keep_gpu_formats(monkeypatch)


def unfused(runner) -> None:
    """The layer as qwen3 ran before head_norm_rope: the norm, three products, two per-head norms, two RoPEs,
    kv_store."""
    runner.family = Family("qwen3-unfused", pre_norm_layer(compose(qkv_products, qk_head_norm, rope_qk)))


def test_the_same_logits_as_the_single_ops_it_replaces(model_path):
    """Weights as float32 (the cpu backend's own storage): the concatenated q|k|v product without RoPE and
    head_norm_rope against the single ops, within float32 rounding of sums taken in another order."""
    fused, prompt, decode, _ = prompt_then_decode(model_path, "f32", PROMPT)
    single, prompt_single, _, _ = prompt_then_decode(model_path, "f32", PROMPT, unfused)
    assert "q_norm" in prompt_single and "q_norm" not in prompt
    for a, b in zip(fused, single):
        scale = float(np.abs(b).max())
        assert np.abs(a - b).max() <= 1e-4 * scale, float(np.abs(a - b).max() / scale)
    assert [int(np.argmax(r)) for r in fused[-1]] == [int(np.argmax(r)) for r in single[-1]]


@pytest.mark.usefixtures("weights_as_a_gpu_holds_them")
@pytest.mark.parametrize("kv_dtype", ["f16", "bf16", "f32"])
def test_k_and_v_stored_by_head_norm_rope_as_kv_store_stores_them(model_path, monkeypatch, kv_dtype):
    with monkeypatch.context() as planted:
        planted.setattr(kernel_choice, "stores_kv_in_epilogue", lambda dtype: False)
        logits_off, _, decode_off, pools_off = prompt_then_decode(model_path, kv_dtype, PROMPT)
    logits_on, prompt_on, decode_on, pools_on = prompt_then_decode(model_path, kv_dtype, PROMPT)
    # a decode step's layer: the fused products (fused_qmatvec, no RoPE), one head_norm_rope launch, attention
    assert decode_on.count("attn_norm+qkv") == LAYERS and decode_on.count("qk_norm+rope+kv_store") == LAYERS
    assert "kv_store" not in decode_on and decode_off.count("kv_store") == LAYERS
    assert decode_off.count("qk_norm+rope") == LAYERS and len(decode_on) == len(decode_off) - LAYERS
    assert not {"q_norm", "k_norm", "rope_q", "rope_k"} & set(decode_on + prompt_on)
    assert prompt_on.count("qk_norm+rope+kv_store") == LAYERS  # prompts too: the store is not the products'
    for on, off in zip(logits_on, logits_off):
        assert np.array_equal(on, off)
    assert np.array_equal(pools_on, pools_off)
    assert np.isfinite(logits_on[-1]).all()


@pytest.mark.usefixtures("weights_as_a_gpu_holds_them")
def test_a_q8_0_cache_keeps_the_kv_store_launch(model_path):
    _, _, decode, _ = prompt_then_decode(model_path, "q8_0", PROMPT)
    assert decode.count("kv_store") == LAYERS and decode.count("qk_norm+rope") == LAYERS
    assert "qk_norm+rope+kv_store" not in decode
