"""Each kernel on a real GPU against its numpy reference (run with `pytest -m gpu tests/gpu`).

Fresh random inputs every run (the seed is in each failure message), outputs poisoned with 0xFF bytes
(NaN floats, -1 ints) before every launch so an element a kernel fails to write cannot pass, and sizes
that include the demo model's shapes (SmolLM2-135M: hidden 576, ffn 1536, 9 heads / 3 KV heads of 64,
vocabulary 49152) and sizes that are not multiples of a block or a warp.

Kernels come through the loader like in a real run: the precompiled code object for the device when
kernels/prebuilt holds a current one (build it with `python -m rocmforge_kernels.build`), otherwise
compiled at run time. test_every_op_compiles_at_run_time and test_prebuilt_code_objects_load cover the
path not taken.
"""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import add, add_bias, argmax, matmul, matvec, rmsnorm, rope, silu_mul
from hipcore.ops.weight_formats import column_multiple
from hipcore.runtime import kernels as loader
from support.rope_factors import far_factors
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu

U32 = 2.0**-24  # float32 unit roundoff
ENTRIES = {
    "add": [("add_f32", add.SIGNATURE)],
    "add_bias": [("add_bias_f32", add_bias.SIGNATURE)],
    "argmax": [("argmax_f32", argmax.SIGNATURE)],
    "matmul": [(f"matmul_{t}", matmul.SIGNATURE) for t in matmul.WEIGHT_TYPES],
    "matvec": [(f"matvec_{t}", matvec.SIGNATURE) for t in matvec.WEIGHT_TYPES]
              + [(f"matvec_split_{t}", matvec.SIGNATURE) for t in matvec.SPLIT_TYPES],
    "rmsnorm": [("rmsnorm_f32", rmsnorm.SIGNATURE), ("rmsnorm_f32_f16", rmsnorm.SIGNATURE),
                ("rmsnorm_add_f32", rmsnorm.SIGNATURE), ("rmsnorm_bias_f32", rmsnorm.SIGNATURE_BIAS),
                ("rmsnorm_f32_and_f16", rmsnorm.SIGNATURE_AND_F16),
                ("rmsnorm_bias_f32_and_f16", rmsnorm.SIGNATURE_BIAS_AND_F16)],
    "rope": [("rope_f32", rope.SIGNATURE), ("rope_neox_f32", rope.SIGNATURE)],
    "silu_mul": [("silu_mul_f32", silu_mul.SIGNATURE)],
}


def run_matvec(gpu, mem, rng, seed, weight_type, rows, cols, batch, kernel=None):
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(batch * rows * 4)
    if kernel is None:
        matvec.launch(gpu, None, y, w, xs, rows, cols, batch, weight_type=weight_type)
    else:
        grid, block = matvec.geometry(gpu.arch, rows, batch)
        kernel.launch(grid, block, (y, w, xs, rows, cols, batch))
    got = y.download(np.float32).reshape(batch, rows)
    want = matvec.reference(raw, weight_type, x, rows, cols)
    # Tolerance: every output is a float32 sum of `cols` products of exactly decoded weights (the halves
    # d, m and the quants convert exactly; d*q+m is one fma) with x. Whatever the order of the sum (lanes,
    # then a butterfly over the warp), each product passes through at most `cols` roundings, so
    # |error| <= cols * u * sum|w x| (the recursive summation bound; the reference decodes exactly and
    # sums in float64). A mis-decoded block is off by O(|w x|), far above it.
    w_abs = np.abs(matvec.dequantize_rows(raw, weight_type, cols, np.float64))
    bound = (cols + 2) * U32 * (np.abs(x.astype(np.float64)) @ w_abs.T)
    bad = ~(np.abs(got - want) <= bound + 1e-30)
    assert not bad.any(), (f"seed {seed}: {int(bad.sum())} of {bad.size} outputs off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {want[bad][0]!r}")


