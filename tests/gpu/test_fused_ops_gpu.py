"""The fused kernels (kernels/fused_matvec.hip, kernels/fused_matmul.hip) and device sampling
(kernels/sample.hip) on a real GPU against their numpy references (run with `pytest -m gpu tests/gpu`).

Fresh random inputs every run (the seed is in each failure message), outputs poisoned with 0xFF before
every launch, the demo model's shapes (SmolLM2-135M: hidden 576, q 576 + k 192 + v 192 rows, ffn 1536,
head 49152 rows of Q8_0) at decode batches 1, 4, 8 and 64 and odd sizes. Tolerances: the recursive-
summation bound of a float32 dot product, doubled for the folded norm (its scale and the x*g products
add a few roundings), plus RoPE's own bound (tests/test_kernels_emulated_fused.py derives the same ones).
"""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import fused_matmul, fused_matvec, matvec, rmsnorm, rope, sample, silu_mul
from support.rope_factors import far_factors
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu

U32 = 2.0**-24


def product_bound(raw, weight_type, xs, rows, cols):
    w_abs = np.abs(matvec.dequantize_rows(raw.reshape(rows, -1), weight_type, cols, np.float64))
    return (cols + 8) * U32 * (np.abs(xs) @ w_abs.T) + 1e-30


def check(got, want, tol, seed, what):
    bad = ~(np.abs(got - want) <= tol)
    assert not bad.any(), (f"seed {seed}, {what}: {int(bad.sum())} of {bad.size} off; first at {np.argwhere(bad)[0].tolist()}: "
                           f"got {got[bad][0]!r}, want {want[bad][0]!r}")


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
@pytest.mark.parametrize("batch", [1, 4, 9, 64])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "freq_factors"])
def test_norm_rope_demo_shapes(gpu, mem, rng, seed, weight_type, batch, with_factors):
    head_dim, q_rows, kv_rows, cols = 64, 576, 192, 576
    rows = q_rows + 2 * kv_rows
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    positions = rng.integers(0, 8192, batch).astype(np.int32)
    factors = far_factors(rng, 64) if with_factors else None  # rope_freqs.weight (Llama 3.1/3.2)
    q, k, v = mem.poisoned(batch * q_rows * 4), mem.poisoned(batch * kv_rows * 4), mem.poisoned(batch * kv_rows * 4)
    fused_matvec.launch_norm_rope(gpu, None, q, k, v, mem.upload(raw), mem.upload(x), mem.upload(g), mem.upload(positions),
                                  q_rows=q_rows, kv_rows=kv_rows, cols=cols, batch=batch, head_dim=head_dim, rope_dim=64,
                                  eps=1e-5, theta=100000.0, freq_scale=1.0, weight_type=weight_type,
                                  freq_factors=mem.upload(factors) if with_factors else None)
    want = fused_matvec.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols, head_dim, 64,
                                            100000.0, 1.0, factors)
    unrotated = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
    bound = 2 * product_bound(raw, weight_type, rmsnorm.reference(x, g, 1e-5), rows, cols)
    angle = rope.angles(positions, 64, 100000.0, 1.0, factors)
    for buf, ref, lo, width in ((q, want[0], 0, q_rows), (k, want[1], q_rows, kv_rows), (v, want[2], q_rows + kv_rows, kv_rows)):
        got = buf.download(np.float32).reshape(batch, width)
        pair_bound = bound[:, lo:lo + width].reshape(batch, -1, 2).sum(-1).repeat(2, -1)
        if lo < q_rows + kv_rows:
            size = np.abs(unrotated[:, lo:lo + width]).reshape(batch, -1, 2).sum(-1).repeat(2, -1)
            tol = pair_bound + size * np.tile((32 * U32 * angle + 8 * U32).repeat(2, -1), width // head_dim)
        else:
            tol = bound[:, lo:lo + width]
        check(got, ref, tol, seed, f"{weight_type} rows {lo}+{width} batch {batch} factors {with_factors}")


@pytest.mark.parametrize("weight_type,rows,cols,batch", [
    ("q4_1", 1536, 576, 1), ("q4_1", 1536, 576, 8), ("q4_1", 1536, 576, 64), ("q8_0", 1536, 576, 3),
    ("f16", 1536, 576, 2), ("f32", 33, 96, 5), ("q4_1", 7, 32, 1), ("q5_0", 2048, 640, 1), ("q5_1", 1536, 576, 8),
    ("bf16", 1536, 576, 3),
])
def test_norm_swiglu(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    raw = random_weights(rng, weight_type, 2 * rows, cols)
    x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    y = mem.poisoned(batch * rows * 4)
    fused_matvec.launch_norm_swiglu(gpu, None, y, mem.upload(raw), mem.upload(x), mem.upload(g), rows=rows, cols=cols,
                                    batch=batch, eps=1e-5, weight_type=weight_type)
    both = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, 2 * rows, cols)
    err = 2 * product_bound(raw, weight_type, rmsnorm.reference(x, g, 1e-5), 2 * rows, cols)
    want = fused_matvec.reference_norm_swiglu(raw, weight_type, x, g, 1e-5, rows, cols)
    tol = 1.1 * np.abs(both[:, rows:]) * err[:, :rows] + np.abs(silu_mul.reference(both[:, :rows], 1.0)) * err[:, rows:] \
        + 6 * U32 * np.abs(want) + 1e-30
    check(y.download(np.float32).reshape(batch, rows), want, tol, seed, f"{weight_type} {rows}x{cols} batch {batch}")


@pytest.mark.parametrize("weight_type,rows,cols,batch", [
    ("q4_1", 576, 576, 1), ("q4_1", 576, 1536, 1), ("q4_1", 576, 1536, 64), ("q8_0", 576, 576, 9), ("f16", 577, 96, 2),
    ("f32", 33, 64, 7), ("q5_0", 640, 2048, 1), ("q5_1", 576, 1536, 9), ("bf16", 577, 96, 1),
])
def test_add(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    y0 = rng.standard_normal((batch, rows)).astype(np.float32)
    y = mem.upload(y0)
    fused_matvec.launch_add(gpu, None, y, mem.upload(raw), mem.upload(x), rows=rows, cols=cols, batch=batch, weight_type=weight_type)
    want = fused_matvec.reference_add(raw, weight_type, x, y0, rows, cols)
    tol = product_bound(raw, weight_type, x, rows, cols) + 2 * U32 * np.abs(want)
    check(y.download(np.float32).reshape(batch, rows), want, tol, seed, f"{weight_type} {rows}x{cols} batch {batch}")


@pytest.mark.parametrize("weight_type,batch", [("q8_0", 1), ("q8_0", 8), ("q8_0", 64), ("f16", 2), ("q4_1", 3), ("q5_0", 1),
                                               ("q5_1", 4)])
def test_norm_output_head(gpu, mem, rng, seed, weight_type, batch):
    rows, cols = 49152, 576
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    y = mem.poisoned(batch * rows * 4)
    fused_matvec.launch_norm(gpu, None, y, mem.upload(raw), mem.upload(x), mem.upload(g), rows=rows, cols=cols, batch=batch,
                             eps=1e-5, weight_type=weight_type)
    want = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
    tol = 2 * product_bound(raw, weight_type, rmsnorm.reference(x, g, 1e-5), rows, cols)
    check(y.download(np.float32).reshape(batch, rows), want, tol, seed, f"head {weight_type} batch {batch}")


@pytest.mark.parametrize("vocab", [128256, 32001])
def test_sample_greedy_rows(gpu, mem, rng, seed, vocab):
    """numpy's argmax (lowest id among equal maxima, the first NaN) for Llama 3's vocabulary, read four logits a
    load, and an odd one whose rows past the first are read one logit at a time."""
    logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    top = logits.max() + 1
    logits[0, vocab - 1] = top
    logits[1, [vocab - 2, 70_001 % vocab, 6]] = top
    logits[2, [9, 10, 11]] = top
    logits[3, [vocab // 2, 40]] = np.nan
    logits[4, :] = -np.inf
    out = mem.poisoned(6 * 4)
    logits_buf, params_buf = mem.upload(logits), mem.upload(np.zeros((6, 5), np.float32))
    sample.launch(gpu, None, out, logits_buf, params_buf, 6, vocab)
    want = [int(np.argmax(row)) for row in logits]
    assert out.download(np.int32).tolist() == want, f"seed {seed}"
    # Split over chunks_for(vocab) workgroups a row (a workspace): the same picks, launch after launch (the
    # counters back at zero each time).
    workspace = mem.upload(np.zeros(sample.workspace_size(6, vocab) // 4, np.int32), "scratch")
    for launch in range(3):
        out.fill(0xFF)
        sample.launch(gpu, None, out, logits_buf, params_buf, 6, vocab, workspace)
        assert out.download(np.int32).tolist() == want, f"seed {seed}, launch {launch}"
    assert not workspace.download(np.int32)[:6].any(), "counters left non-zero"


def test_sample(gpu, mem, rng, seed):
    vocab, rows = 49152, 15
    logits = (rng.standard_normal((rows, vocab)) * rng.uniform(1, 5)).astype(np.float32)
    logits[2, rng.choice(vocab, 5, replace=False)] = logits[2].max() + 1  # a tie at the top, cut by k = 3
    params = np.array([[0.8, 40, 0.95, 0.05, 0], [1.3, 200, 0.9, 0, 0], [1.0, 3, 1, 0, 0], [0, 40, 0.95, 0.05, 0],
                       [0.5, 1024, 0.99, 0.01, 0], [2.0, 1, 1, 0, 0], [1.0, 64, 0.5, 0.2, 0], [0.9, 512, 1, 0, 0],
                       [0.7, 40, 0.95, 0.05, 0], [1.1, 100, 0.8, 0, 0], [0.0, 0, 1, 0, 0], [1.5, 1000, 1, 0.3, 0],
                       [1.0, 0, 1, 0, 0], [0.8, 0, 1, 0.05, 0], [2.0, 0, 1, 0, 0]],  # the whole vocabulary
                      dtype=np.float32)
    rows = len(params)
    params[:, 4] = rng.random(rows)
    out, split_out = mem.poisoned(rows * 4), mem.poisoned(rows * 4)
    logits_buf, params_buf = mem.upload(logits), mem.upload(params)
    sample.launch(gpu, None, out, logits_buf, params_buf, rows, vocab)
    got = out.download(np.int32)
    # With a workspace the greedy row and the whole-vocabulary rows without min-p (12, 14) are split, every other
    # row is its chunk 0's alone (the same picks); the counters are back at zero.
    workspace = mem.upload(np.zeros(sample.workspace_size(rows, vocab) // 4, np.int32), "scratch")
    sample.launch(gpu, None, split_out, logits_buf, params_buf, rows, vocab, workspace)
    split = split_out.download(np.int32)
    assert [int(split[i]) for i in range(rows) if i not in (12, 14)] == [int(got[i]) for i in range(rows)
                                                                          if i not in (12, 14)], f"seed {seed}"
    assert not workspace.download(np.int32)[:rows].any(), "counters left non-zero"
    for i in range(rows):
        t, k, p, m, u = (float(v) for v in params[i])
        # float32 sums on the device against float64 on the host: over a whole 49k vocabulary the running
        # sum's rounding reaches ~1e-6 of the total, so those rows allow a wider neighbourhood of the draw
        du_max = 1e-5 if k <= 0 and p >= 1 else 2e-6
        picks = {sample.pick(logits[i], t, int(k), min(p + dp, 1.0) if p < 1 else 1.0, m, min(max(u + du, 0.0), 0.999999))
                 for du in (-du_max, 0, du_max) for dp in (-2e-6, 0, 2e-6)}
        assert int(got[i]) in picks, f"seed {seed}, row {i}, params {params[i]}: got {got[i]}, want one of {picks}"
        assert int(split[i]) in picks, f"seed {seed}, split row {i}, params {params[i]}: got {split[i]}, want {picks}"


# ---- fused_matmul: the same references at prompt and large-batch sizes, split over columns -----


@pytest.fixture
def workspace(gpu):
    buf = gpu.allocate(fused_matmul.WORKSPACE_BYTES, "scratch")
    buf.fill(0)
    yield buf
    assert not buf.download(np.int32, fused_matmul.COUNTER_BYTES // 4).any(), "split counters left non-zero"
    buf.free()


def launch_twice_same_bits(launch, out, what):
    """Run `launch` twice: the second result must equal the first bit for bit (the split combine is in a
    fixed order, and the counters were reset by the first launch)."""
    launch()
    first = out.download(np.uint32)
    launch()
    assert np.array_equal(out.download(np.uint32), first), f"{what}: a second launch gave other bits"


@pytest.mark.parametrize("weight_type,n_tokens", [("q4_1", 9), ("q4_1", 33), ("q4_1", 64), ("q4_1", 128),
                                                  ("q4_1", 512), ("q8_0", 64), ("f16", 17), ("f32", 100),
                                                  ("q5_0", 64), ("q5_1", 128)])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "freq_factors"])
def test_matmul_norm_rope_demo_shapes(gpu, mem, rng, seed, workspace, weight_type, n_tokens, with_factors):
    head_dim, q_rows, kv_rows, cols = 64, 576, 192, 576
    rows = q_rows + 2 * kv_rows
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    positions = rng.integers(0, 8192, n_tokens).astype(np.int32)
    factors = far_factors(rng, 64) if with_factors else None  # rope_freqs.weight (Llama 3.1/3.2)
    q, k, v = (mem.poisoned(n_tokens * w * 4) for w in (q_rows, kv_rows, kv_rows))
    w_buf, x_buf, g_buf, p_buf = mem.upload(raw), mem.upload(x), mem.upload(g), mem.upload(positions)
    f_buf = mem.upload(factors) if with_factors else None
    launch_twice_same_bits(lambda: fused_matmul.launch_norm_rope(
        gpu, None, q, k, v, w_buf, x_buf, g_buf, p_buf, q_rows=q_rows, kv_rows=kv_rows, cols=cols, n_tokens=n_tokens,
        head_dim=head_dim, rope_dim=64, eps=1e-5, theta=100000.0, freq_scale=1.0, weight_type=weight_type,
        workspace=workspace, freq_factors=f_buf), q, f"norm_rope {weight_type} tokens {n_tokens}")
    want = fused_matmul.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols, head_dim,
                                            64, 100000.0, 1.0, factors)
    unrotated = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
    bound = 2 * product_bound(raw, weight_type, rmsnorm.reference(x, g, 1e-5), rows, cols)
    angle = rope.angles(positions, 64, 100000.0, 1.0, factors)
    for buf, ref, lo, width in ((q, want[0], 0, q_rows), (k, want[1], q_rows, kv_rows),
                                (v, want[2], q_rows + kv_rows, kv_rows)):
        got = buf.download(np.float32).reshape(n_tokens, width)
        if lo < q_rows + kv_rows:
            pair_bound = bound[:, lo:lo + width].reshape(n_tokens, -1, 2).sum(-1).repeat(2, -1)
            size = np.abs(unrotated[:, lo:lo + width]).reshape(n_tokens, -1, 2).sum(-1).repeat(2, -1)
            tol = pair_bound + size * np.tile((32 * U32 * angle + 8 * U32).repeat(2, -1), width // head_dim)
        else:
            tol = bound[:, lo:lo + width]
        check(got, ref, tol, seed, f"{weight_type} rows {lo}+{width} tokens {n_tokens} factors {with_factors}")


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    ("q4_1", 1536, 576, 9), ("q4_1", 1536, 576, 64), ("q4_1", 1536, 576, 512), ("q8_0", 1536, 576, 40),
    ("f16", 100, 96, 70), ("f32", 33, 96, 5), ("q5_0", 2048, 640, 64), ("q5_1", 1536, 576, 33),
    ("bf16", 1536, 576, 40),
])
def test_matmul_norm_swiglu(gpu, mem, rng, seed, workspace, weight_type, rows, cols, n_tokens):
    raw = random_weights(rng, weight_type, 2 * rows, cols)
    x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    y = mem.poisoned(n_tokens * rows * 4)
    w_buf, x_buf, g_buf = mem.upload(raw), mem.upload(x), mem.upload(g)
    launch_twice_same_bits(lambda: fused_matmul.launch_norm_swiglu(
        gpu, None, y, w_buf, x_buf, g_buf, rows=rows, cols=cols, n_tokens=n_tokens, eps=1e-5, weight_type=weight_type,
        workspace=workspace), y, f"swiglu {weight_type} {rows}x{cols} tokens {n_tokens}")
    both = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, 2 * rows, cols)
    err = 2 * product_bound(raw, weight_type, rmsnorm.reference(x, g, 1e-5), 2 * rows, cols)
    want = fused_matmul.reference_norm_swiglu(raw, weight_type, x, g, 1e-5, rows, cols)
    tol = 1.1 * np.abs(both[:, rows:]) * err[:, :rows] + np.abs(silu_mul.reference(both[:, :rows], 1.0)) * err[:, rows:] \
        + 6 * U32 * np.abs(want) + 1e-30
    check(y.download(np.float32).reshape(n_tokens, rows), want, tol, seed, f"{weight_type} {rows}x{cols} tokens {n_tokens}")


@pytest.mark.parametrize("weight_type,rows,cols,n_tokens", [
    ("q4_1", 576, 576, 64), ("q4_1", 576, 1536, 9), ("q4_1", 576, 1536, 64), ("q4_1", 576, 1536, 512),
    ("q8_0", 576, 576, 128), ("f16", 577, 96, 40), ("f32", 33, 64, 65), ("q5_0", 640, 2048, 64),
    ("q5_1", 576, 1536, 9), ("bf16", 577, 96, 40),
])
def test_matmul_add(gpu, mem, rng, seed, workspace, weight_type, rows, cols, n_tokens):
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    y0 = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    y = mem.upload(y0)
    fused_matmul.launch_add(gpu, None, y, mem.upload(raw), mem.upload(x), rows=rows, cols=cols, n_tokens=n_tokens,
                            weight_type=weight_type, workspace=workspace)
    want = fused_matmul.reference_add(raw, weight_type, x, y0, rows, cols)
    tol = product_bound(raw, weight_type, x, rows, cols) + 2 * U32 * np.abs(want)
    check(y.download(np.float32).reshape(n_tokens, rows), want, tol, seed, f"{weight_type} {rows}x{cols} tokens {n_tokens}")


@pytest.mark.parametrize("weight_type,n_tokens", [("q8_0", 9), ("q8_0", 64), ("q4_1", 128), ("q5_1", 9)])
def test_matmul_norm_output_head(gpu, mem, rng, seed, workspace, weight_type, n_tokens):
    rows, cols = 49152, 576
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    y = mem.poisoned(n_tokens * rows * 4)
    fused_matmul.launch_norm(gpu, None, y, mem.upload(raw), mem.upload(x), mem.upload(g), rows=rows, cols=cols,
                             n_tokens=n_tokens, eps=1e-5, weight_type=weight_type, workspace=workspace)
    want = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
    tol = 2 * product_bound(raw, weight_type, rmsnorm.reference(x, g, 1e-5), rows, cols)
    check(y.download(np.float32).reshape(n_tokens, rows), want, tol, seed, f"head {weight_type} tokens {n_tokens}")
