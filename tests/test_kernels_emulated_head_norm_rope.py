"""head_norm_rope (qwen3's and gemma3's per-head norms, gpt-oss's biases, RoPE and the store of k and v) under the
kernel-language emulation (tests/support/emulated_kernels.py), at warp 32 and 64, against its numpy reference
(add_bias.py's, rmsnorm.py's, then rope.py's), in both RoPE layouts, with and without frequency factors, over any
grid (grid-stride); with a cache target, the pools against kv_store.reference on what the same kernel writes without
one."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype as kv_dtype_named
from hipcore.ops import head_norm_rope, kv_store, rope
from support.emulated_kernels import U32, run
from support.rope_factors import factors_arg, far_factors

EPS, THETA, FREQ_SCALE = 1e-6, 1000000.0, 1.0
# (tokens, q heads, kv heads, head_dim, rope_dim): qwen3's 128, gemma3's 256, a partial rotation, a head wider than
# the workgroup's 64 threads twice over, and one narrower than it.
SHAPES = [(3, 4, 2, 128, 128), (2, 2, 1, 256, 256), (2, 3, 1, 64, 32), (1, 2, 2, 16, 16)]


def make_inputs(rng, tokens, heads, kv_heads, head_dim):
    q = (rng.standard_normal((tokens, heads, head_dim)) * 3).astype(np.float32)
    k = (rng.standard_normal((tokens, kv_heads, head_dim)) * 0.5).astype(np.float32)
    v = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    qw = (1 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32)
    kw = (1 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32)
    return q, k, v, qw, kw


def write(tmp_path, **arrays):
    for name, a in arrays.items():
        a.tofile(tmp_path / name)
    return [tmp_path / name for name in arrays]


def tolerance(normed: np.ndarray, positions, rope_dim, factors, rope_type) -> np.ndarray:
    """test_rope's bound on the rotation (each element's pair's magnitude, the angle's rounding) on the normalized
    head, plus 16 u32 of it for the norm (a sum of squares in another order, a reciprocal square root, two products)."""
    angle = rope.angles(positions, rope_dim, THETA, FREQ_SCALE, factors)[:, None, :]
    first, second = rope.pair_slices(rope_dim, rope_type)
    mag = np.abs(normed).astype(np.float64)
    tol = 16 * U32 * mag + 1e-30
    pair = mag[..., first] + mag[..., second]
    for part in (first, second):
        tol[..., part] += pair * (32 * U32 * angle + 8 * U32)
    return tol


def run_kernel(harnesses, warp, tmp_path, grid, files, tokens, heads, kv_heads, head_dim, rope_dim, rope_type,
               kv_format=0, block_size=0, num_blocks=0, pool_bytes=0, biases=("-", "-", "-"), with_v=False):
    """files: q, k, v, q_weight|-, k_weight|-, positions, factors|-, slots|-; biases: q's, k's, v's (files or -).
    (q, k, the pools' bytes), and v after them where with_v."""
    run(harnesses, warp, head_norm_rope.ENTRY, grid, head_norm_rope.THREADS, tokens, heads, kv_heads, head_dim,
        rope_dim, head_norm_rope.ROPE_TYPES[rope_type], EPS, THETA, FREQ_SCALE, kv_format, block_size, num_blocks,
        pool_bytes, *files[:5], *biases, *files[5:], tmp_path / "o")
    raw = np.fromfile(tmp_path / "o", np.uint8)
    n_q, n_k = tokens * heads * head_dim * 4, tokens * kv_heads * head_dim * 4
    q = raw[:n_q].view(np.float32).reshape(tokens, heads, head_dim)
    k = raw[n_q:n_q + n_k].view(np.float32).reshape(tokens, kv_heads, head_dim)
    v = raw[n_q + n_k:n_q + 2 * n_k].view(np.float32).reshape(tokens, kv_heads, head_dim)
    return (q, k, raw[n_q + 2 * n_k:], v) if with_v else (q, k, raw[n_q + 2 * n_k:])


@pytest.mark.parametrize("rope_type", ["norm", "neox"])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "factors"])
def test_heads_normalized_and_rotated_in_place(harnesses, warp, rope_type, with_factors, tmp_path):
    rng = np.random.default_rng([warp, with_factors, len(rope_type)])
    for tokens, heads, kv_heads, head_dim, rope_dim in SHAPES:
        q, k, v, qw, kw = make_inputs(rng, tokens, heads, kv_heads, head_dim)
        positions = rng.integers(0, 40000, tokens).astype(np.int32)
        factors = far_factors(rng, rope_dim) if with_factors else None
        files = write(tmp_path, q=q, k=k, v=v, qw=qw, kw=kw, p=positions) + [factors_arg(tmp_path, factors), "-"]
        items = tokens * (heads + kv_heads)
        for grid in sorted({items, 1, 3}):
            got_q, got_k, _ = run_kernel(harnesses, warp, tmp_path, grid, files, tokens, heads, kv_heads, head_dim,
                                         rope_dim, rope_type)
            for got, x, w in ((got_q, q, qw), (got_k, k, kw)):
                want = head_norm_rope.reference(x, w, EPS, positions, rope_dim, THETA, FREQ_SCALE, factors, rope_type)
                normed = head_norm_rope.reference(x, w, EPS, positions, 0, THETA, FREQ_SCALE)
                err = np.abs(got.astype(np.float64) - want)
                tol = tolerance(normed, positions, rope_dim, factors, rope_type)
                assert np.all(err <= tol), f"{head_dim}/{rope_dim} grid {grid}: {float(np.max(err / tol)):.2f} x tol"


