"""The GPU tier of matmul_mma (kernels/matmul_mma.hip on the device's matrix instructions) against its
numpy reference on fresh random inputs, within matmul_mma.error_bound (the f16 roundings of W and x and
the f32 sums; the module says why), and kernel_choice.project's choice between it and matmul."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import gelu_mul, kernel_choice, matmul_mma, matmul_mma_qkv, matmul_mma_swiglu
from hipcore.ops.weight_formats import column_multiple
from hipcore.runtime import kernels as loader
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu


def check(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens, tile=None, grid=None):
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(n_tokens * rows * 4)
    if grid is None:
        matmul_mma.launch(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type=weight_type, tile_tokens=tile)
    else:
        kernel = loader.get_kernel(gpu, matmul_mma.OP, f"{matmul_mma.OP}_{weight_type}", matmul_mma.SIGNATURE)
        _, block, tile, _ = matmul_mma.geometry(rows, n_tokens, tile)
        kernel.launch(grid, block, (y, w, xs, 0, rows, cols, n_tokens, tile, 1, 0))
    got = y.download(np.float32).reshape(n_tokens, rows)
    want = matmul_mma.reference(raw, weight_type, x, rows, cols)
    bad = ~(np.abs(got - want) <= matmul_mma.error_bound(raw, weight_type, x, rows, cols))
    assert not bad.any(), (f"seed {seed}, tile {tile}: {int(bad.sum())} of {bad.size} outputs off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {want[bad][0]!r}")


def test_the_device_has_matrix_cores(gpu):
    assert matmul_mma.has_matrix_cores(gpu.arch), f"{gpu.arch}: this tier measures the matrix-core path"


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # Llama-3.1-8B's products (Q4_K; Q6_K for attn_v and ffn_down) at a batch and a prompt.
    ("q4_k", 4096, 4096, 512), ("q4_k", 1024, 4096, 32), ("q4_k", 14336, 4096, 64), ("q6_k", 4096, 14336, 128),
    ("q6_k", 1024, 4096, 512),
    # Every format; rows and tokens that cut tiles short, 9 tokens (the smallest the models send).
    ("q4_0", 577, 576, 33), ("q4_1", 130, 1536, 100), ("q8_0", 1001, 96, 65), ("q5_k", 300, 512, 9),
    ("q4_k", 129, 256, 4095), ("q6_k", 3, 256, 9), ("q5_0", 2048, 640, 512), ("q5_0", 577, 96, 33),
    ("q5_1", 640, 2048, 100), ("q5_1", 130, 1536, 9), ("f16", 4096, 4096, 512), ("f16", 577, 96, 33),
    ("bf16", 4096, 4096, 512), ("bf16", 577, 96, 33),
])
def test_matmul_mma(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    check(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens)


@pytest.mark.parametrize("tile", matmul_mma.TILE_TOKENS)
@pytest.mark.parametrize("weight_type", ["q4_k", "q6_k", "q8_0"])
def test_matmul_mma_every_tile_shape(gpu, mem, rng, seed, weight_type, tile):
    check(gpu, mem, rng, seed, weight_type, 260, column_multiple(weight_type) * 3, 100, tile=tile)


def test_matmul_mma_loops_over_tiles_a_small_grid_leaves(gpu, mem, rng, seed):
    for grid in (1, 3):
        check(gpu, mem, rng, seed, "q4_k", 300, 512, 150, grid=grid)


@pytest.mark.parametrize("n_tokens", [matmul_mma.MMA_MIN_TOKENS_KQUANT - 1, matmul_mma.MMA_MIN_TOKENS_KQUANT, 512])
def test_project_on_either_side_of_the_threshold(gpu, mem, rng, seed, n_tokens):
    rows, cols = 512, 1024
    raw = random_weights(rng, "q4_k", rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(n_tokens * rows * 4)
    kernel_choice.project(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type="q4_k")
    got = y.download(np.float32).reshape(n_tokens, rows)
    assert np.all(np.abs(got - matmul_mma.reference(raw, "q4_k", x, rows, cols))
                  <= matmul_mma.error_bound(raw, "q4_k", x, rows, cols)), f"seed {seed}"


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # Llama-3.1-8B's decode batches (one token tile: split over the columns) and a 1B-shaped k; a small product at a
    # prompt step of 512 tokens (the fragment path's 32-token tiles, 16 of them down the tokens, 4 splits: the
    # reduced Gemma-2-9B's o in tests/gpu/test_gemma_prompt_gpu.py).
    ("q4_k", 4096, 4096, 32), ("q4_k", 1024, 4096, 9), ("q6_k", 1024, 4096, 16), ("q4_k", 14336, 4096, 32),
    ("q6_k", 4096, 14336, 24), ("q4_k", 512, 2048, 12), ("q8_0", 130, 512, 40), ("q4_k", 256, 1024, 512),
])
def test_split_columns_and_the_residual_add(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    """A workspace as the runner has: the launcher splits the columns; the result matches the reference,
    twice in a row (the counters were left at zero) and bit for bit the same (the partials are summed in
    split order); with accumulate the product lands on top of y."""
    from hipcore.ops import fused_matmul

    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    y0 = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(n_tokens * rows * 4)
    workspace = mem.upload(np.zeros(fused_matmul.WORKSPACE_BYTES, np.uint8))
    splits = matmul_mma.geometry(rows, n_tokens, cols=cols, workspace_bytes=workspace.nbytes)[3]
    assert splits > 1, "these shapes are the decode batches the splits are for"
    want = matmul_mma.reference(raw, weight_type, x, rows, cols)
    bound = matmul_mma.error_bound(raw, weight_type, x, rows, cols)
    runs = []
    for _ in range(2):
        matmul_mma.launch(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type=weight_type, workspace=workspace)
        runs.append(y.download(np.float32).reshape(n_tokens, rows))
        bad = ~(np.abs(runs[-1] - want) <= bound)
        assert not bad.any(), f"seed {seed}, {splits} splits: {int(bad.sum())} of {bad.size} outputs off"
    assert np.array_equal(runs[0], runs[1]), "two launches of the same split product differ"
    assert not workspace.download(np.int32, matmul_mma.COUNTER_BYTES // 4).any(), "counters left non-zero"
    y.upload(y0)
    matmul_mma.launch(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type=weight_type, workspace=workspace,
                      accumulate=True)
    got = y.download(np.float32).reshape(n_tokens, rows)
    assert np.all(np.abs(got - (y0 + want)) <= bound + 2.0**-23 * np.abs(y0 + want)), f"seed {seed}: accumulate"


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    ("q4_k", 4096, 4096, 8), ("q5_k", 300, 512, 9), ("q6_k", 4096, 14336, 32), ("q4_k", 129, 1024, 31),
    ("q6_k", 1024, 4096, 3),
    # The 32-element block formats (two blocks a step): Llama-3.1-8B's down and gate shapes, a 1B-shaped k, rows that
    # cut a tile short, one token.
    ("q8_0", 4096, 14336, 8), ("q4_0", 14336, 4096, 32), ("q5_0", 512, 2048, 5), ("q5_1", 4096, 4096, 16),
    ("q4_1", 130, 576, 12), ("q8_0", 1024, 4096, 1), ("f16", 14336, 4096, 8), ("f16", 1024, 4096, 32),
    ("bf16", 14336, 4096, 8), ("bf16", 1024, 4096, 32),
])
def test_every_path_agrees_with_the_reference(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    """Where the launcher takes the fragment path (decode batches on NVIDIA), each of its entries at any
    batch of one token tile (the direct one past 8 tokens, the staged one below 9) and the shared-tile kernel it
    replaced: each within the bound of the reference, split as the runner's."""
    from hipcore.ops import fused_matmul

    if not matmul_mma.has_fragment_path(gpu.arch, weight_type, 32):
        pytest.skip(f"{gpu.arch} has no fragment path (NVIDIA sm_80 and later only)")
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(n_tokens * rows * 4)
    workspace = mem.upload(np.zeros(fused_matmul.WORKSPACE_BYTES, np.uint8))
    want = matmul_mma.reference(raw, weight_type, x, rows, cols)
    bound = matmul_mma.error_bound(raw, weight_type, x, rows, cols)
    for path in matmul_mma.PATHS:
        matmul_mma.launch(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type=weight_type, workspace=workspace,
                          path=path)
        bad = ~(np.abs(y.download(np.float32).reshape(n_tokens, rows) - want) <= bound)
        assert not bad.any(), f"seed {seed}, path {path}: {int(bad.sum())} of {bad.size} outputs off"


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # Llama-3.1-8B's gate and up at a prompt step of 512 tokens (896 tiles: four waves of single products);
    # Llama-3.2-1B's; rows and tokens that cut tiles short; Q5_K.
    ("q4_k", 14336, 4096, 512), ("q4_k", 8192, 2048, 512), ("q4_k", 1000, 512, 200), ("q5_k", 300, 768, 130),
])
def test_swiglu_pairs(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    """matmul_mma_swiglu on f16 x: h16 = silu(gate) * up and the gate and up products within
    swiglu_error_bound, launched twice (the pairs' counters are left at zero for the next launch: the second
    gives the same bytes)."""
    w_gate, w_up = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    x = rng.standard_normal((n_tokens, cols)).astype(np.float16)
    wg, wu, xs = mem.upload(w_gate, "weights"), mem.upload(w_up, "weights"), mem.upload(x)
    h16 = mem.poisoned(n_tokens * rows * 2)
    gate, up = mem.poisoned(n_tokens * rows * 4), mem.poisoned(n_tokens * rows * 4)
    workspace = mem.upload(np.zeros(matmul_mma.COUNTER_BYTES // 4, np.int32))
    results = []
    for _ in range(2):
        matmul_mma_swiglu.launch_swiglu(gpu, None, h16, gate, up, wg, wu, xs, rows, cols, n_tokens, weight_type=weight_type,
                                 workspace=workspace)
        results.append([h16.download(np.float16).astype(np.float64).reshape(n_tokens, rows)]
                       + [b.download(np.float32).astype(np.float64).reshape(n_tokens, rows) for b in (gate, up)])
    assert not workspace.download(np.int32).any(), "the pairs' counters were not left at zero"
    assert all(np.array_equal(a, b) for a, b in zip(*results)), "the second launch gave other bytes"
    x32 = x.astype(np.float32)
    want = matmul_mma_swiglu.swiglu_reference(w_gate, w_up, weight_type, x32, rows, cols)
    bounds = matmul_mma_swiglu.swiglu_error_bound(w_gate, w_up, weight_type, x32, rows, cols)
    for name, got, w, bound in zip(("h16", "gate", "up"), results[0], want, bounds):
        bad = ~(np.abs(got - w) <= bound)
        assert not bad.any(), (f"seed {seed} {name}: {int(bad.sum())} of {bad.size} outputs off; first at "
                               f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {w[bad][0]!r}")


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens,accumulate", [
    # Llama-3.1-8B's down (Q6_K and Q4_K layers) and q at 512 tokens, the residual added; short tiles; 32-token tiles.
    ("q6_k", 4096, 14336, 512, True), ("q4_k", 4096, 14336, 512, True), ("q4_k", 4096, 4096, 512, False),
    ("q5_k", 300, 768, 130, False), ("q6_k", 1024, 4096, 40, True),
    # 128-token tiles (pick_x16_tile_tokens) with the token tile cut short: 256 tiles; 32 and 64 tiles, split 8
    # and 4 ways (the 8B's k, the 1B's down).
    ("q5_k", 16384, 256, 150, False), ("q6_k", 16384, 256, 150, True), ("q4_k", 1024, 4096, 512, False),
    ("q6_k", 2048, 8192, 512, True),
    # 32-token tiles at 512 tokens, split 8 ways: the reduced Gemma-2-9B's down (tests/gpu/test_gemma_prompt_gpu.py).
    ("q4_k", 256, 5120, 512, True), ("q6_k", 256, 5120, 512, True),
    # The block formats, F16 and BF16 (128-token tiles only): the 8B's gate and down, a 1B-shaped k split 4 ways.
    ("q8_0", 14336, 4096, 512, False), ("q4_0", 4096, 14336, 512, True), ("f16", 4096, 4096, 512, False),
    ("q5_1", 1024, 4096, 512, True), ("q5_0", 4096, 4096, 300, False), ("q4_1", 2048, 2048, 512, True),
    ("bf16", 14336, 4096, 512, False), ("bf16", 4096, 14336, 300, True),
])
def test_f16_x_products(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens, accumulate):
    """matmul_mma_x16 (x f16; x16_128 where pick_x16_tile_tokens says) against the reference on the same f16
    values, within error_bound, its columns split as the launcher splits them with the runner's workspace (its
    counters left at zero); and, unsplit, the same bytes as the float32 entry given those values as float32 (it
    rounds x to f16 as it stages it)."""
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float16)
    y0 = rng.standard_normal((n_tokens, rows)).astype(np.float32) if accumulate else np.zeros((n_tokens, rows), np.float32)
    w, x16, x32 = mem.upload(raw, "weights"), mem.upload(x), mem.upload(x.astype(np.float32))
    workspace = mem.upload(np.zeros(matmul_mma.WIDE_WORKSPACE_BYTES // 4, np.int32))
    outs = []
    for xs, f16, ws in ((x16, True, None), (x32, False, None), (x16, True, workspace)):
        y = mem.upload(y0)
        matmul_mma.launch(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type=weight_type, accumulate=accumulate,
                          x_f16=f16, path="auto" if f16 else "shared", workspace=ws)
        outs.append(y.download(np.float32).reshape(n_tokens, rows))
    assert np.array_equal(outs[0], outs[1]), "f16 x and the same values as float32 gave other results"
    assert not workspace.download(np.int32)[:matmul_mma.COUNTER_BYTES // 4].any(), "the counters were not left at zero"
    want = y0 + matmul_mma.reference(raw, weight_type, x.astype(np.float32), rows, cols)
    bound = matmul_mma.error_bound(raw, weight_type, x.astype(np.float32), rows, cols) + 2.0**-23 * np.abs(want)
    for label, got in (("unsplit", outs[0]), ("split", outs[2])):
        bad = ~(np.abs(got - want) <= bound)
        assert not bad.any(), (f"seed {seed} {label}: {int(bad.sum())} of {bad.size} outputs off; first at "
                               f"{np.argwhere(bad)[0].tolist()}")


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # Llama-3.1-8B's gate and up at 512 tokens (448 tiles of 128 tokens); Q5_K with tiles cut short.
    ("q4_k", 14336, 4096, 512), ("q5_k", 16384, 256, 150),
    # The block formats, F16 and BF16 (no SwiGLU pair to compare with).
    ("q8_0", 14336, 4096, 512), ("q4_0", 8192, 2048, 512), ("q5_0", 14336, 4096, 300), ("f16", 8192, 2048, 512),
    ("bf16", 14336, 4096, 512),
])
def test_the_wide_swiglu(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    """The gate product in 128-token tiles (launch with x_f16), then matmul_mma_silu_up: h16 within
    silu_up_error_bound of the reference, and the same bytes as a SwiGLU pair's h16 (the same products and the
    same silu)."""
    assert kernel_choice.silu_up_fits(gpu, n_tokens, rows, weight_type)
    w_gate, w_up = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    # Random Q8_0 codes reach 127 d: with unit x over 4,096 columns silu(gate) * up passed f16's 65,504 (h16 is f16,
    # as for the K-quants), which a model's activations do not; x at a quarter keeps h within range for every type.
    x = (0.25 * rng.standard_normal((n_tokens, cols))).astype(np.float16)
    wg, wu, xs = mem.upload(w_gate, "weights"), mem.upload(w_up, "weights"), mem.upload(x)
    h16, pair_h16 = mem.poisoned(n_tokens * rows * 2), mem.poisoned(n_tokens * rows * 2)
    gate, up = mem.poisoned(n_tokens * rows * 4), mem.poisoned(n_tokens * rows * 4)
    matmul_mma.launch(gpu, None, gate, wg, xs, rows, cols, n_tokens, weight_type=weight_type, x_f16=True)
    matmul_mma_swiglu.launch_silu_up(gpu, None, h16, gate, wu, xs, rows, cols, n_tokens, weight_type=weight_type)
    got = h16.download(np.float16).reshape(n_tokens, rows)
    workspace = mem.upload(np.zeros(matmul_mma.COUNTER_BYTES // 4, np.int32))
    if weight_type in matmul_mma_swiglu.SWIGLU_TYPES and matmul_mma.tile_count(rows, n_tokens, 64) <= matmul_mma.MAX_SPLIT_TILES:
        matmul_mma_swiglu.launch_swiglu(gpu, None, pair_h16, gate, up, wg, wu, xs, rows, cols, n_tokens,
                                 weight_type=weight_type, workspace=workspace)
        assert np.array_equal(got.view(np.uint16), pair_h16.download(np.uint16).reshape(n_tokens, rows)), \
            "the wide SwiGLU and the pair gave other bytes"
    x32 = x.astype(np.float32)
    want = matmul_mma_swiglu.swiglu_reference(w_gate, w_up, weight_type, x32, rows, cols)[0]
    bound = matmul_mma_swiglu.silu_up_error_bound(w_gate, w_up, weight_type, x32, rows, cols)
    bad = ~(np.abs(got.astype(np.float64) - want) <= bound)
    assert not bad.any(), f"seed {seed}: {int(bad.sum())} of {bad.size} outputs off; first at {np.argwhere(bad)[0].tolist()}"


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # Gemma-2-9B's gate and up at 512 tokens; Q5_K with tiles cut short.
    ("q4_k", 14336, 3584, 512), ("q5_k", 16384, 256, 150),
])
def test_the_wide_geglu(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    """matmul_mma_gelu_up (Gemma's GeGLU): h16 within the GeGLU bound of gelu(gate) * up."""
    assert kernel_choice.silu_up_fits(gpu, n_tokens, rows, weight_type, "gelu")
    w_gate, w_up = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    x = (0.25 * rng.standard_normal((n_tokens, cols))).astype(np.float16)  # as test_the_wide_swiglu's
    wg, wu, xs = mem.upload(w_gate, "weights"), mem.upload(w_up, "weights"), mem.upload(x)
    h16, gate = mem.poisoned(n_tokens * rows * 2), mem.poisoned(n_tokens * rows * 4)
    matmul_mma.launch(gpu, None, gate, wg, xs, rows, cols, n_tokens, weight_type=weight_type, x_f16=True)
    matmul_mma_swiglu.launch_silu_up(gpu, None, h16, gate, wu, xs, rows, cols, n_tokens, weight_type=weight_type,
                                     activation="gelu")
    got = h16.download(np.float16).reshape(n_tokens, rows).astype(np.float64)
    x32 = x.astype(np.float32)
    _, g, u = matmul_mma_swiglu.swiglu_reference(w_gate, w_up, weight_type, x32, rows, cols)
    want = gelu_mul.reference(g, u)
    bound = matmul_mma_swiglu.silu_up_error_bound(w_gate, w_up, weight_type, x32, rows, cols, "gelu")
    bad = ~(np.abs(got - want) <= bound)
    assert not bad.any(), f"seed {seed}: {int(bad.sum())} of {bad.size} outputs off; first at {np.argwhere(bad)[0].tolist()}"


@pytest.mark.parametrize("types,rows,cols,n_tokens", [
    # Llama-3.1-8B's attention input (Q4_K_M's two kinds of layer) at a batch of 8 (the direct entry) and 32;
    # Llama-3.2-1B's; a Q5_K_M layer; rows that cut tiles short; a prompt step of 512 tokens, which small products
    # take here too (tests/gpu/test_gemma_prompt_gpu.py's reduced Gemma-2-9B: heads of 256 over 256 columns).
    (("q4_k", "q4_k", "q6_k"), (4096, 1024, 1024), 4096, 8), (("q4_k", "q4_k", "q6_k"), (4096, 1024, 1024), 4096, 32),
    (("q4_k", "q4_k", "q4_k"), (4096, 1024, 1024), 4096, 32), (("q4_k", "q4_k", "q6_k"), (2048, 512, 512), 2048, 24),
    (("q5_k", "q5_k", "q6_k"), (4096, 1024, 1024), 4096, 6), (("q6_k", "q5_k", "q4_k"), (300, 130, 36), 512, 40),
    (("q4_k", "q4_k", "q4_k"), (1024, 512, 512), 256, 512),
    # gpt-oss-20b's Q8_0 attention input (2,880 columns) at 8 and 32 sequences; F16 and BF16 with row tiles cut short.
    (("q8_0",) * 3, (4096, 512, 512), 2880, 8), (("q8_0",) * 3, (4096, 512, 512), 2880, 32),
    (("f16",) * 3, (200, 72, 72), 448, 5), (("bf16",) * 3, (200, 72, 72), 448, 20),
])
def test_qkv_in_one_launch(gpu, mem, rng, seed, types, rows, cols, n_tokens):
    """matmul_mma_qkv.launch_qkv with a workspace as the runner has: each of q, k and v within the bound of its
    reference, twice in a row bit for bit the same, the counters left at zero."""
    from hipcore.ops import fused_matmul

    raws = [random_weights(rng, t, r, cols) for t, r in zip(types, rows)]
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    if not matmul_mma.has_fragment_path(gpu.arch, types[0], 32, cols):
        pytest.skip(f"{gpu.arch} has no fragment path (NVIDIA sm_80 and later only)")
    ws = tuple(mem.upload(raw, "weights") for raw in raws)
    xs = mem.upload(x)
    ys = tuple(mem.poisoned(n_tokens * r * 4) for r in rows)
    workspace = mem.upload(np.zeros(fused_matmul.WORKSPACE_BYTES, np.uint8))
    assert kernel_choice.takes_qkv(gpu, n_tokens, types, cols, rows)
    runs = []
    for _ in range(2):
        matmul_mma_qkv.launch_qkv(gpu, None, ys, ws, xs, rows, cols, n_tokens, weight_types=types, workspace=workspace)
        runs.append([y.download(np.float32).reshape(n_tokens, r) for y, r in zip(ys, rows)])
        for got, raw, t, r, name in zip(runs[-1], raws, types, rows, "qkv"):
            want = matmul_mma.reference(raw, t, x, r, cols)
            bad = ~(np.abs(got - want) <= matmul_mma.error_bound(raw, t, x, r, cols))
            assert not bad.any(), f"seed {seed}, {name} ({t}): {int(bad.sum())} of {bad.size} outputs off"
    assert all(np.array_equal(a, b) for a, b in zip(*runs)), "two launches of the same products differ"
    assert not workspace.download(np.int32, matmul_mma.COUNTER_BYTES // 4).any(), "counters left non-zero"


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # Llama-3.1-8B's and Llama-3.2-1B's gate and up at batches of 8 (the direct entry) and 32; Q5_K and Q6_K; rows that
    # cut a tile short.
    ("q4_k", 14336, 4096, 8), ("q4_k", 14336, 4096, 32), ("q4_k", 8192, 2048, 24), ("q5_k", 14336, 4096, 6),
    ("q6_k", 300, 512, 40),
])
def test_the_fragment_paths_swiglu(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    """matmul_mma_swiglu.launch_swiglu_fragments with a workspace as the runner has: silu(gate) * up and the up
    product within their bounds, twice in a row bit for bit the same, the counters left at zero."""
    from hipcore.ops import fused_matmul

    if not matmul_mma.has_fragment_path(gpu.arch, weight_type, 32):
        pytest.skip(f"{gpu.arch} has no fragment path (NVIDIA sm_80 and later only)")
    w_gate, w_up = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    wg, wu, xs = mem.upload(w_gate, "weights"), mem.upload(w_up, "weights"), mem.upload(x)
    gate, up = mem.poisoned(n_tokens * rows * 4), mem.poisoned(n_tokens * rows * 4)
    workspace = mem.upload(np.zeros(fused_matmul.WORKSPACE_BYTES, np.uint8))
    assert kernel_choice.swiglu_fragments_fit(gpu, n_tokens, rows, cols, (weight_type, weight_type), workspace)
    want_h, _, want_u = matmul_mma_swiglu.swiglu_reference(w_gate, w_up, weight_type, x, rows, cols)
    bound_h, _, bound_u = matmul_mma_swiglu.swiglu_error_bound(w_gate, w_up, weight_type, x, rows, cols)
    runs = []
    for _ in range(2):
        matmul_mma_swiglu.launch_swiglu_fragments(gpu, None, gate, up, wg, wu, xs, rows, cols, n_tokens,
                                                  weight_type=weight_type, workspace=workspace)
        runs.append([b.download(np.float32).reshape(n_tokens, rows) for b in (gate, up)])
        for got, want, bound, name in zip(runs[-1], (want_h, want_u), (bound_h, bound_u), ("silu(gate) * up", "up")):
            bad = ~(np.abs(got - want) <= bound)
            assert not bad.any(), f"seed {seed}, {name}: {int(bad.sum())} of {bad.size} outputs off"
    assert all(np.array_equal(a, b) for a, b in zip(*runs)), "two launches of the same products differ"
    assert not workspace.download(np.int32, matmul_mma.COUNTER_BYTES // 4).any(), "counters left non-zero"
