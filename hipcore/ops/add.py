"""add: out = a + b, elementwise (the residual connection).

Kernel `add_f32(out p, a p, b p, n i)` (kernels/add.hip), float32 [n]; out may be a or b. Grid-stride,
256 threads per block. A float32 sum is correctly rounded on every device, so results are bit-exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "add"
ENTRY = "add_f32"
SIGNATURE = "pppi"


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32: the float64 sum rounded once more is the correctly rounded float32 sum (53 >= 2*24+2)."""
    return (np.asarray(a, dtype=np.float64) + np.asarray(b, dtype=np.float64)).astype(np.float32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, a: int, b: int, n: int) -> None:
    np.add(device.view(a, np.float32, n), device.view(b, np.float32, n), out=device.view(out, np.float32, n))


def launch(device: Device, stream: Stream | None, out: Any, a: Any, b: Any, n: int) -> None:
    check_sizes(OP, n=n)
    for name, arg in (("out", out), ("a", a), ("b", b)):
        check_memory(OP, name, arg, n * 4)
    grid, block = elementwise_grid(n)
    get_kernel(device, OP, ENTRY, SIGNATURE).launch(grid, block, (out, a, b, n), stream=stream)
