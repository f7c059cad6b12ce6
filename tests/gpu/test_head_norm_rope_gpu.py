"""head_norm_rope (the per-head norms and RoPE of qwen3 and gemma3, gpt-oss's biases, and the store of k and v) on a
real GPU against
its numpy reference (run with `pytest -m gpu tests/gpu`): fresh random inputs every run (the seed is in each failure
message), q and k poisoned where the kernel must write, the bound of tests/test_kernels_emulated_head_norm_rope.py;
with a cache target, the pools bit for bit against kv_store.reference on what the kernel makes without one; the op
compiled at run time (nvrtc / hiprtc) gives the same bytes as its prebuilt object."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import head_norm_rope, kv_store
from hipcore.runtime import kernels as loader
from support.rope_factors import far_factors
from test_kernels_emulated_head_norm_rope import tolerance

pytestmark = pytest.mark.gpu
EPS, THETA = 1e-6, 1000000.0


def launch(gpu, mem, q, k, v, qw, kw, positions, rope_dim, rope_type, factors=None, target=None, biases=None,
           with_v=False):
    """(q, k) after the launch, and v where with_v; qw and kw None: no norm; biases: q's, k's and v's arrays."""
    bufs = [None if a is None else mem.upload(a) for a in (q, k, v, qw, kw, positions)]
    tokens, heads, head_dim = q.shape
    head_norm_rope.launch(gpu, None, *bufs, n_tokens=tokens, n_heads=heads, n_kv_heads=k.shape[1], head_dim=head_dim,
                          rope_dim=rope_dim, eps=EPS, theta=THETA, freq_scale=1.0,
                          freq_factors=None if factors is None else mem.upload(factors), rope_type=rope_type,
                          kv_target=target, biases=None if biases is None else tuple(map(mem.upload, biases)))
    gpu.synchronize()
    out = bufs[0].download(np.float32).reshape(q.shape), bufs[1].download(np.float32).reshape(k.shape)
    return (*out, bufs[2].download(np.float32).reshape(v.shape)) if with_v else out


# qwen3-8B's decode and a prompt of its heads, gemma3's 256-wide heads, a partial rotation
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim,rope_dim", [
    (1, 32, 8, 128, 128), (77, 32, 8, 128, 128), (5, 8, 4, 256, 256), (3, 4, 1, 64, 32)])
@pytest.mark.parametrize("rope_type", ["norm", "neox"])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "factors"])
def test_heads_normalized_and_rotated(gpu, mem, rng, seed, tokens, heads, kv_heads, head_dim, rope_dim, rope_type,
                                      with_factors):
    q = (rng.standard_normal((tokens, heads, head_dim)) * 3).astype(np.float32)
    k = (rng.standard_normal((tokens, kv_heads, head_dim)) * 0.5).astype(np.float32)
    v = np.full((tokens, kv_heads, head_dim), np.nan, np.float32)  # no target: never read
    qw, kw = (1 + 0.3 * rng.standard_normal((2, head_dim))).astype(np.float32)
    positions = rng.integers(0, 40000, tokens).astype(np.int32)
    factors = far_factors(rng, rope_dim) if with_factors else None
    got_q, got_k = launch(gpu, mem, q, k, v, qw, kw, positions, rope_dim, rope_type, factors)
    for got, x, w in ((got_q, q, qw), (got_k, k, kw)):
        want = head_norm_rope.reference(x, w, EPS, positions, rope_dim, THETA, 1.0, factors, rope_type)
        normed = head_norm_rope.reference(x, w, EPS, positions, 0, THETA, 1.0)
        err = np.abs(got.astype(np.float64) - want)
        tol = tolerance(normed, positions, rope_dim, factors, rope_type)
        assert np.all(err <= tol), f"seed {seed}: worst {float((err / tol).max()):.2f} x tolerance"


@pytest.mark.parametrize("dtype", sorted(kv_store.EPILOGUE_FORMATS))
def test_k_and_v_stored_as_kv_store_stores_them(gpu, mem, rng, seed, dtype):
    tokens, heads, kv_heads, head_dim, block_size, num_blocks = 9, 32, 8, 128, 16, 3
    fmt = kv_dtype(dtype)
    q = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    qw, kw = (1 + 0.3 * rng.standard_normal((2, head_dim))).astype(np.float32)
    positions = rng.integers(0, 4096, tokens).astype(np.int32)
    slots = rng.choice(num_blocks * block_size, tokens, replace=False).astype(np.int32)
    slots[2] = -1  # a padding row
    plain_q, plain_k = launch(gpu, mem, q, k, v, qw, kw, positions, head_dim, "neox")
    pool_shape = (num_blocks, kv_heads, block_size, fmt.row_bytes(head_dim))
    pools = [mem.upload(np.full(pool_shape, 0xA5, np.uint8), "kv") for _ in range(2)]
    target = kv_store.EpilogueTarget(pools[0], pools[1], mem.upload(slots), block_size, num_blocks, dtype)
    got_q, got_k = launch(gpu, mem, q, k, v, qw, kw, positions, head_dim, "neox", target=target)
    assert np.array_equal(got_q, plain_q), f"seed {seed}: q changed with a cache target"
    assert np.array_equal(got_k, k), f"seed {seed}: the k buffer was written with a cache target"
    for pool, rows, name in zip(pools, (plain_k, v), "kv"):
        want = np.full(pool_shape, 0xA5, np.uint8)
        kv_store.reference(want, rows, slots, fmt)
        assert np.array_equal(pool.download(np.uint8).reshape(pool_shape), want), f"seed {seed}: {name} pool"


