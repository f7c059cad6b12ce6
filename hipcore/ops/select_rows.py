"""select_rows: copy chosen rows of a float32 matrix into a compact one.

The engine only needs logits for the last token of each sequence that samples, so the final norm
and the output projection run on those rows alone.

Kernel `select_rows_f32` with the signature (out p, x p, rows p, n_rows i, width i, n_src_rows i):
out[i, :] = x[rows[i], :] for i < n_rows. Launch geometry: one workgroup per selected row, 256 threads.
"""

from __future__ import annotations

import numpy as np

from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel

SIGNATURE = "pppiii"
THREADS = 256


def reference(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= x.shape[0]):
        raise DeviceError(f"select_rows: row index outside [0, {x.shape[0]})")
    return x[rows]


@cpu_kernel("select_rows_f32", SIGNATURE)
def _host(dev: CpuDevice, grid, block, out: int, x: int, rows: int, n_rows: int, width: int, n_src_rows: int) -> None:
    src = dev.view(x, np.float32, (n_src_rows, width))
    dev.view(out, np.float32, (n_rows, width))[:] = reference(src, dev.view(rows, np.int32, n_rows))


def launch(device: Device, stream: Stream | None, out, x, rows, n_rows: int, width: int, n_src_rows: int) -> None:
    kernel = get_kernel(device, "select_rows", "select_rows_f32", SIGNATURE)
    kernel.launch(n_rows, THREADS, [out, x, rows, n_rows, width, n_src_rows], stream=stream)
