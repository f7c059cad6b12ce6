"""rmsnorm: out = x / sqrt(mean(x^2) + eps) * weight, row by row (llama.cpp's RMS_NORM then MUL).

Kernel `rmsnorm_f32(out p, x p, weight p, n i, eps f)` (kernels/rmsnorm.hip): x and out are float32
[rows, n], weight float32 [n]; one block per row (grid = rows), so the row count is the grid's.
`out` may be `x`. `rmsnorm_f32_f16` (the same arguments) writes out as f16, rounded to nearest: the x of
matmul_mma's x16 products (launch's out_f16); out must not overlap x there. `rmsnorm_add_f32` (the same arguments)
adds the normalized rows to out, float32 (launch_add: Gemma's norm of a product before the residual add; the kernel
may fuse the weight's product with the add, one rounding fewer than a norm launch then an add launch, which the
host reference does); out must not overlap x. `rmsnorm_bias_f32(out p, x p, bias p, weight p, n i, eps f)` first adds
bias float32 [n] to every row of x in place, as add_bias adds it, then normalizes the sum into out (launch_bias:
gpt-oss's o bias on the residual stream with the feed-forward's norm, one launch where there were two, the same
bits); out must not overlap x. `rmsnorm_f32_and_f16(out p, out16 p, x p, weight p, n i, eps f)` and
`rmsnorm_bias_f32_and_f16(out p, out16 p, x p, bias p, weight p, n i, eps f)` write rmsnorm_f32's (rmsnorm_bias_f32's)
float32 rows and, from the same values, rmsnorm_f32_f16's f16 rows into out16 (launch's and launch_bias's `also_f16`:
a mixture's router reads the float32 rows, its experts on the matrix cores the f16 ones); out16 overlaps neither.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_disjoint, check_memory, check_sizes, row_block
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "rmsnorm"
ENTRY = "rmsnorm_f32"
ENTRY_F16 = "rmsnorm_f32_f16"
ENTRY_ADD = "rmsnorm_add_f32"
ENTRY_BIAS = "rmsnorm_bias_f32"
ENTRY_AND_F16 = "rmsnorm_f32_and_f16"
ENTRY_BIAS_AND_F16 = "rmsnorm_bias_f32_and_f16"
SIGNATURE = "pppif"
SIGNATURE_BIAS = "ppppif"
SIGNATURE_AND_F16 = "ppppif"
SIGNATURE_BIAS_AND_F16 = "pppppif"
MAX_THREADS = 256  # the kernel's __launch_bounds__


def reference(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """float64 [rows, n] (sums of squares in float64)."""
    x64 = np.asarray(x, dtype=np.float64)
    scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + float(np.float32(eps)))
    return x64 * scale * np.asarray(weight, dtype=np.float64)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, weight: int, n: int, eps: float) -> None:
    rows = grid[0]
    result = reference(device.view(x, np.float32, (rows, n)), device.view(weight, np.float32, n), eps)
    device.view(out, np.float32, (rows, n))[:] = result  # computed in full first: out may be x


@cpu_kernel(ENTRY_F16, SIGNATURE)
def _host_f16(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, weight: int, n: int, eps: float) -> None:
    rows = grid[0]
    result = reference(device.view(x, np.float32, (rows, n)), device.view(weight, np.float32, n), eps)
    device.view(out, np.float16, (rows, n))[:] = result.astype(np.float32)  # float32 first, as the kernel


@cpu_kernel(ENTRY_ADD, SIGNATURE)
def _host_add(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, weight: int, n: int, eps: float) -> None:
    rows = grid[0]
    normed = reference(device.view(x, np.float32, (rows, n)), device.view(weight, np.float32, n), eps)
    view = device.view(out, np.float32, (rows, n))
    view[:] = view + normed.astype(np.float32)  # rounded as the norm's float32 output, then the float32 sum


@cpu_kernel(ENTRY_BIAS, SIGNATURE_BIAS)
def _host_bias(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, bias: int, weight: int, n: int,
               eps: float) -> None:
    rows = grid[0]
    view = device.view(x, np.float32, (rows, n))
    view += device.view(bias, np.float32, n)[None, :]  # add_bias's float32 sum, in place
    device.view(out, np.float32, (rows, n))[:] = reference(view, device.view(weight, np.float32, n), eps)


@cpu_kernel(ENTRY_AND_F16, SIGNATURE_AND_F16)
def _host_and_f16(device: CpuDevice, grid: Dim3, block: Dim3, out: int, out16: int, x: int, weight: int, n: int,
                  eps: float) -> None:
    _host(device, grid, block, out, x, weight, n, eps)
    _copy_f16(device, grid[0], n, out, out16)


@cpu_kernel(ENTRY_BIAS_AND_F16, SIGNATURE_BIAS_AND_F16)
def _host_bias_and_f16(device: CpuDevice, grid: Dim3, block: Dim3, out: int, out16: int, x: int, bias: int, weight: int,
                       n: int, eps: float) -> None:
    _host_bias(device, grid, block, out, x, bias, weight, n, eps)
    _copy_f16(device, grid[0], n, out, out16)


def _copy_f16(device: CpuDevice, rows: int, n: int, out: int, out16: int) -> None:
    """The float32 rows just written, rounded to f16 (the kernel rounds the same float32 values)."""
    device.view(out16, np.float16, (rows, n))[:] = device.view(out, np.float32, (rows, n))


def _check_f16_copy(entry: str, also_f16: Any, rows: int, n: int, *others) -> None:
    check_memory(OP, "also_f16", also_f16, rows * n * 2)
    for name, buf in others:
        check_disjoint(entry, ("also_f16", also_f16, rows * n * 2), (name, buf, rows * n * 4))


def launch_bias(device: Device, stream: Stream | None, out: Any, x: Any, bias: Any, weight: Any, rows: int, n: int,
                eps: float, *, also_f16: Any = None) -> None:
    """x += bias (every row, in place), then out = rmsnorm(x) * weight; `rows` rows of `n` floats (out and x apart).
    also_f16: a buffer of rows x n f16 that also gets the result, rounded (rmsnorm_bias_f32_and_f16), or None."""
    check_sizes(OP, rows=rows, n=n)
    for name, buf in (("out", out), ("x", x)):
        check_memory(OP, name, buf, rows * n * 4)
    for name, buf in (("bias", bias), ("weight", weight)):
        check_memory(OP, name, buf, n * 4)
    check_disjoint(ENTRY_BIAS, ("out", out, rows * n * 4), ("x", x, rows * n * 4))
    if also_f16 is not None:
        _check_f16_copy(ENTRY_BIAS_AND_F16, also_f16, rows, n, ("out", out), ("x", x))
        kernel = get_kernel(device, OP, ENTRY_BIAS_AND_F16, SIGNATURE_BIAS_AND_F16, programmatic=True)
        kernel.launch(rows, row_block(n, MAX_THREADS), (out, also_f16, x, bias, weight, n, eps), stream=stream)
        return
    kernel = get_kernel(device, OP, ENTRY_BIAS, SIGNATURE_BIAS, programmatic=True)
    kernel.launch(rows, row_block(n, MAX_THREADS), (out, x, bias, weight, n, eps), stream=stream)


def launch_add(device: Device, stream: Stream | None, out: Any, x: Any, weight: Any, rows: int, n: int,
               eps: float) -> None:
    """out += rmsnorm(x) * weight, `rows` rows of `n` floats (out and x apart)."""
    check_sizes(OP, rows=rows, n=n)
    for name, buf in (("out", out), ("x", x)):
        check_memory(OP, name, buf, rows * n * 4)
    check_memory(OP, "weight", weight, n * 4)
    check_disjoint(ENTRY_ADD, ("out", out, rows * n * 4), ("x", x, rows * n * 4))
    kernel = get_kernel(device, OP, ENTRY_ADD, SIGNATURE, programmatic=True)
    kernel.launch(rows, row_block(n, MAX_THREADS), (out, x, weight, n, eps), stream=stream)


def launch(device: Device, stream: Stream | None, out: Any, x: Any, weight: Any, rows: int, n: int, eps: float, *,
           out_f16: bool = False, also_f16: Any = None) -> None:
    """Normalize `rows` rows of `n` floats of x into out (float32, or f16 with out_f16). also_f16: a buffer of rows x
    n f16 that also gets the float32 result, rounded (rmsnorm_f32_and_f16; not with out_f16), or None."""
    check_sizes(OP, rows=rows, n=n)
    check_memory(OP, "out", out, rows * n * (2 if out_f16 else 4))
    check_memory(OP, "x", x, rows * n * 4)
    check_memory(OP, "weight", weight, n * 4)
    if also_f16 is not None:
        if out_f16:
            raise ValueError(f"{OP}: also_f16 copies a float32 output; out_f16 writes f16 only")
        _check_f16_copy(ENTRY_AND_F16, also_f16, rows, n, ("out", out), ("x", x))
        kernel = get_kernel(device, OP, ENTRY_AND_F16, SIGNATURE_AND_F16, programmatic=True)
        kernel.launch(rows, row_block(n, MAX_THREADS), (out, also_f16, x, weight, n, eps), stream=stream)
        return
    if out_f16:
        check_disjoint(ENTRY_F16, ("out", out, rows * n * 2), ("x", x, rows * n * 4))
    kernel = get_kernel(device, OP, ENTRY_F16 if out_f16 else ENTRY, SIGNATURE, programmatic=True)
    kernel.launch(rows, row_block(n, MAX_THREADS), (out, x, weight, n, eps), stream=stream)