def test_the_bound_catches_a_missing_weight_and_the_other_layout(harnesses, warp, tmp_path):
    """What the kernel could be confused with lies far outside the bound: the norm without its weight, and RoPE in
    the other layout."""
    rng = np.random.default_rng([warp, 9])
    tokens, heads, kv_heads, head_dim, rope_dim = 2, 2, 1, 128, 128
    q, k, v, qw, kw = make_inputs(rng, tokens, heads, kv_heads, head_dim)
    positions = np.array([5, 3000], np.int32)
    files = write(tmp_path, q=q, k=k, v=v, qw=qw, kw=kw, p=positions) + ["-", "-"]
    got_q, _, _ = run_kernel(harnesses, warp, tmp_path, 6, files, tokens, heads, kv_heads, head_dim, rope_dim, "neox")
    normed = head_norm_rope.reference(q, qw, EPS, positions, 0, THETA, FREQ_SCALE)
    tol = tolerance(normed, positions, rope_dim, None, "neox")
    for wrong in (head_norm_rope.reference(q, np.ones_like(qw), EPS, positions, rope_dim, THETA, FREQ_SCALE, None, "neox"),
                  head_norm_rope.reference(q, qw, EPS, positions, rope_dim, THETA, FREQ_SCALE, None, "norm")):
        assert np.any(np.abs(got_q - wrong) > tol)


def cache_case(rng, tokens, kv_heads, head_dim, fmt):
    """(positions, block_size, num_blocks, slots, pool_shape) of a small paged cache: distinct slots for the tokens, the
    second a padding token's (-1)."""
    positions = rng.integers(0, 4096, tokens).astype(np.int32)
    block_size, num_blocks = 4, 3
    slots = rng.choice(num_blocks * block_size, tokens, replace=False).astype(np.int32)
    slots[1] = -1
    return positions, block_size, num_blocks, slots, (num_blocks, kv_heads, block_size, fmt.row_bytes(head_dim))


def assert_pools(pools, pool_shape, k_rows, v_rows, slots, fmt, what):
    """The K and V pools' bytes (as the harness returns them) are kv_store's for these rows at these slots."""
    for pool, rows, name in zip(pools.reshape(2, *pool_shape), (k_rows, v_rows), "kv"):
        want = np.full(pool_shape, 0xA5, np.uint8)
        kv_store.reference(want, rows, slots, fmt)
        assert np.array_equal(pool, want), f"{name} pool {what}"


@pytest.mark.parametrize("kv_dtype", sorted(kv_store.EPILOGUE_FORMATS))
def test_k_and_v_stored_into_the_cache(harnesses, warp, kv_dtype, tmp_path):
    """With a cache target k (normalized and rotated) and v go into the pools at each token's slot, the bytes
    kv_store writes for the k this kernel makes without one and for v as it came; every other slot (and a padding
    token's, slot -1) stays as it was; q is the same as without a target, and the k buffer keeps its input."""
    rng = np.random.default_rng([warp, 7, *map(ord, kv_dtype)])
    fmt = kv_dtype_named(kv_dtype)
    for tokens, heads, kv_heads, head_dim, rope_dim in [(3, 4, 2, 128, 128), (2, 2, 1, 256, 256)]:
        q, k, v, qw, kw = make_inputs(rng, tokens, heads, kv_heads, head_dim)
        positions, block_size, num_blocks, slots, pool_shape = cache_case(rng, tokens, kv_heads, head_dim, fmt)
        pool_bytes = int(np.prod(pool_shape))
        base = write(tmp_path, q=q, k=k, v=v, qw=qw, kw=kw, p=positions, slots=slots)
        plain_files, store_files = base[:-1] + ["-", "-"], base[:-1] + ["-", base[-1]]
        items = tokens * (heads + 2 * kv_heads)
        for grid in sorted({items, 1}):
            plain_q, plain_k, _ = run_kernel(harnesses, warp, tmp_path, grid, plain_files, tokens, heads, kv_heads,
                                             head_dim, rope_dim, "neox")
            got_q, got_k, pools = run_kernel(harnesses, warp, tmp_path, grid, store_files, tokens, heads, kv_heads,
                                             head_dim, rope_dim, "neox", kv_store.EPILOGUE_FORMATS[kv_dtype],
                                             block_size, num_blocks, pool_bytes)
            assert np.array_equal(got_q, plain_q), "q changed with a cache target"
            assert np.array_equal(got_k, k), "the k buffer was written with a cache target"
            assert_pools(pools, pool_shape, plain_k, v, slots, fmt, f"{kv_dtype} head_dim {head_dim} grid {grid}")