@pytest.mark.parametrize("tokens", [1, 8, 77])
def test_gpt_oss_biases_rope_and_cache(gpu, mem, rng, seed, tokens):
    """gpt-oss-20b's heads (64 q heads, 8 kv heads of 64, NEOX, YaRN-like divisors): q and k plus their biases and
    rotated within the bound, v plus its bias to the bit (no norm weights: no norm); with a cache target the pools
    hold the bytes kv_store writes for what the same launch makes without one."""
    heads, kv_heads, head_dim, block_size, num_blocks = 64, 8, 64, 16, 8
    fmt = kv_dtype("f16")
    q, k, v = ((rng.standard_normal((tokens, n, head_dim)) * 3).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    biases = [(rng.standard_normal(n * head_dim) * 2).astype(np.float32) for n in (heads, kv_heads, kv_heads)]
    positions = rng.integers(0, 40000, tokens).astype(np.int32)
    factors = far_factors(rng, head_dim)
    got_q, got_k, got_v = launch(gpu, mem, q, k, v, None, None, positions, head_dim, "neox", factors, biases=biases,
                                 with_v=True)
    assert np.array_equal(got_v, v + biases[2].reshape(kv_heads, head_dim)), f"seed {seed}: v + bias"
    for got, x, b in ((got_q, q, biases[0]), (got_k, k, biases[1])):
        want = head_norm_rope.reference(x, None, EPS, positions, head_dim, THETA, 1.0, factors, "neox", bias=b)
        tol = tolerance(x + b.reshape(x.shape[1:]), positions, head_dim, factors, "neox")
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= tol), f"seed {seed}: worst {float((err / tol).max()):.2f} x tolerance"
    slots = rng.choice(num_blocks * block_size, tokens, replace=False).astype(np.int32)
    pool_shape = (num_blocks, kv_heads, block_size, fmt.row_bytes(head_dim))
    pools = [mem.upload(np.full(pool_shape, 0xA5, np.uint8), "kv") for _ in range(2)]
    target = kv_store.EpilogueTarget(pools[0], pools[1], mem.upload(slots), block_size, num_blocks, "f16")
    stored_q, _ = launch(gpu, mem, q, k, v, None, None, positions, head_dim, "neox", factors, target, biases)
    assert np.array_equal(stored_q, got_q), f"seed {seed}: q changed with a cache target"
    for pool, rows, name in zip(pools, (got_k, got_v), "kv"):
        want = np.full(pool_shape, 0xA5, np.uint8)
        kv_store.reference(want, rows, slots, fmt)
        assert np.array_equal(pool.download(np.uint8).reshape(pool_shape), want), f"seed {seed}: {name} pool"


def test_compiled_at_run_time_the_same_as_prebuilt(gpu, mem, rng, seed):
    sources = loader.kernels_dir()
    image = gpu.jit_compile((sources / "head_norm_rope.hip").read_text(), "head_norm_rope.hip", [str(sources)], [])
    kernel = gpu.load_module(image, "head_norm_rope").kernel(head_norm_rope.ENTRY, head_norm_rope.SIGNATURE)
    tokens, heads, kv_heads, head_dim = 4, 8, 2, 128
    q = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    qw, kw = (1 + 0.3 * rng.standard_normal((2, head_dim))).astype(np.float32)
    positions = np.arange(tokens, dtype=np.int32) * 97
    want_q, want_k = launch(gpu, mem, q, k, k, qw, kw, positions, head_dim, "neox")
    bufs = [mem.upload(a) for a in (q, k, k, qw, kw, positions)]
    kernel.launch(tokens * (heads + kv_heads), head_norm_rope.THREADS,
                  (*bufs[:5], 0, 0, 0, bufs[5], 0, tokens, heads, kv_heads, head_dim, head_dim, 1, EPS, THETA, 1.0,
                   *kv_store.NO_EPILOGUE_TARGET_ARGS))
    gpu.synchronize()
    assert np.array_equal(bufs[0].download(np.float32).reshape(q.shape), want_q), f"seed {seed}"
    assert np.array_equal(bufs[1].download(np.float32).reshape(k.shape), want_k), f"seed {seed}"
