"""Every op's host implementation against its numpy reference, through the cpu backend's launch path
(the launcher, the loader, the registered host kernel, device memory), on random inputs of several
sizes, including sizes that are not multiples of a block or a warp; plus the launchers' checks."""

from __future__ import annotations

import numpy as np
import pytest

from support.gguf_quantize import max_abs_error, quantize
from hipcore.model.weights import GPU_MATRIX_TYPES
from hipcore.ops import (add, add_bias, argmax, kernel_choice, matmul, matmul_mma, matvec, qmatvec, rmsnorm, rope,
                         silu_mul, weight_formats)
from hipcore.ops.weight_formats import column_multiple
from support.weight_samples import random_weights

U32 = 2.0**-24  # float32 unit roundoff


def to_device(dev, array: np.ndarray, tag: str = "activations"):
    buf = dev.allocate(max(array.nbytes, 1), tag)
    buf.upload(np.ascontiguousarray(array))
    return buf


def empty(dev, nbytes: int):
    buf = dev.allocate(nbytes, "activations")
    buf.fill(0xFF)  # NaN in every float: an element the kernel forgets to write shows up
    return buf


# ---- matvec, matmul -----------------------------------------------------------------------------


def fit_cols(cols: int, weight_type: str) -> int:
    """cols rounded up to what the format allows (the K-quants' rows are whole super-blocks of 256)."""
    multiple = column_multiple(weight_type)
    return -(-cols // multiple) * multiple


def run_product(dev, launcher, weight_type, rows, cols, n, seed, **options):
    rng = np.random.default_rng(seed)
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w, xs, y = to_device(dev, raw, "weights"), to_device(dev, x), empty(dev, n * rows * 4)
    launcher(dev, None, y, w, xs, rows, cols, n, weight_type=weight_type, **options)
    got = y.download(np.float32).reshape(n, rows)
    # Float32 sums of `cols` products: error below (cols + 2) u sum|w x| (the recursive-summation bound).
    assert np.all(np.abs(got - matmul.reference(raw, weight_type, x, rows, cols))
                  <= matmul.error_bound(raw, weight_type, x, rows, cols))
    return raw, x, got


@pytest.mark.parametrize("weight_type", matvec.WEIGHT_TYPES)
@pytest.mark.parametrize("rows,cols,batch", [(1, 32, 1), (7, 96, 1), (129, 576, 1), (64, 1536, 3), (33, 64, 9)])
def test_matvec_matches_reference(cpu_device, weight_type, rows, cols, batch):
    cols = fit_cols(cols, weight_type)
    run_product(cpu_device, matvec.launch, weight_type, rows, cols, batch, [rows, cols, batch, len(weight_type)])


@pytest.mark.parametrize("weight_type", matmul.WEIGHT_TYPES)
@pytest.mark.parametrize("rows,cols,n_tokens,tile", [(1, 32, 1, None), (70, 96, 5, 16), (129, 576, 64, None),
                                                     (65, 512, 130, 32), (576, 1536, 9, 64)])
def test_matmul_matches_reference(cpu_device, weight_type, rows, cols, n_tokens, tile):
    cols = fit_cols(cols, weight_type)
    seed = [rows, cols, n_tokens, len(weight_type), 3]
    run_product(cpu_device, matmul.launch, weight_type, rows, cols, n_tokens, seed, tile_tokens=tile)


def test_weight_decoder_agrees_with_gguf():
    """Our decoder (used by the references and the host kernels) against the gguf package's, for every
    format the kernels read."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(7)
    for weight_type in weight_formats.FORMATS:
        cols = fit_cols(512, weight_type)
        raw = random_weights(rng, weight_type, 5, cols)
        theirs = dequantize(raw, GGMLQuantizationType[weight_type.upper()]).reshape(5, cols).astype(np.float64)
        exact = weight_formats.dequantize_rows(raw, weight_type, cols, np.float64)
        # gguf rounds d*q+m (and the K-quants' d*sc*q - dmin*m) to float32 once
        np.testing.assert_allclose(exact, theirs, rtol=2 * U32, atol=0, err_msg=weight_type)
        np.testing.assert_allclose(weight_formats.dequantize_rows(raw, weight_type, cols), exact, rtol=U32, atol=0)


def test_weight_decoder_on_quantized_data():
    """Real quantized blocks (tests/support/gguf_quantize.py's quantizers, the inverse of ggml's layouts) decode to
    within a quantization step of the values they came from: the layouts are ggml's, not just the
    gguf package's reading of random bytes."""
    rng = np.random.default_rng(11)
    values = rng.standard_normal((4, 512)).astype(np.float32)
    for weight_type in weight_formats.FORMATS:
        if weight_type == "f32":
            continue
        raw = quantize(values, weight_type.upper())
        decoded = weight_formats.dequantize_rows(raw, weight_type, 512, np.float64)
        assert np.abs(decoded - values).max() <= max_abs_error(values, weight_type.upper()), weight_type


@pytest.mark.parametrize("launcher,count", [(matvec.launch, "batch"), (matmul.launch, "n_tokens")])
def test_product_launchers_refuse_bad_arguments(cpu_device, launcher, count):
    w = cpu_device.allocate(20 * 4, "weights")
    x = cpu_device.allocate(4 * 256, "activations")
    y = cpu_device.allocate(4 * 4, "activations")
    with pytest.raises(ValueError, match="multiple of 32"):
        launcher(cpu_device, None, y, w, x, 4, 48, 1, weight_type="q4_1")
    with pytest.raises(ValueError, match="multiple of 256"):
        launcher(cpu_device, None, y, w, x, 1, 128, 1, weight_type="q4_k")
    with pytest.raises(ValueError, match="W needs 160 bytes"):
        launcher(cpu_device, None, y, w, x, 4, 64, 1, weight_type="q4_1")
    with pytest.raises(ValueError, match="no kernel for weight type"):
        launcher(cpu_device, None, y, w, x, 1, 256, 1, weight_type="q2_k")
    with pytest.raises(ValueError, match="16-byte aligned"):
        launcher(cpu_device, None, y, w, x.addr(4), 1, 32, 1, weight_type="q4_1")
    with pytest.raises(ValueError, match="4-byte aligned"):
        launcher(cpu_device, None, y, w.addr(2), x, 1, 32, 1, weight_type="q4_1")
    with pytest.raises(ValueError, match=f"{count} must be an int"):
        launcher(cpu_device, None, y, w, x, 1, 32, 0, weight_type="q4_1")
    with pytest.raises(ValueError, match="y and x overlap"):
        launcher(cpu_device, None, x, w, x, 1, 32, 1, weight_type="q4_1")
    with pytest.raises(ValueError, match="y and W overlap"):
        launcher(cpu_device, None, w, w, x, 1, 32, 1, weight_type="q4_1")


def test_matmul_refuses_unknown_tiles(cpu_device):
    w = cpu_device.allocate(20, "weights")
    x = cpu_device.allocate(128, "activations")
    y = cpu_device.allocate(4, "activations")
    with pytest.raises(ValueError, match="tile_tokens must be one of"):
        matmul.launch(cpu_device, None, y, w, x, 1, 32, 1, weight_type="q4_1", tile_tokens=48)


def test_matvec_geometry_covers_every_row():
    for arch in ("sm_90", "gfx942", "gfx1100"):
        for rows, batch in ((1, 1), (576, 1), (1536, 1), (49152, 1), (49151, 3)):
            grid, block = matvec.geometry(arch, rows, batch)
            warps = grid * block // (64 if arch == "gfx942" else 32)
            assert warps * (2 if batch == 1 else 1) >= rows and block % 64 == 0


def test_matvec_split_takes_products_of_few_rows_only():
    """The routers of Qwen3-30B-A3B and gpt-oss-20b (a token, a decode batch) and a shared expert's gate take the split
    entries, a workgroup a row with threads enough for the row in one step; everything else keeps its entry and
    geometry: quantized types, rows of fewer than SPLIT_MIN_COLS columns, SPLIT_MAX_GROUPS row groups or more."""
    for arch in ("sm_90", "gfx942", "gfx1100"):
        for weight_type in matvec.SPLIT_TYPES:
            for rows, cols, batch in ((128, 2048, 1), (128, 2048, 8), (32, 2880, 1), (1, 2048, 1), (1022, 1024, 1),
                                      (511, 4096, 2)):
                entry, grid, block = matvec.choose(arch, weight_type, rows, cols, batch)
                assert entry == f"matvec_split_{weight_type}" and grid == rows, (arch, weight_type, rows, cols, batch)
                per_thread = 2 if batch == 1 else 1
                assert block % 64 == 0 and 64 <= block <= matvec.SPLIT_MAX_THREADS
                assert block * per_thread * 8 >= cols or block == matvec.SPLIT_MAX_THREADS
            for rows, cols, batch in ((1024, 2048, 1), (512, 2048, 2), (4096, 4096, 1), (128, 576, 1), (128, 992, 8)):
                assert matvec.choose(arch, weight_type, rows, cols, batch) == (
                    f"matvec_{weight_type}", *matvec.geometry(arch, rows, batch)), (arch, weight_type, rows, cols, batch)
        for weight_type in ("q4_k", "q8_0", "q4_0"):
            assert matvec.choose(arch, weight_type, 128, 2048, 1) == (f"matvec_{weight_type}",
                                                                       *matvec.geometry(arch, 128, 1))


def test_matvec_launches_the_split_entry_on_the_cpu_backend(cpu_device, monkeypatch):
    """The host twin of matvec_split_f32 is registered and gives the reference's result (run_product's bound)."""
    entries = []
    real = matvec.get_kernel
    monkeypatch.setattr(matvec, "get_kernel", lambda dev, op, entry, sig: entries.append(entry) or real(dev, op, entry,
                                                                                                        sig))
    run_product(cpu_device, matvec.launch, "f32", 128, 2048, 1, 5)
    run_product(cpu_device, matvec.launch, "bf16", 32, 2880, 4, 6)
    assert entries == ["matvec_split_f32", "matvec_split_bf16"]


@pytest.mark.parametrize("rows,n_tokens", [(1, 1), (192, 512), (576, 512), (1536, 512), (576, 128), (576, 2048),
                                           (4096, 512), (11008, 512), (49152, 4096), (49152, 9), (7, 33)])
def test_matmul_tiles_cover_the_output_and_keep_the_gpu_busy(rows, n_tokens):
    grid, block, tile = matmul.geometry(rows, n_tokens)
    tiles = matmul.tile_count(rows, n_tokens, tile)
    assert block == matmul.THREADS and tile in matmul.TILE_TOKENS and 1 <= grid <= min(tiles, matmul.MAX_GRID)
    assert tiles * matmul.TILE_ROWS * tile >= rows * n_tokens  # the grid-stride loop reaches every output
    smallest_holding = next((t for t in matmul.TILE_TOKENS if t >= n_tokens), matmul.TILE_TOKENS[-1])
    assert tile <= smallest_holding  # never more padding than the batch needs
    if tile < smallest_holding:  # made smaller only to give more workgroups
        assert matmul.tile_count(rows, n_tokens, tile * 2) < matmul.BUSY_WORKGROUPS
    # The demo model at pp512: every projection gets at least ~half the SMs of an H100 busy.
    if n_tokens == 512:
        assert tiles >= 96


def test_project_takes_matvec_for_few_tokens_and_matmul_beyond(cpu_device, monkeypatch):
    calls = []
    monkeypatch.setattr(matvec, "launch", lambda *a, **k: calls.append(("matvec", a[7])))
    monkeypatch.setattr(matmul, "launch", lambda *a, **k: calls.append(("matmul", a[7])))
    monkeypatch.setattr(qmatvec, "launch", lambda *a, **k: calls.append(("qmatvec", a[7])))
    for weight_type in ("q4_1", "mxfp4"):  # MXFP4's few tokens on qmatvec: matvec has no entry for it
        for n in (1, matmul.MATVEC_MAX_TOKENS, matmul.MATVEC_MAX_TOKENS + 1, 512):
            kernel_choice.project(cpu_device, None, 0, 0, 0, 4, 32, n, weight_type=weight_type)
    limit = matmul.MATVEC_MAX_TOKENS
    assert calls == [("matvec", 1), ("matvec", limit), ("matmul", limit + 1), ("matmul", 512),
                     ("qmatvec", 1), ("qmatvec", limit), ("matmul", limit + 1), ("matmul", 512)]


def test_gpu_matrix_types_are_the_kernels_formats():
    """The weights loader keeps a matrix in its GGUF format on a GPU exactly when both product kernels
    read it, the few tokens' (matvec, or qmatvec for QMATVEC_SINGLE_TYPES) and matmul (else it converts it to F16 at
    load)."""
    few = frozenset(matvec.WEIGHT_TYPES) | frozenset(kernel_choice.QMATVEC_SINGLE_TYPES) & frozenset(qmatvec.WEIGHT_TYPES)
    assert GPU_MATRIX_TYPES == few & frozenset(matmul.WEIGHT_TYPES)
    assert "mxfp4" in GPU_MATRIX_TYPES and "mxfp4" in matmul_mma.WEIGHT_TYPES
    assert {"f16", "bf16", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k"} <= GPU_MATRIX_TYPES  # issue 6's minimum


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


def test_rope_reference_neox_mode_rotates_the_halves_together():
    # NEOX (qwen2, qwen3): pair i is (x[i], x[i + d/2]); at pos 1 pair 0 turns by 1 radian, pair 1 by 0.1 ...
    x = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], np.float32)[None, None, :]
    turned = rope.reference(x, np.array([1]), 8, 10000.0, 1.0, rope_type="neox")[0, 0]
    angles = np.array([1.0, 0.1, 0.01, 1e-3])
    np.testing.assert_allclose(turned, np.concatenate([np.cos(angles), np.sin(angles)]), rtol=1e-6)