def make_biases(rng, heads, kv_heads, head_dim):
    return [(rng.standard_normal(n * head_dim) * 2).astype(np.float32) for n in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("rope_type", ["norm", "neox"])
def test_biases_without_norms(harnesses, warp, rope_type, tmp_path):
    """gpt-oss's heads: q and k plus their biases, rotated (no norm weights: no norm), v plus its bias in place
    without a cache target; the planted faults (the bias left out, the bias added after the rotation) lie outside the
    bound."""
    rng = np.random.default_rng([warp, 23, len(rope_type)])
    for tokens, heads, kv_heads, head_dim, rope_dim in [(3, 4, 2, 64, 64), (2, 3, 1, 64, 32)]:
        q, k, v, _, _ = make_inputs(rng, tokens, heads, kv_heads, head_dim)
        qb, kb, vb = make_biases(rng, heads, kv_heads, head_dim)
        positions = rng.integers(0, 40000, tokens).astype(np.int32)
        factors = far_factors(rng, rope_dim)
        files = write(tmp_path, q=q, k=k, v=v) + ["-", "-"] + write(tmp_path, p=positions) + \
            [factors_arg(tmp_path, factors), "-"]
        biases = write(tmp_path, qb=qb, kb=kb, vb=vb)
        for grid in sorted({tokens * (heads + 2 * kv_heads), 1, 3}):
            got_q, got_k, _, got_v = run_kernel(harnesses, warp, tmp_path, grid, files, tokens, heads, kv_heads,
                                                head_dim, rope_dim, rope_type, biases=biases, with_v=True)
            assert np.array_equal(got_v, v + vb.reshape(kv_heads, head_dim)), f"v + bias, grid {grid}"
            for got, x, b in ((got_q, q, qb), (got_k, k, kb)):
                want = head_norm_rope.reference(x, None, EPS, positions, rope_dim, THETA, FREQ_SCALE, factors,
                                                rope_type, bias=b)
                biased = x + b.reshape(x.shape[1:])
                tol = tolerance(biased, positions, rope_dim, factors, rope_type)
                assert np.all(np.abs(got.astype(np.float64) - want) <= tol), f"{head_dim}/{rope_dim} grid {grid}"
                rotate = dict(positions=positions, rope_dim=rope_dim, theta=THETA, freq_scale=FREQ_SCALE,
                              freq_factors=factors, rope_type=rope_type)
                for wrong in (head_norm_rope.reference(x, None, EPS, **rotate),
                              head_norm_rope.reference(x, None, EPS, **rotate) + b.reshape(x.shape[1:])):
                    assert np.any(np.abs(got - wrong) > tol)


@pytest.mark.parametrize("kv_dtype", sorted(kv_store.EPILOGUE_FORMATS))
def test_biased_k_and_v_stored_into_the_cache(harnesses, warp, kv_dtype, tmp_path):
    """With biases and a cache target: the pools hold the bytes kv_store writes for the k and v the same kernel makes
    without a target (k biased and rotated, v biased), q as without one, the k and v buffers as they came."""
    rng = np.random.default_rng([warp, 29, *map(ord, kv_dtype)])
    fmt = kv_dtype_named(kv_dtype)
    tokens, heads, kv_heads, head_dim, rope_dim = 3, 4, 2, 64, 64
    q, k, v, _, _ = make_inputs(rng, tokens, heads, kv_heads, head_dim)
    positions, block_size, num_blocks, slots, pool_shape = cache_case(rng, tokens, kv_heads, head_dim, fmt)
    qb, kb, vb = make_biases(rng, heads, kv_heads, head_dim)
    biases = write(tmp_path, qb=qb, kb=kb, vb=vb)
    base = write(tmp_path, q=q, k=k, v=v) + ["-", "-"] + write(tmp_path, p=positions, slots=slots)
    plain_files, store_files = base[:-1] + ["-", "-"], base[:-1] + ["-", base[-1]]
    plain_q, plain_k, _, plain_v = run_kernel(harnesses, warp, tmp_path, 5, plain_files, tokens, heads, kv_heads,
                                              head_dim, rope_dim, "neox", biases=biases, with_v=True)
    got_q, got_k, pools, got_v = run_kernel(harnesses, warp, tmp_path, 5, store_files, tokens, heads, kv_heads,
                                            head_dim, rope_dim, "neox", kv_store.EPILOGUE_FORMATS[kv_dtype],
                                            block_size, num_blocks, int(np.prod(pool_shape)), biases=biases,
                                            with_v=True)
    assert np.array_equal(got_q, plain_q)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, v), "k or v written with a cache target"
    assert_pools(pools, pool_shape, plain_k, plain_v, slots, fmt, kv_dtype)
