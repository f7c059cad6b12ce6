"""kernels/fused_qmatvec.hip (a layer's decode products on int8-quantized activations, norm, RoPE, SwiGLU and
the residual add folded in, each matrix of its own type) run on the CPU under the host emulation at wave 32
and wave 64, against hipcore/ops/fused_qmatvec.py's float64 references, which quantize x * g exactly as the
kernels do.

The bound: qmatvec.error_bound (the float32 roundings of the product, after exact integer dot products)
scaled by the norm's s and doubled, plus 1e-5 of the row's magnitude s * |xq| @ |W|^T for the float32 norm
scale, sin/cos and exp (each ~1e-7 relative). A wrong type, scale, slice order or rotation moves results by
whole percents of that magnitude, far above it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype as kv_dtype_named
from hipcore.ops import fused_qmatvec, fused_qmatvec_geometry, kv_store, qmatvec, rope
from hipcore.ops.weight_formats import dequantize_rows, row_bytes
from support.emulated_kernels import ARCH_FOR_WARP, U32, run, write_inputs
from support.rope_factors import factors_arg, far_factors
from support.weight_samples import random_weights

EPS, THETA, FREQ_SCALE = 1e-5, 10000.0, 0.5
SLACK = 1e-5


def product_bound(raw, weight_type, xs, s, rows, cols) -> tuple[np.ndarray, np.ndarray]:
    """(bound, magnitude) float64 [batch, rows] of s * quantize(xs) @ W^T."""
    w = dequantize_rows(raw.reshape(rows, row_bytes(weight_type, cols)), weight_type, cols, np.float64)
    magnitude = s[:, None] * (np.abs(qmatvec.quantize_x(xs, weight_type)) @ np.abs(w).T)
    return 2 * s[:, None] * qmatvec.error_bound(raw, weight_type, xs, rows, cols) + SLACK * magnitude, magnitude


def inputs(rng, batch, cols):
    x = (rng.standard_normal((batch, cols)) * rng.choice([0.1, 1.0, 8.0], (batch, cols))).astype(np.float32)
    g = (1.0 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    return x, g


def suffixes(batch, types):
    """The entries (their suffixes) that read `types` for `batch` tokens: the launcher's (entry_suffix), and "n"
    wherever "n" reads them; none where no entry does (the 32-element block types past one token)."""
    got = {fused_qmatvec.entry_suffix(batch, types)} if fused_qmatvec.supports(*types, tokens=batch) else set()
    return sorted(got | ({"n"} if all(t in fused_qmatvec.KQUANT_TYPES for t in types) else set()))


def grids(warp, entry, variant, cols, *matrix_rows, more=()):
    """(grid, block, k_split, tile_groups): the launcher's, one workgroup walking every tile, and `more`. variant:
    an entry suffix ("1b" and "1m" size their grids as "1": one token; "nm" as "n")."""
    variant = variant[0]
    geo = fused_qmatvec_geometry.geometry(ARCH_FOR_WARP[warp], entry, variant, cols, *matrix_rows)
    return [geo._replace(grid=g) for g in sorted({geo.grid, 1, *more})]


# q, k, v types as Q4_K_M lays them out (Q6_K v), one layer of every other type, three distinct types, and the
# 32-element blocks with a min or a fifth bit.
QKV_TYPES = [("q4_k", "q4_k", "q6_k"), ("q5_k", "q8_0", "q4_0"), ("q6_k", "q4_k", "q5_k"), ("q4_1", "q5_0", "q5_1"),
             ("mxfp4",) * 3]


@pytest.mark.parametrize("types", QKV_TYPES, ids=["-".join(t) for t in QKV_TYPES])
def test_norm_rope(harnesses, warp, types, tmp_path):
    rng = np.random.default_rng([warp, *map(ord, "".join(types))])
    # (q heads, kv heads, head_dim, rope_dim, cols, batch): a single token, 2..4, and more than one pass.
    # The first and last divide the frequencies by factors (rope_freqs.weight), the middle one not; the first two add
    # biases (qwen2's) before RoPE, the last none (null pointers).
    cases = [(2, 1, 16, 16, 256, 1), (4, 2, 8, 4, 512, 3), (2, 1, 16, 8, 256, 6)]
    for case, (q_heads, kv_heads, head_dim, rope_dim, cols, batch) in enumerate(cases):
        q_rows, kv_rows = q_heads * head_dim, kv_heads * head_dim
        raws = [random_weights(rng, t, r, cols) for t, r in zip(types, (q_rows, kv_rows, kv_rows))]
        x, g = inputs(rng, batch, cols)
        positions = rng.integers(0, 4096, batch).astype(np.int32)
        factors = far_factors(rng, rope_dim) if case != 1 else None
        biases = [rng.normal(0, 2, r).astype(np.float32) for r in (q_rows, kv_rows, kv_rows)] if case < 2 else None
        files = write_inputs(tmp_path, wq=raws[0], wk=raws[1], wv=raws[2], x=x, g=g, p=positions)
        files.append(factors_arg(tmp_path, factors))
        bias_files = write_inputs(tmp_path, bq=biases[0], bk=biases[1], bv=biases[2]) if biases is not None else []
        want = fused_qmatvec.reference_norm_rope(list(zip(raws, types)), x, g, EPS, positions, q_rows, kv_rows, cols,
                                                 head_dim, rope_dim, THETA, FREQ_SCALE, factors, biases)
        # The float32 angle (position times a rounded frequency) errs by a few ulps of itself: rope.hip's bound.
        angle_error = np.zeros((batch, head_dim))
        angle_error[:, :rope_dim] = (32 * U32 * rope.angles(positions, rope_dim, THETA, FREQ_SCALE, factors)).repeat(2, -1)
        xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
        for variant in suffixes(batch, types):
            for grid, block, k_split, tile_groups in grids(warp, "qmatvec_norm_rope", variant, cols, q_rows, kv_rows,
                                                           kv_rows):
                run(harnesses, warp, f"qmatvec_norm_rope_{variant}", grid, block, fused_qmatvec.pack_types(types),
                    q_rows, kv_rows, cols, batch, head_dim, rope_dim, EPS, THETA, FREQ_SCALE, *files, tmp_path / "o",
                    k_split, tile_groups, *bias_files)
                check_qkv(tmp_path / "o", want, raws, types, xg, s, angle_error, q_rows, kv_rows, cols, head_dim,
                          f"{types} {q_rows}/{kv_rows}x{cols} batch {batch} {variant} grid {grid} "
                          f"factors {factors is not None} biases {biases is not None}", biases)


def check_qkv(out_file, want, raws, types, xg, s, angle_error, q_rows, kv_rows, cols, head_dim, what, biases=None):
    """q, k and v of a qmatvec_norm_rope launch (out_file) within product_bound of the reference `want` (biases: the
    bq, bk, bv it added, whose float32 add rounds once more, or None)."""
    batch = xg.shape[0]
    got = np.split(np.fromfile(out_file, np.float32), [batch * q_rows, batch * (q_rows + kv_rows)])
    for i, (name, part, ref, raw, t, rows) in enumerate(zip("qkv", got, want, raws, types, (q_rows, kv_rows, kv_rows))):
        bound, magnitude = product_bound(raw, t, xg, s, rows, cols)
        if biases is not None:  # the add's rounding: half an ulp of the biased sum, at most |product| + |bias| in size
            bias = np.abs(biases[i].astype(np.float64))[None, :]
            bound = bound + U32 * (magnitude + bias)
            magnitude = magnitude + bias
        if name != "v":  # a rotation mixes a pair: each result carries both members' errors
            bound = bound.reshape(batch, -1, 2).sum(-1).repeat(2, -1)
            pair = magnitude.reshape(batch, -1, 2).sum(-1).repeat(2, -1)
            bound = bound + pair * np.tile(angle_error, rows // head_dim)
        err = np.abs(part.reshape(batch, rows) - ref)
        assert np.all(err <= bound), f"{name} {what}: {np.max(err / bound):.2f} of the bound"


class OneTokenQkv:
    """One token's norm+q|k|v+RoPE case (random weights of `types`, no frequency factors) written for the
    harness, with its reference and error bounds; run_and_check launches qmatvec_norm_rope_1 on it."""

    def __init__(self, rng, types, *, q_heads, kv_heads, head_dim, rope_dim, cols, tmp_path):
        self.types, self.head_dim, self.rope_dim, self.cols, self.tmp_path = types, head_dim, rope_dim, cols, tmp_path
        self.q_rows, self.kv_rows = q_heads * head_dim, kv_heads * head_dim
        self.matrix_rows = (self.q_rows, self.kv_rows, self.kv_rows)
        self.raws = [random_weights(rng, t, r, cols) for t, r in zip(types, self.matrix_rows)]
        x, g = inputs(rng, 1, cols)
        positions = rng.integers(0, 4096, 1).astype(np.int32)
        self.files = write_inputs(tmp_path, wq=self.raws[0], wk=self.raws[1], wv=self.raws[2], x=x, g=g, p=positions)
        self.files.append(factors_arg(tmp_path, None))
        self.want = fused_qmatvec.reference_norm_rope(list(zip(self.raws, types)), x, g, EPS, positions, self.q_rows,
                                                      self.kv_rows, cols, head_dim, rope_dim, THETA, FREQ_SCALE)
        self.angle_error = (32 * U32 * rope.angles(positions, rope_dim, THETA, FREQ_SCALE)).repeat(2, -1)
        self.xg, self.s = fused_qmatvec.norm_parts(x, g, EPS, cols)

    def run_and_check(self, harnesses, warp, grid, block, k_split, tile_groups, what):
        out = self.tmp_path / "o"
        out.unlink(missing_ok=True)
        run(harnesses, warp, "qmatvec_norm_rope_1", grid, block, fused_qmatvec.pack_types(self.types), self.q_rows,
            self.kv_rows, self.cols, 1, self.head_dim, self.rope_dim, EPS, THETA, FREQ_SCALE, *self.files, out,
            k_split, tile_groups)
        check_qkv(out, self.want, self.raws, self.types, self.xg, self.s, self.angle_error, self.q_rows, self.kv_rows,
                  self.cols, self.head_dim, what)


@pytest.mark.parametrize("types", QKV_TYPES[:2], ids=["-".join(t) for t in QKV_TYPES[:2]])
def test_norm_rope_split_row_groups(harnesses, warp, types, tmp_path):
    """norm+q|k|v+RoPE at one token with k_split 2 and 4 (a row group's warps share its columns; part 0's warp
    rotates and writes the group's rows), at its own tiles' grid and with one workgroup walking them: 72 slices
    a row, so that the warps of a group take unequal shares (at 4 one takes none); kv rows fewer than a tile's.
    k_split 3 (not a divisor of the warps at wave 64) counts as 1."""
    rng = np.random.default_rng([warp, 7, *map(ord, "".join(types))])
    cols = 2304
    case = OneTokenQkv(rng, types, q_heads=4, kv_heads=1, head_dim=16, rope_dim=16, cols=cols, tmp_path=tmp_path)
    for k_split in (2, 4, 3):
        fused_qmatvec_geometry.FORCED_K_SPLIT = k_split if k_split != 3 else 1
        try:
            grid, block, _, tile_groups = fused_qmatvec_geometry.geometry(ARCH_FOR_WARP[warp], "qmatvec_norm_rope", "1", cols,
                                                                 *case.matrix_rows)
        finally:
            fused_qmatvec_geometry.FORCED_K_SPLIT = None
        for g_ in sorted({grid, 1}):
            case.run_and_check(harnesses, warp, g_, block, k_split, tile_groups, f"k_split {k_split} grid {g_}")


@pytest.mark.parametrize("types", QKV_TYPES[:2], ids=["-".join(t) for t in QKV_TYPES[:2]])
def test_norm_rope_tiles_of_fewer_row_groups(harnesses, warp, types, tmp_path):
    """norm+q|k|v+RoPE at one token with tiles of fewer row groups than the block has (tile_groups: the other
    warps stage x and read nothing), unsplit and at k_split 2, at the tiles' own grid and with one workgroup
    walking them; a tile's rows not a divisor of the matrices' (kv rows end mid-tile). tile_groups 0 and past
    the block's groups mean all of them."""
    rng = np.random.default_rng([warp, 8, *map(ord, "".join(types))])
    cols = 2304
    case = OneTokenQkv(rng, types, q_heads=6, kv_heads=1, head_dim=12, rope_dim=12, cols=cols, tmp_path=tmp_path)
    groups = 256 // warp  # the block's row groups unsplit
    for k_split in (1, 2):
        for tile_groups in sorted({1, 3, groups // k_split - 1, 0, groups + 1}):
            fused_qmatvec_geometry.FORCED_K_SPLIT = k_split
            fused_qmatvec_geometry.FORCED_TILE_GROUPS = min(tile_groups, groups // k_split)
            try:
                grid, block, _, _ = fused_qmatvec_geometry.geometry(ARCH_FOR_WARP[warp], "qmatvec_norm_rope", "1", cols,
                                                           *case.matrix_rows)
            finally:
                fused_qmatvec_geometry.FORCED_K_SPLIT = fused_qmatvec_geometry.FORCED_TILE_GROUPS = None
            for g_ in sorted({grid, 1}):
                case.run_and_check(harnesses, warp, g_, block, k_split, tile_groups,
                                   f"k_split {k_split} tile_groups {tile_groups} grid {g_}")


@pytest.mark.parametrize("kv_dtype", sorted(kv_store.EPILOGUE_FORMATS))
def test_norm_rope_stores_kv_into_the_cache(harnesses, warp, kv_dtype, tmp_path):
    """With a cache target the epilogue writes k and v into the pools at each token's slot, the bytes kv_store
    writes for the k and v the same launch makes without one (kv_store.reference on them), leaves every other
    slot (and a padding token's, slot -1) alone, and never writes the k and v buffers; q is unchanged."""
    rng = np.random.default_rng([warp, 6, *map(ord, kv_dtype)])
    types = ("q4_k", "q4_k", "q6_k")
    fmt = kv_dtype_named(kv_dtype)
    for q_heads, kv_heads, head_dim, rope_dim, cols, batch in [(4, 2, 16, 16, 256, 1), (2, 1, 8, 8, 256, 5)]:
        q_rows, kv_rows = q_heads * head_dim, kv_heads * head_dim
        block_size, num_blocks = 4, 3
        raws = [random_weights(rng, t, r, cols) for t, r in zip(types, (q_rows, kv_rows, kv_rows))]
        x, g = inputs(rng, batch, cols)
        positions = rng.integers(0, 4096, batch).astype(np.int32)
        slots = rng.choice(num_blocks * block_size, batch, replace=False).astype(np.int32)
        if batch > 1:
            slots[1] = -1  # a padding row of a batch
        files = write_inputs(tmp_path, wq=raws[0], wk=raws[1], wv=raws[2], x=x, g=g, p=positions, slots=slots)
        slot_file, files = files[-1], files[:-1] + [factors_arg(tmp_path, None)]
        pool_shape = (num_blocks, kv_heads, block_size, fmt.row_bytes(head_dim))
        pool_bytes = int(np.prod(pool_shape))
        variant = fused_qmatvec.variant(batch)
        for grid, block, k_split, tile_groups in grids(warp, "qmatvec_norm_rope", variant, cols, q_rows, kv_rows,
                                                       kv_rows):
            common = (fused_qmatvec.pack_types(types), q_rows, kv_rows, cols, batch, head_dim, rope_dim, EPS, THETA,
                      FREQ_SCALE, *files)
            run(harnesses, warp, f"qmatvec_norm_rope_{variant}", grid, block, *common, tmp_path / "plain", k_split,
                tile_groups)
            plain = np.split(np.fromfile(tmp_path / "plain", np.float32), [batch * q_rows, batch * (q_rows + kv_rows)])
            run(harnesses, warp, f"qmatvec_norm_rope_store_{variant}", grid, block, kv_store.EPILOGUE_FORMATS[kv_dtype],
                block_size, num_blocks, pool_bytes, slot_file, *common, tmp_path / "stored", k_split, tile_groups)
            raw = np.fromfile(tmp_path / "stored", np.uint8)
            floats = raw[:4 * batch * (q_rows + 2 * kv_rows)].view(np.float32)
            got_pools = raw[4 * batch * (q_rows + 2 * kv_rows):].reshape(2, *pool_shape)
            assert np.array_equal(floats[:batch * q_rows], plain[0]), "q changed with a cache target"
            assert np.all(np.isnan(floats[batch * q_rows:])), "the k and v buffers were written with a cache target"
            for pool, rows, name in zip(got_pools, plain[1:], "kv"):
                want = np.full(pool_shape, 0xA5, np.uint8)
                kv_store.reference(want, rows.reshape(batch, kv_heads, head_dim), slots, fmt)
                assert np.array_equal(pool, want), f"{name} pool {kv_dtype} batch {batch} grid {grid}"


@pytest.mark.parametrize("types", [("q4_k", "q4_k"), ("q4_k", "q6_k"), ("q8_0", "q5_k"), ("q5_0", "q5_0"), ("q4_1", "q5_1"),
                                   ("mxfp4", "mxfp4")],
                         ids=lambda t: "-".join(t))
def test_norm_swiglu(harnesses, warp, types, tmp_path):
    rng = np.random.default_rng([warp, 2, *map(ord, "".join(types))])
    # rows not a multiple of a warp's rows; 40 rows on 2 workgroups: at one token the split entry's last round
    # goes as tiles of split row groups (kernels/fused_qmatvec.hip: norm_swiglu_pass), at wave 32 and wave 64;
    # the split entry runs at every one-token grid (it is correct at any, the launcher picks it by speed)
    assert fused_qmatvec_geometry.splits_last_round(ARCH_FOR_WARP[warp], 40, 2)
    for rows, cols, batch in [(20, 256, 1), (9, 512, 2), (6, 256, 5), (40, 256, 1)]:
        wg, wu = (random_weights(rng, t, rows, cols) for t in types)
        x, g = inputs(rng, batch, cols)
        files = write_inputs(tmp_path, wg=wg, wu=wu, x=x, g=g)
        want = fused_qmatvec.reference_norm_swiglu([(wg, types[0]), (wu, types[1])], x, g, EPS, rows, cols)
        xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
        gate = fused_qmatvec.reference_norm(wg, types[0], x, g, EPS, rows, cols)
        up = fused_qmatvec.reference_norm(wu, types[1], x, g, EPS, rows, cols)
        tol_gate, _ = product_bound(wg, types[0], xg, s, rows, cols)
        tol_up, _ = product_bound(wu, types[1], xg, s, rows, cols)
        # silu(a) * u: |d/da| <= 1.1 |u|, |d/du| = |silu(a)| <= |a|; then the float32 rounding of the result.
        bound = 1.1 * np.abs(up) * tol_gate + np.abs(gate) * tol_up + tol_gate * tol_up + SLACK * np.abs(want)
        for variant in suffixes(batch, types):
            names = [f"qmatvec_norm_swiglu_{variant}"] + (["qmatvec_norm_swiglu_split_1"] if variant == "1" else [])
            for name in names:
                for grid, block, *_ in grids(warp, "qmatvec_norm_swiglu", variant, cols, rows, more=(2,)):
                    run(harnesses, warp, name, grid, block, fused_qmatvec.pack_types(types), rows, cols, batch, EPS,
                        *files, tmp_path / "o")
                    got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
                    assert np.all(np.abs(got - want) <= bound), f"{types} {rows}x{cols} batch {batch} {name} grid {grid}"


@pytest.mark.parametrize("weight_type", fused_qmatvec.WEIGHT_TYPES)
def test_norm_and_add(harnesses, warp, weight_type, tmp_path):
    """The head (y = n @ W^T) and the residual product (y += x @ W^T), every type."""
    rng = np.random.default_rng([warp, 3, *map(ord, weight_type)])
    cols = 256 if weight_type.endswith("_k") else 96
    for rows, batch in [(37, 1), (13, 3)]:
        raw = random_weights(rng, weight_type, rows, cols)
        x, g = inputs(rng, batch, cols)
        y0 = rng.standard_normal((batch, rows)).astype(np.float32)
        files = write_inputs(tmp_path, w=raw, x=x, g=g)
        xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
        norm_want = fused_qmatvec.reference_norm(raw, weight_type, x, g, EPS, rows, cols)
        norm_bound, _ = product_bound(raw, weight_type, xg, s, rows, cols)
        add_want = fused_qmatvec.reference_add(raw, weight_type, x, y0, rows, cols)
        add_bound, _ = product_bound(raw, weight_type, x, np.ones(batch), rows, cols)
        add_bound += 2**-24 * np.abs(add_want)
        code = fused_qmatvec.TYPE_CODES[weight_type]
        for variant in suffixes(batch, (weight_type,)):
            k_split = grids(warp, "qmatvec_add", variant, cols, rows)[0].k_split
            for grid, block, *_ in grids(warp, "qmatvec_norm", variant, cols, rows):
                run(harnesses, warp, f"qmatvec_norm_{variant}", grid, block, code, rows, cols, batch, EPS, *files,
                    tmp_path / "o")
                got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
                assert np.all(np.abs(got - norm_want) <= norm_bound), f"norm {rows} batch {batch} {variant} grid {grid}"
                y0.tofile(tmp_path / "y")
                run(harnesses, warp, f"qmatvec_add_{variant}", grid, block, code, rows, cols, batch, files[0], files[1],
                    tmp_path / "y", tmp_path / "o", k_split)
                got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
                assert np.all(np.abs(got - add_want) <= add_bound), f"add {rows} batch {batch} {variant} grid {grid}"
                # the store flag (Gemma's o and down): y = x @ W^T, y0 overwritten
                run(harnesses, warp, f"qmatvec_add_{variant}", grid, block, code | fused_qmatvec.STORE_FLAG, rows, cols,
                    batch, files[0], files[1], tmp_path / "y", tmp_path / "o", k_split)
                got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
                assert np.all(np.abs(got - (add_want - y0)) <= add_bound), f"store {rows} batch {batch} {variant}"


@pytest.mark.parametrize("weight_type", ["q4_k", "q6_k"])
def test_columns_staged_in_several_chunks(harnesses, warp, weight_type, tmp_path):
    """Rows longer than one chunk of staged x (512 slice-tokens of shared memory: 2048 columns for a pass of 8
    tokens, 16384 for one token): each chunk is quantized and read in turn, and the sums of squares cover all."""
    rng = np.random.default_rng([warp, 4, *map(ord, weight_type)])
    for rows, cols, batch in [(6, 2304, 6), (4, 16640, 1)]:
        raw = random_weights(rng, weight_type, rows, cols)
        x, g = inputs(rng, batch, cols)
        files = write_inputs(tmp_path, w=raw, x=x, g=g)
        xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
        want = fused_qmatvec.reference_norm(raw, weight_type, x, g, EPS, rows, cols)
        bound, _ = product_bound(raw, weight_type, xg, s, rows, cols)
        variant = fused_qmatvec.variant(batch)
        grid, block, *_ = fused_qmatvec_geometry.geometry(ARCH_FOR_WARP[warp], "qmatvec_norm", variant, cols, rows)
        run(harnesses, warp, f"qmatvec_norm_{variant}", grid, block, fused_qmatvec.TYPE_CODES[weight_type], rows, cols,
            batch, EPS, *files, tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
        assert np.all(np.abs(got - want) <= bound), f"{weight_type} {rows}x{cols} batch {batch}: " \
                                                    f"{np.max(np.abs(got - want) / bound):.2f} of the bound"


@pytest.mark.parametrize("weight_type", ["q4_k", "q6_k", "q8_0"])
def test_residual_split_row_groups(harnesses, warp, weight_type, tmp_path):
    """The residual product at one token with k_split 2 and 4 (its row groups' warps share the columns, their
    sums meet in shared memory), at its own tiles' grid and with one workgroup walking them: 72 slices a
    row, so that the warps of a group take unequal shares (at 4 one takes none); rows not a multiple of a
    tile's. k_split 3 (not a divisor of the warps at wave 64) counts as 1."""
    rng = np.random.default_rng([warp, 5, *map(ord, weight_type)])
    rows, cols, batch = 20, 2304, 1
    raw = random_weights(rng, weight_type, rows, cols)
    x, _ = inputs(rng, batch, cols)
    y0 = rng.standard_normal((batch, rows)).astype(np.float32)
    files = write_inputs(tmp_path, w=raw, x=x)
    want = fused_qmatvec.reference_add(raw, weight_type, x, y0, rows, cols)
    bound, _ = product_bound(raw, weight_type, x, np.ones(batch), rows, cols)
    bound += 2**-24 * np.abs(want)
    for k_split in (2, 4, 3):
        fused_qmatvec_geometry.FORCED_K_SPLIT = k_split if k_split != 3 else 1
        try:
            grid, block, *_ = fused_qmatvec_geometry.geometry(ARCH_FOR_WARP[warp], "qmatvec_add", "1", cols, rows)
        finally:
            fused_qmatvec_geometry.FORCED_K_SPLIT = None
        for g in sorted({grid, 1}):
            y0.tofile(tmp_path / "y")
            run(harnesses, warp, "qmatvec_add_1", g, block, fused_qmatvec.TYPE_CODES[weight_type], rows, cols, batch,
                files[0], files[1], tmp_path / "y", tmp_path / "o", k_split)
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= bound), f"k_split {k_split} grid {g}: {np.max(np.abs(got - want) / bound):.2f}"


def test_entry_suffix_picks_the_entries_that_read_the_types():
    """The K-quant set (with Q8_0, Q4_0) takes the "1" and "n" entries; one token with a 32-element block type
    (Q4_1, Q5_0, Q5_1, alone or with Q8_0, Q4_0) the "1b" entries; what no entry reads together is refused by name."""
    assert fused_qmatvec.entry_suffix(1, ("q4_k", "q4_k", "q6_k")) == "1"
    assert fused_qmatvec.entry_suffix(3, ("q4_k", "q4_k", "q6_k")) == "n"
    assert fused_qmatvec.entry_suffix(1, ("q8_0", "q4_0")) == "1" and fused_qmatvec.entry_suffix(5, ("q8_0",)) == "n"
    assert fused_qmatvec.entry_suffix(1, ("q5_0", "q5_0", "q5_1")) == "1b"
    assert fused_qmatvec.entry_suffix(1, ("q4_1", "q8_0")) == "1b"
    assert fused_qmatvec.entry_suffix(1, ("mxfp4",) * 3) == "1m" and fused_qmatvec.entry_suffix(4, ("mxfp4",)) == "nm"
    for batch, types in [(2, ("q5_0",)), (1, ("q5_0", "q6_k")), (1, ("q4_1", "q4_k")), (1, ("mxfp4", "q4_0"))]:
        with pytest.raises(ValueError, match="no entry reads"):
            fused_qmatvec.entry_suffix(batch, types)


def test_launcher_splits_the_residual_of_few_tiles():
    """The launcher's k_split on Llama-3 shapes: the residual product and norm+q|k|v+RoPE at one token double it
    while their tiles stay within the workgroup cap (two a multiprocessor, an H100's 132 where the device does
    not say) and each warp keeps SPLIT_MIN_SLICES slices of a row; nothing else splits. The grid is the cap at
    most, which follows the device's multiprocessors."""
    def geometry(entry, cols, *rows, entry_variant="1"):
        return fused_qmatvec_geometry.geometry("sm_90", entry, entry_variant, cols, *rows)

    assert geometry("qmatvec_add", 4096, 4096) == (256, 256, 2, 0)    # an 8B's o: 128 tiles -> 256 (512 at 4)
    assert geometry("qmatvec_add", 14336, 4096) == (256, 256, 2, 0)   # an 8B's down
    assert geometry("qmatvec_add", 2048, 2048) == (128, 256, 2, 0)    # a 1B's o: 64 slices a row, 32 a warp
    assert geometry("qmatvec_add", 8192, 2048) == (256, 256, 4, 0)    # a 1B's down
    assert geometry("qmatvec_add", 4096, 4096, entry_variant="n").k_split == 1
    assert geometry("qmatvec_add", 256, 64).k_split == 1              # 8 slices a row: nothing to share
    assert geometry("qmatvec_norm_rope", 2048, 2048, 512, 512).k_split == 2  # a 1B's q|k|v: 96 tiles -> 192
    assert geometry("qmatvec_norm_rope", 4096, 4096, 1024, 1024).k_split == 1  # an 8B's: 384 tiles at 2, past 264
    assert geometry("qmatvec_norm_rope", 2048, 2048, 512, 512, entry_variant="n").k_split == 1
    assert geometry("qmatvec_norm", 4096, 128256) == (264, 256, 1, 0)   # the head: 4008 tiles in 264 workgroups
    assert fused_qmatvec_geometry.geometry("sm_90", "qmatvec_norm", "1", 4096, 128256, multiprocessors=304).grid == 608
    assert fused_qmatvec_geometry.geometry("sm_90", "qmatvec_norm_rope", "1", 2048, 2048, 512, 512,
                                  multiprocessors=40)[:3] == (80, 256, 1)  # 192 tiles at 2: past a small GPU's 80
    fused_qmatvec_geometry.FORCED_K_SPLIT = 8
    try:
        with pytest.raises(ValueError, match="k_split"):
            geometry("qmatvec_add", 4096, 4096)
    finally:
        fused_qmatvec_geometry.FORCED_K_SPLIT = None


def test_launcher_takes_the_split_gate_up_entry_only_where_a_last_round_would_idle_half_the_workgroups(monkeypatch):
    """One-token gate|up takes qmatvec_norm_swiglu_split_1 where its last round of tiles would leave at least half
    the workgroups idle (an 8B's 14,336 rows: 896 tiles, 3 rounds of 264 and 104 left), the entry without the
    split tiles elsewhere (a 3B's 8,192: 512 tiles, 1 round and 248 left; a small model's one round) and for
    batches."""
    launched = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def launch(self, grid, block, args, stream=None):
            launched.append((self.name, grid))

    monkeypatch.setattr(fused_qmatvec, "get_kernel", lambda device, op, name, signature, programmatic: Kernel(name))
    device = SimpleNamespace(arch="sm_90", multiprocessors=132)
    cases = [(14336, 1, "qmatvec_norm_swiglu_split_1", 264), (8192, 1, "qmatvec_norm_swiglu_1", 264),
             (1536, 1, "qmatvec_norm_swiglu_1", 96), (14336, 2, "qmatvec_norm_swiglu_n", 264)]
    for rows, batch, _, _ in cases:
        fused_qmatvec._launch(device, None, "qmatvec_norm_swiglu", batch, 4096, (rows,), ("q4_k", "q4_k"), ())
    assert launched == [(name, grid) for _, _, name, grid in cases]
    launched.clear()  # GeGLU never takes the split entry, which computes SwiGLU only
    fused_qmatvec._launch(device, None, "qmatvec_norm_swiglu", 1, 4096, (14336,), ("q4_k", "q4_k"), (), gelu=True)
    assert launched == [("qmatvec_norm_swiglu_1", 264)]
    assert fused_qmatvec_geometry.splits_last_round("gfx942", 11008, 264)      # wave 64: 1,376 tiles, 5 rounds and 56 left
    assert not fused_qmatvec_geometry.splits_last_round("sm_90", 11008, 264)   # wave 32: 688 tiles, 2 rounds and 160 left
    assert not fused_qmatvec_geometry.splits_last_round("sm_90", 4224, 264)    # 264 tiles: one whole round


def test_launcher_spreads_qkv_tiles_over_the_multiprocessors():
    """norm+q|k|v+RoPE at one token: where its whole tiles outnumber the SMs (some would take two, others one),
    tiles of the fewest row groups (at least half the block's) whose count fits the workgroup cap; elsewhere,
    and for every other entry and for batches, all the groups (0)."""
    def geometry(cols, *rows, entry="qmatvec_norm_rope", entry_variant="1", arch="sm_90", **kw):
        return fused_qmatvec_geometry.geometry(arch, entry, entry_variant, cols, *rows, **kw)

    assert geometry(4096, 4096, 1024, 1024) == (257, 256, 1, 6)  # an 8B: 192 tiles of 8 groups -> 257 of 6
    assert geometry(2048, 2048, 512, 512) == (257, 256, 2, 3)    # a 1B at k_split 2: 192 of 4 groups -> 257 of 3
    assert geometry(3072, 3072, 1024, 1024) == (258, 256, 1, 5)  # a 3B: 160 of 8 -> 258 of 5
    assert geometry(2048, 2048, 512, 512, multiprocessors=304) == (192, 256, 2, 0)  # 192 tiles, 304 SMs
    assert geometry(576, 576, 192, 192).tile_groups == 0                          # 30 tiles: an SM each
    assert geometry(4096, 4096, 1024, 1024, arch="gfx942") == (264, 256, 1, 0)   # 4 groups: 384 tiles, past the cap
    assert geometry(4096, 4096, 1024, 1024, entry_variant="n").tile_groups == 0
    assert geometry(4096, 4096, entry="qmatvec_add").tile_groups == 0
    for cols, *rows in [(4096, 4096, 1024, 1024), (2048, 2048, 512, 512), (3072, 3072, 1024, 1024)]:
        geo = geometry(cols, *rows)
        every = 8 // geo.k_split
        assert every / 2 <= geo.tile_groups < every and geo.grid <= 264
        fused_qmatvec_geometry.FORCED_TILE_GROUPS = geo.tile_groups - 1  # one fewer: past the cap, or under half
        try:
            fewer = geometry(cols, *rows)
        finally:
            fused_qmatvec_geometry.FORCED_TILE_GROUPS = None
        assert fewer.tile_groups < every / 2 or sum(-(-r // (fewer.tile_groups * 4)) for r in rows) > 264
    fused_qmatvec_geometry.FORCED_TILE_GROUPS = 9
    try:
        with pytest.raises(ValueError, match="tile_groups"):
            geometry(4096, 4096, 1024, 1024)
    finally:
        fused_qmatvec_geometry.FORCED_TILE_GROUPS = None
