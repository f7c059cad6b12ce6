"""Every op's host implementation against its numpy reference, through the cpu backend's launch path
(the launcher, the loader, the registered host kernel, device memory), on random inputs of several
sizes, including sizes that are not multiples of a block or a warp; plus the launchers' checks."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import add, argmax, matvec, rmsnorm, rope, silu_mul
from weight_samples import random_weights

U32 = 2.0**-24  # float32 unit roundoff


def to_device(dev, array: np.ndarray, tag: str = "activations"):
    buf = dev.allocate(max(array.nbytes, 1), tag)
    buf.upload(np.ascontiguousarray(array))
    return buf


def empty(dev, nbytes: int):
    buf = dev.allocate(nbytes, "activations")
    buf.fill(0xFF)  # NaN in every float: an element the kernel forgets to write shows up
    return buf


# ---- matvec ------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_type", matvec.WEIGHT_TYPES)
@pytest.mark.parametrize("rows,cols,batch", [(1, 32, 1), (7, 96, 1), (129, 576, 1), (64, 1536, 3), (33, 64, 9)])
def test_matvec_matches_reference(cpu_device, weight_type, rows, cols, batch):
    rng = np.random.default_rng([rows, cols, batch, len(weight_type)])
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    w, xs, y = to_device(cpu_device, raw, "weights"), to_device(cpu_device, x), empty(cpu_device, batch * rows * 4)
    matvec.launch(cpu_device, None, y, w, xs, rows, cols, batch, weight_type=weight_type)
    got = y.download(np.float32).reshape(batch, rows)
    want = matvec.reference(raw, weight_type, x, rows, cols)
    # Float32 sums of `cols` products: error below cols * u * sum|w x| (the recursive-summation bound).
    w64 = matvec.dequantize_rows(raw, weight_type, cols, np.float64)
    bound = (cols + 2) * U32 * (np.abs(x.astype(np.float64)) @ np.abs(w64).T)
    assert np.all(np.abs(got - want) <= bound + 1e-30)


def test_matvec_dequantizer_agrees_with_gguf():
    """Our decoder (used by the reference and the host kernel) against the gguf package's."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(7)
    qtypes = {"q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0, "f16": GGMLQuantizationType.F16}
    for weight_type, qtype in qtypes.items():
        raw = random_weights(rng, weight_type, 5, 128)
        theirs = dequantize(raw, qtype).reshape(5, 128).astype(np.float64)
        exact = matvec.dequantize_rows(raw, weight_type, 128, np.float64)
        np.testing.assert_allclose(exact, theirs, rtol=2 * U32, atol=0)  # gguf rounds d*q+m to float32
        np.testing.assert_allclose(matvec.dequantize_rows(raw, weight_type, 128), exact, rtol=2 * U32, atol=0)


def test_matvec_launcher_refuses_bad_arguments(cpu_device):
    w = cpu_device.allocate(20 * 4, "weights")
    x = cpu_device.allocate(4 * 64, "activations")
    y = cpu_device.allocate(4 * 4, "activations")
    with pytest.raises(ValueError, match="multiple of 32"):
        matvec.launch(cpu_device, None, y, w, x, 4, 48, weight_type="q4_1")
    with pytest.raises(ValueError, match="W needs 160 bytes"):
        matvec.launch(cpu_device, None, y, w, x, 4, 64, weight_type="q4_1")
    with pytest.raises(ValueError, match="no kernel for weight type"):
        matvec.launch(cpu_device, None, y, w, x, 1, 32, weight_type="q4_k")
    with pytest.raises(ValueError, match="16-byte aligned"):
        matvec.launch(cpu_device, None, y, w, x.addr(4), 1, 32, weight_type="q4_1")
    with pytest.raises(ValueError, match="batch must be an int"):
        matvec.launch(cpu_device, None, y, w, x, 1, 32, 0, weight_type="q4_1")
    with pytest.raises(ValueError, match="y and x overlap"):
        matvec.launch(cpu_device, None, x, w, x, 1, 32, weight_type="q4_1")


def test_matvec_geometry_covers_every_row():
    for arch in ("sm_90", "gfx942", "gfx1100"):
        for rows, batch in ((1, 1), (576, 1), (1536, 1), (49152, 1), (49151, 3)):
            grid, block = matvec.geometry(arch, rows, batch)
            warps = grid * block // (64 if arch == "gfx942" else 32)
            assert warps * (2 if batch == 1 else 1) >= rows and block % 64 == 0


# ---- rmsnorm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (2, 64), (4, 576), (1, 1000)])
def test_rmsnorm_matches_reference(cpu_device, rows, n):
    rng = np.random.default_rng([rows, n])
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    weight = rng.standard_normal(n).astype(np.float32)
    xs, ws, out = to_device(cpu_device, x), to_device(cpu_device, weight), empty(cpu_device, x.nbytes)
    rmsnorm.launch(cpu_device, None, out, xs, ws, rows, n, 1e-5)
    want = rmsnorm.reference(x, weight, 1e-5)
    np.testing.assert_allclose(out.download(np.float32).reshape(rows, n), want, rtol=U32, atol=1e-30)
    # The definition itself: with unit weights each row's mean square is 1 (less the eps share).
    unit = rmsnorm.reference(x, np.ones(n, np.float32), 1e-5)
    ms = np.mean(x.astype(np.float64) ** 2, axis=1)
    np.testing.assert_allclose(np.mean(unit**2, axis=1), ms / (ms + np.float32(1e-5)), rtol=1e-12)


def test_rmsnorm_in_place(cpu_device):
    x = np.random.default_rng(1).standard_normal((3, 100)).astype(np.float32)
    weight = np.full(100, 0.5, np.float32)
    xs, ws = to_device(cpu_device, x), to_device(cpu_device, weight)
    rmsnorm.launch(cpu_device, None, xs, xs, ws, 3, 100, 1e-6)
    np.testing.assert_allclose(xs.download(np.float32).reshape(3, 100), rmsnorm.reference(x, weight, 1e-6), rtol=U32)


# ---- rope --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_tokens,n_heads,head_dim,rope_dim", [(1, 1, 2, 2), (5, 3, 64, 64), (7, 9, 64, 32), (3, 2, 6, 4)])
def test_rope_matches_reference(cpu_device, n_tokens, n_heads, head_dim, rope_dim):
    rng = np.random.default_rng([n_tokens, n_heads, head_dim, rope_dim])
    x = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, 4096, n_tokens).astype(np.int32)
    xs, ps = to_device(cpu_device, x), to_device(cpu_device, positions)
    rope.launch(cpu_device, None, xs, ps, n_tokens, n_heads, head_dim, rope_dim, 10000.0, 0.5)
    got = xs.download(np.float32).reshape(x.shape)
    want = rope.reference(x, positions, rope_dim, 10000.0, 0.5)
    np.testing.assert_allclose(got, want, rtol=U32, atol=1e-30)
    assert np.array_equal(got[..., rope_dim:], x[..., rope_dim:])  # past rope_dim: untouched
    # A rotation keeps each pair's length.
    np.testing.assert_allclose(np.hypot(got[..., 0:rope_dim:2], got[..., 1:rope_dim:2]),
                               np.hypot(x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]), rtol=4 * U32)


