"""MXFP4 (GGML type 39) in the dense products on a real GPU: qmatvec_mxfp4 (a few tokens), matmul_mma_mxfp4 (prompts
on the matrix cores) and matmul_mxfp4 (prompts without them), each against its op's float64 reference and bound, on
fresh random inputs (the seed is printed on failure) with poisoned outputs; gpt-oss-20b's shapes (hidden 2880, q 4096
= 64 heads of 64, k and v 512) and small odd ones; W starting at every byte offset mod 4, as the rows of a q|k|v
buffer of 17-byte blocks do; and kernel_choice.project, the model's single product, at every token count it splits
on."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import kernel_choice, matmul, matmul_mma, qmatvec
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu

# (rows, cols): gpt-oss-20b's q, k|v and o products, its head's width, small odd ones (one block, three)
SHAPES = [(4096, 2880), (512, 2880), (2880, 4096), (7, 32), (33, 96)]
OPS = {"qmatvec": qmatvec, "matmul": matmul, "matmul_mma": matmul_mma}


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
