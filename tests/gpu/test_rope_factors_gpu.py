"""Llama 3.1/3.2-style files (rope_freqs.weight: per-pair RoPE frequency divisors) on a real GPU, against the
cpu backend, which tests/test_rope_factors_model.py holds to the numpy reference.

Two tiny models carrying factors far from 1: Q8_0 (the prompt through fused_matmul, decode steps through
fused_matvec replayed from captured graphs) and Q4_K_M-typed (decode steps through fused_qmatvec).
Teacher-forced on the cpu's greedy tokens, the top-10 logits of every step stay within the tolerance of
the largest logit. Tolerances: Q8_0 runs in float32 on both sides (summation order, sin/cos: ~1e-6 relative
measured on the other model tests), 1e-3 leaves room for the larger angles the factors make; Q4_K_M
rounds x to int8 per 32 values on the GPU, 4e-2 as tests/gpu/test_fused_qmatvec_gpu.py derives. The same
weights without the factors move the logits by far more than either tolerance (checked), so a GPU path
that dropped the factors could not pass. Figures go to
rope_factors_gpu_figures.json in $ROCMFORGE_FIGURES, when set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from support.rope_factors import far_factors

pytestmark = pytest.mark.gpu

SHAPE = dict(hidden=256, ffn=512, n_heads=4, n_kv_heads=2, vocab=384, n_layers=2, tied=False, context=256)
FACTORS = far_factors(np.random.default_rng(41), SHAPE["hidden"] // SHAPE["n_heads"])
MODELS = {"q8_0": (dict(tensor_type="Q8_0"), 1e-3),
          "q4_k_m": (dict(tensor_type="Q4_K", tensor_types={"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}),
                     4e-2)}
PROMPT, STEPS = [5 + (i * 37) % 370 for i in range(40)], 16
_figures: dict[str, dict] = {}


def model_file(tmp_path_factory, name: str, factors) -> str:
    types, _ = MODELS[name]
    folder = tmp_path_factory.mktemp(f"rope-{name}")
    return str(write_tiny_llama(folder / "m.gguf", seed=3, rope_freqs=factors, **SHAPE, **types))


def teacher_forced_logits(loaded, tokens: list[int]) -> list[np.ndarray]:
    """Logits of the prompt (one step), then of each following token (one decode step each)."""
    seq, out = 9, []
    try:
        out.append(loaded.runner.execute(step_batch(loaded.cache, [(seq, tokens[:len(PROMPT)], 0)]))[0])
        for pos in range(len(PROMPT), len(tokens)):
            out.append(loaded.runner.execute(step_batch(loaded.cache, [(seq, [tokens[pos]], pos)]))[0])
        return [row.astype(np.float64) for row in out]
    finally:
        loaded.cache.free_sequence(seq)
        loaded.device.synchronize()
        loaded.cache.release_fenced()


@pytest.mark.parametrize("name", list(MODELS))
def test_gpu_applies_the_factors_as_the_cpu_backend(gpu, tmp_path_factory, name):
    tolerance = MODELS[name][1]
    path, plain_path = model_file(tmp_path_factory, name, FACTORS), model_file(tmp_path_factory, name, None)
    options = dict(max_seqs=4, ctx_size=256, kv_dtype="f16")
    with load_model(path, LoadOptions(device="cpu", **options)) as on_cpu:
        # The cpu's greedy continuation, then every step's logits on the same tokens.
        tokens = list(PROMPT)
        for _ in range(STEPS):
            tokens.append(int(np.argmax(teacher_forced_logits(on_cpu, tokens)[-1])))
        cpu = teacher_forced_logits(on_cpu, tokens)
    with load_model(path, LoadOptions(**options), device=gpu) as on_gpu:
        assert on_gpu.weights.rope_freqs is not None
        got = teacher_forced_logits(on_gpu, tokens)
        assert on_gpu.runner.graphs.replays > 0, "the decode steps were not replayed from captured graphs"
    with load_model(plain_path, LoadOptions(**options), device=gpu) as plain_gpu:
        plain = teacher_forced_logits(plain_gpu, tokens)
    worst, plain_least = 0.0, np.inf
    for step, (g, c, p) in enumerate(zip(got, cpu, plain)):
        scale = np.max(np.abs(c))
        top = np.argsort(c)[-10:]
        rel = float(np.max(np.abs(g[top] - c[top])) / scale)
        worst = max(worst, rel)
        plain_least = min(plain_least, float(np.max(np.abs(p - c)) / scale))
        assert rel <= tolerance, f"{name} step {step}: top-10 logits differ by {rel:.3e} of the largest"
    assert plain_least > 3 * tolerance, f"{name}: without the factors the logits moved only {plain_least:.3e}"
    _figures[name] = {"steps": len(got), "max_rel_top10_logit_diff": worst, "without_factors_min_rel_diff": plain_least}
    print(name, _figures[name])
    if os.environ.get("ROCMFORGE_FIGURES"):
        out = Path(os.environ["ROCMFORGE_FIGURES"]) / "rope_factors_gpu_figures.json"
        out.write_text(json.dumps(_figures, indent=2))
