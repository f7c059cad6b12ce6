"""matvec: y[b, r] = sum_c W[r, c] * x[b, c] with W in its GGUF block layout (the decode hot path).

Kernels `matvec_<type>(y p, W p, x p, rows i, cols i, batch i)` for the types of WEIGHT_TYPES
(kernels/matvec.hip): W is [rows, cols] row-major in GGUF blocks (layouts: hipcore/ops/weight_formats.py);
x is float32 [batch, cols], y float32 [batch, rows]. cols must be a multiple of 32 (of 256 for the
K-quants); y must not overlap x or W.

Geometry: a warp takes two rows at a time when batch is 1 and one row otherwise (the kernel loops
over row groups, so any grid is correct). Large matrices get 256-thread blocks; small ones 64-thread
blocks, so that their few warps spread over as many compute units as possible. A batch of more than 8
rows makes the kernel pass over W again for every 8; hipcore/ops/kernel_choice.py `project` hands such batches
to the matmul kernel instead.

Products of few rows (split_rows: the MoE routers, 128 x 2048 or 32 x 2880 in F32) take `matvec_split_<type>`
(F16, BF16, F32; same arguments): a workgroup a row and pass of up to 8 batch rows, its threads splitting the row's
columns and their sums added in a fixed order, so that such a product runs more than one warp a row pair
(split_geometry). kernel_choice.project takes it past matmul.MATVEC_MAX_TOKENS tokens too (split_takes_batch: a
decode batch's router, where matmul's tiles left one to four workgroups walking the columns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import INT32_MAX, check_disjoint, check_memory, check_sizes
from hipcore.ops.weight_formats import (  # noqa: F401 (BLOCK_BYTES: re-exported)
    BLOCK_BYTES, check_format, column_multiple, dequantize_rows, host_product, row_bytes,
)
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "matvec"
SIGNATURE = "pppiii"
WEIGHT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "f16", "bf16", "f32")
# The widest aligned load the kernel makes of W.
WEIGHT_ALIGNMENT = {"q4_0": 2, "q4_1": 4, "q5_0": 2, "q5_1": 4, "q8_0": 2, "q4_k": 4, "q5_k": 4, "q6_k": 2, "f16": 16,
                    "bf16": 16, "f32": 16}
X_ALIGNMENT = 16  # x is read with 16-byte loads
BIG_MATRIX_ROW_GROUPS = 4096  # from here on 256-thread blocks, below it 64-thread ones
SPLIT_TYPES = ("f16", "bf16", "f32")
# The split entries take products whose row groups (a warp each in `geometry`) number fewer than SPLIT_MAX_GROUPS,
# over rows of at least SPLIT_MIN_COLS columns (narrower rows are one step of a warp already). Set from the
# latency of a row group's steps, not yet from a measurement of both sides: a decode step of Qwen3-30B-A3B's router
# (128 x 2048 F32, 64 row pairs) took 5.35 us at 196 GB/s on an NVIDIA H100 on matvec_f32, its warps walking
# each row in four round trips to memory; scripts/bench/measure_router_matvec.py times both entries.
SPLIT_MAX_GROUPS = 512
MAX_BATCH_PER_PASS = 8  # kernels/matvec.hip: kMaxBatchPerPass
MAX_SPLIT_GRID = 1 << 20  # enough workgroups to fill any GPU; the split entry loops over its items beyond
SPLIT_MIN_COLS = 1024
SPLIT_MAX_THREADS = 256  # kernels/matvec.hip: kSplitMaxThreads
# Past matmul.MATVEC_MAX_TOKENS tokens such a product keeps the split entry while the x its workgroups read
# (each (row, pass) item reads its 8 tokens' x again: rows x batch x cols floats, from L2) stays within this. matmul
# tiles it as 64 rows x 16 tokens (pick_tile_tokens halves the tile for the few rows), one to 64 workgroups walking
# 64-90 steps of columns with one step's loads in flight: 63 us at any token count for Qwen3-30B-A3B's router (128 x
# 2048), 87-92 us for gpt-oss-20b's (32 x 2880) and gpt-oss-120b's (128 x 2880). The split entry's time grows with
# the x it reads: Qwen3-30B-A3B's 5.3 us at 32 tokens, 16.7 at 128, 31.3 at 256 (256 MiB of x), 59.8 at 512 (512
# MiB: the crossover); gpt-oss-20b's 3.9 at 32, 22.6 at 512 (180 MiB). Measured on an NVIDIA H100 80GB HBM3
# (2026-12-07, scripts/bench/measure_router_matvec.py --with-matmul; docs/history/2026-12-07-moe-router-batches.md).
# The bound keeps twice the crossover's margin.
SPLIT_MAX_X_BYTES = 256 << 20


# ---- reference ---------------------------------------------------------------------------------


def reference(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [batch, rows]: W decoded exactly (in float64) and the products summed in float64.

    The decoder is hipcore/ops/weight_formats.py's, checked against the gguf package's dequantizer in
    the tests; it keeps the reference usable where gguf is not installed (the GPU test machines).
    """
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    w = dequantize_rows(raw, weight_type, cols, np.float64)
    return np.asarray(x, dtype=np.float64).reshape(-1, cols) @ w.T


