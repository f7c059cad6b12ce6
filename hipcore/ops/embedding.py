"""embedding: look up token rows of the embedding table, dequantizing them to float32.

Kernels `embedding_<type>` (type: f32, f16, q8_0, q4_1, ...) with the signature
    (out p, table p, ids p, n_tokens i, hidden i, vocab i)
out: float32 [n_tokens, hidden]; table: [vocab, hidden] in the GGUF block layout of <type>, row-major;
ids: int32 [n_tokens]. An id outside [0, vocab) is an error on the host and yields a zero row on a GPU
(kernels cannot raise; the engine checks prompt ids before they get here).
Launch geometry: one workgroup per token, 256 threads.
"""

from __future__ import annotations

import numpy as np

from hipcore.quants import dequantize, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel

SIGNATURE = "pppiii"
THREADS = 256
# GGML type ids of the table formats with a kernel (the gguf package's GGMLQuantizationType values).
TABLE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 8, "bf16": 30}


def reference(table_raw: np.ndarray, ggml_type: int, ids: np.ndarray, vocab: int, hidden: int) -> np.ndarray:
    """float32 [len(ids), hidden]: the dequantized rows `ids` of a [vocab, hidden] table."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise DeviceError(f"embedding: token id {int(ids.max() if ids.max() >= vocab else ids.min())} outside [0, {vocab})")
    rows = table_raw.reshape(vocab, row_bytes(ggml_type, hidden))[ids]
    return dequantize(rows.reshape(-1), ggml_type, (len(ids), hidden))


def _register(name: str, ggml_type: int) -> None:
    @cpu_kernel(f"embedding_{name}", SIGNATURE)
    def host(dev: CpuDevice, grid, block, out: int, table: int, ids: int, n_tokens: int, hidden: int, vocab: int) -> None:
        raw = dev.view(table, np.uint8, vocab * row_bytes(ggml_type, hidden))
        dev.view(out, np.float32, (n_tokens, hidden))[:] = reference(raw, ggml_type, dev.view(ids, np.int32, n_tokens), vocab, hidden)


for _name, _type in TABLE_TYPES.items():
    _register(_name, _type)


def launch(device: Device, stream: Stream | None, out, table, ids, n_tokens: int, hidden: int, vocab: int, table_type: str) -> None:
    kernel = get_kernel(device, "embedding", f"embedding_{table_type}", SIGNATURE)
    kernel.launch(n_tokens, THREADS, [out, table, ids, n_tokens, hidden, vocab], stream=stream)