@pytest.mark.parametrize("n_tokens,n_heads,head_dim,rope_dim", [(5, 3, 64, 64), (3, 2, 6, 4)])
def test_rope_neox_launch_matches_reference(cpu_device, n_tokens, n_heads, head_dim, rope_dim):
    rng = np.random.default_rng([n_tokens, head_dim])
    x = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, 4096, n_tokens).astype(np.int32)
    xs, ps = to_device(cpu_device, x), to_device(cpu_device, positions)
    rope.launch(cpu_device, None, xs, ps, n_tokens, n_heads, head_dim, rope_dim, 10000.0, 1.0, rope_type="neox")
    got = xs.download(np.float32).reshape(x.shape)
    np.testing.assert_allclose(got, rope.reference(x, positions, rope_dim, 10000.0, 1.0, rope_type="neox"), rtol=U32, atol=1e-30)
    assert np.abs(got - rope.reference(x, positions, rope_dim, 10000.0, 1.0, rope_type="norm")).max() > 0.1
    with pytest.raises(ValueError, match="rope_type"):
        rope.launch(cpu_device, None, xs, ps, n_tokens, n_heads, head_dim, rope_dim, 10000.0, 1.0, rope_type="gptj")


def test_add_bias_adds_to_every_row(cpu_device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    bias = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    xs, bs = to_device(cpu_device, x), to_device(cpu_device, bias)
    add_bias.launch(cpu_device, None, xs, bs, 3, 4)
    assert np.array_equal(xs.download(np.float32).reshape(3, 4), x + bias)
    with pytest.raises(ValueError):
        add_bias.launch(cpu_device, None, xs, bs, 3, 5)  # the bias buffer holds 4 floats, not 5


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