def test_rope_reference_is_llama_cpp_norm_mode():
    # Position 0 is the identity; pair i turns by pos * theta^(-2i/d): at pos 1, pair 0 by 1 radian.
    x = np.tile(np.array([1.0, 0.0], np.float32), 4)[None, None, :]
    assert np.array_equal(rope.reference(x, np.array([0]), 8, 10000.0, 1.0), x)
    turned = rope.reference(x, np.array([1]), 8, 10000.0, 1.0)[0, 0]
    expected = [np.cos(1.0), np.sin(1.0), np.cos(0.1), np.sin(0.1), np.cos(0.01), np.sin(0.01), np.cos(1e-3), np.sin(1e-3)]
    np.testing.assert_allclose(turned, expected, rtol=1e-6)


def test_rope_launcher_refuses_bad_dims(cpu_device):
    x = cpu_device.allocate(64 * 4, "activations")
    p = cpu_device.allocate(4, "activations")
    with pytest.raises(ValueError, match="rope_dim must be even"):
        rope.launch(cpu_device, None, x, p, 1, 1, 64, 65, 10000.0)
    with pytest.raises(ValueError, match="positive"):
        rope.launch(cpu_device, None, x, p, 1, 1, 64, 64, 0.0)


# ---- silu_mul, add -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 255, 257, 10_001])
def test_silu_mul_matches_reference(cpu_device, n):
    rng = np.random.default_rng(n)
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    gate[: min(n, 4)] = np.array([-100.0, 100.0, 0.0, -1e30], np.float32)[: min(n, 4)]
    up = rng.standard_normal(n).astype(np.float32)
    g, u, out = to_device(cpu_device, gate), to_device(cpu_device, up), empty(cpu_device, 4 * n)
    silu_mul.launch(cpu_device, None, out, g, u, n)
    want = silu_mul.reference(gate, up)
    np.testing.assert_allclose(out.download(np.float32), want, rtol=U32, atol=1e-30)
    if n >= 4:
        assert want[3] == 0.0  # silu(-1e30) * up is a zero (silu's limit), not NaN
    silu_mul.launch(cpu_device, None, g, g, u, n)  # in place
    np.testing.assert_allclose(g.download(np.float32), want, rtol=U32, atol=1e-30)


