"""silu_mul: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (SwiGLU's gate).

Kernel `silu_mul_f32(out p, gate p, up p, n i)` (kernels/silu_mul.hip), float32 [n]; out may be gate
or up. Grid-stride, 256 threads per block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "silu_mul"
ENTRY = "silu_mul_f32"
SIGNATURE = "pppi"


def reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """float64; for very negative gates exp(-g) overflows to inf and silu is -0, its limit."""
    g = np.asarray(gate, dtype=np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * np.asarray(up, dtype=np.float64)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, gate: int, up: int, n: int) -> None:
    device.view(out, np.float32, n)[:] = reference(device.view(gate, np.float32, n), device.view(up, np.float32, n))


def launch(device: Device, stream: Stream | None, out: Any, gate: Any, up: Any, n: int) -> None:
    check_sizes(OP, n=n)
    for name, arg in (("out", out), ("gate", gate), ("up", up)):
        check_memory(OP, name, arg, n * 4)
    grid, block = elementwise_grid(n)
    get_kernel(device, OP, ENTRY, SIGNATURE, programmatic=True).launch(grid, block, (out, gate, up, n), stream=stream)
