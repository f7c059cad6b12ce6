"""embedding: look up token rows of the embedding table, dequantizing them to float32.

Kernels `embedding_<type>` (type: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k;
kernels/embedding.hip) with the signature
    (out p, table p, ids p, n_tokens i, hidden i, vocab i)
out: float32 [n_tokens, hidden]; table: [vocab, hidden] in the GGUF block layout of <type>, row-major;
ids: int32 [n_tokens]. An id outside [0, vocab) is an error on the host and yields a zero row on a GPU
(kernels cannot raise; the engine checks prompt ids before they get here). Every format decodes with
at most one rounding to float32 (none but Q4_K/Q5_K's d * sc * q - dmin * m), in the kernels as in the
host reference, so GPU and host rows are equal bit for bit.
Launch geometry: workgroup-stride over the tokens (at most 65,535 workgroups), one thread per element.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import ELEMENTWISE_MAX_BLOCKS, check_memory, check_sizes, row_block
from hipcore.ops.weight_formats import BLOCK_BYTES, BLOCK_ELEMENTS, dequantize_rows
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel

OP = "embedding"
SIGNATURE = "pppiii"
MAX_THREADS = 256  # the kernels' launch bounds
# GGML type ids of the table formats with a kernel (the gguf package's GGMLQuantizationType values).
TABLE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
               "q6_k": 14, "bf16": 30}
# (elements, bytes) per block of each format (the matrix kernels' formats), and the alignment of the
# kernel's widest load from it (2-byte halves in every block format: a Q6_K block is 210 bytes).
BLOCKS = {t: (BLOCK_ELEMENTS[t], BLOCK_BYTES[t]) for t in TABLE_TYPES}
TABLE_ALIGNMENT = {"f32": 4, "f16": 2, "bf16": 2, "q4_0": 2, "q4_1": 2, "q5_0": 2, "q5_1": 2, "q8_0": 2, "q4_k": 2,
                   "q5_k": 2, "q6_k": 2}


def row_bytes(table_type: str, hidden: int) -> int:
    elems, nbytes = BLOCKS[table_type]
    if hidden % elems:
        raise ValueError(f"{OP}: {table_type} rows hold a multiple of {elems} elements, not {hidden}")
    return hidden // elems * nbytes


def decode_rows(raw: np.ndarray, table_type: str, hidden: int) -> np.ndarray:
    """float32 [rows, hidden] from raw rows uint8 [rows, row_bytes]: the matrix formats' exact decoder
    (weight_formats.dequantize_rows: exact in float64, rounded once to float32), which the kernels match
    bit for bit (kernels/embedding.hip says why). It needs no gguf package, so the GPU test machines can
    run it; the tests check it against gguf's dequantizer."""
    if table_type not in TABLE_TYPES:
        raise ValueError(f"{OP}: no decoder for table type {table_type!r}; have {', '.join(TABLE_TYPES)}")
    return dequantize_rows(raw, table_type, hidden, np.float32)


def reference(table_raw: np.ndarray, table_type: str, ids: np.ndarray, vocab: int, hidden: int) -> np.ndarray:
    """float32 [len(ids), hidden]: the dequantized rows `ids` of a [vocab, hidden] table."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise DeviceError(f"embedding: token id {int(ids.max() if ids.max() >= vocab else ids.min())} outside [0, {vocab})")
    rows = np.asarray(table_raw, dtype=np.uint8).reshape(vocab, row_bytes(table_type, hidden))[ids]
    return decode_rows(rows, table_type, hidden)


def _register(name: str) -> None:
    @cpu_kernel(f"embedding_{name}", SIGNATURE)
    def host(dev: CpuDevice, grid, block, out: int, table: int, ids: int, n_tokens: int, hidden: int, vocab: int) -> None:
        raw = dev.view(table, np.uint8, vocab * row_bytes(name, hidden))
        dev.view(out, np.float32, (n_tokens, hidden))[:] = reference(raw, name, dev.view(ids, np.int32, n_tokens), vocab, hidden)


for _name in TABLE_TYPES:
    _register(_name)


def geometry(n_tokens: int, hidden: int) -> tuple[int, int]:
    """(grid, block): a workgroup per token up to the grid limit, threads enough for a row."""
    return min(n_tokens, ELEMENTWISE_MAX_BLOCKS), row_block(hidden, MAX_THREADS)


def launch(device: Device, stream: Stream | None, out: Any, table: Any, ids: Any, n_tokens: int, hidden: int, vocab: int,
           table_type: str) -> None:
    """out[n_tokens, hidden] = the rows `ids` of the [vocab, hidden] table of format `table_type`."""
    if table_type not in TABLE_TYPES:
        raise ValueError(f"{OP}: no kernel for table type {table_type!r}; have {', '.join(TABLE_TYPES)}")
    op = f"embedding_{table_type}"
    check_sizes(op, n_tokens=n_tokens, hidden=hidden, vocab=vocab)
    check_memory(op, "table", table, vocab * row_bytes(table_type, hidden), TABLE_ALIGNMENT[table_type])
    check_memory(op, "ids", ids, n_tokens * 4)
    check_memory(op, "out", out, n_tokens * hidden * 4)
    grid, block = geometry(n_tokens, hidden)
    # programmatic: the entries wait for the kernel ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, op, SIGNATURE, programmatic=True)
    kernel.launch(grid, block, [out, table, ids, n_tokens, hidden, vocab], stream=stream)
