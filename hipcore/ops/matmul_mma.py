"""matmul_mma: y[t, r] = sum_c W[r, c] * x[t, c] on the matrix cores (prompt steps and large batches).

Kernels `matmul_mma_<type>(y p, W p, x p, rows i, cols i, n_tokens i, tile_tokens i)` for the types of
WEIGHT_TYPES (kernels/matmul_mma.hip); operands, layouts and requirements as matmul's. W is decoded to f16
in shared memory, x rounded to f16, and 16x16x16 f16 products accumulate in f32 on the matrix instruction
hip_compat.h picks for the target (mma.sync on NVIDIA sm_80+, MFMA on CDNA, WMMA on RDNA3/RDNA4; plain
FMA elsewhere, where `has_matrix_cores` is false and `project` keeps matmul's FP32 kernel instead).

Geometry: 256-thread workgroups, each computing tiles of TILE_ROWS rows x tile_tokens tokens (a
grid-stride loop over the tiles); tile_tokens is 64, or 32 when the batch fits in 32 or 64-token tiles
would leave fewer than matmul.BUSY_WORKGROUPS workgroups.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from hipcore.ops import matmul, matvec
from hipcore.ops.launch_checks import INT32_MAX
from hipcore.ops.weight_formats import dequantize_rows, host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.kernels import get_kernel

OP = "matmul_mma"
SIGNATURE = "pppiiii"
WEIGHT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
THREADS = 256  # the kernel's warp tiling is written for exactly this
TILE_ROWS = 128
TILE_TOKENS = (32, 64)
MAX_GRID = 1 << 20
# From this many tokens on `project` takes the matrix cores where the device has them (measured on an
# NVIDIA H100 80GB HBM3 on the Llama-3.1-8B shapes against matmul's FP32 kernel: docs/benchmarks.md).
MMA_MIN_TOKENS = matmul.MATVEC_MAX_TOKENS + 1
F16_MAX = 65504.0
U16 = 2.0**-11  # f16 unit roundoff
F16_HALF_SPACING = 2.0**-25  # half the spacing of f16's subnormals: the absolute rounding error near 0

_MATRIX_CORE_ARCH = re.compile(r"sm_(\d+)[af]?$|gfx(908|90a|94[012]|950|11[0-9a-f]{2}|12[0-9a-f]{2})$")


def has_matrix_cores(arch: str) -> bool:
    """Whether kernels/matmul_mma.hip runs on matrix instructions on `arch` (hip_compat.h's RF_MMA_KIND)."""
    m = _MATRIX_CORE_ARCH.match(arch)
    return bool(m) and (m.group(1) is None or int(m.group(1)) >= 80)


# ---- reference ---------------------------------------------------------------------------------

reference = matmul.reference


def error_bound(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [n_tokens, rows]: how far the kernel's result may be from `reference`.

    W (decoded in float32) and x are each rounded once to f16: |w' - w| <= u16 |w| + h (u16 = 2^-11, h =
    2^-25 where f16 is subnormal), so |w'x' - wx| <= (2 u16 + u16^2) |w x| + h (|x| + |w|) (1 + u16) + h^2.
    The products of f16 are exact in f32; their sum of `cols` terms passes each through at most cols
    roundings, and matrix units may truncate rather than round: (cols + 4) * 2^-23 relative to sum |w'x'|.
    A mis-decoded weight or a wrong fragment lane is off by O(|w x|), far above it.
    """
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    w_abs = np.abs(dequantize_rows(raw, weight_type, cols, np.float64))
    x_abs = np.abs(np.asarray(x, dtype=np.float64).reshape(-1, cols))
    wx = x_abs @ w_abs.T
    rounding = (2 * U16 + U16 * U16) * wx + F16_HALF_SPACING * (1 + U16) * (x_abs.sum(1)[:, None] + w_abs.sum(1)[None, :])
    summing = (cols + 4) * 2.0**-23 * (1 + 3 * U16) * wx
    return 1.01 * (rounding + summing) + 1e-30


# ---- host implementation (the cpu backend: matmul's float32 product) ---------------------------


def _host(weight_type: str):
    def run(device: CpuDevice, grid, block, y: int, w: int, x: int, rows: int, cols: int, n_tokens: int,
            tile_tokens: int) -> None:
        raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
        result = np.empty((n_tokens, rows), dtype=np.float32)
        host_product(raw, weight_type, device.view(x, np.float32, (n_tokens, cols)), cols, result)
        device.view(y, np.float32, (n_tokens, rows))[:] = result

    return run


for _type in WEIGHT_TYPES:
    cpu_kernel(f"{OP}_{_type}", SIGNATURE)(_host(_type))


# ---- launcher ----------------------------------------------------------------------------------


def tile_count(rows: int, n_tokens: int, tile_tokens: int) -> int:
    return -(-rows // TILE_ROWS) * -(-n_tokens // tile_tokens)


def pick_tile_tokens(rows: int, n_tokens: int) -> int:
    """32 tokens when they hold the batch or 64-token tiles would leave too few workgroups, else 64."""
    if n_tokens <= 32 or tile_count(rows, n_tokens, 64) < matmul.BUSY_WORKGROUPS:
        return 32
    return 64


def geometry(rows: int, n_tokens: int, tile_tokens: int | None = None) -> tuple[int, int, int]:
    """(grid, block, tile_tokens) for y[n_tokens, rows]; tile_tokens as given, or pick_tile_tokens'."""
    tile = pick_tile_tokens(rows, n_tokens) if tile_tokens is None else tile_tokens
    if tile not in TILE_TOKENS:
        raise ValueError(f"{OP}: tile_tokens must be one of {TILE_TOKENS}, got {tile!r}")
    return min(tile_count(rows, n_tokens, tile), MAX_GRID), THREADS, tile


def supports(weight_type: str) -> bool:
    return weight_type in WEIGHT_TYPES


def launch(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, n_tokens: int, *,
           weight_type: str, tile_tokens: int | None = None) -> None:
    """y[n_tokens, rows] = x[n_tokens, cols] @ W[rows, cols]^T on the matrix cores, W of `weight_type`."""
    matvec.check_operands(OP, weight_type, WEIGHT_TYPES, y, w, x, rows, cols, n_tokens, "n_tokens")
    grid, block, tile = geometry(rows, n_tokens, tile_tokens)
    if tile_count(rows, n_tokens, tile) > INT32_MAX:  # the kernel counts tiles in int32
        raise ValueError(f"{OP}_{weight_type}: {rows} rows x {n_tokens} tokens is more tiles than the kernel counts")
    kernel = get_kernel(device, OP, f"{OP}_{weight_type}", SIGNATURE)
    kernel.launch(grid, block, (y, w, x, rows, cols, n_tokens, tile), stream=stream)


def project(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, n_tokens: int, *,
            weight_type: str) -> None:
    """matmul.project, with the matrix cores for MMA_MIN_TOKENS tokens and more where the device has them
    and the format is one of WEIGHT_TYPES."""
    if n_tokens >= MMA_MIN_TOKENS and supports(weight_type) and has_matrix_cores(device.arch):
        launch(device, stream, y, w, x, rows, cols, n_tokens, weight_type=weight_type)
    else:
        matmul.project(device, stream, y, w, x, rows, cols, n_tokens, weight_type=weight_type)
