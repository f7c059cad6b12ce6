"""The HIP kernels themselves, run on the CPU under a host emulation of the kernel language, against
the numpy references: CI has no GPU, but it can still catch a wrong index, block layout, reduction
or grid-stride loop in kernels/*.hip.

tests/kernel_emulation/ holds the emulation (each GPU thread a std::thread, warps exchanging in
lockstep) and a harness that runs one kernel per process. It is compiled with g++ once per warp width,
32 (NVIDIA, RDNA) and 64 (CDNA), against the kernel sources as they are and the vendor-neutral part of
hip_compat.h. The geometry is what the launchers choose, plus deliberately small grids. Tolerances
are those of the GPU tier (tests/gpu/test_ops_gpu.py), where they are justified.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hipcore.ops import add, argmax, fused_matmul, fused_matvec, matmul, matvec, rmsnorm, rope, sample, silu_mul
from hipcore.kvcache.dtypes import KV_DTYPES, kv_dtype
from hipcore.ops import embedding, kv_store, paged_attention, select_rows
from hipcore.ops.launch_checks import elementwise_grid, row_block
from hipcore.ops.weight_formats import column_multiple
from hipcore.runtime.kernels import COMPAT_HEADER, kernels_dir
from forward_pass_samples import PagedSample, make_sample, random_table
from weight_samples import random_weights

U32 = 2.0**-24
EMULATION = Path(__file__).parent / "kernel_emulation"
NEUTRAL_MARKER = "// Vendor-neutral from here on"
OPS = ("add", "argmax", "fused_matmul", "fused_matvec", "matmul", "matvec", "rmsnorm", "rope", "sample", "silu_mul")
FORWARD_PASS_OPS = ("embedding", "kv_store", "paged_attention", "select_rows")
ARCH_FOR_WARP = {32: "sm_90", 64: "gfx942"}  # what the launchers size grids for


@pytest.fixture(scope="session")
def harnesses(tmp_path_factory) -> dict[int, Path]:
    compiler = shutil.which("g++")
    assert compiler, "g++ (C++20) is needed to build the kernel emulation: apt-get install g++"
    work = tmp_path_factory.mktemp("kernel_emulation")
    for op in OPS + FORWARD_PASS_OPS:
        shutil.copy(kernels_dir() / f"{op}.hip", work)
    for name in ("emulation.h", "harness.cpp"):
        shutil.copy(EMULATION / name, work)
    header = (kernels_dir() / COMPAT_HEADER).read_text()
    assert header.count(NEUTRAL_MARKER) == 1, f"{COMPAT_HEADER} lost its '{NEUTRAL_MARKER}' line"
    neutral = header[header.index(NEUTRAL_MARKER):]
    (work / COMPAT_HEADER).write_text('#pragma once\n#include "emulation.h"\n' + neutral)

    def build(warp: int) -> Path:
        out = work / f"harness{warp}"
        proc = subprocess.run([compiler, "-std=c++20", "-O1", "-pthread", f"-DWARP_SIZE={warp}", "-Wno-unknown-pragmas",
                               "-o", str(out), str(work / "harness.cpp")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip((32, 64), pool.map(build, (32, 64))))


@pytest.fixture(params=[32, 64], ids=["warp32", "warp64"])
def warp(request) -> int:
    return request.param


def run(harnesses, warp: int, *args) -> None:
    proc = subprocess.run([str(harnesses[warp]), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"harness {args[:3]} exited with {proc.returncode}: {proc.stderr[-2000:]}"


@pytest.mark.parametrize("weight_type", matvec.WEIGHT_TYPES)
def test_matvec(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1])])
    # Rows shorter than a warp's items, odd row counts (a half-full last pair), 576 and 1536 columns,
    # batches within one pass (2..8) and over several (9, 11) with remainders. The K-quants' rows are
    # 1, 2 or 6 super-blocks of 256.
    shapes = [(7, 32, 1), (33, 64, 1), (65, 576, 1), (20, 1536, 1), (5, 96, 2), (17, 576, 8), (9, 64, 11), (3, 32, 9)]
    if column_multiple(weight_type) == 256:
        shapes = [(7, 256, 1), (33, 512, 1), (20, 1536, 1), (5, 256, 2), (17, 512, 8), (3, 256, 9)]
    for rows, cols, batch in shapes:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        raw.tofile(tmp_path / "w")
        x.tofile(tmp_path / "x")
        want = matvec.reference(raw, weight_type, x, rows, cols)
        w_abs = np.abs(matvec.dequantize_rows(raw, weight_type, cols, np.float64))
        bound = (cols + 2) * U32 * (np.abs(x.astype(np.float64)) @ w_abs.T) + 1e-30
        grid, block = matvec.geometry(ARCH_FOR_WARP[warp], rows, batch)
        for g in sorted({grid, 1, 2}):  # the launcher's grid, and grids the kernel must loop over
            run(harnesses, warp, f"matvec_{weight_type}", g, block, rows, cols, batch, tmp_path / "w", tmp_path / "x",
                tmp_path / "y")
            got = np.fromfile(tmp_path / "y", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= bound), f"{rows}x{cols} batch {batch} grid {g}"


@pytest.mark.parametrize("weight_type", matmul.WEIGHT_TYPES)
def test_matmul(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1]), 7])
    block = column_multiple(weight_type)
    # (rows, cols, n_tokens, tile_tokens or None for the launcher's): tiles cut in both directions, exact
    # tiles, a single token, every tile shape, one and several column steps of 32 (and super-blocks).
    cases = [(70, block, 5, None), (64, 2 * block, 64, 64), (130, block, 33, 32), (3, block, 1, 16),
             (65, 3 * block if block == 32 else block, 17, None)]
    for rows, cols, n_tokens, tile in cases:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        raw.tofile(tmp_path / "w")
        x.tofile(tmp_path / "x")
        want = matmul.reference(raw, weight_type, x, rows, cols)
        bound = matmul.error_bound(raw, weight_type, x, rows, cols)
        grid, threads, tile = matmul.geometry(rows, n_tokens, tile)
        for g in sorted({grid, 1}):  # the launcher's grid, and one workgroup looping over every tile
            run(harnesses, warp, f"matmul_{weight_type}", g, threads, rows, cols, n_tokens, tile, tmp_path / "w",
                tmp_path / "x", tmp_path / "y")
            got = np.fromfile(tmp_path / "y", np.float32).reshape(n_tokens, rows)
            assert np.all(np.abs(got - want) <= bound), f"{rows}x{cols} tokens {n_tokens} tile {tile} grid {g}"


def test_argmax(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for rows, n in [(1, 1), (3, 100), (2, 1025), (4, 5000)]:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        if n > 3:
            x[0, rng.choice(n, 3, replace=False)] = x.max() + 1  # a tie: the lowest index wins
        if rows > 2:
            x[1, [n - 1, n // 2]] = np.nan  # the first NaN wins
            x[2, :] = -np.inf  # all equal: index 0
        x.tofile(tmp_path / "x")
        run(harnesses, warp, "argmax_f32", rows, row_block(n, argmax.MAX_THREADS), n, tmp_path / "x", tmp_path / "o")
        assert np.array_equal(np.fromfile(tmp_path / "o", np.int32), argmax.reference(x)), f"{rows}x{n}"


def test_rmsnorm(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for rows, n in [(1, 1), (3, 7), (2, 576), (1, 1000)]:
        x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        weight = rng.standard_normal(n).astype(np.float32)
        x.tofile(tmp_path / "x")
        weight.tofile(tmp_path / "w")
        want = rmsnorm.reference(x, weight, 1e-5)
        tol = (n + 8) * U32 * np.abs(want) + 1e-30
        block = row_block(n, rmsnorm.MAX_THREADS)
        run(harnesses, warp, "rmsnorm_f32", rows, block, n, 1e-5, tmp_path / "x", tmp_path / "w", tmp_path / "o")
        assert np.all(np.abs(np.fromfile(tmp_path / "o", np.float32).reshape(rows, n) - want) <= tol)
        run(harnesses, warp, "rmsnorm_f32", rows, block, n, 1e-5, tmp_path / "x", tmp_path / "w", "-", tmp_path / "o")
        assert np.all(np.abs(np.fromfile(tmp_path / "o", np.float32).reshape(rows, n) - want) <= tol), "in place"


def test_rope(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for tokens, heads, head_dim, rope_dim, max_pos in [(3, 2, 64, 64, 4096), (2, 3, 6, 4, 100), (4, 1, 64, 32, 32768)]:
        x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
        positions = rng.integers(0, max_pos, tokens).astype(np.int32)
        x.tofile(tmp_path / "x")
        positions.tofile(tmp_path / "p")
        want = rope.reference(x, positions, rope_dim, 10000.0, 0.5)
        angle = rope.angles(positions, rope_dim, 10000.0, 0.5)[:, None, :]
        pair = np.abs(x[..., 0:rope_dim:2]).astype(np.float64) + np.abs(x[..., 1:rope_dim:2])
        tol = pair * (32 * U32 * angle + 8 * U32) + 1e-30
        grid, block = elementwise_grid(tokens * heads * (rope_dim // 2))
        for g in sorted({grid, 1}):
            run(harnesses, warp, "rope_f32", g, block, tokens, heads, head_dim, rope_dim, 10000.0, 0.5,
                tmp_path / "x", tmp_path / "p", tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(x.shape)
            for lane in (0, 1):
                assert np.all(np.abs(got[..., lane:rope_dim:2] - want[..., lane:rope_dim:2]) <= tol)
            assert np.array_equal(got[..., rope_dim:], x[..., rope_dim:])


def test_silu_mul_and_add(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for n in (1, 300, 1000):
        gate = (rng.standard_normal(n) * 4).astype(np.float32)
        gate[0] = -1e30
        up = rng.standard_normal(n).astype(np.float32)
        gate.tofile(tmp_path / "a")
        up.tofile(tmp_path / "b")
        grid, block = elementwise_grid(n)
        for g in sorted({grid, 1}):
            run(harnesses, warp, "silu_mul_f32", g, block, n, tmp_path / "a", tmp_path / "b", tmp_path / "o")
            want = silu_mul.reference(gate, up)
            assert np.all(np.abs(np.fromfile(tmp_path / "o", np.float32) - want) <= 6 * U32 * np.abs(want) + 1e-30)
            run(harnesses, warp, "add_f32", g, block, n, tmp_path / "a", tmp_path / "b", tmp_path / "o")
            assert np.array_equal(np.fromfile(tmp_path / "o", np.float32), add.reference(gate, up))


# ---- fused_matvec.hip: the single ops' chains folded into the products ---------------------------


def matvec_bound(raw, weight_type, xs, rows, cols):
    """The matvec rounding bound of the product xs @ W^T (float64 [batch, rows])."""
    w_abs = np.abs(matvec.dequantize_rows(raw.reshape(rows, -1), weight_type, cols, np.float64))
    return (cols + 8) * U32 * (np.abs(xs) @ w_abs.T) + 1e-30


def normed(x, g, eps=1e-5):
    return rmsnorm.reference(x, g, eps)


def write(tmp_path, **arrays):
    for name, array in arrays.items():
        np.ascontiguousarray(array).tofile(tmp_path / name)
    return [tmp_path / name for name in arrays]


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
def test_fused_norm_rope(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 1])
    # (q heads, kv heads, head_dim, rope_dim, cols, batch): one and several passes over W, partial rope.
    # The emulation costs a host thread per GPU thread: every format gets one case, the demo model's
    # format (q4_1) the rest.
    cases = [(1, 1, 16, 8, 64, 2), (2, 1, 32, 16, 96, 5), (3, 1, 64, 64, 64, 1), (1, 1, 16, 16, 576, 2)]
    for q_heads, kv_heads, head_dim, rope_dim, cols, batch in cases if weight_type == "q4_1" else cases[:1]:
        q_rows, kv_rows = q_heads * head_dim, kv_heads * head_dim
        rows = q_rows + 2 * kv_rows
        raw = random_weights(rng, weight_type, rows, cols)
        x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        positions = rng.integers(0, 4096, batch).astype(np.int32)
        files = write(tmp_path, w=raw, x=x, g=g, p=positions)
        want = fused_matvec.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols,
                                                head_dim, rope_dim, 10000.0, 0.5)
        # Product bound on the unrotated values; a rotation mixes a pair and adds its own rounding.
        bound = matvec_bound(raw, weight_type, normed(x, g) * 1.0, rows, cols) * 2
        angle = rope.angles(positions, rope_dim, 10000.0, 0.5)  # [batch, rope_dim / 2]
        unrotated = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        grid, block = fused_matvec.geometry(ARCH_FOR_WARP[warp], rows // 2)
        for gsize in sorted({min(grid, 4), 1}):
            run(harnesses, warp, f"matvec_norm_rope_{weight_type}", gsize, block, q_rows, kv_rows, cols, batch,
                head_dim, rope_dim, 1e-5, 10000.0, 0.5, *files, tmp_path / "o")
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
                assert np.all(np.abs(part - ref) <= tol), f"{weight_type} rows {lo}.. batch {batch} grid {gsize}"


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
def test_fused_norm_and_norm_swiglu(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 2])
    cases = [(7, 32, 5), (33, 96, 1), (20, 576, 2), (9, 64, 9)]
    for rows, cols, batch in cases if weight_type == "q4_1" else cases[:1]:
        x = (rng.standard_normal((batch, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        n = normed(x, g)
        # y = rmsnorm(x) g W^T over `rows` rows (odd counts: a half-full last pair)
        raw = random_weights(rng, weight_type, rows, cols)
        files = write(tmp_path, w=raw, x=x, g=g)
        grid, block = fused_matvec.geometry(ARCH_FOR_WARP[warp], -(-rows // 2))
        want = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        tol = 2 * matvec_bound(raw, weight_type, n, rows, cols)
        for gsize in sorted({min(grid, 4), 1}):
            run(harnesses, warp, f"matvec_norm_{weight_type}", gsize, block, rows, cols, batch, 1e-5, *files, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= tol), f"norm {rows}x{cols} batch {batch} grid {gsize}"
        # silu(n W_gate^T) * (n W_up^T), W = [gate; up]
        raw = random_weights(rng, weight_type, 2 * rows, cols)
        files = write(tmp_path, w=raw, x=x, g=g)
        both = fused_matvec.reference_norm(raw, weight_type, x, g, 1e-5, 2 * rows, cols)
        err = 2 * matvec_bound(raw, weight_type, n, 2 * rows, cols)
        gate, up = both[:, :rows], both[:, rows:]
        want = fused_matvec.reference_norm_swiglu(raw, weight_type, x, g, 1e-5, rows, cols)
        tol = 1.1 * np.abs(up) * err[:, :rows] + np.abs(silu_mul.reference(gate, 1.0)) * err[:, rows:] \
            + 6 * U32 * np.abs(want) + 1e-30
        grid, block = fused_matvec.geometry(ARCH_FOR_WARP[warp], rows)
        for gsize in sorted({min(grid, 4), 1}):
            run(harnesses, warp, f"matvec_norm_swiglu_{weight_type}", gsize, block, rows, cols, batch, 1e-5, *files,
                tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= tol), f"swiglu {rows}x{cols} batch {batch} grid {gsize}"


@pytest.mark.parametrize("weight_type", fused_matvec.WEIGHT_TYPES)
def test_fused_add(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 3])
    cases = [(7, 64, 6), (33, 32, 1), (6, 1536, 1)]
    for rows, cols, batch in cases if weight_type == "q4_1" else cases[:1]:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        y = rng.standard_normal((batch, rows)).astype(np.float32)
        files = write(tmp_path, w=raw, x=x, y=y)
        want = fused_matvec.reference_add(raw, weight_type, x, y, rows, cols)
        tol = matvec_bound(raw, weight_type, x, rows, cols) + 2 * U32 * np.abs(want)
        grid, block = fused_matvec.geometry(ARCH_FOR_WARP[warp], -(-rows // 2))
        for gsize in sorted({min(grid, 4), 1}):
            run(harnesses, warp, f"matvec_add_{weight_type}", gsize, block, rows, cols, batch, *files, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= tol), f"add {rows}x{cols} batch {batch} grid {gsize}"


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


@pytest.mark.parametrize("weight_type", fused_matmul.WEIGHT_TYPES)
def test_fused_matmul_norm_rope(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), 11])
    for q_heads, kv_heads, head_dim, rope_dim, cols, n_tokens, tile, splits in (
            FUSED_ROPE_CASES if weight_type == "q4_1" else FUSED_ROPE_CASES[1:2]):
        q_rows, kv_rows = q_heads * head_dim, kv_heads * head_dim
        rows = q_rows + 2 * kv_rows
        raw = random_weights(rng, weight_type, rows, cols)
        x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        positions = rng.integers(0, 4096, n_tokens).astype(np.int32)
        files = write(tmp_path, w=raw, x=x, g=g, p=positions)
        want = fused_matmul.reference_norm_rope(raw, weight_type, x, g, 1e-5, positions, q_rows, kv_rows, cols,
                                                head_dim, rope_dim, 10000.0, 0.5)
        bound = matvec_bound(raw, weight_type, normed(x, g), rows, cols) * 2
        angle = rope.angles(positions, rope_dim, 10000.0, 0.5)
        unrotated = fused_matmul.reference_norm(raw, weight_type, x, g, 1e-5, rows, cols)
        for gsize, tile_used, split_used, ws in matmul_launches(-(-rows // 64), cols, n_tokens, tile, splits):
            run(harnesses, warp, f"matmul_norm_rope_{weight_type}", gsize, fused_matmul.THREADS, q_rows, kv_rows, cols,
                n_tokens, head_dim, rope_dim, tile_used, split_used, 1e-5, 10000.0, 0.5, ws, *files, tmp_path / "o",
                tmp_path / "ws")
            got = np.fromfile(tmp_path / "o", np.float32)
            parts = np.split(got, [n_tokens * q_rows, n_tokens * (q_rows + kv_rows)])
            what = f"{weight_type} {rows}x{cols} tokens {n_tokens} tile {tile_used} splits {split_used} grid {gsize}"
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
        files = write(tmp_path, w=raw, x=x, g=g)
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
        files = write(tmp_path, w=raw, x=x, g=g)
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
        files = write(tmp_path, w=raw, x=x, y=y)
        want = fused_matmul.reference_add(raw, weight_type, x, y, rows, cols)
        tol = matvec_bound(raw, weight_type, x, rows, cols) + 2 * U32 * np.abs(want)
        for gsize, tile_used, split_used, ws in matmul_launches(-(-rows // 64), cols, n_tokens, tile, splits):
            what = f"add {weight_type} {rows}x{cols} tokens {n_tokens} tile {tile_used} splits {split_used} grid {gsize}"
            run(harnesses, warp, f"matmul_add_{weight_type}", gsize, fused_matmul.THREADS, rows, cols, n_tokens,
                tile_used, split_used, ws, *files, tmp_path / "o", tmp_path / "ws")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, rows)
            assert np.all(np.abs(got - want) <= tol), what
            assert_counters_zero(tmp_path / "ws", ws, what)


# ---- embedding, select_rows, kv_store, paged_attention: the lookups and attention of the forward pass


def write_inputs(tmp_path, **arrays) -> list:
    """Each array to a file named after its keyword; the paths in order."""
    for name, array in arrays.items():
        np.ascontiguousarray(array).tofile(tmp_path / name)
    return [tmp_path / name for name in arrays]


def test_embedding(harnesses, warp, tmp_path):
    """Every table format, bit for bit (the decoding is exact); an id past the vocabulary gives zeros."""
    rng = np.random.default_rng([warp, 21])
    vocab, n_tokens = 37, 6
    for table_type in embedding.TABLE_TYPES:
        hidden = 7 if embedding.BLOCKS[table_type][0] == 1 else 96  # an odd width where the format allows it
        raw = random_table(rng, table_type, vocab, hidden)
        ids = rng.integers(0, vocab, n_tokens).astype(np.int32)
        ids[-1] = vocab
        paths = write_inputs(tmp_path, table=raw, ids=ids)
        want = embedding.reference(raw, table_type, ids[:-1], vocab, hidden)
        grid, block = embedding.geometry(n_tokens, hidden)
        for g in sorted({grid, 2}):  # the launcher's grid, and one the kernel must stride over
            run(harnesses, warp, f"embedding_{table_type}", g, block, n_tokens, hidden, vocab, *paths, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, hidden)
            assert np.array_equal(got[:-1].view(np.uint32), want.view(np.uint32)), f"{table_type} grid {g}"
            assert np.array_equal(got[-1], np.zeros(hidden, np.float32)), table_type


def test_select_rows(harnesses, warp, tmp_path):
    rng = np.random.default_rng([warp, 22])
    x = rng.standard_normal((9, 300)).astype(np.float32)
    rows = np.array([8, 0, 3, 3, -1, 9], np.int32)  # repeats; -1 and 9 are outside x and give zero rows
    paths = write_inputs(tmp_path, x=x, rows=rows)
    grid, block = select_rows.geometry(len(rows), 300)
    for g in sorted({grid, 1}):
        run(harnesses, warp, "select_rows_f32", g, block, len(rows), 300, 9, *paths, tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.float32).reshape(len(rows), 300)
        assert np.array_equal(got[:4], select_rows.reference(x, rows[:4])) and not got[4:].any()


@pytest.mark.parametrize("kv", list(KV_DTYPES))
def test_kv_store(harnesses, warp, kv, tmp_path):
    """The stored bytes equal the host codec's; padding slots (-1) and slots past the pool are skipped,
    and every byte not written keeps its old value."""
    rng = np.random.default_rng([warp, 23, len(kv)])
    fmt = kv_dtype(kv)
    for n_kv_heads, head_dim, block_size, n_tokens in [(3, 64, 16, 7), (1, 32, 1, 3), (2, 96, 8, 11)]:
        num_blocks = 2 + -(-n_tokens // block_size) * 2
        pools = [rng.integers(0, 256, (num_blocks, n_kv_heads, block_size, fmt.row_bytes(head_dim)), dtype=np.uint8)
                 for _ in range(2)]
        k, v = ((rng.standard_normal((n_tokens, n_kv_heads, head_dim)) * rng.uniform(1e-3, 1e3)).astype(np.float32)
                for _ in range(2))
        k[0, 0, :32] = 0.0  # an all-zero q8_0 block: scale 0, no division by zero
        v[0, 0, :32] = np.arange(32, dtype=np.float32) - 15.5  # q8_0: halves round away from zero
        slots = rng.choice(np.arange(block_size, num_blocks * block_size), n_tokens, replace=False).astype(np.int32)
        slots[1] = -1
        slots[-1] = num_blocks * block_size  # past the pool
        valid = (slots >= 0) & (slots < num_blocks * block_size)
        want = [pool.copy() for pool in pools]
        for pool, rows in zip(want, (k, v)):
            kv_store.reference(pool, rows[valid], slots[valid], fmt)
        paths = write_inputs(tmp_path, k=k, v=v, slots=slots, k_pool=pools[0], v_pool=pools[1])
        for g in sorted({min(n_tokens, 65535), 2}):
            run(harnesses, warp, f"kv_store_{kv}", g, kv_store.THREADS, n_tokens, n_kv_heads, head_dim, block_size,
                num_blocks, *paths, tmp_path / "ko", tmp_path / "vo")
            for name, expected in (("ko", want[0]), ("vo", want[1])):
                got = np.fromfile(tmp_path / name, np.uint8).reshape(expected.shape)
                assert np.array_equal(got, expected), f"{kv} {name} heads {n_kv_heads} head_dim {head_dim} grid {g}"


# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), padding tokens)
ATTENTION_CASES = [
    (9, 3, 64, 16, [(1, 1), (30, 1), (100, 1), (12, 4)], 1),  # the demo model's heads: decodes, a prompt chunk
    (4, 4, 32, 8, [(70, 1), (9, 9)], 0),  # no grouping; 4 lanes per key
    (8, 2, 128, 32, [(100, 1), (33, 3)], 0),  # 4 query heads per KV head; 16 lanes per key
    (7, 1, 96, 4, [(65, 2)], 0),  # 7 query heads: chunks of 4 and 3; 12 of 16 lanes per key
    (9, 3, 64, 16, [(300, 1), (1, 1)], 1),  # a small decode launch: one workgroup per query head
    (9, 3, 64, 16, [(700, 1)], 0),  # past the spread's contexts: keys split over workgroups, then combined
    (8, 2, 64, 16, [(290, 1)] * 9, 0),  # too many tokens to spread: chunks of 4 heads, 3 splits each
]


def run_attention(harnesses, warp, tmp_path, sample, workspace: bool, positions=None, block_tables=None):
    """The kernel's output for `sample` (optionally with other positions or tables) and the workspace
    after the launch, with the launcher's geometry."""
    s = sample
    splits = paged_attention.split_limit(s.n_tokens, s.n_heads, s.n_kv_heads, s.max_blocks * s.block_size) \
        if workspace else 1
    slots = paged_attention.slot_count(s.n_tokens, s.n_heads, s.n_kv_heads, splits)
    ws_bytes = paged_attention.workspace_bytes(s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim, slots) if splits > 1 else 0
    grid, block = paged_attention.geometry(ARCH_FOR_WARP[warp], s.n_tokens, s.n_heads, s.n_kv_heads, slots)
    paths = write_inputs(tmp_path, q=s.q, k_pool=s.k_pool, v_pool=s.v_pool,
                  tables=s.block_tables if block_tables is None else block_tables, token_seq=s.token_seq,
                  positions=s.positions if positions is None else positions)
    run(harnesses, warp, f"paged_attention_{s.kv_dtype}", grid, block, s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim,
        s.block_size, s.max_blocks, s.num_blocks, slots, s.scale, *paths, ws_bytes, tmp_path / "o", tmp_path / "ws")
    got = np.fromfile(tmp_path / "o", np.float32).reshape(s.q.shape)
    return got, np.fromfile(tmp_path / "ws", np.uint8), splits


