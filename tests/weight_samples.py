"""Random weights in the matvec kernels' formats, shared by the cpu, emulated and GPU kernel tests."""

from __future__ import annotations

import numpy as np

from hipcore.ops import matvec


def random_weights(rng: np.random.Generator, weight_type: str, rows: int, cols: int) -> np.ndarray:
    """Raw GGUF bytes [rows, row_bytes]: random quants with finite scales (d, and m for Q4_1) of
    varied sign and size, or plain random halves / floats."""
    if weight_type in ("f16", "f32"):
        return rng.standard_normal((rows, cols)).astype(np.float16 if weight_type == "f16" else np.float32).view(np.uint8)
    blocks = rng.integers(0, 256, (rows, cols // 32, matvec.BLOCK_BYTES[weight_type]), dtype=np.uint8)
    scales = (rng.standard_normal((rows, cols // 32, 2)) * 0.02).astype(np.float16)
    blocks[..., 0:2] = scales[..., 0:1].view(np.uint8)
    if weight_type == "q4_1":
        blocks[..., 2:4] = scales[..., 1:2].view(np.uint8)
    return blocks.reshape(rows, -1)
