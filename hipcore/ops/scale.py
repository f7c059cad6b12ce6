"""scale: out = x * factor, elementwise (Gemma's token embeddings times sqrt(hidden_size)).

Kernel `scale_f32(out p, x p, n i, factor f)` (kernels/scale.hip), float32 [n]; out may be x. Grid-stride,
256 threads per block. One float32 product is correctly rounded on every device: results are bit-exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "scale"
ENTRY = "scale_f32"
SIGNATURE = "ppif"


def reference(x: np.ndarray, factor: float) -> np.ndarray:
    """float32: the product of two float32 values rounded once (float64 holds it exactly)."""
    return (np.asarray(x, dtype=np.float64) * float(np.float32(factor))).astype(np.float32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, n: int, factor: float) -> None:
    device.view(out, np.float32, n)[:] = reference(device.view(x, np.float32, n), factor)


def launch(device: Device, stream: Stream | None, out: Any, x: Any, n: int, factor: float) -> None:
    check_sizes(OP, n=n)
    if not np.isfinite(factor):
        raise ValueError(f"{OP}: factor must be finite, got {factor}")
    for name, arg in (("out", out), ("x", x)):
        check_memory(OP, name, arg, n * 4)
    grid, block = elementwise_grid(n)
    get_kernel(device, OP, ENTRY, SIGNATURE).launch(grid, block, (out, x, n, factor), stream=stream)