@pytest.mark.parametrize("kv", list(KV_DTYPES))
def test_paged_attention(harnesses, warp, kv, tmp_path):
    """Decode and prompt tokens of several sequences in one launch, against the reference, with and
    without splitting keys over workgroups; after a split launch the counters are back at zero."""
    rng = np.random.default_rng([warp, 24, len(kv)])
    # The emulation costs a host thread per GPU thread: f16 (the default KV dtype) gets every case, the
    # other formats, which differ only in how a row is loaded and decoded, the demo model's.
    for n_heads, n_kv_heads, head_dim, block_size, seqs, padding in ATTENTION_CASES[:None if kv == "f16" else 1]:
        sample = make_sample(rng, kv, n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding, q_scale=2.0)
        want, tol = sample.reference(), sample.tolerance()
        for workspace in (True, False) if n_heads == 9 and kv == "f16" else (True,):
            got, ws, max_splits = run_attention(harnesses, warp, tmp_path, sample, workspace)
            bad = ~(np.abs(got - want) <= tol)
            assert not bad.any(), (f"{kv} {n_heads}/{n_kv_heads}x{head_dim} splits {max_splits}: {int(bad.sum())} off, "
                                   f"worst {float((np.abs(got - want) / tol).max()):.1f} x tolerance")
            assert not got[sample.positions < 0].any(), "padding tokens give zero rows"
            if workspace and max_splits > 1:
                n_counters = sample.n_tokens * n_kv_heads * paged_attention.head_chunks(n_heads, n_kv_heads)
                assert not ws[:4 * n_counters].any(), "the counters are left at zero"


