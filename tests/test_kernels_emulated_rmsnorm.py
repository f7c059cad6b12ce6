"""kernels/rmsnorm.hip's entries under the kernel-language emulation (tests/support/emulated_kernels.py) at warp 32 and
64, against rmsnorm.py's reference and against each other: rmsnorm_f32 (out of place, in place, f16 out),
rmsnorm_add_f32 (the norm then the add), rmsnorm_bias_f32 (add_bias then the norm) and the `_and_f16` entries (both
forms of the same values; planted: the f16 copy taken before the scale and weight), on the float4 path and the scalar
one. Tolerances are those of the GPU tier (tests/gpu/test_ops_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import rmsnorm
from hipcore.ops.launch_checks import row_block
from support.emulated_kernels import U32, build_harnesses, run


def test_rmsnorm(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    # (12, 128): per-head q/k norm (qwen3); n % 4 == 0 takes the float4 path, (1, 1) and (3, 7) the scalar one
    for rows, n in [(1, 1), (3, 7), (2, 576), (1, 1000), (12, 128), (2, 4096)]:
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
        # f16 out: the float32 result rounded once more (u16 of it, or half f16's subnormal spacing).
        run(harnesses, warp, "rmsnorm_f32_f16", rows, block, n, 1e-5, tmp_path / "x", tmp_path / "w", tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.float16).reshape(rows, n).astype(np.float64)
        assert np.all(np.abs(got - want) <= tol + 2.0**-11 * (np.abs(want) + tol) + 2.0**-25), f"f16 out {rows}x{n}"


def test_rmsnorm_add_is_the_norm_then_the_add(harnesses, warp, tmp_path):
    """rmsnorm_add_f32 (Gemma's norm of a product added to the residual stream) gives rmsnorm_f32's output added to
    the residual, on the float4 path and the scalar one: here (no FMA contraction) the bytes of the two launches it
    replaces; a GPU compiler may fuse the weight's product with the add (tests/gpu/test_ops_gpu.py's bound)."""
    rng = np.random.default_rng([warp, 5])
    for rows, n in [(3, 7), (2, 576), (4, 2560)]:
        x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        residual = rng.standard_normal((rows, n)).astype(np.float32)
        weight = (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
        for name, a in (("x", x), ("r", residual), ("w", weight)):
            a.tofile(tmp_path / name)
        block = row_block(n, rmsnorm.MAX_THREADS)
        run(harnesses, warp, "rmsnorm_f32", rows, block, n, 1e-6, tmp_path / "x", tmp_path / "w", tmp_path / "normed")
        normed = np.fromfile(tmp_path / "normed", np.float32).reshape(rows, n)
        run(harnesses, warp, "rmsnorm_add_f32", rows, block, n, 1e-6, tmp_path / "r", tmp_path / "x", tmp_path / "w",
            tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.float32).reshape(rows, n)
        assert np.array_equal(got, residual + normed), f"{rows}x{n}"
        assert not np.array_equal(got, normed)


def test_rmsnorm_bias_is_add_bias_then_the_norm(harnesses, warp, tmp_path):
    """rmsnorm_bias_f32 (gpt-oss's o bias with the feed-forward's norm) leaves x + bias in x (add_bias's sum) and
    writes rmsnorm_f32's output of that sum, to the bit, on the float4 path and the scalar one; the planted fault (the
    norm of x without its bias) is a different output."""
    rng = np.random.default_rng([warp, 6])
    for rows, n in [(3, 7), (2, 576), (4, 2880)]:
        x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        weight = (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
        biased = x + bias
        for name, a in (("x", x), ("b", bias), ("w", weight), ("xb", biased)):
            a.tofile(tmp_path / name)
        block = row_block(n, rmsnorm.MAX_THREADS)
        run(harnesses, warp, "rmsnorm_f32", rows, block, n, 1e-6, tmp_path / "xb", tmp_path / "w", tmp_path / "normed")
        normed = np.fromfile(tmp_path / "normed", np.float32).reshape(rows, n)
        run(harnesses, warp, "rmsnorm_f32", rows, block, n, 1e-6, tmp_path / "x", tmp_path / "w", tmp_path / "plain")
        plain = np.fromfile(tmp_path / "plain", np.float32).reshape(rows, n)
        run(harnesses, warp, "rmsnorm_bias_f32", rows, block, n, 1e-6, tmp_path / "x", tmp_path / "b", tmp_path / "w",
            tmp_path / "o", tmp_path / "x_out")
        assert np.array_equal(np.fromfile(tmp_path / "x_out", np.float32).reshape(rows, n), biased), f"{rows}x{n}"
        got = np.fromfile(tmp_path / "o", np.float32).reshape(rows, n)
        assert np.array_equal(got, normed), f"{rows}x{n}"
        assert not np.array_equal(got, plain)


def check_and_f16_entries(harnesses, warp, tmp_path) -> None:
    """rmsnorm_f32_and_f16 and rmsnorm_bias_f32_and_f16 against rmsnorm_f32 and rmsnorm_f32_f16 of the same input, to
    the bit, on the float4 path and the scalar one (the test below)."""
    rng = np.random.default_rng([warp, 7])
    for rows, n in [(3, 7), (2, 576), (4, 2880)]:
        x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        weight = (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
        for name, a in (("x", x), ("b", bias), ("w", weight), ("xb", x + bias)):
            a.tofile(tmp_path / name)
        block = row_block(n, rmsnorm.MAX_THREADS)
        for entry, source, bias_file in (("rmsnorm_f32_and_f16", "x", "-"), ("rmsnorm_bias_f32_and_f16", "xb", "b")):
            run(harnesses, warp, "rmsnorm_f32", rows, block, n, 1e-6, tmp_path / source, tmp_path / "w",
                tmp_path / "want")
            run(harnesses, warp, "rmsnorm_f32_f16", rows, block, n, 1e-6, tmp_path / source, tmp_path / "w",
                tmp_path / "want16")
            bias_path = bias_file if bias_file == "-" else tmp_path / bias_file
            run(harnesses, warp, entry, rows, block, n, 1e-6, tmp_path / "x", bias_path, tmp_path / "w", tmp_path / "o",
                tmp_path / "o16", tmp_path / "x_out")
            got, got16 = np.fromfile(tmp_path / "o", np.float32), np.fromfile(tmp_path / "o16", np.uint16)
            assert np.array_equal(got, np.fromfile(tmp_path / "want", np.float32)), f"{entry} {rows}x{n}"
            assert np.array_equal(got16, np.fromfile(tmp_path / "want16", np.uint16)), f"{entry} f16 {rows}x{n}"
            x_out = np.fromfile(tmp_path / "x_out", np.float32)
            assert np.array_equal(x_out, (x + bias if bias_file != "-" else x).reshape(-1)), f"{entry} x {rows}x{n}"


def test_the_and_f16_entries_write_both_forms_of_the_same_values(harnesses, warp, tmp_path):
    """rmsnorm_f32_and_f16 and rmsnorm_bias_f32_and_f16 (a mixture's router reads the float32 rows, its experts on the
    matrix cores the f16 copy): the float32 rows are rmsnorm_f32's (or rmsnorm_bias_f32's, x left with its bias) to
    the bit, the f16 rows rmsnorm_f32_f16's of the same input."""
    check_and_f16_entries(harnesses, warp, tmp_path)


def test_a_copy_taken_before_the_weight_is_caught(tmp_path):
    """Planted: the float4 path's f16 copy written from x before the norm's scale and weight."""
    work = tmp_path / "planted"
    work.mkdir()
    harnesses = build_harnesses(work, edit={"rmsnorm.hip": lambda text: text.replace(
        "if (out16) put4<false>(out16, i, r);", "if (out16) put4<false>(out16, i, v);")}, warps=(32,))
    with pytest.raises(AssertionError, match="f16"):
        check_and_f16_entries(harnesses, 32, tmp_path)
