"""qmatvec: y[b, r] = sum_c W[r, c] * xq[b, c], the decode product on int8-quantized activations.

Kernels `qmatvec_<type>(y p, W p, x p, rows i, cols i, batch i)` for the types of WEIGHT_TYPES
(kernels/qmatvec.hip): W is [rows, cols] in its GGUF block layout, x float32 [batch, cols], y float32
[batch, rows]. Inside the kernel x is quantized per "slice" of 32 columns (the 32 weights a lane reads:
two runs of 16 columns that the format packs side by side, see slice_columns) to int8 codes q and one
float32 scale d = amax / 127, q = rint(x * (127 / amax)); the products are integer dot products of the
codes (as llama.cpp's MMVQ path does). That is the function `reference` computes, in float64, from x
quantized exactly as the kernel does: the result differs from the float product x @ W^T by the
quantization of x (about 0.4% of |x| per element, relative), which `quantization_error` states.

Geometry as matvec.py's: a warp takes four rows at a time when batch is 1 and one row otherwise (the
kernel loops over row groups, so any grid is correct); 256-thread blocks from BIG_MATRIX_ROW_GROUPS row
groups on, 64-thread blocks below. Batches of more than 4 take further passes over W (4 tokens per pass keeps every
AMD target free of spills; 8 spilled over 100 VGPRs on RDNA3/4).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.matvec import check_operands
from hipcore.ops.weight_formats import BLOCK_BYTES, BLOCK_ELEMENTS, dequantize_rows, host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "qmatvec"
SIGNATURE = "pppiii"
WEIGHT_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "mxfp4")
# The widest aligned load the kernel makes of W: 16-byte blocks for Q4_K / Q5_K, 2-byte words, or none (MXFP4: its
# 17-byte blocks read as the aligned words around them).
WEIGHT_ALIGNMENT = {"q4_k": 16, "q5_k": 16, "q6_k": 2, "q8_0": 2, "q4_0": 2, "mxfp4": 1}
BIG_MATRIX_ROW_GROUPS = 4096
SLICE = 32
U32 = 2.0**-24


def supports(weight_type: str) -> bool:
    return weight_type in WEIGHT_TYPES


# ---- the quantization of x ---------------------------------------------------------------------


def slice_columns(weight_type: str) -> np.ndarray:
    """The columns of each slice within one block of the format, slice after slice (32 each): the order in
    which the kernel's lanes see x. K-quants: 8 slices of a 256-column super-block; others: one block."""
    if weight_type in ("q4_k", "q5_k"):  # slice s: 64(s/2) + 16(s%2) + [0, 16) and the same + 32
        starts = [(64 * (s // 2) + 16 * (s % 2), 64 * (s // 2) + 16 * (s % 2) + 32) for s in range(8)]
    elif weight_type == "q6_k":  # slice s: 128(s/4) + 16(s%4) + [0, 16) and the same + 64
        starts = [(128 * (s // 4) + 16 * (s % 4), 128 * (s // 4) + 16 * (s % 4) + 64) for s in range(8)]
    else:
        starts = [(0, 16)]
    return np.concatenate([np.arange(a, a + 16) for pair in starts for a in pair])


def quantize_x(x: np.ndarray, weight_type: str) -> np.ndarray:
    """float64 [batch, cols]: x as the kernel quantizes it (codes times their slice's float32 scale)."""
    x = np.asarray(x, dtype=np.float32)
    batch, cols = x.shape
    block = max(SLICE, BLOCK_ELEMENTS[weight_type])
    order = (np.arange(0, cols, block)[:, None] + slice_columns(weight_type)[None, :]).reshape(-1)
    slices = x[:, order].reshape(batch, -1, SLICE)
    amax = np.abs(slices).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    # The kernel rounds the exact product x * inv once (a fused multiply-add); in float64 it is exact.
    q = np.rint(slices.astype(np.float64) * inv.astype(np.float64))
    out = np.empty((batch, cols), dtype=np.float64)
    out[:, order] = (q * d.astype(np.float64)).reshape(batch, cols)
    return out


def quantization_error(x: np.ndarray, weight_type: str) -> np.ndarray:
    """float64 [batch, cols]: |x - quantize_x(x)|, at most half a code step of x's slice."""
    return np.abs(np.asarray(x, dtype=np.float64) - quantize_x(x, weight_type))


# ---- reference -------------------------------------------------------------------------------


def _weights(w_raw: np.ndarray, weight_type: str, rows: int, cols: int) -> np.ndarray:
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    return dequantize_rows(raw, weight_type, cols, np.float64)


def reference(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [batch, rows]: W decoded exactly times x quantized as the kernel does, summed in float64."""
    xq = quantize_x(np.asarray(x, dtype=np.float32).reshape(-1, cols), weight_type)
    return xq @ _weights(w_raw, weight_type, rows, cols).T


def error_bound(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [batch, rows]: how far the kernel's float32 result may be from `reference`.

    The integer dot products are exact; what rounds is, per slice and row, the scaling of at most two
    integer sums (three roundings), then the sum over a lane's slices and the warp's shuffle reduction:
    fewer than cols / 32 + 10 roundings on the path of any term. Each is bounded by u = 2^-24 times the
    magnitudes summed: |x| times |w|, where for Q4_K / Q5_K the scaled codes d*sc*q and the mins
    dmin*m count separately (the kernel forms both sums before subtracting them), and so do Q4_1's and
    Q5_1's d*q and m (fused_qmatvec's formats).
    """
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    w = dequantize_rows(raw, weight_type, cols, np.float64)
    magnitude = np.abs(w)
    if weight_type in ("q4_k", "q5_k", "q4_1", "q5_1"):  # the mins alone: the same blocks with d set to 0
        blocks = raw.reshape(rows, -1, BLOCK_BYTES[weight_type]).copy()
        blocks[..., 0:2] = 0
        mins = dequantize_rows(blocks.reshape(rows, -1), weight_type, cols, np.float64)
        magnitude = np.abs(w - mins) + np.abs(mins)
    xq = np.abs(quantize_x(np.asarray(x, dtype=np.float32).reshape(-1, cols), weight_type))
    return (cols // SLICE + 10) * U32 * (xq @ magnitude.T) + 1e-30


# ---- host implementation (the cpu backend) ---------------------------------------------------


def _host(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, y: int, w: int, x: int, rows: int, cols: int, batch: int) -> None:
        raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
        xq = quantize_x(device.view(x, np.float32, (batch, cols)), weight_type).astype(np.float32)
        result = np.empty((batch, rows), dtype=np.float32)
        host_product(raw, weight_type, xq, cols, result)
        device.view(y, np.float32, (batch, rows))[:] = result

    return run


for _type in WEIGHT_TYPES:
    cpu_kernel(f"qmatvec_{_type}", SIGNATURE)(_host(_type))


# ---- launcher ----------------------------------------------------------------------------------


def geometry(arch: str, rows: int, batch: int) -> tuple[int, int]:
    """(grid, block) for `rows` rows and `batch` vectors on a device of architecture `arch`."""
    rows_per_warp = 4 if batch == 1 else 1
    groups = -(-rows // rows_per_warp)
    threads = 256 if groups >= BIG_MATRIX_ROW_GROUPS else 64
    warps_per_block = max(1, threads // wavefront_size(arch))
    return -(-groups // warps_per_block), threads


def launch(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, batch: int = 1, *,
           weight_type: str) -> None:
    """y[batch, rows] = quantize(x[batch, cols]) @ W[rows, cols]^T for W of `weight_type` (WEIGHT_TYPES)."""
    check_operands(OP, weight_type, WEIGHT_TYPES, y, w, x, rows, cols, batch, "batch", WEIGHT_ALIGNMENT)
    grid, block = geometry(device.arch, rows, batch)
    kernel = get_kernel(device, OP, f"{OP}_{weight_type}", SIGNATURE)
    kernel.launch(grid, block, (y, w, x, rows, cols, batch), stream=stream)
