"""MXFP4 (GGML type 39) in the dense products: qmatvec_mxfp4 and fused_qmatvec's `_1m` / `_nm` entries (decode),
matmul_mxfp4 and matmul_mma_mxfp4 (prompts). Their ordinary checks against the float64 references and bounds at wave
32 and 64 are the ops' own, which take every type of WEIGHT_TYPES, MXFP4 among them (tests/test_kernels_emulated_qmatvec.py,
test_kernels_emulated_fused_qmatvec.py, test_kernels_emulated.py's test_matmul, test_kernels_emulated_mma.py on every
matrix-core path). Here the planted faults those checks must catch: the FP4 sign bit read from the wrong bit in each of
block_format_mxfp4.h's two decodes (int8_values for dp4a, decode8 for the float tiles), each kernel reading only its
own; and a dense product's rows starting at every byte alignment (17-byte blocks), as rows inside a buffer of q|k|v
do."""

from __future__ import annotations

import numpy as np

from hipcore.ops import fused_qmatvec, fused_qmatvec_geometry, matmul, matmul_mma, qmatvec
from support.emulated_kernels import ARCH_FOR_WARP, build_harnesses, nvidia_harness_with, run, run_mma
from support.weight_samples import random_weights

HEADER = "block_format_mxfp4.h"
DP4A_SIGN = ("((codes >> 3) & kByteOnes)", "((codes >> 2) & kByteOnes)")  # int8_values: qmatvec's (and the experts')
TILE_SIGN = ("(code & 8u) ? -magnitude", "(code & 4u) ? -magnitude")  # decode8: matmul's and matmul_mma's


