"""The fused matvec ops on the cpu backend: each equals the chain of single ops it replaces, through
the same launchers the model uses, and the launchers refuse what the kernels cannot do."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import add, fused_matvec, matvec, rmsnorm, rope, silu_mul
from weight_samples import random_weights

TYPES = fused_matvec.WEIGHT_TYPES


class Mem:
    def __init__(self, dev):
        self.dev, self.buffers = dev, []

    def put(self, array: np.ndarray):
        buf = self.dev.allocate(max(array.nbytes, 4), "activations")
        buf.upload(np.ascontiguousarray(array))
        self.buffers.append(buf)
        return buf

    def empty(self, nbytes: int):
        buf = self.dev.allocate(nbytes, "activations")
        buf.fill(0xFF)
        self.buffers.append(buf)
        return buf

    def get(self, buf, shape):
        return buf.download(np.float32, int(np.prod(shape))).reshape(shape)


@pytest.fixture
def mem(cpu_device):
    m = Mem(cpu_device)
    yield m
    for buf in m.buffers:
        buf.free()


def chain_norm(mem, raw, wt, x, g, rows, cols):
    """rmsnorm then matvec, through the single ops."""
    dev, batch = mem.dev, x.shape[0]
    xn = mem.empty(x.nbytes)
    y = mem.empty(batch * rows * 4)
    rmsnorm.launch(dev, None, xn, mem.put(x), mem.put(g), batch, cols, 1e-5)
    matvec.launch(dev, None, y, mem.put(raw), xn, rows, cols, batch, weight_type=wt)
    return mem.get(y, (batch, rows))


@pytest.mark.parametrize("weight_type", TYPES)
def test_norm_rope_equals_norm_matvecs_and_rope(mem, weight_type):
    rng = np.random.default_rng(len(weight_type))
    head_dim, q_rows, kv_rows, cols, batch = 16, 48, 16, 64, 3
    rows = q_rows + 2 * kv_rows
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((batch, cols)) * 2).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    positions = np.array([0, 7, 300], dtype=np.int32)
    q, k, v = (mem.empty(batch * n * 4) for n in (q_rows, kv_rows, kv_rows))
    fused_matvec.launch_norm_rope(mem.dev, None, q, k, v, mem.put(raw), mem.put(x), mem.put(g), mem.put(positions),
                                  q_rows=q_rows, kv_rows=kv_rows, cols=cols, batch=batch, head_dim=head_dim, rope_dim=12,
                                  eps=1e-5, theta=10000.0, freq_scale=1.0, weight_type=weight_type)
    y = chain_norm(mem, raw, weight_type, x, g, rows, cols)
    want_q = rope.reference(y[:, :q_rows].reshape(batch, -1, head_dim), positions, 12, 10000.0, 1.0).reshape(batch, -1)
    want_k = rope.reference(y[:, q_rows:q_rows + kv_rows].reshape(batch, -1, head_dim), positions, 12, 10000.0,
                            1.0).reshape(batch, -1)
    scale = np.abs(y).max()
    np.testing.assert_allclose(mem.get(q, (batch, q_rows)), want_q, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(mem.get(k, (batch, kv_rows)), want_k, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(mem.get(v, (batch, kv_rows)), y[:, q_rows + kv_rows:], rtol=0, atol=1e-5 * scale)
    # The float64 reference agrees with the chain as well.
    ref_q, ref_k, ref_v = fused_matvec.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols,
                                                           head_dim, 12, 10000.0, 1.0)
    np.testing.assert_allclose(ref_q, want_q, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(ref_v, y[:, q_rows + kv_rows:], rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("weight_type", TYPES)
def test_norm_swiglu_add_and_norm_equal_their_chains(mem, weight_type):
    rng = np.random.default_rng(10 + len(weight_type))
    rows, cols, batch = 24, 96, 2
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    dev = mem.dev

    raw = random_weights(rng, weight_type, 2 * rows, cols)
    h = mem.empty(batch * rows * 4)
    fused_matvec.launch_norm_swiglu(dev, None, h, mem.put(raw), mem.put(x), mem.put(g), rows=rows, cols=cols,
                                    batch=batch, eps=1e-5, weight_type=weight_type)
    y = chain_norm(mem, raw, weight_type, x, g, 2 * rows, cols)
    want = silu_mul.reference(y[:, :rows], y[:, rows:])
    np.testing.assert_allclose(mem.get(h, (batch, rows)), want, rtol=0, atol=1e-5 * np.abs(want).max())

    raw = random_weights(rng, weight_type, rows, cols)
    out = mem.empty(batch * rows * 4)
    fused_matvec.launch_norm(dev, None, out, mem.put(raw), mem.put(x), mem.put(g), rows=rows, cols=cols, batch=batch,
                             eps=1e-5, weight_type=weight_type)
    want = chain_norm(mem, raw, weight_type, x, g, rows, cols)
    np.testing.assert_allclose(mem.get(out, (batch, rows)), want, rtol=0, atol=1e-5 * np.abs(want).max())

    residual = rng.standard_normal((batch, rows)).astype(np.float32)
    y_buf = mem.put(residual)
    fused_matvec.launch_add(dev, None, y_buf, mem.put(raw), mem.put(x), rows=rows, cols=cols, batch=batch,
                            weight_type=weight_type)
    product = mem.empty(batch * rows * 4)
    matvec.launch(dev, None, product, mem.put(raw), mem.put(x), rows, cols, batch, weight_type=weight_type)
    want = add.reference(residual, mem.get(product, (batch, rows)))
    np.testing.assert_allclose(mem.get(y_buf, (batch, rows)), want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_launchers_refuse_what_the_kernels_cannot_do(mem):
    dev = mem.dev
    raw = mem.put(random_weights(np.random.default_rng(0), "q4_1", 32, 64))
    x, g, out = mem.empty(64 * 4), mem.empty(64 * 4), mem.empty(64 * 4)
    with pytest.raises(ValueError, match="no fused kernel for weight type 'q6_k'"):
        fused_matvec.launch_add(dev, None, out, raw, x, rows=16, cols=64, batch=1, weight_type="q6_k")
    with pytest.raises(ValueError, match="multiple of 32"):
        fused_matvec.launch_norm(dev, None, out, raw, x, g, rows=1, cols=48, batch=1, eps=1e-5, weight_type="f32")
    with pytest.raises(ValueError, match="needs .* bytes"):
        fused_matvec.launch_add(dev, None, out, raw, x, rows=64, cols=64, batch=1, weight_type="q4_1")
    with pytest.raises(ValueError, match="overlap"):
        fused_matvec.launch_add(dev, None, x, raw, x, rows=16, cols=64, batch=1, weight_type="q4_1")
    with pytest.raises(ValueError, match="whole heads"):
        fused_matvec.launch_norm_rope(dev, None, out, out, out, raw, x, g, mem.empty(4), q_rows=12, kv_rows=4, cols=64,
                                      batch=1, head_dim=8, rope_dim=8, eps=1e-5, theta=1e4, freq_scale=1.0,
                                      weight_type="q4_1")
    assert fused_matvec.supports("q8_0") and not fused_matvec.supports("q6_k")
