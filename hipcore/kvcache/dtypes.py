"""The element formats a KV cache can store, their exact sizes, and their numpy codecs.

A K or V row is the head_dim values of one (token, KV head). Formats:
  f16   IEEE half, 2 bytes per element (the default)
  bf16  bfloat16 (the top half of an f32, rounded to nearest even), 2 bytes per element
  f32   4 bytes per element
  q8_0  ggml's Q8_0: each run of 32 elements is one block {f16 scale d, 32 x int8 q}, value = d * q,
        so 34 bytes per 32 elements; head_dim must be a multiple of 32.

The codecs here are the numerical reference of the kv_store kernels: host kernels call them, and
GPU kernels must produce the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hipcore.kvcache.errors import KvConfigError

Q8_0_BLOCK_ELEMS = 32
Q8_0_BLOCK_BYTES = 2 + Q8_0_BLOCK_ELEMS  # f16 scale + 32 int8


@dataclass(frozen=True)
class KvDtype:
    """A KV storage format: `block_bytes` bytes hold `block_elems` consecutive elements of a row."""

    name: str
    block_elems: int
    block_bytes: int
    description: str

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one (token, head) row of head_dim elements, scales included."""
        if head_dim % self.block_elems:
            raise KvConfigError(
                f"KV dtype {self.name} stores {self.block_elems}-element blocks, so head_dim must be a "
                f"multiple of {self.block_elems}; got head_dim={head_dim} (choose f16, bf16 or f32)"
            )
        return head_dim // self.block_elems * self.block_bytes

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """float32 [..., head_dim] -> uint8 [..., row_bytes]: the bytes this format stores."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        head_dim = rows.shape[-1]
        row_bytes = self.row_bytes(head_dim)
        if self.name == "f32":
            raw = rows.view(np.uint8)
        elif self.name == "f16":
            raw = rows.astype(np.float16).view(np.uint8)
        elif self.name == "bf16":
            raw = _f32_to_bf16_bits(rows).view(np.uint8)
        else:
            raw = _quantize_q8_0(rows)
        return raw.reshape(rows.shape[:-1] + (row_bytes,))

    def decode(self, raw: np.ndarray, head_dim: int) -> np.ndarray:
        """uint8 [..., row_bytes] -> float32 [..., head_dim]."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        row_bytes = self.row_bytes(head_dim)
        if raw.shape[-1] != row_bytes:
            raise ValueError(f"{self.name} rows of head_dim {head_dim} are {row_bytes} bytes, got {raw.shape[-1]}")
        lead = raw.shape[:-1]
        if self.name == "f32":
            out = raw.view(np.float32)
        elif self.name == "f16":
            out = raw.view(np.float16).astype(np.float32)
        elif self.name == "bf16":
            out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            out = _dequantize_q8_0(raw)
        return out.reshape(lead + (head_dim,))


KV_DTYPES: dict[str, KvDtype] = {
    d.name: d
    for d in (
        KvDtype("f16", 1, 2, "IEEE half precision"),
        KvDtype("bf16", 1, 2, "bfloat16"),
        KvDtype("f32", 1, 4, "single precision"),
        KvDtype("q8_0", Q8_0_BLOCK_ELEMS, Q8_0_BLOCK_BYTES, "ggml Q8_0: 32 x int8 with one f16 scale"),
    )
}
DEFAULT_KV_DTYPE = "f16"


def kv_dtype(name: str) -> KvDtype:
    """The format called `name` (case-insensitive), or a KvConfigError listing the choices."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in KV_DTYPES:
        raise KvConfigError(f"unknown KV dtype {name!r}; choose one of {', '.join(KV_DTYPES)}")
    return KV_DTYPES[key]


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch and the GPU intrinsics do; NaN stays a (quiet) NaN."""
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def _quantize_q8_0(rows: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0_ref: d = amax / 127, q = round-half-away(x / d)."""
    groups = rows.reshape(-1, Q8_0_BLOCK_ELEMS)
    amax = np.abs(groups).max(axis=1)
    d = amax / np.float32(127.0)
    inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d != 0)
    scaled = groups * inv[:, None]
    q = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5)), -127, 127).astype(np.int8)
    out = np.empty((groups.shape[0], Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


def _dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, Q8_0_BLOCK_BYTES)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)