def error_bound(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [batch, rows]: how far a kernel's float32 result may be from `reference`.

    Each output is a float32 sum of `cols` products of x with weights decoded to float32 (exact, or one
    rounding: d*q+m, d*sc*q-dmin*m, d*scale*q), each added by one fused multiply-add. In any order of
    summation each product then passes through at most `cols` roundings and its weight through one, so
    |error| <= (cols + 1) * u * sum_c |w x| (the recursive-summation bound, u = 2^-24); (cols + 2) leaves
    room for the reference's own float64 rounding. A mis-decoded weight is off by O(|w x|), far above it.
    """
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    w_abs = np.abs(dequantize_rows(raw, weight_type, cols, np.float64))
    return (cols + 2) * 2.0**-24 * (np.abs(np.asarray(x, dtype=np.float64).reshape(-1, cols)) @ w_abs.T) + 1e-30


# ---- host implementation (the cpu backend) ---------------------------------------------------


def _host(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, y: int, w: int, x: int, rows: int, cols: int, batch: int) -> None:
        raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
        result = np.empty((batch, rows), dtype=np.float32)
        host_product(raw, weight_type, device.view(x, np.float32, (batch, cols)), cols, result)
        device.view(y, np.float32, (batch, rows))[:] = result

    return run


for _type in WEIGHT_TYPES:
    cpu_kernel(f"matvec_{_type}", SIGNATURE)(_host(_type))
for _type in SPLIT_TYPES:
    cpu_kernel(f"matvec_split_{_type}", SIGNATURE)(_host(_type))


# ---- launcher ----------------------------------------------------------------------------------


def geometry(arch: str, rows: int, batch: int) -> tuple[int, int]:
    """(grid, block) for `rows` rows and `batch` vectors on a device of architecture `arch`."""
    rows_per_warp = 2 if batch == 1 else 1
    groups = -(-rows // rows_per_warp)
    threads = 256 if groups >= BIG_MATRIX_ROW_GROUPS else 64
    warps_per_block = max(1, threads // wavefront_size(arch))
    return -(-groups // warps_per_block), threads


def split_rows(weight_type: str, rows: int, cols: int, batch: int) -> bool:
    """True when this product takes the split entry (see SPLIT_MAX_GROUPS)."""
    groups = -(-rows // (2 if batch == 1 else 1))
    return (weight_type in SPLIT_TYPES and cols >= SPLIT_MIN_COLS and groups < SPLIT_MAX_GROUPS
            and split_items(rows, batch) <= INT32_MAX)  # the kernel counts its items in int32


def split_items(rows: int, batch: int) -> int:
    """The split entry's work items: a row and pass of up to MAX_BATCH_PER_PASS batch rows each."""
    return rows * -(-batch // MAX_BATCH_PER_PASS)


def split_takes_batch(weight_type: str, rows: int, cols: int, batch: int) -> bool:
    """True when a product of more than matmul.MATVEC_MAX_TOKENS tokens takes the split entry rather than matmul's
    tiles: split_rows, and the x its items read within SPLIT_MAX_X_BYTES."""
    return split_rows(weight_type, rows, cols, batch) and rows * batch * cols * 4 <= SPLIT_MAX_X_BYTES


def split_geometry(rows: int, cols: int, batch: int) -> tuple[int, int]:
    """(grid, block) of the split entry: a workgroup a row and pass of up to 8 batch rows (kMaxBatchPerPass), threads
    enough for one step over the row (two items of 8 columns a thread when decoding, one for batches) in multiples
    of 64, up to SPLIT_MAX_THREADS."""
    per_thread = 2 if batch == 1 else 1
    threads = -(-(cols // 8) // per_thread)
    return min(split_items(rows, batch), MAX_SPLIT_GRID), min(SPLIT_MAX_THREADS, max(64, -(-threads // 64) * 64))


def choose(arch: str, weight_type: str, rows: int, cols: int, batch: int) -> tuple[str, int, int]:
    """(entry, grid, block) of this product on a device of architecture `arch`."""
    if split_rows(weight_type, rows, cols, batch):
        return (f"{OP}_split_{weight_type}", *split_geometry(rows, cols, batch))
    return (f"{OP}_{weight_type}", *geometry(arch, rows, batch))


def check_operands(op: str, weight_type: str, have: tuple[str, ...], y: Any, w: Any, x: Any, rows: int, cols: int,
                   n: int, count_name: str, alignment: dict[str, int] | None = None, x_itemsize: int = 4) -> None:
    """The checks of a y[n, rows] = x[n, cols] @ W^T launch (matvec's, qmatvec's and matmul's): a known format,
    sizes, cols a multiple of the format's block, buffers large and aligned enough (W as `alignment`, by
    default matvec's WEIGHT_ALIGNMENT, says; x of `x_itemsize` bytes a value: 2 for f16), y apart from x and W."""
    check_format(op, weight_type, have)
    entry = f"{op}_{weight_type}"
    check_sizes(entry, rows=rows, cols=cols, **{count_name: n})
    if cols % column_multiple(weight_type):
        raise ValueError(f"{entry}: cols must be a multiple of {column_multiple(weight_type)} (the format's block), got {cols}")
    w_bytes, x_bytes, y_bytes = rows * row_bytes(weight_type, cols), n * cols * x_itemsize, n * rows * 4
    check_memory(entry, "W", w, w_bytes, (alignment or WEIGHT_ALIGNMENT)[weight_type])
    check_memory(entry, "x", x, x_bytes, X_ALIGNMENT)
    check_memory(entry, "y", y, y_bytes)
    check_disjoint(entry, ("y", y, y_bytes), ("x", x, x_bytes))
    check_disjoint(entry, ("y", y, y_bytes), ("W", w, w_bytes))


def launch(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, batch: int = 1, *,
           weight_type: str) -> None:
    """y[batch, rows] = x[batch, cols] @ W[rows, cols]^T for W of `weight_type` (one of WEIGHT_TYPES)."""
    check_operands(OP, weight_type, WEIGHT_TYPES, y, w, x, rows, cols, batch, "batch")
    entry, grid, block = choose(device.arch, weight_type, rows, cols, batch)
    kernel = get_kernel(device, OP, entry, SIGNATURE)
    kernel.launch(grid, block, (y, w, x, rows, cols, batch), stream=stream)
