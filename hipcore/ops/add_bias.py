"""add_bias: x[row] += bias, in place, for every row (the q/k/v biases of qwen2 after their products).

Kernel `add_bias_f32(x p, bias p, rows i, n i)` (kernels/add_bias.hip): x float32 [rows, n], bias
float32 [n]. Grid-stride, 256 threads per block; a float32 sum is correctly rounded, so bit-exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "add_bias"
ENTRY = "add_bias_f32"
SIGNATURE = "ppii"


def reference(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """float32 [rows, n]: each row plus bias, correctly rounded (a float64 sum rounded once)."""
    return (np.asarray(x, dtype=np.float64) + np.asarray(bias, dtype=np.float64)[None, :]).astype(np.float32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, x: int, bias: int, rows: int, n: int) -> None:
    view = device.view(x, np.float32, (rows, n))
    view += device.view(bias, np.float32, n)[None, :]


def launch(device: Device, stream: Stream | None, x: Any, bias: Any, rows: int, n: int) -> None:
    """Add bias [n] to each of the `rows` rows of x [rows, n], in place."""
    check_sizes(OP, rows=rows, n=n)
    check_memory(OP, "x", x, rows * n * 4)
    check_memory(OP, "bias", bias, n * 4)
    grid, block = elementwise_grid(rows * n)
    get_kernel(device, OP, ENTRY, SIGNATURE).launch(grid, block, (x, bias, rows, n), stream=stream)
