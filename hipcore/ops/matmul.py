"""matmul: y[t, r] = sum_c W[r, c] * x[t, c] with W in its GGUF block layout (prompt evaluation).

Kernels `matmul_<type>(y p, W p, x p, rows i, cols i, n_tokens i, tile_tokens i)` for the types of
WEIGHT_TYPES (kernels/matmul.hip); the same layouts and requirements as matvec: W [rows, cols] in GGUF
blocks (hipcore/ops/weight_formats.py), x float32 [n_tokens, cols], y float32 [n_tokens, rows]; cols a
multiple of 32 (256 for the K-quants); y apart from x and W.

Geometry: 256-thread workgroups, each computing tiles of TILE_ROWS rows x tile_tokens tokens (a
grid-stride loop over the tiles, so any grid is correct). tile_tokens is 16, 32 or 64 (pick_tile_tokens):
the smallest that holds every token, so a short batch computes no padding; and for a long batch 64
(each value loaded from shared memory feeds 16 multiply-adds), unless that leaves fewer than
BUSY_WORKGROUPS workgroups, when smaller tiles spread the work over more compute units (an H100 has
132; SmolLM2's 576-row projections at 512 tokens are only 72 tiles of 64 x 64).

kernel_choice.project, what a model calls, takes matvec up to MATVEC_MAX_TOKENS tokens and matmul beyond (where
the matrix cores do not take the product).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import matvec
from hipcore.ops.launch_checks import INT32_MAX
from hipcore.ops.weight_formats import dequantize_rows, host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "matmul"
SIGNATURE = "pppiiii"
# matvec's and MXFP4 (whose few-token products take qmatvec: kernel_choice.single_product_op).
WEIGHT_TYPES = matvec.WEIGHT_TYPES + ("mxfp4",)
# The widest aligned load the kernel makes of W (MXFP4: none, its blocks read as the aligned words around them).
WEIGHT_ALIGNMENT = {**matvec.WEIGHT_ALIGNMENT, "mxfp4": 1}
THREADS = 256  # the kernel's thread layout is written for exactly this
TILE_ROWS = 64
TILE_TOKENS = (16, 32, 64)
BUSY_WORKGROUPS = 128  # about one per compute unit of the GPUs this is tuned on (H100/H200: 132 SMs)
MAX_GRID = 1 << 20  # enough workgroups to fill any GPU; the kernel loops over the tiles beyond
# Up to this many tokens matvec reads W once (it takes 8 tokens per pass over W) and is as fast as W can
# be read; beyond it matvec reads W again per 8 tokens, while matmul reads each W tile once per tile of
# tokens. See scripts/bench/measure_matmul.py, which measures the crossover.
MATVEC_MAX_TOKENS = 8


# ---- reference ---------------------------------------------------------------------------------


def reference(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [n_tokens, rows]: W decoded exactly (in float64) and the products summed in float64."""
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    return np.asarray(x, dtype=np.float64).reshape(-1, cols) @ dequantize_rows(raw, weight_type, cols, np.float64).T


error_bound = matvec.error_bound  # the same sums of cols products: one bound


# ---- host implementation (the cpu backend) ---------------------------------------------------


def _host(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, y: int, w: int, x: int, rows: int, cols: int, n_tokens: int,
            tile_tokens: int) -> None:
        raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
        result = np.empty((n_tokens, rows), dtype=np.float32)
        host_product(raw, weight_type, device.view(x, np.float32, (n_tokens, cols)), cols, result)
        device.view(y, np.float32, (n_tokens, rows))[:] = result

    return run


for _type in WEIGHT_TYPES:
    cpu_kernel(f"matmul_{_type}", SIGNATURE)(_host(_type))


# ---- launcher ----------------------------------------------------------------------------------


def tile_count(rows: int, n_tokens: int, tile_tokens: int) -> int:
    return -(-rows // TILE_ROWS) * -(-n_tokens // tile_tokens)


def pick_tile_tokens(rows: int, n_tokens: int) -> int:
    """Tokens per tile: the smallest of TILE_TOKENS that holds n_tokens, else the largest; then halved
    while the grid would have fewer than BUSY_WORKGROUPS tiles (see the module docstring)."""
    tile = next((t for t in TILE_TOKENS if t >= n_tokens), TILE_TOKENS[-1])
    while tile > TILE_TOKENS[0] and tile_count(rows, n_tokens, tile) < BUSY_WORKGROUPS:
        tile //= 2
    return tile


def geometry(rows: int, n_tokens: int, tile_tokens: int | None = None) -> tuple[int, int, int]:
    """(grid, block, tile_tokens) for y[n_tokens, rows]; tile_tokens as given, or pick_tile_tokens'."""
    tile = pick_tile_tokens(rows, n_tokens) if tile_tokens is None else tile_tokens
    if tile not in TILE_TOKENS:
        raise ValueError(f"matmul: tile_tokens must be one of {TILE_TOKENS}, got {tile!r}")
    return min(tile_count(rows, n_tokens, tile), MAX_GRID), THREADS, tile


def launch(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, n_tokens: int, *,
           weight_type: str, tile_tokens: int | None = None) -> None:
    """y[n_tokens, rows] = x[n_tokens, cols] @ W[rows, cols]^T for W of `weight_type` (one of WEIGHT_TYPES).
    tile_tokens overrides the launcher's choice of tile (16, 32 or 64 tokens): for measurements."""
    matvec.check_operands(OP, weight_type, WEIGHT_TYPES, y, w, x, rows, cols, n_tokens, "n_tokens", WEIGHT_ALIGNMENT)
    grid, block, tile = geometry(rows, n_tokens, tile_tokens)
    if tile_count(rows, n_tokens, tile) > INT32_MAX:  # the kernel counts tiles in int32
        raise ValueError(f"matmul_{weight_type}: {rows} rows x {n_tokens} tokens is more tiles than the kernel counts")
    kernel = get_kernel(device, OP, f"{OP}_{weight_type}", SIGNATURE)
    kernel.launch(grid, block, (y, w, x, rows, cols, n_tokens, tile), stream=stream)

