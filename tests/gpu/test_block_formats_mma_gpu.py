"""Tiny llama models of the 32-element block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), F16 and BF16 on a real GPU,
their prompt and decode-batch products on matmul_mma's fragment path as wide models take them, against the cpu
backend (run with `pytest -m gpu tests/gpu/test_block_formats_mma_gpu.py`).

Wide Q8_0, Q5_0, Q5_1, Q4_1, F16 and BF16 matrices leave the fused families for the single ops on NVIDIA from
matmul_mma.min_tokens tokens (kernel_choice.mma_first), and separate Q4_0 matrices leave fused_qmatvec there
(qmatvec_limit); these files are narrower than MMA_FIRST_MIN_COLS, which is set to 0 here. Six sequences start together (one step of 15 prompt tokens:
the staged entries), then decode together (steps of 6 tokens: the direct entries), teacher-forced on the cpu's greedy
tokens; every row's top-10 logits within MAX_RELATIVE_LOGIT_DIFF of its largest. Tolerance: matmul_mma rounds W and x
to f16 (u = 2^-11) in each of the ~9 products on a logit's path, ~2e-3 relative, against the cpu's float32 decode; 1e-2
covers that 5x over, and a mis-decoded weight (a nibble of the wrong lane, a fifth bit of the next pair) moves logits
by their own size (tests/test_kernels_emulated_mma.py plants such faults). The KV cache is f32. Figures go to
block_formats_mma_figures.json in $ROCMFORGE_FIGURES, when set.

And a 200-token prompt on the 128-token tiles of f16 x (q, k, v, o, gate, down: matmul_mma_x16_128_<type>; up with the
SwiGLU: matmul_mma_silu_up_<type>), as a wide model's prompts take them (WIDE_MIN_TILES and BUSY_ITEMS lowered so that
this small model's products qualify unsplit), then decode steps, against the cpu backend within the same tolerance.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.ops import kernel_choice, matmul_mma, matmul_mma_swiglu
from support.gguf_factory import write_tiny_llama
from support.launch_recording import record_entries
from support.model_steps import step_batch

pytestmark = pytest.mark.gpu

MAX_RELATIVE_LOGIT_DIFF = 1e-2
MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2  # int8 x (fused_qmatvec): tests/gpu/test_model_q5_gpu.py's
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16")
PROMPTS = [[5, 77, 123], [9, 300], [41, 17, 250, 3], [99], [64, 200, 12], [7, 8]]  # 15 tokens, 6 sequences
DECODE_STEPS = 10


@pytest.mark.parametrize("tensor_type", TYPES)
def test_block_format_model_on_the_fragment_path_matches_the_cpu_backend(gpu, tmp_path, tensor_type, monkeypatch):
    if not matmul_mma.has_fragment_path(gpu.arch, tensor_type.lower(), 32):
        pytest.skip(f"{gpu.arch} has no fragment path (NVIDIA sm_80 and later only)")
    path = write_tiny_llama(tmp_path / f"{tensor_type}.gguf", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, vocab=384,
                            n_layers=2, tensor_type=tensor_type, embedding_type="Q8_0", tied=False, context=256, seed=13)
    monkeypatch.setattr(kernel_choice, "MMA_FIRST_MIN_COLS", 0)
    entries = record_entries(monkeypatch, matmul_mma)
    options = dict(max_seqs=8, ctx_size=256, kv_dtype="f32")
    worst = 0.0
    with load_model(str(path), LoadOptions(**options), device=gpu) as on_gpu, \
            load_model(str(path), LoadOptions(device="cpu", **options)) as on_cpu:
        assert on_gpu.weights.layers[0].attn_q.fmt == tensor_type.lower() and not on_gpu.weights.converted
        tokens = [list(p) for p in PROMPTS]
        for step in range(DECODE_STEPS + 1):
            items = [(seq, toks if step == 0 else toks[-1:], 0 if step == 0 else len(toks) - 1)
                     for seq, toks in enumerate(tokens)]
            gpu_rows, cpu_rows = (np.asarray(loaded.runner.execute(step_batch(loaded.cache, items)), dtype=np.float64)
                                  for loaded in (on_gpu, on_cpu))
            for seq, (got, want) in enumerate(zip(gpu_rows, cpu_rows)):
                top = np.argsort(want)[-10:]
                rel = float(np.max(np.abs(got[top] - want[top])) / np.max(np.abs(want)))
                worst = max(worst, rel)
                assert rel <= MAX_RELATIVE_LOGIT_DIFF, f"{tensor_type} step {step} seq {seq}: top-10 off by {rel:.3e}"
                tokens[seq].append(int(np.argmax(want)))
        for loaded in (on_gpu, on_cpu):
            for seq in range(len(tokens)):
                loaded.cache.free_sequence(seq)
            loaded.device.synchronize()
            loaded.cache.release_fenced()
    kind = tensor_type.lower()
    record(tensor_type, {"model": tensor_type, "decode_steps": DECODE_STEPS, "sequences": len(PROMPTS),
                         "max_rel_top10_logit_diff": worst})
    assert f"matmul_mma_fragments_{kind}" in entries and f"matmul_mma_direct_{kind}" in entries, sorted(set(entries))


def record(label: str, figures: dict) -> None:
    print(figures)
    if os.environ.get("ROCMFORGE_FIGURES"):
        out = Path(os.environ["ROCMFORGE_FIGURES"]) / "block_formats_mma_figures.json"
        previous = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**previous, label: figures}, indent=2))


@pytest.mark.parametrize("tensor_type", TYPES)
def test_block_format_prompt_on_the_128_token_f16_tiles_matches_the_cpu_backend(gpu, tmp_path, tensor_type, monkeypatch):
    if not matmul_mma.has_wide_tiles(gpu.arch):
        pytest.skip(f"{gpu.arch} has no 128-token tiles (NVIDIA sm_80 and later only)")
    path = write_tiny_llama(tmp_path / f"{tensor_type}.gguf", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, vocab=384,
                            n_layers=2, tensor_type=tensor_type, embedding_type="Q8_0", tied=False, context=256, seed=17)
    monkeypatch.setattr(kernel_choice, "MMA_FIRST_MIN_COLS", 0)
    monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 1)
    monkeypatch.setattr(matmul_mma, "BUSY_ITEMS", 8)
    entries = record_entries(monkeypatch, matmul_mma, matmul_mma_swiglu)
    options = dict(max_seqs=2, ctx_size=256, kv_dtype="f32")
    tokens = [int(v) for v in np.random.default_rng(5).integers(1, 384, 200)]
    worst = 0.0
    with load_model(str(path), LoadOptions(**options), device=gpu) as on_gpu, \
            load_model(str(path), LoadOptions(device="cpu", **options)) as on_cpu:
        for step in range(4):
            new, first = (tokens, 0) if step == 0 else (tokens[-1:], len(tokens) - 1)
            got, want = (np.asarray(loaded.runner.execute(step_batch(loaded.cache, [(0, new, first)]))[0], np.float64)
                         for loaded in (on_gpu, on_cpu))
            top = np.argsort(want)[-10:]
            rel = float(np.max(np.abs(got[top] - want[top])) / np.max(np.abs(want)))
            worst = max(worst, rel)
            # Past the prompt, one-token steps: Q4_0's take fused_qmatvec, x rounded to int8 (the int8 paths' tolerance).
            tolerance = MAX_RELATIVE_LOGIT_DIFF if step == 0 else MAX_RELATIVE_QUANT_LOGIT_DIFF
            assert rel <= tolerance, f"{tensor_type} step {step}: top-10 off by {rel:.3e}"
            tokens.append(int(np.argmax(want)))
        for loaded in (on_gpu, on_cpu):
            loaded.cache.free_sequence(0)
            loaded.device.synchronize()
            loaded.cache.release_fenced()
    kind = tensor_type.lower()
    record(f"{tensor_type} prompt", {"model": tensor_type, "prompt_tokens": 200, "max_rel_top10_logit_diff": worst})
    assert f"matmul_mma_x16_128_{kind}" in entries and f"matmul_mma_silu_up_{kind}" in entries, sorted(set(entries))