def qmatvec_excess(harness, rows: int, cols: int, batch: int, rng, tmp_path) -> float:
    """max |got - want| / qmatvec.error_bound of qmatvec_mxfp4 at wave 32 (<= 1 passes)."""
    raw = random_weights(rng, "mxfp4", rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    raw.tofile(tmp_path / "w")
    x.tofile(tmp_path / "x")
    grid, threads = qmatvec.geometry(ARCH_FOR_WARP[32], rows, batch)
    run(harness, 32, "qmatvec_mxfp4", grid, threads, rows, cols, batch, tmp_path / "w", tmp_path / "x", tmp_path / "y")
    got = np.fromfile(tmp_path / "y", np.float32).reshape(batch, rows)
    want = qmatvec.reference(raw, "mxfp4", x, rows, cols)
    return float(np.max(np.abs(got - want) / qmatvec.error_bound(raw, "mxfp4", x, rows, cols)))


def fused_add_excess(harness, rows: int, cols: int, batch: int, rng, tmp_path) -> float:
    """max |got - want| / bound of fused_qmatvec's qmatvec_add for MXFP4 at wave 32 (y += x @ W^T; <= 1 passes): the
    bound qmatvec.error_bound's, twice over, and one rounding of the add."""
    raw = random_weights(rng, "mxfp4", rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    y0 = rng.standard_normal((batch, rows)).astype(np.float32)
    for name, array in (("w", raw), ("x", x), ("y", y0)):
        array.tofile(tmp_path / name)
    suffix = fused_qmatvec.entry_suffix(batch, ("mxfp4",))
    geo = fused_qmatvec_geometry.geometry(ARCH_FOR_WARP[32], "qmatvec_add", suffix[0], cols, rows)
    run(harness, 32, f"qmatvec_add_{suffix}", geo.grid, geo.block, fused_qmatvec.TYPE_CODES["mxfp4"], rows, cols, batch,
        tmp_path / "w", tmp_path / "x", tmp_path / "y", tmp_path / "o", geo.k_split)
    got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
    want = fused_qmatvec.reference_add(raw, "mxfp4", x, y0, rows, cols)
    bound = 2 * qmatvec.error_bound(raw, "mxfp4", x, rows, cols) + 2.0**-24 * np.abs(want)
    return float(np.max(np.abs(got - want) / bound))


def matmul_excess(harness, rows: int, cols: int, n_tokens: int, rng, tmp_path) -> float:
    """max |got - want| / matmul.error_bound of matmul_mxfp4 at wave 32 (<= 1 passes)."""
    raw = random_weights(rng, "mxfp4", rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    raw.tofile(tmp_path / "w")
    x.tofile(tmp_path / "x")
    grid, threads, tile = matmul.geometry(rows, n_tokens)
    run(harness, 32, "matmul_mxfp4", grid, threads, rows, cols, n_tokens, tile, tmp_path / "w", tmp_path / "x",
        tmp_path / "y")
    got = np.fromfile(tmp_path / "y", np.float32).reshape(n_tokens, rows)
    want = matmul.reference(raw, "mxfp4", x, rows, cols)
    return float(np.max(np.abs(got - want) / matmul.error_bound(raw, "mxfp4", x, rows, cols)))


def mma_excess(harness, rows: int, cols: int, n_tokens: int, rng, tmp_path) -> float:
    """max |got - want| / matmul_mma.error_bound of matmul_mma_mxfp4 on the harness (<= 1 passes)."""
    raw = random_weights(rng, "mxfp4", rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    raw.tofile(tmp_path / "w")
    x.tofile(tmp_path / "x")
    grid, threads, tile, splits = matmul_mma.geometry(rows, n_tokens, cols=cols)
    assert matmul_mma.entry_name("sm_90", "mxfp4", tile, n_tokens, cols=cols) == "matmul_mma_mxfp4"  # no fragments
    run_mma(harness, "matmul_mma_mxfp4", grid, threads, rows, cols, n_tokens, tile, splits, 0, 0, tmp_path / "w",
            tmp_path / "x", "-", tmp_path / "y", tmp_path / "ws")
    got = np.fromfile(tmp_path / "y", np.float32).reshape(n_tokens, rows)
    want = matmul_mma.reference(raw, "mxfp4", x, rows, cols)
    return float(np.max(np.abs(got - want) / matmul_mma.error_bound(raw, "mxfp4", x, rows, cols)))


def test_rows_at_every_byte_alignment_match(harnesses, tmp_path):
    """Rows of 1, 3 and 5 blocks (17, 51, 85 bytes): row r starts at 17 r bytes, every alignment mod 4 in turn."""
    rng = np.random.default_rng(41)
    for cols in (32, 96, 160):
        assert qmatvec_excess(harnesses, 9, cols, 1, rng, tmp_path) <= 1.0, cols
        assert qmatvec_excess(harnesses, 9, cols, 3, rng, tmp_path) <= 1.0, cols
        assert matmul_excess(harnesses, 9, cols, 11, rng, tmp_path) <= 1.0, cols
        assert fused_add_excess(harnesses, 9, cols, 1, rng, tmp_path) <= 1.0, cols
        assert fused_add_excess(harnesses, 9, cols, 3, rng, tmp_path) <= 1.0, cols


def test_a_misread_sign_bit_is_caught_in_both_decodes(tmp_path):
    """One harness with both faults planted: qmatvec and fused_qmatvec read int8_values alone and matmul decode8
    alone, so each kernel's failure is its own decode's."""
    edit = {HEADER: lambda text: text.replace(*DP4A_SIGN).replace(*TILE_SIGN)}
    harness = build_harnesses(tmp_path, edit=edit, warps=(32,))
    rng = np.random.default_rng(43)
    assert qmatvec_excess(harness, 33, 256, 1, rng, tmp_path) > 10.0, "the dp4a decode's sign fault went unnoticed"
    assert fused_add_excess(harness, 33, 256, 1, rng, tmp_path) > 10.0, "fused_qmatvec's sign fault went unnoticed"
    assert matmul_excess(harness, 33, 256, 20, rng, tmp_path) > 10.0, "the float tiles' sign fault went unnoticed"


def test_a_misread_sign_bit_is_caught_on_the_matrix_cores(tmp_path):
    harness = nvidia_harness_with(*TILE_SIGN, tmp_path)
    rng = np.random.default_rng(47)
    assert mma_excess(harness, 64, 256, 40, rng, tmp_path) > 10.0, "matmul_mma's sign fault went unnoticed"