@pytest.mark.parametrize("weight_type,rows,cols,batch", [
    # The demo model's matrices at decode (batch 1).
    ("q4_1", 1536, 576, 1), ("q4_1", 576, 1536, 1), ("q8_0", 49152, 576, 1),
    ("q4_1", 576, 576, 1), ("q4_1", 192, 576, 1), ("q8_0", 576, 576, 1), ("q8_0", 192, 576, 1),
    ("f16", 576, 576, 1), ("f16", 192, 576, 1), ("f32", 576, 576, 1), ("f32", 49152, 576, 1),
    # Odd row counts (the last row pair is half full), a row shorter than a warp's items, long rows.
    ("q4_1", 7, 32, 1), ("q8_0", 33, 64, 1), ("f16", 1001, 96, 1), ("q4_1", 3, 8192, 1), ("q8_0", 5, 4128, 1),
    # Batches: one pass of 2..8 rows of x, then several passes with a remainder.
    ("q4_1", 1536, 576, 2), ("q8_0", 577, 576, 8), ("f16", 192, 576, 5), ("q4_1", 576, 1536, 17), ("q8_0", 9, 64, 11),
    ("f32", 1536, 576, 7), ("f32", 33, 96, 12),
    # The other formats: Q4_0 and BF16 at the demo model's shapes, the K-quants at 7B-class rows (their
    # rows are whole super-blocks of 256), odd row counts, batches of one and several passes.
    ("q4_0", 1536, 576, 1), ("q4_0", 577, 1536, 3), ("bf16", 576, 576, 1), ("bf16", 193, 576, 9),
    ("q4_k", 4096, 4096, 1), ("q4_k", 11008, 4096, 1), ("q4_k", 33, 256, 5), ("q5_k", 4096, 4096, 1),
    ("q5_k", 7, 512, 11), ("q6_k", 4096, 4096, 1), ("q6_k", 4096, 11008, 1), ("q6_k", 65, 768, 8),
    # Q5_0 / Q5_1 (Gemma 3 270M's 640-wide layers, an 8B-class row), odd rows, batches of one and several passes.
    ("q5_0", 1024, 640, 1), ("q5_0", 4096, 4096, 1), ("q5_0", 33, 96, 9), ("q5_1", 2048, 640, 1),
    ("q5_1", 640, 2048, 1), ("q5_1", 577, 576, 8), ("q5_1", 7, 32, 11),
])
def test_matvec(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    run_matvec(gpu, mem, rng, seed, weight_type, rows, cols, batch)


@pytest.mark.parametrize("weight_type,rows,cols,batch", [
    # Qwen3-30B-A3B's router (a token, a decode batch), gpt-oss-20b's and gpt-oss-120b's, a shared expert's gate, the
    # most rows a token takes the split entry for, the other float types, a batch of two passes; decode batches of 32
    # (each pass a workgroup's item, as kernel_choice.project launches them past 8 tokens) and of 20 (a last pass of 4).
    ("f32", 128, 2048, 1), ("f32", 128, 2048, 8), ("f32", 32, 2880, 1), ("f32", 128, 2880, 4), ("f32", 1, 2048, 1),
    ("f32", 1022, 1024, 1), ("f16", 60, 2048, 1), ("bf16", 64, 3584, 2), ("f32", 33, 1056, 11),
    ("f32", 128, 2048, 32), ("f32", 32, 2880, 32), ("f32", 32, 2880, 20),
])
def test_matvec_split(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    """Products of few rows take matvec_split_<type>: within matvec.error_bound of the reference, and the same bits
    on a second launch (the warps' sums are added in a fixed order)."""
    assert matvec.split_rows(weight_type, rows, cols, batch)
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    w, xs = mem.upload(raw, "weights"), mem.upload(x)
    outputs = []
    for _ in range(2):
        y = mem.poisoned(batch * rows * 4)
        matvec.launch(gpu, None, y, w, xs, rows, cols, batch, weight_type=weight_type)
        outputs.append(y.download(np.float32).reshape(batch, rows))
    want, bound = matvec.reference(raw, weight_type, x, rows, cols), matvec.error_bound(raw, weight_type, x, rows, cols)
    bad = ~(np.abs(outputs[0] - want) <= bound)
    assert not bad.any(), f"seed {seed}: {int(bad.sum())} of {bad.size} outputs off; first at {np.argwhere(bad)[0]}"
    assert outputs[0].tobytes() == outputs[1].tobytes(), f"seed {seed}: two launches differ"


def run_matmul(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens, tile=None, kernel=None, grid=None):
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(n_tokens * rows * 4)
    if kernel is None:
        matmul.launch(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type=weight_type, tile_tokens=tile)
        tile = matmul.geometry(rows, n_tokens, tile)[2]
    else:
        launcher_grid, block, tile = matmul.geometry(rows, n_tokens, tile)
        kernel.launch(grid or launcher_grid, block, (y, w, xs, rows, cols, n_tokens, tile))
    got = y.download(np.float32).reshape(n_tokens, rows)
    want = matmul.reference(raw, weight_type, x, rows, cols)
    # Tolerance: the recursive-summation bound (cols + 2) u sum|w x|, as for matvec (matmul.error_bound
    # says why): each output is one float32 sum, in column order, of one fused multiply-add per column.
    bad = ~(np.abs(got - want) <= matmul.error_bound(raw, weight_type, x, rows, cols))
    assert not bad.any(), (f"seed {seed}, tile {tile}: {int(bad.sum())} of {bad.size} outputs off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {want[bad][0]!r}")


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    # SmolLM2-135M at pp512: q, k/v, gate/up, down (Q4_1), and the output head for 64 sampled rows (Q8_0).
    ("q4_1", 576, 576, 512), ("q4_1", 192, 576, 512), ("q4_1", 1536, 576, 512), ("q4_1", 576, 1536, 512),
    ("q8_0", 49152, 576, 64),
    # The same at 128 and 2048 tokens, and 7B-class shapes.
    ("q4_1", 576, 576, 128), ("q4_1", 1536, 576, 2048), ("q4_k", 4096, 4096, 512), ("q6_k", 11008, 4096, 64),
    ("q4_0", 4096, 4096, 100),
    # Every format; odd rows and token counts (partial tiles both ways), 1 and 4096 tokens.
    ("q4_0", 577, 576, 33), ("q8_0", 1001, 96, 65), ("q4_k", 1536, 1024, 77), ("q5_k", 300, 512, 33),
    ("q6_k", 576, 1536, 512), ("f16", 1001, 96, 65), ("bf16", 192, 576, 17), ("f32", 33, 96, 4096),
    ("q4_1", 1, 32, 1), ("q4_1", 7, 32, 4095), ("q4_k", 64, 256, 4096), ("q6_k", 3, 256, 9),
    ("q5_0", 1024, 640, 512), ("q5_0", 7, 32, 4095), ("q5_1", 2048, 640, 77), ("q5_1", 1001, 96, 65),
])
def test_matmul(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens):
    run_matmul(gpu, mem, rng, seed, weight_type, rows, cols, n_tokens)


