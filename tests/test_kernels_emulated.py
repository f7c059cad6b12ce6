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

from hipcore.ops import add, argmax, fused_matvec, matmul, matvec, rmsnorm, rope, silu_mul
from hipcore.ops.launch_checks import elementwise_grid, row_block
from hipcore.ops.weight_formats import column_multiple
from hipcore.runtime.kernels import COMPAT_HEADER, kernels_dir
from weight_samples import random_weights

U32 = 2.0**-24
EMULATION = Path(__file__).parent / "kernel_emulation"
NEUTRAL_MARKER = "// Vendor-neutral from here on"
OPS = ("add", "argmax", "fused_matvec", "matmul", "matvec", "rmsnorm", "rope", "silu_mul")
ARCH_FOR_WARP = {32: "sm_90", 64: "gfx942"}  # what the launchers size grids for


@pytest.fixture(scope="session")
def harnesses(tmp_path_factory) -> dict[int, Path]:
    compiler = shutil.which("g++")
    assert compiler, "g++ (C++20) is needed to build the kernel emulation: apt-get install g++"
    work = tmp_path_factory.mktemp("kernel_emulation")
    for op in OPS:
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
