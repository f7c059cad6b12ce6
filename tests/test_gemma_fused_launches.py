"""Gemma 3's and Gemma 2's layers with their fused launches, on the cpu backend with small models of the Gemma-3-4B
and Gemma-2-9B shapes (scripts/models/synthetic_models.py) in Q4_K_M: the products as a GPU takes them (fused_qmatvec's
q|k|v, without RoPE for Gemma 3, with RoPE and the store of k and v for Gemma 2, and its gate|up with GeGLU, through
their host references), head_norm_rope (Gemma 3), and each post-norm added to the residual stream in one launch; 8
launches a Gemma 3 decode layer where the single ops took 13, 7 a Gemma 2 layer (13 while its attention input took
the single ops); and logits within
the GPU tier's tolerance of the cpu backend's own float32 path (the single ops)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from support.model_steps import keep_gpu_formats, prompt_then_decode
from test_synthetic_models import SMALL, write_reduced, write_tiktoken  # also puts scripts/models/ on sys.path

PROMPT = [260, 259, 32, 104, 101, 108]
LAYER = ["attn_norm+qkv", "qk_norm+rope+kv_store", "attention", "attn_output", "attn_output_post_norm+residual",
         "ffn_norm+gate_up+gelu", "ffn_down", "ffn_down_post_norm+residual"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("gemma3")
    return write_reduced(work, write_tiktoken(work / "tokenizer.model"), "Gemma-3-4B", 8)


def test_a_decode_layer_takes_eight_launches_and_agrees_with_the_single_ops(model_path, monkeypatch):
    single, _, _, _ = prompt_then_decode(model_path, "f16", PROMPT)  # weights as float32: single ops throughout
    keep_gpu_formats(monkeypatch)
    fused, prompt, decode, _ = prompt_then_decode(model_path, "f16", PROMPT)
    layers = SMALL["layers"]
    body = decode[decode.index("attn_norm+qkv"):decode.index("attn_norm+qkv") + len(LAYER) * layers]
    assert body == LAYER * layers, decode
    assert not {"gelu_mul", "q_norm", "rope_q", "kv_store", "attn_output_residual"} & set(decode)
    assert {"gelu_mul", "qk_norm+rope+kv_store"} <= set(prompt)  # 7 tokens: the single products, GeGLU after them
    for a, b in zip(fused, single):
        assert np.isfinite(a).all()
        scale = float(np.abs(b).max())
        assert np.abs(a - b).max() <= 4e-2 * scale, float(np.abs(a - b).max() / scale)


GEMMA2_LAYER = ["attn_norm+qkv+rope+kv_store", "attention", "attn_output", "attn_output_post_norm+residual",
                "ffn_norm+gate_up+gelu", "ffn_down", "ffn_down_post_norm+residual"]


def test_a_gemma2_decode_layer_takes_seven_launches_and_agrees_with_the_single_ops(tmp_path, monkeypatch):
    """Gemma 2's NEOX pairs, uploaded side by side, take the fused attention input (RoPE in NORM mode, k and v
    stored by the product), and its attention output stays float32 for the post-normed o product."""
    path = write_reduced(tmp_path, write_tiktoken(tmp_path / "tokenizer.model"), "Gemma-2-9B", 9)
    single, _, _, _ = prompt_then_decode(path, "f16", PROMPT)
    keep_gpu_formats(monkeypatch)
    fused, prompt, decode, _ = prompt_then_decode(path, "f16", PROMPT)
    start = decode.index(GEMMA2_LAYER[0])
    assert decode[start:start + len(GEMMA2_LAYER) * SMALL["layers"]] == GEMMA2_LAYER * SMALL["layers"], decode
    assert not {"rope_q", "q_proj", "kv_store", "gelu_mul"} & set(decode)
    assert decode[-1] == "final_softcap"
    for a, b in zip(fused, single):
        assert np.isfinite(a).all()
        scale = float(np.abs(b).max())
        assert np.abs(a - b).max() <= 4e-2 * scale, float(np.abs(a - b).max() / scale)

