"""The fused matvec and matmul ops on the cpu backend: each equals the chain of single ops it replaces,
through the same launchers the model uses, and the launchers refuse what the kernels cannot do."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.ops.kernel_choice import (FUSED_MATVEC_MAX_TOKENS, FUSED_QMATVEC_MAX_TOKENS, MMA_FIRST_MIN_COLS,
                                       QMATVEC_FIRST_MIN_COLS, fused_family, mma_first, qmatvec_limit, separate_fusable)
from hipcore.ops import add, fused_matmul, fused_matvec, matmul_mma, matvec, rmsnorm, rope, silu_mul
from support.weight_samples import random_weights

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


# ---- fused_matmul: the same operations for many tokens ----------------------------------------


@pytest.mark.parametrize("weight_type", TYPES)
def test_fused_matmul_host_kernels_give_fused_matvecs_floats(mem, weight_type):
    """The model switches between the two families by step size; on the cpu backend that must not change
    a single float (the decode-graph and golden tests rely on it)."""
    rng = np.random.default_rng(20 + len(weight_type))
    dev, n, cols, hd = mem.dev, 37, 64, 16
    x = mem.put((rng.standard_normal((n, cols)) * 2).astype(np.float32))
    g = mem.put(rng.standard_normal(cols).astype(np.float32))
    positions = mem.put(rng.integers(0, 500, n).astype(np.int32))
    workspace = mem.empty(fused_matmul.WORKSPACE_BYTES)
    w_qkv = mem.put(random_weights(rng, weight_type, 5 * hd, cols))
    outs = {}
    for family, kw in ((fused_matvec, {"batch": n}), (fused_matmul, {"n_tokens": n, "workspace": workspace})):
        widths = (3 * hd, hd, hd, 24, 32, 32)
        q, k, v, h, y, head = (mem.empty(n * width * 4) for width in widths)
        family.launch_norm_rope(dev, None, q, k, v, w_qkv, x, g, positions, q_rows=3 * hd, kv_rows=hd, cols=cols,
                                head_dim=hd, rope_dim=hd, eps=1e-5, theta=1e4, freq_scale=1.0, weight_type=weight_type,
                                **kw)
        family.launch_norm_swiglu(dev, None, h, w_qkv, x, g, rows=24, cols=cols, eps=1e-5, weight_type=weight_type, **kw)
        y.upload(np.ones((n, 32), np.float32))
        family.launch_add(dev, None, y, w_qkv, x, rows=32, cols=cols, weight_type=weight_type, **kw)
        family.launch_norm(dev, None, head, w_qkv, x, g, rows=32, cols=cols, eps=1e-5, weight_type=weight_type, **kw)
        outs[family.OP] = [mem.get(buf, (n, w)) for buf, w in zip((q, k, v, h, y, head), widths)]
    for got, want in zip(outs["fused_matmul"], outs["fused_matvec"]):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isfinite(outs["fused_matmul"][0]).all()


def test_fused_matmul_geometry_splits_few_tiles_only():
    ws, busy = fused_matmul.WORKSPACE_BYTES, fused_matmul.BUSY_ITEMS
    # The demo model's decode batch of 64: q|k|v's 15 row tiles in 32-token tiles (64-token ones would be
    # only 15 tiles), 30 tiles split to fit half of BUSY_ITEMS workgroups.
    assert fused_matmul.geometry(15, 576, 64, ws) == (30 * (busy // 2 // 30), 256, 32, busy // 2 // 30)
    # ffn_down (9 row tiles, 48 steps) at 32 tokens: as many splits as fit, MIN_SPLIT_STEPS steps each;
    # at 128 tokens its 36 tiles fill a whole BUSY_ITEMS wave.
    grid, _, tile, splits = fused_matmul.geometry(9, 1536, 32, ws)
    assert splits == min(busy // 2 // 9, 48 // fused_matmul.MIN_SPLIT_STEPS) and grid == 9 * splits
    assert fused_matmul.geometry(9, 1536, 128, ws)[3] == busy // 36
    assert fused_matmul.geometry(48, 576, 64, ws)[3] == 1  # 96 tiles: not in two halves
    # Enough tiles: 64-token tiles, no split, no workspace needed.
    assert fused_matmul.geometry(768, 576, 64, 0) == (768, 256, 64, 1)
    assert fused_matmul.geometry(48, 576, 512, ws) == (384, 256, 64, 1)
    # A 512-token prompt: o's 72 tiles of 64 tokens split 3 ways; q|k|v's 120 whole, not in halves.
    assert fused_matmul.geometry(9, 576, 512, ws) == (216, 256, 64, 3)
    assert fused_matmul.geometry(15, 576, 512, ws) == (120, 256, 64, 1)
    assert fused_matmul.geometry(768, 576, 16, ws)[2] == 32  # few tokens: 32-token tiles
    # A small workspace lowers the splits until the partials fit; none at all: no split.
    small = fused_matmul.partial_bytes(30, 2, 32)
    assert fused_matmul.geometry(15, 576, 64, small)[3] == 2
    assert fused_matmul.geometry(15, 576, 64, 0)[3] == 1
    # Every launch the launcher picks fits WORKSPACE_BYTES and BUSY_ITEMS, each split MIN_SPLIT_STEPS steps.
    for row_tiles in (1, 3, 9, 15, 48, 200, 255):
        for cols in (32, 96, 576, 1536, 8192):
            for n in (1, 9, 33, 64, 65, 128, 512):
                grid, _, tile, splits = fused_matmul.geometry(row_tiles, cols, n, 1 << 40)
                assert splits == 1 or (fused_matmul.partial_bytes(grid // splits, splits, tile) <= ws and grid <= busy)
                assert splits <= max(1, cols // 32 // fused_matmul.MIN_SPLIT_STEPS)
                assert splits != 2
                assert tile == 64 or n <= 32 or fused_matmul.tile_count(row_tiles, n, 64) < fused_matmul.FEW_TILES


def test_fused_matmul_launchers_refuse_what_the_kernels_cannot_do(mem):
    dev = mem.dev
    raw = mem.put(random_weights(np.random.default_rng(0), "q4_1", 64, 96))
    x, g, out = mem.empty(2 * 96 * 4), mem.empty(96 * 4), mem.empty(2 * 64 * 4)
    kw = {"n_tokens": 2, "weight_type": "q4_1"}
    with pytest.raises(ValueError, match="no fused kernel for weight type 'q6_k'"):
        fused_matmul.launch_add(dev, None, out, raw, x, rows=16, cols=96, n_tokens=2, weight_type="q6_k")
    with pytest.raises(ValueError, match="multiple of 32"):
        fused_matmul.launch_norm(dev, None, out, raw, x, g, rows=1, cols=48, eps=1e-5, **kw)
    with pytest.raises(ValueError, match="overlap"):
        fused_matmul.launch_add(dev, None, x, raw, x, rows=16, cols=96, **kw)
    with pytest.raises(ValueError, match="tile_tokens"):
        fused_matmul.launch_add(dev, None, out, raw, x, rows=64, cols=96, tile_tokens=16, **kw)
    with pytest.raises(ValueError, match="splits must be"):
        fused_matmul.launch_add(dev, None, out, raw, x, rows=64, cols=96, splits=4, **kw)
    with pytest.raises(ValueError, match="need a workspace"):
        fused_matmul.launch_add(dev, None, out, raw, x, rows=64, cols=96, splits=2, **kw)
    with pytest.raises(ValueError, match="workspace must be a Buffer"):
        fused_matmul.launch_add(dev, None, out, raw, x, rows=64, cols=96, workspace=12345, **kw)
    with pytest.raises(ValueError, match="whole heads"):
        fused_matmul.launch_norm_rope(dev, None, out, out, out, raw, x, g, mem.empty(8), q_rows=12, kv_rows=4, cols=96,
                                      head_dim=8, rope_dim=8, eps=1e-5, theta=1e4, freq_scale=1.0, **kw)


def test_projection_family_by_step_size():
    assert fused_family("q4_1", 1) is fused_matvec
    assert fused_family("q4_1", FUSED_MATVEC_MAX_TOKENS) is fused_matvec
    assert fused_family("q4_1", FUSED_MATVEC_MAX_TOKENS + 1) is fused_matmul
    assert fused_family("q8_0", 512) is fused_matmul
    assert fused_family("q6_k", 1) is None and fused_family("q6_k", 512) is None
    # One token of a Q8_0, Q5_0 or Q5_1 matrix of at least QMATVEC_FIRST_MIN_COLS columns goes to fused_qmatvec (no
    # fused_matvec family); narrower ones, more tokens, Q4_1 keep fused_matvec.
    wide = QMATVEC_FIRST_MIN_COLS
    for t in ("q8_0", "q5_0", "q5_1"):
        assert fused_family(t, 1, cols=wide) is None and fused_family(t, 1, cols=14336) is None, t
        assert fused_family(t, 1, cols=wide // 2) is fused_matvec and fused_family(t, 1) is fused_matvec, t
        assert fused_family(t, 2, cols=wide) is fused_matvec, t
    assert fused_family("q4_1", 1, cols=wide) is fused_matvec


def test_wide_block_format_products_take_the_matrix_cores_on_nvidia():
    """mma_first: from matmul_mma.min_tokens tokens on, a Q8_0, Q5_0, Q5_1, Q4_1, F16 or BF16 product of at least
    MMA_FIRST_MIN_COLS columns leaves the fused families for the single ops (matmul_mma's fragment path, its shared
    tiles for prompts) where that path exists (NVIDIA sm_80+); fewer tokens, narrow matrices, columns that are not
    whole steps of two blocks and AMD targets keep them."""
    wide, lo = MMA_FIRST_MIN_COLS, matmul_mma.min_tokens("q8_0", "sm_90")
    assert lo == matmul_mma.MMA_MIN_TOKENS_KQUANT_FRAGMENTS < FUSED_MATVEC_MAX_TOKENS
    for t in ("q8_0", "q5_0", "q5_1", "q4_1", "f16", "bf16"):
        for n in (lo, FUSED_MATVEC_MAX_TOKENS, 32, 512):
            assert fused_family(t, n, cols=wide, arch="sm_90") is None and mma_first(t, n, 14336, "sm_90"), (t, n)
        assert fused_family(t, lo - 1, cols=wide, arch="sm_90") is fused_matvec, t
        assert fused_family(t, lo, cols=wide // 2, arch="sm_90") is fused_matvec, t
        assert fused_family(t, 512, cols=wide + 32, arch="sm_90") is fused_matmul, t  # 129 blocks: not whole steps
        assert fused_family(t, lo, cols=wide, arch="gfx942") is fused_matvec, t
        assert fused_family(t, 512, cols=wide, arch="gfx1100") is fused_matmul, t
    assert not mma_first("f32", 32, wide, "sm_90") and fused_family("f32", 32, cols=wide, arch="sm_90") is fused_matmul


def test_q4_0_takes_the_fragment_path_from_where_the_k_quants_do():
    """qmatvec_limit: separate Q4_0 matrices leave fused_qmatvec (two passes over W past 4 tokens) for matmul_mma's
    fragment path where it exists, from the same token count as the K-quants."""
    w = SimpleNamespace(fmt="q4_0", cols=4096)
    assert qmatvec_limit(SimpleNamespace(arch="sm_90"), w) == matmul_mma.MMA_MIN_TOKENS_KQUANT_FRAGMENTS - 1
    assert qmatvec_limit(SimpleNamespace(arch="gfx942"), w) == FUSED_QMATVEC_MAX_TOKENS


def test_separate_matrices_take_the_32_element_block_entries_only_where_measured():
    """separate_fusable: the K-quant set (with Q8_0 and Q4_0) at up to FUSED_QMATVEC_MAX_TOKENS tokens, whatever the
    width; Q5_0 / Q5_1 (and mixes of them with Q8_0, Q4_0) at one token where every such matrix is wide enough
    (qmatvec_first): a narrow model's layers keep the single-op path they ran on; Q4_1 never (not measured); no
    launch mixes a K-quant with a 32-element block type."""
    wide = QMATVEC_FIRST_MIN_COLS

    def w(fmt, cols=wide):
        return SimpleNamespace(fmt=fmt, cols=cols)

    assert separate_fusable(1, w("q4_k"), w("q4_k"), w("q6_k")) and separate_fusable(2, w("q8_0", 256))
    assert separate_fusable(1, w("q5_0"), w("q5_0"), w("q5_1")) and separate_fusable(1, w("q5_1"), w("q8_0"))
    assert not separate_fusable(1, w("q5_0", 256), w("q5_0", 256), w("q5_1", 256))
    assert not separate_fusable(2, w("q5_0"), w("q5_0"), w("q5_1"))
    assert not separate_fusable(1, w("q4_1"), w("q4_1"))
    assert not separate_fusable(1, w("q5_0"), w("q6_k"))
    assert not separate_fusable(1, w("q5_0"), None)