@pytest.mark.parametrize("tile", matmul.TILE_TOKENS)
@pytest.mark.parametrize("weight_type", ["q4_1", "q8_0", "q6_k", "f16"])
def test_matmul_every_tile_shape(gpu, mem, rng, seed, weight_type, tile):
    run_matmul(gpu, mem, rng, seed, weight_type, 130, column_multiple(weight_type) * 3, 100, tile=tile)


def test_matmul_loops_over_tiles_a_small_grid_leaves(gpu, mem, rng, seed):
    """The grid-stride loop: one to a few workgroups compute every tile."""
    kernel = loader.get_kernel(gpu, matmul.OP, "matmul_q4_1", matmul.SIGNATURE)
    for grid in (1, 3, 7):
        run_matmul(gpu, mem, rng, seed, "q4_1", 200, 576, 150, kernel=kernel, grid=grid)


@pytest.mark.parametrize("n_tokens", [1, matmul.MATVEC_MAX_TOKENS, matmul.MATVEC_MAX_TOKENS + 1, 512])
def test_project_on_either_side_of_the_crossover(gpu, mem, rng, seed, n_tokens, monkeypatch):
    """matvec and matmul on either side of MATVEC_MAX_TOKENS (the matrix cores, where the GPU has them, left out)."""
    from hipcore.ops import kernel_choice, matmul_mma

    monkeypatch.setattr(matmul_mma, "has_matrix_cores", lambda arch: False)
    rows, cols = 576, 1536
    raw = random_weights(rng, "q4_1", rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(n_tokens * rows * 4)
    kernel_choice.project(gpu, None, y, w, xs, rows, cols, n_tokens, weight_type="q4_1")
    got = y.download(np.float32).reshape(n_tokens, rows)
    bound = matmul.error_bound(raw, "q4_1", x, rows, cols)
    assert np.all(np.abs(got - matmul.reference(raw, "q4_1", x, rows, cols)) <= bound), f"seed {seed}"


@pytest.mark.parametrize("rows,n", [(1, 576), (4, 576), (3, 1), (2, 63), (5, 1000), (1, 4096)])
def test_rmsnorm(gpu, mem, rng, seed, rows, n):
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 10)).astype(np.float32)
    weight = rng.standard_normal(n).astype(np.float32)
    xs, ws, out = mem.upload(x), mem.upload(weight), mem.poisoned(x.nbytes)
    rmsnorm.launch(gpu, None, out, xs, ws, rows, n, 1e-5)
    want = rmsnorm.reference(x, weight, 1e-5)
    # Tolerance: the sum of squares carries at most n roundings (relative n*u), the mean, eps, sqrt and
    # division add a few, and sqrt halves the sum's error; x*scale*weight two more: (n + 8) * u relative.
    tol = (n + 8) * U32 * np.abs(want) + 1e-30
    got = out.download(np.float32).reshape(rows, n)
    assert np.all(np.abs(got - want) <= tol), f"seed {seed}"
    out16 = mem.poisoned(rows * n * 2)
    rmsnorm.launch(gpu, None, out16, xs, ws, rows, n, 1e-5, out_f16=True)  # f16: one rounding more
    got16 = out16.download(np.float16).astype(np.float64).reshape(rows, n)
    assert np.all(np.abs(got16 - want) <= tol + 2.0**-11 * (np.abs(want) + tol) + 2.0**-25), f"seed {seed}, f16 out"
    normed = out.download(np.float32).reshape(rows, n)
    residual = rng.standard_normal((rows, n)).astype(np.float32)
    rs = mem.upload(residual)
    rmsnorm.launch_add(gpu, None, rs, xs, ws, rows, n, 1e-5)  # Gemma's post-norm added to the residual stream
    # the norm's float32 output plus the residual, within the roundings of one FMA or of a product and an add
    added = residual.astype(np.float64) + normed
    got = rs.download(np.float32).reshape(rows, n)
    assert np.all(np.abs(got - added) <= U32 * (np.abs(normed) + 2 * np.abs(added)) + 1e-37), f"seed {seed}, add"
    rmsnorm.launch(gpu, None, xs, xs, ws, rows, n, 1e-5)  # in place, as the model does it
    assert np.all(np.abs(xs.download(np.float32).reshape(rows, n) - want) <= tol), f"seed {seed}"
    # the bias first (gpt-oss's o bias): the bytes of an add_bias launch then a norm launch on this GPU
    bias = rng.standard_normal(n).astype(np.float32)
    bs, x1, x2, out1, out2 = mem.upload(bias), mem.upload(x), mem.upload(x), mem.poisoned(x.nbytes), mem.poisoned(x.nbytes)
    add_bias.launch(gpu, None, x1, bs, rows, n)
    rmsnorm.launch(gpu, None, out1, x1, ws, rows, n, 1e-5)
    rmsnorm.launch_bias(gpu, None, out2, x2, bs, ws, rows, n, 1e-5)
    assert np.array_equal(x2.download(np.uint8), x1.download(np.uint8)), f"seed {seed}, x + bias"
    assert np.array_equal(out2.download(np.uint8), out1.download(np.uint8)), f"seed {seed}, norm of x + bias"
    # both forms at once (a mixture's router and its matrix-core experts): the bytes of the float32 and f16 launches
    xc, f32, f16 = mem.upload(x), mem.poisoned(x.nbytes), mem.poisoned(rows * n * 2)
    rmsnorm.launch(gpu, None, out, xc, ws, rows, n, 1e-5)
    rmsnorm.launch(gpu, None, out16, xc, ws, rows, n, 1e-5, out_f16=True)
    rmsnorm.launch(gpu, None, f32, xc, ws, rows, n, 1e-5, also_f16=f16)
    assert np.array_equal(f32.download(np.uint8), out.download(np.uint8)), f"seed {seed}, and_f16's float32"
    assert np.array_equal(f16.download(np.uint8), out16.download(np.uint8)), f"seed {seed}, and_f16's f16"
    x3, out3, f16b = mem.upload(x), mem.poisoned(x.nbytes), mem.poisoned(rows * n * 2)
    rmsnorm.launch_bias(gpu, None, out3, x3, bs, ws, rows, n, 1e-5, also_f16=f16b)
    rmsnorm.launch(gpu, None, out16, x1, ws, rows, n, 1e-5, out_f16=True)  # x1 holds x + bias
    assert np.array_equal(x3.download(np.uint8), x1.download(np.uint8)), f"seed {seed}, bias and_f16's x + bias"
    assert np.array_equal(out3.download(np.uint8), out1.download(np.uint8)), f"seed {seed}, bias and_f16's float32"
    assert np.array_equal(f16b.download(np.uint8), out16.download(np.uint8)), f"seed {seed}, bias and_f16's f16"


