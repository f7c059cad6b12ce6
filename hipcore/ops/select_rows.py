"""select_rows: copy chosen rows of a float32 matrix into a compact one.

The engine only needs logits for the last token of each sequence that samples, so the final norm
and the output projection run on those rows alone.

Kernel `select_rows_f32` (kernels/select_rows.hip) with the signature (out p, x p, rows p, n_rows i,
width i, n_src_rows i): out[i, :] = x[rows[i], :] for i < n_rows. A row index outside [0, n_src_rows)
is an error on the host and gives a zero row on a GPU. Launch geometry: workgroup-stride over the
selected rows (at most 65,535 workgroups), threads over a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import ELEMENTWISE_MAX_BLOCKS, check_disjoint, check_memory, check_sizes, row_block
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel

OP = "select_rows"
ENTRY = "select_rows_f32"
SIGNATURE = "pppiii"
MAX_THREADS = 256  # the kernel's launch bounds


def reference(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= x.shape[0]):
        raise DeviceError(f"select_rows: row index outside [0, {x.shape[0]})")
    return x[rows]


@cpu_kernel(ENTRY, SIGNATURE)
def _host(dev: CpuDevice, grid, block, out: int, x: int, rows: int, n_rows: int, width: int, n_src_rows: int) -> None:
    src = dev.view(x, np.float32, (n_src_rows, width))
    dev.view(out, np.float32, (n_rows, width))[:] = reference(src, dev.view(rows, np.int32, n_rows))


def geometry(n_rows: int, width: int) -> tuple[int, int]:
    return min(n_rows, ELEMENTWISE_MAX_BLOCKS), row_block(width, MAX_THREADS)


def launch(device: Device, stream: Stream | None, out: Any, x: Any, rows: Any, n_rows: int, width: int,
           n_src_rows: int) -> None:
    """out[n_rows, width] = x[rows, :] for x of n_src_rows rows (out must not overlap x)."""
    check_sizes(ENTRY, n_rows=n_rows, width=width, n_src_rows=n_src_rows)
    check_memory(ENTRY, "out", out, n_rows * width * 4)
    check_memory(ENTRY, "x", x, n_src_rows * width * 4)
    check_memory(ENTRY, "rows", rows, n_rows * 4)
    check_disjoint(ENTRY, ("out", out, n_rows * width * 4), ("x", x, n_src_rows * width * 4))
    grid, block = geometry(n_rows, width)
    kernel = get_kernel(device, OP, ENTRY, SIGNATURE)
    kernel.launch(grid, block, [out, x, rows, n_rows, width, n_src_rows], stream=stream)
