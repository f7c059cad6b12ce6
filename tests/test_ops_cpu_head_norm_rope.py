"""head_norm_rope on the cpu backend through its launcher: the same bytes as the launches it replaces (rmsnorm over
every head, then rope, then kv_store), and the launcher's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import add_bias, head_norm_rope, kv_store, rmsnorm, rope
from test_ops_cpu_forward import poisoned, to_device

TOKENS, HEADS, KV_HEADS, HEAD_DIM = 3, 4, 2, 128
ARGS = dict(n_tokens=TOKENS, n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, rope_dim=HEAD_DIM, eps=1e-6,
            theta=1e6, freq_scale=1.0, rope_type="neox")


def inputs(dev, rng):
    q = rng.standard_normal((TOKENS, HEADS, HEAD_DIM)).astype(np.float32)
    k = rng.standard_normal((TOKENS, KV_HEADS, HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((TOKENS, KV_HEADS, HEAD_DIM)).astype(np.float32)
    qw, kw = (1 + 0.2 * rng.standard_normal((2, HEAD_DIM))).astype(np.float32)
    positions = np.array([0, 7, 1000], np.int32)
    return [to_device(dev, a) for a in (q, k, v, qw, kw, positions)]


def test_the_same_bytes_as_the_norms_ropes_and_kv_store_it_replaces(cpu_device):
    rng = np.random.default_rng(11)
    q, k, v, qw, kw, pos = inputs(cpu_device, rng)
    q2, k2 = (to_device(cpu_device, b.download(np.float32)) for b in (q, k))
    for out, w, heads in ((q2, qw, HEADS), (k2, kw, KV_HEADS)):
        rmsnorm.launch(cpu_device, None, out, out, w, TOKENS * heads, HEAD_DIM, 1e-6)
        rope.launch(cpu_device, None, out, pos, TOKENS, heads, HEAD_DIM, HEAD_DIM, 1e6, 1.0, rope_type="neox")
    head_norm_rope.launch(cpu_device, None, q, k, v, qw, kw, pos, **ARGS)
    assert np.array_equal(q.download(np.float32), q2.download(np.float32))
    assert np.array_equal(k.download(np.float32), k2.download(np.float32))
    # with a cache target: k (normalized, rotated) and v in the pools as kv_store writes them; slot -1 skipped
    fmt, block_size, num_blocks = kv_dtype("f16"), 4, 2
    pool_shape = (num_blocks, KV_HEADS, block_size, fmt.row_bytes(HEAD_DIM))
    k_pool, v_pool = (to_device(cpu_device, np.full(pool_shape, 0xA5, np.uint8), "kv") for _ in range(2))
    slots = np.array([5, -1, 2], np.int32)
    target = kv_store.EpilogueTarget(k_pool, v_pool, to_device(cpu_device, slots), block_size, num_blocks, "f16")
    q3, k3, v3 = (to_device(cpu_device, a) for a in (rng.standard_normal((TOKENS, n, HEAD_DIM)).astype(np.float32)
                                                     for n in (HEADS, KV_HEADS, KV_HEADS)))
    k_in, v_in = k3.download(np.float32).copy(), v3.download(np.float32).reshape(TOKENS, KV_HEADS, HEAD_DIM)
    head_norm_rope.launch(cpu_device, None, q3, k3, v3, qw, kw, pos, **ARGS, kv_target=target)
    assert np.array_equal(k3.download(np.float32), k_in)  # the k buffer keeps what the products wrote
    k_want = head_norm_rope.reference(k_in.reshape(TOKENS, KV_HEADS, HEAD_DIM), kw.download(np.float32), 1e-6,
                                      pos.download(np.int32), HEAD_DIM, 1e6, 1.0, None, "neox")
    for pool, rows in ((k_pool, k_want), (v_pool, v_in)):
        want = np.full(pool_shape, 0xA5, np.uint8)
        kv_store.reference(want, rows, slots, fmt)
        assert np.array_equal(pool.download(np.uint8).reshape(pool_shape), want)


@pytest.mark.parametrize("change, match", [
    (dict(head_dim=127, rope_dim=126), "head_dim"), (dict(head_dim=514, rope_dim=514), "head_dim"),
    (dict(rope_dim=130), "rope_dim"), (dict(rope_dim=63), "rope_dim"), (dict(rope_type="yarn"), "rope_type"),
    (dict(theta=0.0), "theta"), (dict(n_tokens=4), "q needs"),
])
def test_the_launcher_refuses_what_the_kernel_cannot_do(cpu_device, change, match):
    q, k, v, qw, kw, pos = inputs(cpu_device, np.random.default_rng(2))
    with pytest.raises(ValueError, match=match):
        head_norm_rope.launch(cpu_device, None, q, k, v, qw, kw, pos, **{**ARGS, **change})


def test_biases_without_norms_the_same_bytes_as_add_bias_rope_and_kv_store(cpu_device):
    """gpt-oss's launches (add_bias on q, k and v, rope on q and k, kv_store) against one head_norm_rope launch with
    biases and no norm weights: q the same bytes, k and v in the pools as kv_store writes them; without a cache
    target k and v biased in place."""
    rng = np.random.default_rng(5)
    q, k, v, _, _, pos = inputs(cpu_device, rng)
    biases = [to_device(cpu_device, (rng.standard_normal(n * HEAD_DIM) * 2).astype(np.float32))
              for n in (HEADS, KV_HEADS, KV_HEADS)]
    q2, k2, v2 = (to_device(cpu_device, b.download(np.float32)) for b in (q, k, v))
    for out, bias, heads in zip((q2, k2, v2), biases, (HEADS, KV_HEADS, KV_HEADS)):
        add_bias.launch(cpu_device, None, out, bias, TOKENS, heads * HEAD_DIM)
    for out, heads in ((q2, HEADS), (k2, KV_HEADS)):
        rope.launch(cpu_device, None, out, pos, TOKENS, heads, HEAD_DIM, HEAD_DIM, 1e6, 1.0, rope_type="neox")
    q3, k3, v3 = (to_device(cpu_device, b.download(np.float32)) for b in (q, k, v))
    head_norm_rope.launch(cpu_device, None, q3, k3, v3, None, None, pos, **ARGS, biases=tuple(biases))
    for got, want in ((q3, q2), (k3, k2), (v3, v2)):
        assert np.array_equal(got.download(np.float32), want.download(np.float32))
    fmt, block_size, num_blocks = kv_dtype("bf16"), 4, 2
    pool_shape = (num_blocks, KV_HEADS, block_size, fmt.row_bytes(HEAD_DIM))
    k_pool, v_pool = (to_device(cpu_device, np.full(pool_shape, 0xA5, np.uint8), "kv") for _ in range(2))
    slots = np.array([-1, 6, 1], np.int32)
    target = kv_store.EpilogueTarget(k_pool, v_pool, to_device(cpu_device, slots), block_size, num_blocks, "bf16")
    head_norm_rope.launch(cpu_device, None, q, k, v, None, None, pos, **ARGS, biases=tuple(biases), kv_target=target)
    assert np.array_equal(q.download(np.float32), q2.download(np.float32))
    for pool, rows in ((k_pool, k2), (v_pool, v2)):
        want = np.full(pool_shape, 0xA5, np.uint8)
        kv_store.reference(want, rows.download(np.float32).reshape(TOKENS, KV_HEADS, HEAD_DIM), slots, fmt)
        assert np.array_equal(pool.download(np.uint8).reshape(pool_shape), want)


def test_the_norm_weights_go_together(cpu_device):
    q, k, v, qw, kw, pos = inputs(cpu_device, np.random.default_rng(3))
    with pytest.raises(ValueError, match="go together"):
        head_norm_rope.launch(cpu_device, None, q, k, v, qw, None, pos, **ARGS)
