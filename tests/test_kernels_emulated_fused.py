"""The fused products (fused_matvec.hip, fused_matmul.hip) run on the CPU under the kernel-language
emulation (tests/support/emulated_kernels.py) against their numpy references, at warp 32 and 64, with the
launchers' geometry and with explicit splits and small grids."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import fused_matmul, fused_matvec, matvec, rmsnorm, rope, silu_mul
from support.weight_samples import random_weights
from support.emulated_kernels import ARCH_FOR_WARP, U32, run, write_inputs
from support.rope_factors import factors_arg, far_factors


# ---- fused_matvec.hip: the single ops' chains folded into the products ---------------------------


def matvec_bound(raw, weight_type, xs, rows, cols):
    """The matvec rounding bound of the product xs @ W^T (float64 [batch, rows])."""
    w_abs = np.abs(matvec.dequantize_rows(raw.reshape(rows, -1), weight_type, cols, np.float64))
    return (cols + 8) * U32 * (np.abs(xs) @ w_abs.T) + 1e-30


def normed(x, g, eps=1e-5):
    return rmsnorm.reference(x, g, eps)


def launches(warp, groups):
    """(split, grid, block) of the launcher's geometry with and without the split entries, each at its full
    grid (up to 4 blocks) and at one block (every block then walks several row pairs)."""
    out = []
    for split in (False, True):
        grid, block = fused_matvec.geometry(ARCH_FOR_WARP[warp], groups, split)
        out += [(split, gsize, block) for gsize in sorted({min(grid, 4), 1})]
    return out


def entry(family, split, weight_type):
    return f"{family}_split_{weight_type}" if split else f"{family}_{weight_type}"


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
def test_fused_norm_rope(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 1])
    # (q heads, kv heads, head_dim, rope_dim, cols, batch): one and several passes over W, partial rope.
    # The emulation costs a host thread per GPU thread: every format gets one case, the demo model's
    # format (q4_1) the rest. Every other case divides the frequencies by factors (rope_freqs.weight); the
    # factors are read in the epilogue, which is the same code for every format.
    # The last case has enough columns that each of the split entries' four warps takes steps of them.
    cases = [(1, 1, 16, 8, 64, 2), (2, 1, 32, 16, 96, 5), (3, 1, 64, 64, 64, 1), (1, 1, 16, 16, 576, 2),
             (1, 1, 16, 16, 1280, 3)]
    for case, (q_heads, kv_heads, head_dim, rope_dim, cols, batch) in enumerate(
            cases if weight_type == "q4_1" else cases[:1]):
        q_rows, kv_rows = q_heads * head_dim, kv_heads * head_dim
        rows = q_rows + 2 * kv_rows
        raw = random_weights(rng, weight_type, rows, cols)
        x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        positions = rng.integers(0, 4096, batch).astype(np.int32)
        factors = far_factors(rng, rope_dim) if case % 2 else None
        files = write_inputs(tmp_path, w=raw, x=x, g=g, p=positions) + [factors_arg(tmp_path, factors)]
        want = fused_matvec.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols,
                                                head_dim, rope_dim, 10000.0, 0.5, factors)
        # Product bound on the unrotated values; a rotation mixes a pair and adds its own rounding.
        bound = matvec_bound(raw, weight_type, normed(x, g) * 1.0, rows, cols) * 2
        angle = rope.angles(positions, rope_dim, 10000.0, 0.5, factors)  # [batch, rope_dim / 2]
        unrotated = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        for split, gsize, block in launches(warp, rows // 2):
            run(harnesses, warp, entry("matvec_norm_rope", split, weight_type), gsize, block, q_rows, kv_rows, cols,
                batch, head_dim, rope_dim, 1e-5, 10000.0, 0.5, *files, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32)
            parts = np.split(got, [batch * q_rows, batch * (q_rows + kv_rows)])
            for part, ref, lo, width in zip(parts, want, (0, q_rows, q_rows + kv_rows), (q_rows, kv_rows, kv_rows)):
                part = part.reshape(batch, width)
                pair_bound = bound[:, lo:lo + width].reshape(batch, -1, 2).sum(-1).repeat(2, -1)
                pair_size = np.abs(unrotated[:, lo:lo + width]).reshape(batch, -1, 2).sum(-1).repeat(2, -1)
                if lo < q_rows + kv_rows:  # rotated heads: add rope's own rounding
                    per_head = np.zeros((batch, head_dim))
                    per_head[:, :rope_dim] = (32 * U32 * angle + 8 * U32).repeat(2, -1)
                    tol = pair_bound + pair_size * np.tile(per_head, width // head_dim)
                else:
                    tol = bound[:, lo:lo + width]
                assert np.all(np.abs(part - ref) <= tol), \
                    f"{weight_type} rows {lo}.. batch {batch} grid {gsize} split {split} factors {factors is not None}"


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
def test_fused_norm_and_norm_swiglu(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 2])
    cases = [(7, 32, 5), (33, 96, 1), (20, 576, 2), (9, 64, 9), (3, 1280, 3)]  # (the last: every split warp's steps)
    for rows, cols, batch in cases if weight_type == "q4_1" else cases[:1]:
        x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        n = normed(x, g)
        # y = rmsnorm(x) g W^T over `rows` rows (odd counts: a half-full last pair)
        raw = random_weights(rng, weight_type, rows, cols)
        files = write_inputs(tmp_path, w=raw, x=x, g=g)
        grid, block = fused_matvec.geometry(ARCH_FOR_WARP[warp], -(-rows // 2))
        want = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        tol = 2 * matvec_bound(raw, weight_type, n, rows, cols)
        for gsize in sorted({min(grid, 4), 1}):
            run(harnesses, warp, f"matvec_norm_{weight_type}", gsize, block, rows, cols, batch, 1e-5, *files, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= tol), f"norm {rows}x{cols} batch {batch} grid {gsize}"
        # silu(n W_gate^T) * (n W_up^T), W = [gate; up]
        raw = random_weights(rng, weight_type, 2 * rows, cols)
        files = write_inputs(tmp_path, w=raw, x=x, g=g)
        both = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, 2 * rows, cols)
        err = 2 * matvec_bound(raw, weight_type, n, 2 * rows, cols)
        gate, up = both[:, :rows], both[:, rows:]
        want = fused_matvec.reference_norm_swiglu(raw, weight_type, x, g, 1e-5, rows, cols)
        tol = 1.1 * np.abs(up) * err[:, :rows] + np.abs(silu_mul.reference(gate, 1.0)) * err[:, rows:] \
            + 6 * U32 * np.abs(want) + 1e-30
        for split, gsize, block in launches(warp, rows):
            run(harnesses, warp, entry("matvec_norm_swiglu", split, weight_type), gsize, block, rows, cols, batch, 1e-5,
                *files, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= tol), f"swiglu {rows}x{cols} batch {batch} grid {gsize} split {split}"


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
def test_fused_add(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 3])
    cases = [(7, 64, 6), (33, 32, 1), (6, 1536, 1), (5, 1536, 3)]  # (the last: every split warp takes steps)
    for rows, cols, batch in cases if weight_type == "q4_1" else cases[:1]:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        y = rng.standard_normal((batch, rows)).astype(np.float32)
        files = write_inputs(tmp_path, w=raw, x=x, y=y)
        want = fused_matvec.reference_add(raw, weight_type, x, y, rows, cols)
        tol = matvec_bound(raw, weight_type, x, rows, cols) + 2 * U32 * np.abs(want)
        for split, gsize, block in launches(warp, -(-rows // 2)):
            run(harnesses, warp, entry("matvec_add", split, weight_type), gsize, block, rows, cols, batch, *files,
                tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= tol), f"add {rows}x{cols} batch {batch} grid {gsize} split {split}"


# ---- fused_matmul.hip: the same chains with matmul tiles, split over columns for few tiles ------


def matmul_launches(row_tiles, cols, n_tokens, tile, splits):
    """(grid, tile, splits, workspace bytes) of the launcher's choice with a full workspace, or of the given
    tile and splits with a workspace of exactly partial_bytes; then each with a grid of 2 workgroups that
    must loop over the (tile, split) items (a split tile finished by a workgroup that also did others)."""
    grid, _, tile, splits = fused_matmul.geometry(row_tiles, cols, n_tokens, fused_matmul.WORKSPACE_BYTES,
                                                  tile_tokens=tile, splits=splits)
    tiles = grid // splits
    workspace = fused_matmul.partial_bytes(tiles, splits, tile) if splits > 1 else 0
    return [(g, tile, splits, workspace) for g in sorted({grid, 2})]


def assert_counters_zero(path, workspace_bytes, what):
    counters = np.fromfile(path, np.int32)[:fused_matmul.COUNTER_BYTES // 4] if workspace_bytes else np.zeros(1)
    assert not counters.any(), f"{what}: the split counters were not left at zero"


# (q heads, kv heads, head_dim, rope_dim, cols, n_tokens, tile_tokens, splits); None: the launcher's.
FUSED_ROPE_CASES = [(1, 1, 64, 64, 64, 5, None, None), (2, 1, 32, 16, 192, 33, 32, 3),
                    (3, 1, 64, 64, 224, 40, 64, 3)]
# Cases whose frequencies are divided by factors (rope_freqs.weight): a split and an unsplit launch.
FUSED_ROPE_FACTOR_CASES = (1, 2)


@pytest.mark.parametrize("weight_type", fused_matmul.WEIGHT_TYPES)
def test_fused_matmul_norm_rope(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 11])
    for case, (q_heads, kv_heads, head_dim, rope_dim, cols, n_tokens, tile, splits) in enumerate(FUSED_ROPE_CASES):
        if weight_type != "q4_1" and case != 1:
            continue
        q_rows, kv_rows = q_heads * head_dim, kv_heads * head_dim
        rows = q_rows + 2 * kv_rows
        raw = random_weights(rng, weight_type, rows, cols)
        x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        positions = rng.integers(0, 4096, n_tokens).astype(np.int32)
        factors = far_factors(rng, rope_dim) if case in FUSED_ROPE_FACTOR_CASES else None
        files = write_inputs(tmp_path, w=raw, x=x, g=g, p=positions) + [factors_arg(tmp_path, factors)]
        want = fused_matmul.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols,
                                                head_dim, rope_dim, 10000.0, 0.5, factors)
        bound = matvec_bound(raw, weight_type, normed(x, g), rows, cols) * 2
        angle = rope.angles(positions, rope_dim, 10000.0, 0.5, factors)
        unrotated = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        for gsize, tile_used, split_used, ws in matmul_launches(-(-rows // 64), cols, n_tokens, tile, splits):
            run(harnesses, warp, f"matmul_norm_rope_{weight_type}", gsize, fused_matmul.THREADS, q_rows, kv_rows, cols,
                n_tokens, head_dim, rope_dim, tile_used, split_used, 1e-5, 10000.0, 0.5, ws, *files, tmp_path / "o",
                tmp_path / "ws")
            got = np.fromfile(tmp_path / "o", np.float32)
            parts = np.split(got, [n_tokens * q_rows, n_tokens * (q_rows + kv_rows)])
            what = (f"{weight_type} {rows}x{cols} tokens {n_tokens} tile {tile_used} splits {split_used} grid {gsize}"
                    f" factors {factors is not None}")
            for part, ref, lo, width in zip(parts, want, (0, q_rows, q_rows + kv_rows), (q_rows, kv_rows, kv_rows)):
                part = part.reshape(n_tokens, width)
                tol = bound[:, lo:lo + width]
                if lo < q_rows + kv_rows:  # a rotation mixes a pair and adds its own rounding
                    pair_bound = tol.reshape(n_tokens, -1, 2).sum(-1).repeat(2, -1)
                    pair_size = np.abs(unrotated[:, lo:lo + width]).reshape(n_tokens, -1, 2).sum(-1).repeat(2, -1)
                    per_head = np.zeros((n_tokens, head_dim))
                    per_head[:, :rope_dim] = (32 * U32 * angle + 8 * U32).repeat(2, -1)
                    tol = pair_bound + pair_size * np.tile(per_head, width // head_dim)
                assert np.all(np.abs(part - ref) <= tol), f"{what}: rows {lo}.."
            assert_counters_zero(tmp_path / "ws", ws, what)


@pytest.mark.parametrize("weight_type", fused_matmul.WEIGHT_TYPES)
def test_fused_matmul_norm_and_norm_swiglu(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 12])
    # (rows, cols, n_tokens, tile_tokens, splits): a partial row tile, 3 uneven splits of 7 steps.
    cases = [(70, 224, 9, 32, 3), (40, 96, 20, None, None), (33, 576, 65, 64, 2)]
    for rows, cols, n_tokens, tile, splits in cases if weight_type == "q4_1" else cases[:1]:
        x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        n = normed(x, g)
        raw = random_weights(rng, weight_type, rows, cols)
        files = write_inputs(tmp_path, w=raw, x=x, g=g)
        want = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        tol = 2 * matvec_bound(raw, weight_type, n, rows, cols)
        for gsize, tile_used, split_used, ws in matmul_launches(-(-rows // 64), cols, n_tokens, tile, splits):
            what = f"norm {weight_type} {rows}x{cols} tokens {n_tokens} tile {tile_used} splits {split_used} grid {gsize}"
            run(harnesses, warp, f"matmul_norm_{weight_type}", gsize, fused_matmul.THREADS, rows, cols, n_tokens,
                tile_used, split_used, 1e-5, ws, *files, tmp_path / "o", tmp_path / "ws")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, rows)
            assert np.all(np.abs(got - want) <= tol), what
            assert_counters_zero(tmp_path / "ws", ws, what)
        # silu(n W_gate^T) * (n W_up^T), W = [gate; up]: tiles of 32 gate rows and their 32 up rows
        raw = random_weights(rng, weight_type, 2 * rows, cols)
        files = write_inputs(tmp_path, w=raw, x=x, g=g)
        both = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, 2 * rows, cols)
        err = 2 * matvec_bound(raw, weight_type, n, 2 * rows, cols)
        gate, up = both[:, :rows], both[:, rows:]
        want = fused_matmul.reference_norm_swiglu(raw, weight_type, x, g, 1e-5, rows, cols)
        tol = 1.1 * np.abs(up) * err[:, :rows] + np.abs(silu_mul.reference(gate, 1.0)) * err[:, rows:] \
            + 6 * U32 * np.abs(want) + 1e-30
        for gsize, tile_used, split_used, ws in matmul_launches(-(-rows // 32), cols, n_tokens, tile, splits):
            what = f"swiglu {weight_type} {rows}x{cols} tokens {n_tokens} tile {tile_used} splits {split_used} grid {gsize}"
            run(harnesses, warp, f"matmul_norm_swiglu_{weight_type}", gsize, fused_matmul.THREADS, rows, cols, n_tokens,
                tile_used, split_used, 1e-5, ws, *files, tmp_path / "o", tmp_path / "ws")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, rows)
            assert np.all(np.abs(got - want) <= tol), what
            assert_counters_zero(tmp_path / "ws", ws, what)


@pytest.mark.parametrize("weight_type", fused_matmul.WEIGHT_TYPES)
def test_fused_matmul_add(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 13])
    cases = [(70, 160, 65, 64, 2), (7, 64, 6, None, None), (64, 1536, 3, 32, 16)]
    for rows, cols, n_tokens, tile, splits in cases if weight_type == "q4_1" else cases[:1]:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        y = rng.standard_normal((n_tokens, rows)).astype(np.float32)
        files = write_inputs(tmp_path, w=raw, x=x, y=y)
        want = fused_matmul.reference_add(raw, weight_type, x, y, rows, cols)
        tol = matvec_bound(raw, weight_type, x, rows, cols) + 2 * U32 * np.abs(want)
        for gsize, tile_used, split_used, ws in matmul_launches(-(-rows // 64), cols, n_tokens, tile, splits):
            what = f"add {weight_type} {rows}x{cols} tokens {n_tokens} tile {tile_used} splits {split_used} grid {gsize}"
            run(harnesses, warp, f"matmul_add_{weight_type}", gsize, fused_matmul.THREADS, rows, cols, n_tokens,
                tile_used, split_used, ws, *files, tmp_path / "o", tmp_path / "ws")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, rows)
            assert np.all(np.abs(got - want) <= tol), what
            assert_counters_zero(tmp_path / "ws", ws, what)