def test_paged_attention_tolerance_catches_wrong_keys(harnesses, tmp_path):
    """The bound of the tests above is tight enough to fail the mistakes an attention kernel makes:
    one key too many (an off-by-one in the causal limit), a key from the wrong block, a query head
    reading the wrong KV head."""
    rng = np.random.default_rng(25)
    sample = make_sample(rng, "f16", 8, 2, 64, 16, [(150, 1), (37, 2)], q_scale=2.0)
    want, tol = sample.reference(), sample.tolerance()
    got, _, _ = run_attention(harnesses, 32, tmp_path, sample, workspace=True)
    assert np.all(np.abs(got - want) <= tol)

    one_more, _, _ = run_attention(harnesses, 32, tmp_path, sample, True, positions=sample.positions + 1)
    unused = sorted(set(range(1, sample.num_blocks)) - set(sample.block_tables.ravel().tolist()))
    other = sample.block_tables.copy()
    other[0, 5] = unused[0]  # 16 keys of sequence 0 read from a block it does not own
    wrong_block, _, _ = run_attention(harnesses, 32, tmp_path, sample, True, block_tables=other)
    for name, bad in (("one key too many", one_more), ("a wrong block", wrong_block)):
        assert (np.abs(bad - want) > tol).any(), name
    regrouped = sample.q.reshape(sample.n_tokens, 4, 2, 64).transpose(0, 2, 1, 3).reshape(sample.q.shape)
    crossed = PagedSample(**{**sample.__dict__, "q": regrouped}).reference()  # head h reading KV head h % 2
    crossed = crossed.reshape(sample.n_tokens, 2, 4, 64).transpose(0, 2, 1, 3).reshape(sample.q.shape)
    assert (np.abs(crossed - want) > tol).any(), "a query head reading another group's KV head"


