"""MXFP4 (GGML type 39) in the dense products on a real GPU: qmatvec_mxfp4 (a few tokens), matmul_mma_mxfp4 (prompts
on the matrix cores) and matmul_mxfp4 (prompts without them), each against its op's float64 reference and bound, on
fresh random inputs (the seed is printed on failure) with poisoned outputs; gpt-oss-20b's shapes (hidden 2880, q 4096
= 64 heads of 64, k and v 512) and small odd ones; W starting at every byte offset mod 4, as the rows of a q|k|v
buffer of 17-byte blocks do; kernel_choice.project, the model's single product, at every token count it splits on;
and a tiny model whose every matrix is MXFP4 against the cpu backend, teacher-forced."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.ops import kernel_choice, matmul, matmul_mma, qmatvec
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu

# (rows, cols): gpt-oss-20b's q, k|v and o products, its head's width, small odd ones (one block, three)
SHAPES = [(4096, 2880), (512, 2880), (2880, 4096), (7, 32), (33, 96)]
OPS = {"qmatvec": qmatvec, "matmul": matmul, "matmul_mma": matmul_mma}
# The model's few-token products quantize x to int8 per 32 values, which the cpu backend's do not: the bound
# tests/gpu/test_families_gpu.py takes for the quantized types (derived in tests/gpu/test_fused_qmatvec_gpu.py).
MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2


def check(got, want, bound, what, seed):
    bad = ~(np.abs(got - want) <= bound)
    assert not bad.any(), (f"{what} (seed {seed}): {int(bad.sum())} of {bad.size} off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {want[bad][0]!r}")


def product(gpu, mem, rng, op, rows, cols, tokens, offset=0, **kwargs):
    """y of `op` for random MXFP4 W (placed `offset` bytes into its buffer) and x; returns (got, raw, x)."""
    raw = random_weights(rng, "mxfp4", rows, cols)
    x = (rng.standard_normal((tokens, cols)) * rng.choice([1e-2, 1.0, 8.0], (tokens, cols))).astype(np.float32)
    w = mem.upload(np.concatenate([np.zeros(offset, np.uint8), raw.reshape(-1)]), "weights")
    y = mem.poisoned(tokens * rows * 4)
    OPS[op].launch(gpu, None, y, w if offset == 0 else w.ptr + offset, mem.upload(x), rows, cols, tokens,
                   weight_type="mxfp4", **kwargs)
    gpu.synchronize()
    return y.download(np.float32).reshape(tokens, rows), raw, x


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_qmatvec(gpu, mem, rng, seed, rows, cols, tokens):
    got, raw, x = product(gpu, mem, rng, "qmatvec", rows, cols, tokens)
    check(got, qmatvec.reference(raw, "mxfp4", x, rows, cols), qmatvec.error_bound(raw, "mxfp4", x, rows, cols),
          f"qmatvec {rows}x{cols} tokens {tokens}", seed)


@pytest.mark.parametrize("op", ["matmul", "matmul_mma"])
@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("tokens", [9, 40, 512])
def test_prompt_products(gpu, mem, rng, seed, op, rows, cols, tokens):
    if op == "matmul_mma" and not matmul_mma.has_matrix_cores(gpu.arch):
        pytest.skip(f"{gpu.arch} has no matrix cores: its prompts take matmul")
    extra = {"workspace": mem.poisoned(matmul_mma.WIDE_WORKSPACE_BYTES)} if op == "matmul_mma" else {}
    if extra:
        extra["workspace"].fill(0)  # zeroed once after allocation, as the runner's
    got, raw, x = product(gpu, mem, rng, op, rows, cols, tokens, **extra)
    check(got, OPS[op].reference(raw, "mxfp4", x, rows, cols), OPS[op].error_bound(raw, "mxfp4", x, rows, cols),
          f"{op} {rows}x{cols} tokens {tokens}", seed)


@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("op,tokens", [("qmatvec", 1), ("qmatvec", 3), ("matmul", 20), ("matmul_mma", 20)])
def test_w_at_any_byte_offset(gpu, mem, rng, seed, offset, op, tokens):
    if op == "matmul_mma" and not matmul_mma.has_matrix_cores(gpu.arch):
        pytest.skip(f"{gpu.arch} has no matrix cores")
    got, raw, x = product(gpu, mem, rng, op, 65, 160, tokens, offset)
    check(got, OPS[op].reference(raw, "mxfp4", x, 65, 160), OPS[op].error_bound(raw, "mxfp4", x, 65, 160),
          f"{op} at offset {offset}", seed)


@pytest.mark.parametrize("tokens", [1, 4, 8, 9, 64, 512])
def test_the_models_single_product_takes_mxfp4(gpu, mem, rng, seed, tokens):
    """kernel_choice.project on gpt-oss-20b's o product: qmatvec up to 8 tokens, the prompt products beyond."""
    rows, cols = 2880, 4096
    raw = random_weights(rng, "mxfp4", rows, cols)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    y = mem.poisoned(tokens * rows * 4)
    workspace = mem.poisoned(matmul_mma.WIDE_WORKSPACE_BYTES)
    workspace.fill(0)
    kernel_choice.project(gpu, None, y, mem.upload(raw, "weights"), mem.upload(x), rows, cols, tokens,
                          weight_type="mxfp4", workspace=workspace)
    gpu.synchronize()
    op = kernel_choice.single_product_op(gpu, tokens, "mxfp4")
    check(y.download(np.float32).reshape(tokens, rows), op.reference(raw, "mxfp4", x, rows, cols),
          op.error_bound(raw, "mxfp4", x, rows, cols), f"project via {op.__name__} tokens {tokens}", seed)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_model_of_mxfp4_matrices_matches_the_cpu_backend(gpu, tmp_path, architecture):
    """Every matrix MXFP4 (the embedding table converted to F16 on the GPU); a 40-token prompt (the prompt products),
    then 12 decode steps teacher-forced on the cpu's greedy tokens (qmatvec), the top-10 logits compared."""
    path = write_tiny_llama(tmp_path / "m.gguf", architecture=architecture, tensor_type="MXFP4", n_layers=2, hidden=256,
                            n_heads=4, n_kv_heads=2, ffn=512, vocab=384, tied=False, logit_scale=6.0, seed=7)
    opts = dict(max_seqs=8, ctx_size=256, kv_dtype="f16", max_step_tokens=64)
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, 384, 40)]
    with load_model(str(path), LoadOptions(device="cpu", **opts)) as on_cpu, \
            load_model(str(path), LoadOptions(**opts), device=gpu) as on_gpu:
        assert on_gpu.weights.layers[0].attn_q.fmt == "mxfp4" and on_gpu.weights.output.fmt == "mxfp4"
        tokens = list(prompt)
        for step in range(13):
            items = [(77, tokens if step == 0 else tokens[-1:], 0 if step == 0 else len(tokens) - 1)]
            g, c = (m.runner.execute(step_batch(m.cache, items))[0].astype(np.float64) for m in (on_gpu, on_cpu))
            top = np.argsort(c)[-10:]
            rel = float(np.max(np.abs(g[top] - c[top])) / np.max(np.abs(c)))
            assert rel <= MAX_RELATIVE_QUANT_LOGIT_DIFF, f"step {step}: top-10 logits differ by {rel:.3e} of the largest"
            tokens.append(int(np.argmax(c)))
