"""argmax: the index of the largest element of each row (greedy sampling), numpy's rules.

Kernel `argmax_f32(out p, x p, n i)` (kernels/argmax.hip): x float32 [rows, n], out int32 [rows]; one
block per row (grid = rows). Ties go to the lowest index; a NaN counts as the largest value, so the
first NaN wins, as with np.argmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, row_block
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "argmax"
ENTRY = "argmax_f32"
SIGNATURE = "ppi"
MAX_THREADS = 1024  # the kernel's __launch_bounds__; a vocabulary row is long, one block reads it


def reference(x: np.ndarray) -> np.ndarray:
    """int32 [rows] for x [rows, n]."""
    return np.argmax(np.asarray(x), axis=-1).astype(np.int32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, n: int) -> None:
    rows = grid[0]
    device.view(out, np.int32, rows)[:] = reference(device.view(x, np.float32, (rows, n)))


def launch(device: Device, stream: Stream | None, out: Any, x: Any, rows: int, n: int) -> None:
    check_sizes(OP, rows=rows, n=n)
    check_memory(OP, "out", out, rows * 4)
    check_memory(OP, "x", x, rows * n * 4)
    get_kernel(device, OP, ENTRY, SIGNATURE).launch(rows, row_block(n, MAX_THREADS), (out, x, n), stream=stream)
