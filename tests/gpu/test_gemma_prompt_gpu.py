"""Gemma's prompt steps on the GPU (run with `pytest -m gpu tests/gpu/test_gemma_prompt_gpu.py`): the GeGLU
feed-forward on f16 activations (the gate product, the up product with GELU in its epilogue, and the down product
before the post-norm reading the f16 result: ProjectionPlanner.ffn_pairs with activation "gelu"), on reduced
Gemma-2-9B and Gemma-3-4B shapes (scripts/models/synthetic_models.py in Q4_K_M: 2 and 6 layers, so that each has a
global layer, and a feed-forward of 5,120 rows so
that a 512-token prompt makes the 160 tiles of 128 tokens the path needs) against the cpu backend's float32 single
ops, and against the same GPU with the path turned off (ProjectionPlanner.ffn_pairs planted False).

Tolerance: 4e-2 of the largest logit over the top 10, the quantized families' GPU bound (tests/gpu/test_families_gpu.py:
activations rounded to f16 or int8 against the cpu backend's float32); what a wrong activation does (SiLU for GELU, the
gate read at another token) moves the logits by whole units.
And the attention of heads of 256 on prompt_attention's wide tile (WIDE): the whole reduced model against the cpu
backend.
The figures also go to gemma_prompt_gpu_figures.json in $ROCMFORGE_FIGURES, when set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.projections import ProjectionPlanner
from hipcore.ops import prompt_attention
from support.model_steps import step_batch
from test_synthetic_models import write_reduced, write_tiktoken

pytestmark = pytest.mark.gpu

MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2
PROMPT_TOKENS = 512
SIZES = dict(hidden=256, heads=4, kv_heads=2, ffn=5120)
LAYERS = {"Gemma-2-9B": 2, "Gemma-3-4B": 6}  # gemma3's sixth layer is its first global one
# Heads of 256 on prompt_attention's wide tile (Gemma 2's with its soft cap of 50), Gemma-2-9B's 16 heads over 8
# and Gemma-3-4B's 8 over 4
WIDE = {"Gemma-2-9B": (dict(hidden=256, heads=16, kv_heads=8, ffn=1024), 512, 50.0),
        "Gemma-3-4B": (dict(hidden=256, heads=8, kv_heads=4, ffn=1024), 1024, 0.0)}


def prompt_logits(path: Path, device, tokens: list[int]) -> tuple[np.ndarray, list[str]]:
    """The last token's logits of one prompt step of `tokens`, and the step's launch names."""
    opts = LoadOptions(device="cpu" if device is None else "auto", max_seqs=1, max_step_tokens=len(tokens),
                       ctx_size=len(tokens) + 64, kv_dtype="f16")
    with load_model(str(path), opts, **({} if device is None else {"device": device})) as model:
        logits = model.runner.execute(step_batch(model.cache, [(1, tokens, 0)]))[0].astype(np.float64)
        names = [n for n, _ in model.runner.launch_plan(len(tokens), 1, all_rows=False, with_sampling=False,
                                                         decode=False)]
        return logits, names


def relative_top10(got: np.ndarray, want: np.ndarray) -> float:
    top = np.argsort(want)[-10:]
    return float(np.max(np.abs(got[top] - want[top])) / np.max(np.abs(want)))


@pytest.mark.parametrize("shape", LAYERS)
def test_the_f16_geglu_prompt_matches_the_cpu_backend(gpu, tmp_path, monkeypatch, shape):
    vocab = 256 + 4 + 256
    path = write_reduced(tmp_path, write_tiktoken(tmp_path / "tokenizer.model"), shape, 11, layers=LAYERS[shape],
                         **SIZES)
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, vocab, PROMPT_TOKENS)]
    on_cpu, _ = prompt_logits(path, None, tokens)
    fused, names = prompt_logits(path, gpu, tokens)
    assert names.count("up_proj+gelu") == LAYERS[shape] and "gelu_mul" not in names, names
    monkeypatch.setattr(ProjectionPlanner, "ffn_pairs", lambda *args, **kwargs: False)
    single, single_names = prompt_logits(path, gpu, tokens)
    assert "gelu_mul" in single_names and "up_proj+gelu" not in single_names
    figures = {"f16_vs_cpu": relative_top10(fused, on_cpu), "f32_vs_cpu": relative_top10(single, on_cpu),
               "f16_vs_f32": relative_top10(fused, single)}
    print(f"{shape}: {figures}")
    if os.environ.get("ROCMFORGE_FIGURES"):
        out = Path(os.environ["ROCMFORGE_FIGURES"]) / "gemma_prompt_gpu_figures.json"
        data = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**data, shape: figures}, indent=2))
    assert np.isfinite(fused).all()
    assert figures["f16_vs_cpu"] <= MAX_RELATIVE_QUANT_LOGIT_DIFF, figures
    assert figures["f16_vs_f32"] <= MAX_RELATIVE_QUANT_LOGIT_DIFF, figures


@pytest.mark.parametrize("shape", WIDE)
def test_heads_of_256_on_the_matrix_cores_match_the_cpu_backend(gpu, tmp_path, shape):
    sizes, n_tokens, softcap = WIDE[shape]
    assert prompt_attention.takes(gpu.arch, n_tokens, "f16", 256, softcap)
    vocab = 256 + 4 + 256
    path = write_reduced(tmp_path, write_tiktoken(tmp_path / "tokenizer.model"), shape, 12, layers=LAYERS[shape],
                         **sizes)
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, vocab, n_tokens)]
    on_cpu, _ = prompt_logits(path, None, tokens)
    on_gpu, _ = prompt_logits(path, gpu, tokens)
    figure = relative_top10(on_gpu, on_cpu)
    print(f"{shape}, heads of 256 at {n_tokens} tokens: {figure:.2e}")
    if os.environ.get("ROCMFORGE_FIGURES"):
        out = Path(os.environ["ROCMFORGE_FIGURES"]) / "gemma_prompt_gpu_figures.json"
        data = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**data, f"{shape} wide attention": figure}, indent=2))
    assert np.isfinite(on_gpu).all()
    assert figure <= MAX_RELATIVE_QUANT_LOGIT_DIFF, figure
