"""Gemma 3's ops on the cpu backend: gelu_mul (GeGLU's gate) and scale (the embedding scale) through the
launch path against their references and known values, and paged_attention's sliding window against
attention computed from its definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hipcore.ops import gelu_mul, paged_attention, scale
from support.forward_pass_samples import make_sample, windowed
from test_ops_cpu_forward import poisoned, to_device

U32 = 2.0**-24


def test_gelu_is_the_tanh_approximation():
    """The reference against 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) written out (llama.cpp's
    ggml_gelu), and against the exact (erf) GELU it approximates to within 1e-3."""
    for x in (-5.0, -1.0, -0.1, 0.0, 0.3, 1.0, 2.5, 8.0):
        tanh_form = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        assert gelu_mul.gelu(np.array([x]))[0] == pytest.approx(tanh_form, rel=1e-12, abs=1e-15)
        assert abs(gelu_mul.gelu(np.array([x]))[0] - 0.5 * x * (1 + math.erf(x / math.sqrt(2)))) < 1e-3
    assert gelu_mul.gelu(np.array([1.0]))[0] == pytest.approx(0.8411919906082768, rel=1e-12)


@pytest.mark.parametrize("n", [1, 257, 10_001])
def test_gelu_mul_matches_reference(cpu_device, n):
    rng = np.random.default_rng(n)
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    gate[: min(n, 3)] = np.array([-1e30, 1e30, 0.0], np.float32)[: min(n, 3)]
    up = rng.standard_normal(n).astype(np.float32)
    g, u, out = to_device(cpu_device, gate), to_device(cpu_device, up), poisoned(cpu_device, 4 * n)
    gelu_mul.launch(cpu_device, None, out, g, u, n)
    want = gelu_mul.reference(gate, up)
    np.testing.assert_allclose(out.download(np.float32), want, rtol=U32, atol=1e-37)
    assert not np.isnan(want).any()
    gelu_mul.launch(cpu_device, None, g, g, u, n)  # in place, as the forward pass runs it
    np.testing.assert_allclose(g.download(np.float32), want, rtol=U32, atol=1e-37)
    small = cpu_device.allocate(4, "activations")
    with pytest.raises(ValueError, match="gelu_mul"):
        gelu_mul.launch(cpu_device, None, small, g, u, n + 1)


def test_scale_is_exact_and_in_place(cpu_device):
    x = np.random.default_rng(3).standard_normal(640).astype(np.float32)
    buf = to_device(cpu_device, x)
    factor = math.sqrt(640)
    scale.launch(cpu_device, None, buf, buf, 640, factor)
    assert np.array_equal(buf.download(np.float32), x * np.float32(factor))
    with pytest.raises(ValueError, match="finite"):
        scale.launch(cpu_device, None, buf, buf, 640, float("inf"))


def naive_windowed_attention(sample, window: int) -> np.ndarray:
    """Token by token and head by head in float64 over the keys j with pos - window < j <= pos."""
    out = np.zeros(sample.q.shape, np.float64)
    group = sample.n_heads // sample.n_kv_heads
    for t in range(sample.n_tokens):
        pos = int(sample.positions[t])
        if pos < 0:
            continue
        keys, values = sample.keys_values(int(sample.token_seq[t]), pos + 1)
        first = max(0, pos - window + 1)
        for h in range(sample.n_heads):
            scores = keys[h // group][first:] @ sample.q[t, h].astype(np.float64) * sample.scale
            p = np.exp(scores - scores.max())
            out[t, h] = (p / p.sum()) @ values[h // group][first:]
    return out


@pytest.mark.parametrize("kv", ["f16", "q8_0", "f32"])
@pytest.mark.parametrize("window", [1, 5, 16, 40])
def test_paged_attention_window_reference_is_windowed_attention(kv, window):
    """With a window, the reference equals attention over each token's last `window` positions, for decode
    tokens and prompt chunks that cross the window's edge; blocks before the windows (the null block, NaN
    rows here) are not read."""
    rng = np.random.default_rng([window, len(kv)])
    plain = make_sample(rng, kv, 8, 2, 64, 16, [(1, 1), (45, 1), (60, 9), (33, 2)], padding=1, q_scale=2.0)
    sample = windowed(plain, window)
    got = sample.reference()
    np.testing.assert_allclose(got, naive_windowed_attention(plain, window), rtol=1e-5, atol=1e-6)
    assert not np.isnan(got).any() and not got[-1].any()
    if window < 16:  # the causal result differs: the window is not a no-op here
        assert not np.allclose(got, plain.reference(), atol=1e-3)


def test_paged_attention_window_through_the_launcher(cpu_device):
    """The host kernel receives the window; a negative window is refused."""
    rng = np.random.default_rng(7)
    sample = windowed(make_sample(rng, "f16", 8, 2, 64, 16, [(50, 1), (30, 4)], q_scale=2.0), 12)
    args = [to_device(cpu_device, a, t) for a, t in ((sample.q, "activations"), (sample.k_pool, "kv"),
                                                    (sample.v_pool, "kv"), (sample.block_tables, "scratch"),
                                                    (sample.token_seq, "scratch"), (sample.positions, "scratch"))]
    out = poisoned(cpu_device, sample.q.nbytes)
    sizes = dict(n_tokens=sample.n_tokens, n_heads=8, n_kv_heads=2, head_dim=64, block_size=16,
                 max_blocks=sample.max_blocks, num_blocks=sample.num_blocks, scale=sample.scale, kv_dtype="f16")
    paged_attention.launch(cpu_device, None, out, *args, **sizes, window=12)
    np.testing.assert_array_equal(out.download(np.float32).reshape(sample.q.shape), sample.reference())
    with pytest.raises(ValueError, match="window"):
        paged_attention.launch(cpu_device, None, out, *args, **sizes, window=-1)


def test_rmsnorm_add_is_the_norm_then_the_add_and_refuses_aliasing(cpu_device):
    """Gemma's post-norm added to the residual stream in one launch: the bytes of rmsnorm then add; out must not
    overlap x (the norm reads all of a row before any of it is written only when out is a separate row)."""
    from hipcore.ops import add, rmsnorm
    rng = np.random.default_rng(4)
    rows, n = 3, 640
    x, residual = (rng.standard_normal((2, rows, n)) * 2).astype(np.float32)
    weight = (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)
    xs, ws, fused, normed = (to_device(cpu_device, a) for a in (x, weight, residual, x))
    rmsnorm.launch(cpu_device, None, normed, xs, ws, rows, n, 1e-6)
    two = to_device(cpu_device, residual)
    add.launch(cpu_device, None, two, two, normed, rows * n)
    rmsnorm.launch_add(cpu_device, None, fused, xs, ws, rows, n, 1e-6)
    assert np.array_equal(fused.download(np.float32), two.download(np.float32))
    with pytest.raises(ValueError, match="overlap"):
        rmsnorm.launch_add(cpu_device, None, xs, xs, ws, rows, n, 1e-6)
