"""softcap: out = cap * tanh(x / cap), elementwise (Gemma 2's final logit soft-capping, cap 30).

Kernel `softcap_f32(out p, x p, n i, cap f)` (kernels/softcap.hip), float32 [n]; out may be x. Grid-stride,
256 threads per block. The kernel computes tanh from expf; REFERENCE_TOLERANCE bounds how far it may be.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "softcap"
ENTRY = "softcap_f32"
SIGNATURE = "ppif"


def reference(x: np.ndarray, cap: float) -> np.ndarray:
    """float32: cap * tanh(x / cap), computed in float64 and rounded once."""
    c = float(np.float32(cap))
    return (c * np.tanh(np.asarray(x, dtype=np.float64) / c)).astype(np.float32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, x: int, n: int, cap: float) -> None:
    device.view(out, np.float32, n)[:] = reference(device.view(x, np.float32, n), cap)


def launch(device: Device, stream: Stream | None, out: Any, x: Any, n: int, cap: float) -> None:
    check_sizes(OP, n=n)
    if not (np.isfinite(cap) and cap > 0):
        raise ValueError(f"{OP}: cap must be positive and finite, got {cap}")
    for name, arg in (("out", out), ("x", x)):
        check_memory(OP, name, arg, n * 4)
    grid, block = elementwise_grid(n)
    get_kernel(device, OP, ENTRY, SIGNATURE).launch(grid, block, (out, x, n, cap), stream=stream)
