"""gelu_mul: out = gelu(gate) * up, GELU in its tanh approximation (GeGLU's gate: Gemma's feed-forward).

gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), the function llama.cpp's ggml_gelu computes
(its CPU backend reads it from a float16 table, which is within the golden tests' tolerance).
Kernel `gelu_mul_f32(out p, gate p, up p, n i)` (kernels/gelu_mul.hip), float32 [n]; out may be gate or
up. Grid-stride, 256 threads per block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "gelu_mul"
ENTRY = "gelu_mul_f32"
SIGNATURE = "pppi"
SQRT_2_OVER_PI = 0.7978845608028654
GELU_COEF_A = 0.044715


def gelu(gate: np.ndarray) -> np.ndarray:
    """float64 tanh-approximated GELU, as g / (1 + exp(-2u)): the same function as 0.5 g (1 + tanh u), without
    the cancellation of 1 + tanh u for negative gates (where tanh rounds to -1 and the tanh form gives 0)."""
    g = np.asarray(gate, dtype=np.float64)
    with np.errstate(over="ignore"):
        u = SQRT_2_OVER_PI * (g + GELU_COEF_A * g * g * g)
        return g / (1.0 + np.exp(-2.0 * u))


def reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """float64 gelu(gate) * up."""
    return gelu(gate) * np.asarray(up, dtype=np.float64)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, gate: int, up: int, n: int) -> None:
    device.view(out, np.float32, n)[:] = reference(device.view(gate, np.float32, n), device.view(up, np.float32, n))


def launch(device: Device, stream: Stream | None, out: Any, gate: Any, up: Any, n: int) -> None:
    check_sizes(OP, n=n)
    for name, arg in (("out", out), ("gate", gate), ("up", up)):
        check_memory(OP, name, arg, n * 4)
    grid, block = elementwise_grid(n)
    get_kernel(device, OP, ENTRY, SIGNATURE).launch(grid, block, (out, gate, up, n), stream=stream)