@pytest.mark.parametrize("n_tokens,n_heads,head_dim,rope_dim,max_pos", [
    (1, 9, 64, 64, 4096), (7, 3, 64, 64, 4096), (33, 9, 64, 64, 64), (5, 2, 64, 32, 32768), (3, 1, 6, 4, 100),
])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "freq_factors"])
@pytest.mark.parametrize("rope_type", ["norm", "neox"])
def test_rope(gpu, mem, rng, seed, n_tokens, n_heads, head_dim, rope_dim, max_pos, with_factors, rope_type):
    x = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, max_pos, n_tokens).astype(np.int32)
    positions[0] = max_pos - 1
    xs, ps = mem.upload(x), mem.upload(positions)
    theta_base, freq_scale = 10000.0, float(rng.choice([1.0, 0.25]))
    factors = far_factors(rng, rope_dim) if with_factors else None  # rope_freqs.weight of Llama 3.1/3.2 files
    rope.launch(gpu, None, xs, ps, n_tokens, n_heads, head_dim, rope_dim, theta_base, freq_scale,
                mem.upload(factors) if with_factors else None, rope_type=rope_type)
    got = xs.download(np.float32).reshape(x.shape)
    want = rope.reference(x, positions, rope_dim, theta_base, freq_scale, factors, rope_type)
    first, second = rope.pair_slices(rope_dim, rope_type)
    # Tolerance: the kernel forms each angle in float32 as pos * freq_scale * exp2(i * log2_step). The
    # exponent's error is a few ulps of |i * log2_step| <= log2(theta_base) ~ 13.3, which exp2 turns into a
    # relative error of ln2 * 13.3 * 3u ~ 28u of the frequency; with the products' roundings the angle
    # is within 32u * |angle| (float32 cannot hold pos * freq better than u * |angle| anyway). Its own
    # sin/cos add ~2u, the rotation 2u: each output is within (|a| + |b|) * (32u * |angle| + 8u). A factor
    # divides the frequency once more (one rounding, inside the 32u), the angle includes it.
    angle = rope.angles(positions, rope_dim, theta_base, freq_scale, factors)[:, None, :]
    pair = np.abs(x[..., first]).astype(np.float64) + np.abs(x[..., second])
    tol = pair * (32 * U32 * angle + 8 * U32) + 1e-30
    for part in (first, second):
        err = np.abs(got[..., part] - want[..., part])
        assert np.all(err <= tol), f"seed {seed}: worst {float((err / tol).max()):.2f} x tolerance"
    assert np.array_equal(got[..., rope_dim:], x[..., rope_dim:])  # untouched past rope_dim, bit for bit


