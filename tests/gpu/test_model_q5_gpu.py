"""Tiny llama models in Q5_0 and Q5_1 on a real GPU against the cpu backend (run with `pytest -m gpu
tests/gpu/test_model_q5_gpu.py`).

Three files: every matrix and the embedding table Q5_0; the same in Q5_1; and a mix as real files have
(Q5_0 q, k, gate, up; Q5_1 v, down and output; Q4_1 attn_output; a Q8_0 table), whose q|k|v and gate|up
cannot be one concatenated matrix, so it takes the single-op path. The weights stay in their format on
the device (checked), and each step's logits are compared teacher-forced on the cpu's greedy tokens: the
top-10 logits within MAX_RELATIVE_LOGIT_DIFF of the largest logit, and the same greedy pick wherever the
cpu's top-2 margin is wider than twice that.

Tolerance: the KV cache is f32 and both backends decode every weight exactly to float32, so the decode
steps (fused_matvec / matvec) differ from the cpu only in float32 summation order (~1e-6 relative). The
12-token prompt step goes to fused_matmul (float32) for the uniform files and to matmul_mma for the mix,
which rounds W and x to f16 (u = 2^-11) in each of the ~9 products on a logit's path: ~2e-3 relative.
1e-2 covers that 5x over; a wrong decode (a fifth bit misplaced moves a weight by 16 d) moves logits by
their own size. The same files once more with the one-token products on fused_qmatvec's int8 entries (the path wide
Q5_0 / Q5_1 models take: kernel_choice.qmatvec_first), within the int8 paths' tolerance. Figures go to
q5_model_figures.json in $ROCMFORGE_FIGURES, when set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.ops import fused_qmatvec, kernel_choice
from support.gguf_factory import write_tiny_llama
from support.launch_recording import record_entries
from support.model_steps import step_batch

pytestmark = pytest.mark.gpu

MAX_RELATIVE_LOGIT_DIFF = 1e-2
# The int8 entries (x rounded to int8 per 32 values before each product): tests/gpu/test_fused_qmatvec_gpu.py's bound.
MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2
MODELS = {
    "q5_0": ("Q5_0", "Q5_0", {}),
    "q5_1": ("Q5_1", "Q5_1", {}),
    "mixed": ("Q5_0", "Q8_0", {"attn_v": "Q5_1", "ffn_down": "Q5_1", "attn_output": "Q4_1", "output": "Q5_1"}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q5_models")
    return {name: str(write_tiny_llama(folder / f"{name}.gguf", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, vocab=384,
                                       n_layers=2, tensor_type=t, embedding_type=e, tensor_types=types, tied=False,
                                       context=256, seed=11))
            for name, (t, e, types) in MODELS.items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_q5_model_matches_the_cpu_backend(gpu, models, name):
    compare_with_the_cpu(gpu, models, name, MAX_RELATIVE_LOGIT_DIFF, name)


@pytest.mark.parametrize("name", list(MODELS))
def test_q5_model_on_the_int8_entries_matches_the_cpu_backend(gpu, models, name, monkeypatch):
    """The same files with their one-token Q5_0 / Q5_1 / Q8_0 products on fused_qmatvec's int8 entries, as wide models
    take them (kernel_choice.qmatvec_first; these are narrower than QMATVEC_FIRST_MIN_COLS, which is set to 0 here):
    the decode steps round x to int8 per 32 values, so the tolerance is the int8 paths' (MAX_RELATIVE_QUANT_LOGIT_DIFF),
    and the launches must have gone to the "1b" entries."""
    monkeypatch.setattr(kernel_choice, "QMATVEC_FIRST_MIN_COLS", 0)
    names = record_entries(monkeypatch, fused_qmatvec)
    compare_with_the_cpu(gpu, models, name, MAX_RELATIVE_QUANT_LOGIT_DIFF, f"{name}-int8")
    assert any(n.endswith("_1b") for n in names), f"no one-token launch took the 1b entries: {sorted(set(names))}"


def compare_with_the_cpu(gpu, models, name, tolerance, label):
    """Teacher-forced on the cpu's greedy tokens: every step's top-10 logits within `tolerance` of the largest, and
    the same greedy pick wherever the cpu's top-2 margin is wider than twice that; figures under `label`."""
    options = dict(max_seqs=4, ctx_size=256, kv_dtype="f32")
    tensor_type, embedding_type, types = MODELS[name]
    with load_model(models[name], LoadOptions(**options), device=gpu) as on_gpu, \
            load_model(models[name], LoadOptions(device="cpu", **options)) as on_cpu:
        w = on_gpu.weights
        assert w.token_embd.fmt == embedding_type.lower() and not w.converted, "a Q5 tensor was widened at load"
        assert w.layers[0].attn_q.fmt == tensor_type.lower()
        assert w.layers[0].attn_v.fmt == types.get("attn_v", tensor_type).lower()
        prompt, steps, seq = [5, 77, 123, 9, 300, 41, 17, 250, 3, 99, 64, 200], 24, 7
        worst, agree, decided = 0.0, 0, 0
        tokens = list(prompt)
        for step in range(steps):
            new = tokens if step == 0 else tokens[-1:]
            first = 0 if step == 0 else len(tokens) - 1
            gpu_logits, cpu_logits = (loaded.runner.execute(step_batch(loaded.cache, [(seq, new, first)]))[0]
                                      .astype(np.float64) for loaded in (on_gpu, on_cpu))
            scale = np.max(np.abs(cpu_logits))
            top = np.argsort(cpu_logits)[-10:]
            rel = float(np.max(np.abs(gpu_logits[top] - cpu_logits[top])) / scale)
            worst = max(worst, rel)
            assert rel <= tolerance, f"{label} step {step}: top-10 logits differ by {rel:.3e} of the largest"
            top2 = np.sort(cpu_logits)[-2:]
            if top2[1] - top2[0] > 2 * tolerance * scale:
                decided += 1
                agree += int(np.argmax(gpu_logits) == np.argmax(cpu_logits))
                assert np.argmax(gpu_logits) == np.argmax(cpu_logits), f"{label} step {step}: greedy pick differs"
            tokens.append(int(np.argmax(cpu_logits)))
        for loaded in (on_gpu, on_cpu):
            loaded.cache.free_sequence(seq)
            loaded.device.synchronize()
            loaded.cache.release_fenced()
    figures = {"model": label, "steps": steps, "max_rel_top10_logit_diff": worst, "greedy_decided_steps": decided,
               "greedy_agree": agree}
    print(figures)
    if os.environ.get("ROCMFORGE_FIGURES"):
        out = Path(os.environ["ROCMFORGE_FIGURES"]) / "q5_model_figures.json"
        previous = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**previous, label: figures}, indent=2))