# ---- sample.hip: the host sampler's rules on the device ----------------------------------------


def acceptable_picks(row, params):
    """Tokens the reference picks when the draw and the top-p / min-p thresholds move by float32 rounding:
    the kernel sums in float32 where the host sums in float64, so at a boundary either side is right."""
    t, k, p, m, u = (float(v) for v in params)
    picks = set()
    for du in (-2e-6, 0.0, 2e-6):
        for dp in (-2e-6, 0.0, 2e-6):
            for dm in (-2e-6, 0.0, 2e-6):
                picks.add(sample.pick(row, t, int(k), min(p + dp, 1.0) if p < 1 else 1.0, max(m + dm, 0.0) if m > 0 else 0.0,
                                      min(max(u + du, 0.0), 0.999999)))
    return picks


def test_sample(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    vocab = 3000
    logits = (rng.standard_normal((10, vocab)) * 3).astype(np.float32)
    logits[3, rng.choice(vocab, 6, replace=False)] = logits[3].max() + 1  # six-way tie at the top: k = 4 cuts it
    logits[4, :] = np.round(logits[4])  # many ties everywhere
    logits[5, 100] = np.nan  # greedy row: the first NaN wins
    params = np.array([
        [0.8, 40, 0.95, 0.05, 0.0], [1.5, 1024, 1.0, 0.0, 0.0], [0.5, 5, 0.5, 0.0, 0.0], [1.0, 4, 1.0, 0.0, 0.0],
        [1.0, 30, 0.9, 0.0, 0.0], [0.0, 40, 0.95, 0.05, 0.0], [0.7, 1, 1.0, 0.0, 0.0], [2.0, 200, 0.8, 0.2, 0.0],
        [1.0, 64, 1.0, 0.5, 0.0], [1.2, 600, 0.99, 0.01, 0.0]], dtype=np.float32)
    params[:, 4] = rng.random(len(params))
    files = write(tmp_path, x=logits, p=params)
    for block in (64, 256):
        run(harnesses, warp, "sample_f32", len(params), block, vocab, *files, tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.int32)
        for i, (row, prm) in enumerate(zip(logits, params)):
            assert int(got[i]) in acceptable_picks(row, prm), f"row {i} block {block}: {got[i]}, params {prm}"
        assert got[5] == 100 and got[6] == int(np.argmax(logits[6]))
    # A vocabulary smaller than top_k: every token is a candidate.
    small = (rng.standard_normal((2, 50)) * 2).astype(np.float32)
    prm = np.array([[1.0, 1024, 1.0, 0.0, 0.3], [0.9, 100, 0.7, 0.1, 0.9]], dtype=np.float32)
    files = write(tmp_path, x=small, p=prm)
    run(harnesses, warp, "sample_f32", 2, 64, 50, *files, tmp_path / "o")
    got = np.fromfile(tmp_path / "o", np.int32)
    assert all(int(got[i]) in acceptable_picks(small[i], prm[i]) for i in range(2))
