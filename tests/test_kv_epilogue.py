"""fused_qmatvec's q|k|v launch storing k and v into the paged cache itself (hipcore/model/projections.py:
stores_kv; kv_store.EpilogueTarget): on the cpu backend, with the weights kept in their GGUF blocks as a GPU
holds them, a Q4_K_M model of Llama-3.2-1B's layer mix (reduced sizes) gives the same logits and the same cache
bytes with the epilogue store and with kv_store's own launch (kernel_choice.stores_kv_in_epilogue planted
False), its decode plans have
no kv_store launch, and a q8_0 cache or a prompt step keeps it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hipcore.ops import kernel_choice
from support.model_steps import keep_gpu_formats, prompt_then_decode
from test_synthetic_models import SMALL, write_small, write_tiktoken  # also puts scripts/models/ on sys.path

PROMPT = [260, 259, 32, 104, 101, 108]


@pytest.fixture(autouse=True)
def weights_as_a_gpu_holds_them(monkeypatch):
    """support.model_steps.keep_gpu_formats: fused_qmatvec makes q, k and v on the cpu backend too."""
    keep_gpu_formats(monkeypatch)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("kv_epilogue")
    return write_small(work, write_tiktoken(work / "tokenizer.model"), "Q4_K_M", "Llama-3.2-1B")


def run_steps(path: Path, kv_dtype: str):
    """support.model_steps.prompt_then_decode of PROMPT."""
    return prompt_then_decode(path, kv_dtype, PROMPT)


@pytest.mark.parametrize("kv_dtype", ["f16", "bf16", "f32"])
def test_epilogue_store_gives_the_same_logits_and_cache_without_the_launch(model_path, monkeypatch, kv_dtype):
    with monkeypatch.context() as planted:
        planted.setattr(kernel_choice, "stores_kv_in_epilogue", lambda dtype: False)
        logits_off, _, decode_off, pools_off = run_steps(model_path, kv_dtype)
    logits_on, prompt_on, decode_on, pools_on = run_steps(model_path, kv_dtype)
    layers = SMALL["layers"]
    assert decode_off.count("kv_store") == layers and "kv_store" not in decode_on
    assert decode_on.count("attn_norm+qkv+rope+kv_store") == layers
    assert len(decode_on) == len(decode_off) - layers
    assert prompt_on.count("kv_store") == layers  # 7 tokens: beyond fused_qmatvec, the single ops
    for on, off in zip(logits_on, logits_off):
        assert np.array_equal(on, off)
    assert np.array_equal(pools_on, pools_off)
    assert np.isfinite(logits_on[-1]).all()


def test_a_q8_0_cache_keeps_the_kv_store_launch(model_path):
    _, _, decode, _ = run_steps(model_path, "q8_0")
    assert decode.count("kv_store") == SMALL["layers"] and "attn_norm+qkv+rope+kv_store" not in decode
