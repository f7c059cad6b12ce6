"""Random weights in the matrix kernels' formats, shared by the cpu, emulated and GPU kernel tests."""

from __future__ import annotations

import numpy as np

from hipcore.ops.weight_formats import BLOCK_BYTES, BLOCK_ELEMENTS

# Byte offsets of the halves in each block format that must be finite (d, and m / dmin).
SCALE_OFFSETS = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}
# Size of those halves: K-quant scales multiply 6- or 8-bit sub-block scales as well as the codes.
SCALE_SIZE = {"q4_0": 0.02, "q4_1": 0.02, "q5_0": 0.01, "q5_1": 0.01, "q8_0": 0.02, "q4_k": 0.002, "q5_k": 0.002, "q6_k": 0.0005}


def random_weights(rng: np.random.Generator, weight_type: str, rows: int, cols: int) -> np.ndarray:
    """Raw GGUF bytes [rows, row_bytes]: random codes and sub-block scales (every bit pattern) with finite
    block scales (d, and m / dmin) of varied sign and size, or plain random halves / bfloat16s / floats."""
    if weight_type == "f32":
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if weight_type == "f16":
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if weight_type == "bf16":
        return (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if weight_type == "mxfp4":  # every code; E8M0 scales 2^-9 .. 2^2 (the values e2m1 times half of 2^(e - 127))
        blocks = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
        blocks[..., 0] = rng.integers(119, 131, (rows, cols // 32), dtype=np.uint8)
        return blocks.reshape(rows, -1)
    blocks = rng.integers(0, 256, (rows, cols // BLOCK_ELEMENTS[weight_type], BLOCK_BYTES[weight_type]), dtype=np.uint8)
    for offset in SCALE_OFFSETS[weight_type]:
        scale = (rng.standard_normal((rows, blocks.shape[1], 1)) * SCALE_SIZE[weight_type]).astype(np.float16)
        blocks[..., offset:offset + 2] = scale.view(np.uint8)
    return blocks.reshape(rows, -1)