@pytest.mark.parametrize("n", [1, 63, 1000, 65_537])
def test_add_is_exact(cpu_device, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    ab, bb, out = to_device(cpu_device, a), to_device(cpu_device, b), empty(cpu_device, 4 * n)
    add.launch(cpu_device, None, out, ab, bb, n)
    assert np.array_equal(out.download(np.float32), add.reference(a, b))
    add.launch(cpu_device, None, ab, ab, bb, n)  # the residual update: out is a
    assert np.array_equal(ab.download(np.float32), a + b)


def test_elementwise_launchers_check_buffer_sizes(cpu_device):
    small = cpu_device.allocate(16, "activations")
    big = cpu_device.allocate(64, "activations")
    with pytest.raises(ValueError, match="add_f32|add: b needs 64 bytes"):
        add.launch(cpu_device, None, big, big, small, 16)
    with pytest.raises(ValueError, match="must be a Buffer or a non-null int address"):
        silu_mul.launch(cpu_device, None, 0, big, big, 16)


# ---- argmax ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 100), (2, 1025), (1, 49152)])
def test_argmax_matches_numpy(cpu_device, rows, n):
    rng = np.random.default_rng([rows, n])
    x = rng.standard_normal((rows, n)).astype(np.float32)
    xs, out = to_device(cpu_device, x), empty(cpu_device, 4 * rows)
    argmax.launch(cpu_device, None, out, xs, rows, n)
    got = out.download(np.int32)
    assert np.array_equal(got, np.argmax(x, axis=1))
    assert all(x[r, got[r]] == x[r].max() for r in range(rows))


def test_argmax_ties_nan_and_infinities(cpu_device):
    n = 300
    x = np.zeros((4, n), np.float32)
    x[0, [17, 5, 200]] = 3.0  # ties: the lowest index wins
    x[1, :] = -np.inf  # all equal: index 0
    x[2, [250, 40]] = np.nan  # the first NaN wins, as in numpy
    x[2, 10] = np.inf
    x[3, 299] = np.inf
    xs, out = to_device(cpu_device, x), empty(cpu_device, 16)
    argmax.launch(cpu_device, None, out, xs, 4, n)
    assert out.download(np.int32).tolist() == [5, 0, 40, 299]