@pytest.mark.parametrize("n", [1, 1000, 1536, (1 << 20) + 3])
def test_silu_mul(gpu, mem, rng, seed, n):
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    gate[: min(n, 5)] = np.array([-100.0, 100.0, 0.0, -1e30, 80.0], np.float32)[: min(n, 5)]
    up = rng.standard_normal(n).astype(np.float32)
    g, u, out = mem.upload(gate), mem.upload(up), mem.poisoned(4 * n)
    silu_mul.launch(gpu, None, out, g, u, n)
    want = silu_mul.reference(gate, up)
    # Tolerance: expf within 2 ulp (CUDA's documented bound; AMD's inline expansion is within 1), then
    # 1 + e, the division and the product one rounding each: 6u relative. Large negative gates overflow
    # exp to inf and give a zero, as in the reference.
    tol = 6 * U32 * np.abs(want) + 1e-30
    assert np.all(np.abs(out.download(np.float32) - want) <= tol), f"seed {seed}"
    silu_mul.launch(gpu, None, g, g, u, n)  # in place
    assert np.all(np.abs(g.download(np.float32) - want) <= tol), f"seed {seed}"


@pytest.mark.parametrize("rows,n", [(1, 1), (7, 128), (33, 896), (4096, 1024)])
def test_add_bias_is_bit_exact(gpu, mem, rng, seed, rows, n):
    x = rng.standard_normal((rows, n)).astype(np.float32)
    bias = (rng.standard_normal(n) * 2).astype(np.float32)
    xs, bs = mem.upload(x), mem.upload(bias)
    add_bias.launch(gpu, None, xs, bs, rows, n)
    assert np.array_equal(xs.download(np.float32).reshape(rows, n), add_bias.reference(x, bias)), f"seed {seed}"


