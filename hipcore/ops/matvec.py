"""matvec: y[b, r] = sum_c W[r, c] * x[b, c] with W in its GGUF block layout (the decode hot path).

Kernels `matvec_<type>(y p, W p, x p, rows i, cols i, batch i)` for type q4_1, q8_0, f16, f32
(kernels/matvec.hip): W is [rows, cols] row-major in GGUF blocks of 32 (Q4_1: {half d, half m,
uint8 qs[16]}, 20 bytes; Q8_0: {half d, int8 qs[32]}, 34 bytes) or plain halves; x is float32
[batch, cols], y float32 [batch, rows]. cols must be a multiple of 32; y must not overlap x or W.

Geometry: a warp takes two rows at a time when batch is 1 and one row otherwise (the kernel loops
over row groups, so any grid is correct). Large matrices get 256-thread blocks; small ones 64-thread
blocks, so that their few warps spread over as many compute units as possible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_disjoint, check_memory, check_sizes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "matvec"
SIGNATURE = "pppiii"
WEIGHT_TYPES = ("q4_1", "q8_0", "f16", "f32")
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # per 32 weights
WEIGHT_ALIGNMENT = {"q4_1": 4, "q8_0": 2, "f16": 16, "f32": 16}  # the widest aligned load the kernel makes of W
X_ALIGNMENT = 16  # x is read with 16-byte loads
BIG_MATRIX_ROW_GROUPS = 4096  # from here on 256-thread blocks, below it 64-thread ones
HOST_ROWS_PER_CHUNK = 4096  # the host kernel dequantizes this many rows at a time


def row_bytes(weight_type: str, cols: int) -> int:
    if weight_type in ("f16", "f32"):
        return cols * (2 if weight_type == "f16" else 4)
    return cols // 32 * BLOCK_BYTES[weight_type]


# ---- reference ---------------------------------------------------------------------------------


def reference(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [batch, rows]: W decoded exactly (in float64) and the products summed in float64.

    The decoder is this module's numpy one, checked against the gguf package's dequantizer in the
    tests; it keeps the reference usable where gguf is not installed (the GPU test machines).
    """
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    w = dequantize_rows(raw, weight_type, cols, np.float64)
    return np.asarray(x, dtype=np.float64).reshape(-1, cols) @ w.T


# ---- host implementation (the cpu backend) ---------------------------------------------------


def dequantize_rows(raw: np.ndarray, weight_type: str, cols: int, dtype: type = np.float32) -> np.ndarray:
    """[rows, cols] of `dtype` from raw bytes [rows, row_bytes]. In float64 the values are exact (halves
    times small integers); in float32 d*q+m is rounded twice (within 2 ulp). Written independently of
    the gguf package's dequantizer, which the tests check it against."""
    rows = raw.shape[0]
    if weight_type in ("f16", "f32"):
        return raw.view(np.float16 if weight_type == "f16" else np.float32).astype(dtype, copy=False).reshape(rows, cols)
    blocks = raw.reshape(rows, cols // 32, BLOCK_BYTES[weight_type])
    d = blocks[..., 0:2].copy().view(np.float16).astype(dtype)  # [rows, nb, 1]
    if weight_type == "q8_0":
        q = blocks[..., 2:34].view(np.int8).astype(dtype)
        return (d * q).reshape(rows, cols)
    m = blocks[..., 2:4].copy().view(np.float16).astype(dtype)
    qs = blocks[..., 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(dtype)  # elements 0..15, then 16..31
    return (d * q + m).reshape(rows, cols)


def _host(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, y: int, w: int, x: int, rows: int, cols: int, batch: int) -> None:
        stride = row_bytes(weight_type, cols)
        raw = device.view(w, np.uint8, (rows, stride))
        xs = device.view(x, np.float32, (batch, cols))
        result = np.empty((batch, rows), dtype=np.float32)
        if weight_type == "f32":  # already decoded: one BLAS call, no temporary
            np.matmul(xs, raw.view(np.float32).T, out=result)
            device.view(y, np.float32, (batch, rows))[:] = result
            return
        for start in range(0, rows, HOST_ROWS_PER_CHUNK):  # bounded temporary memory for big matrices
            chunk = dequantize_rows(raw[start:start + HOST_ROWS_PER_CHUNK], weight_type, cols)
            result[:, start:start + chunk.shape[0]] = xs @ chunk.T
        device.view(y, np.float32, (batch, rows))[:] = result

    return run


for _type in WEIGHT_TYPES:
    cpu_kernel(f"matvec_{_type}", SIGNATURE)(_host(_type))


# ---- launcher ----------------------------------------------------------------------------------


def geometry(arch: str, rows: int, batch: int) -> tuple[int, int]:
    """(grid, block) for `rows` rows and `batch` vectors on a device of architecture `arch`."""
    rows_per_warp = 2 if batch == 1 else 1
    groups = -(-rows // rows_per_warp)
    threads = 256 if groups >= BIG_MATRIX_ROW_GROUPS else 64
    warps_per_block = max(1, threads // wavefront_size(arch))
    return -(-groups // warps_per_block), threads


def launch(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, batch: int = 1, *,
           weight_type: str) -> None:
    """y[batch, rows] = x[batch, cols] @ W[rows, cols]^T for W of `weight_type` ('q4_1', 'q8_0', 'f16')."""
    op = f"matvec_{weight_type}"
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"matvec: no kernel for weight type {weight_type!r}; have {', '.join(WEIGHT_TYPES)}")
    check_sizes(op, rows=rows, cols=cols, batch=batch)
    if cols % 32:
        raise ValueError(f"{op}: cols must be a multiple of 32 (the GGUF block size), got {cols}")
    check_memory(op, "W", w, rows * row_bytes(weight_type, cols), WEIGHT_ALIGNMENT[weight_type])
    check_memory(op, "x", x, batch * cols * 4, X_ALIGNMENT)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    check_disjoint(op, ("y", y, batch * rows * 4), ("W", w, rows * row_bytes(weight_type, cols)))
    grid, block = geometry(device.arch, rows, batch)
    kernel = get_kernel(device, OP, op, SIGNATURE)
    kernel.launch(grid, block, (y, w, x, rows, cols, batch), stream=stream)