@pytest.mark.parametrize("n", [1, 576, 1000, (1 << 20) + 3])
def test_add_is_bit_exact(gpu, mem, rng, seed, n):
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    ab, bb, out = mem.upload(a), mem.upload(b), mem.poisoned(4 * n)
    add.launch(gpu, None, out, ab, bb, n)
    # A float32 sum is correctly rounded on every GPU: no tolerance at all.
    assert np.array_equal(out.download(np.float32), add.reference(a, b)), f"seed {seed}"
    add.launch(gpu, None, ab, ab, bb, n)
    assert np.array_equal(ab.download(np.float32), add.reference(a, b))


@pytest.mark.parametrize("rows,n", [(1, 49152), (3, 49152), (2, 1), (4, 100), (1, 1025), (2, 5000)])
def test_argmax(gpu, mem, rng, seed, rows, n):
    x = rng.standard_normal((rows, n)).astype(np.float32)
    if n > 3:
        top = x.max() + 1.0
        x[0, rng.choice(n, 3, replace=False)] = top  # a three-way tie in row 0: the lowest index must win
    xs, out = mem.upload(x), mem.poisoned(4 * rows)
    argmax.launch(gpu, None, out, xs, rows, n)
    assert np.array_equal(out.download(np.int32), argmax.reference(x)), f"seed {seed}"


def test_argmax_nan_and_infinities(gpu, mem):
    n = 49152
    x = np.zeros((4, n), np.float32)
    x[0, :] = -np.inf  # all equal: index 0
    x[1, [30000, 700]] = np.nan  # the first NaN, as numpy
    x[1, 5] = np.inf
    x[2, n - 1] = np.inf
    x[3, [40000, 12, 40001]] = 2.0
    xs, out = mem.upload(x), mem.poisoned(16)
    argmax.launch(gpu, None, out, xs, 4, n)
    assert out.download(np.int32).tolist() == [0, 700, n - 1, 12]


def test_every_op_compiles_at_run_time(gpu, mem, rng, seed):
    """hiprtc / nvrtc take the same sources (hip_compat.h has no include for them to find), and the
    run-time compiled matvec and matmul compute the same as the reference."""
    sources = loader.kernels_dir()
    modules = {}
    for op, entries in ENTRIES.items():
        image = gpu.jit_compile((sources / f"{op}.hip").read_text(), f"{op}.hip", [str(sources)], [])
        modules[op] = gpu.load_module(image, op)
        for entry, signature in entries:
            modules[op].kernel(entry, signature)
    for weight_type in matvec.WEIGHT_TYPES:
        cols = 576 if column_multiple(weight_type) == 32 else 768
        kernel = modules["matvec"].kernel(f"matvec_{weight_type}", matvec.SIGNATURE)
        run_matvec(gpu, mem, rng, seed, weight_type, 1536, cols, 1, kernel=kernel)
        run_matvec(gpu, mem, rng, seed, weight_type, 65, cols, 3, kernel=kernel)
        kernel = modules["matmul"].kernel(f"matmul_{weight_type}", matmul.SIGNATURE)
        run_matmul(gpu, mem, rng, seed, weight_type, 130, cols, 70, kernel=kernel)


def test_prebuilt_code_objects_load(gpu):
    """The precompiled code objects for this device load and hold every entry point."""
    available = loader.available_code_objects(gpu.arch)
    assert set(ENTRIES) <= set(available), (
        f"no current precompiled code objects for {gpu.arch} in {loader.prebuilt_dir()} (have: {available}); "
        "build them with `python -m rocmforge_kernels.build` and bring kernels/prebuilt along")
    manifest = loader.read_manifest()
    for op, entries in ENTRIES.items():
        path = loader.current_object(gpu.arch, op)
        built_for = path.parent.name
        module = gpu.load_module(path.read_bytes(), op)
        for entry, signature in entries:
            attributes = module.kernel(entry, signature).attributes()
            recorded = manifest["objects"][built_for][op]["kernels"][entry]["registers"]
            if gpu.backend == "cuda":  # the driver reports what ptxas reported at build time
                assert attributes["registers"] == recorded, entry
            if "max_threads_per_block" in attributes:  # the launchers' blocks fit the kernels' launch bounds
                assert attributes["max_threads_per_block"] >= (argmax.MAX_THREADS if op == "argmax" else 256), entry
