"""Tensor types: which ggml types exist, their block geometry, which we support, and dequantization.

The block geometry comes from the `gguf` package's table (the same numbers ggml uses). Type ids are
sorted into four kinds, because each deserves a different answer to the user:

- supported: we read, upload and compute with them (SUPPORTED_TYPES);
- unsupported: real, current ggml types we do not implement (Q2_K, IQ2_XXS, ...): exit 4, named;
- removed: ids ggml once defined and has since dropped (Q4_2/Q4_3 in 2023, the Q4_0_4_4-style
  repacked types in 2024). Such a file was written by an older tool and is not corrupt, but no
  current reader accepts it: exit 4, with the advice to re-convert;
- unknown: ids never defined. Nothing valid carries them, so the file is corrupt: exit 3.

Dequantization on the host uses the gguf package's numpy code for block formats (it is also the
reference the GPU kernels are tested against) and plain numpy views for F32/F16/BF16.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

# MXFP4 (type 39: an E8M0 scale and 32 e2m1 values, 4.25 bits a weight): gpt-oss's experts; any tensor of it reads.
SUPPORTED_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                             "MXFP4"})

REMOVED_TYPES: dict[int, str] = {
    4: "Q4_2", 5: "Q4_3",
    31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
    36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8",
}

_KNOWN: dict[int, tuple[str, int, int]] = {
    int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES
}
TYPE_IDS: dict[str, int] = {name: type_id for type_id, (name, _, _) in _KNOWN.items()}

_PLAIN_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


def type_kind(ggml_type: int) -> str:
    """'supported', 'unsupported', 'removed' or 'unknown' (see the module docstring)."""
    if ggml_type in _KNOWN:
        return "supported" if _KNOWN[ggml_type][0] in SUPPORTED_TYPES else "unsupported"
    return "removed" if ggml_type in REMOVED_TYPES else "unknown"


def type_name(ggml_type: int) -> str:
    """'Q4_1' for 3; a removed id gives its old name; an unknown id gives 'unknown type 200'."""
    if ggml_type in _KNOWN:
        return _KNOWN[ggml_type][0]
    return REMOVED_TYPES.get(ggml_type, f"unknown type {ggml_type}")


def type_id(name: str) -> int:
    """The ggml type id of a current type name ('Q8_0' -> 8); KeyError for anything else."""
    return TYPE_IDS[name]


def block_geometry(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a current ggml type; ValueError for removed/unknown ids."""
    if ggml_type not in _KNOWN:
        raise ValueError(f"ggml type {ggml_type} ({type_name(ggml_type)}) has no block geometry")
    _, block, nbytes = _KNOWN[ggml_type]
    return block, nbytes


def row_bytes(ggml_type: int, n_cols: int) -> int:
    """Bytes of one row of n_cols elements; ValueError unless n_cols is a positive multiple of the block."""
    block, nbytes = block_geometry(ggml_type)
    if n_cols <= 0 or n_cols % block:
        raise ValueError(f"{type_name(ggml_type)} rows hold a multiple of {block} elements, not {n_cols}")
    return n_cols // block * nbytes


def tensor_bytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes of a whole tensor of numpy-order `shape` (last axis contiguous)."""
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    return rows * row_bytes(ggml_type, shape[-1])


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Decode the bytes of a tensor into a new float32 array of numpy-order `shape`.

    `raw` is the tensor's bytes exactly (uint8, contiguous); ValueError if its size does not match.
    """
    name = type_name(ggml_type)
    if name not in SUPPORTED_TYPES:
        raise ValueError(f"dequantization of {name} is not supported (supported: {', '.join(sorted(SUPPORTED_TYPES))})")
    shape = tuple(int(d) for d in shape)
    expected = tensor_bytes(ggml_type, shape)
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.size != expected:
        raise ValueError(f"{name} tensor of shape {shape} needs {expected} bytes, got {flat.size}")
    if name in _PLAIN_DTYPES:
        return flat.view(_PLAIN_DTYPES[name]).astype(np.float32).reshape(shape)
    if name == "BF16":
        return (flat.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    n_cols = shape[-1]
    rows = flat.reshape(-1, row_bytes(ggml_type, n_cols))
    with np.errstate(over="ignore", invalid="ignore"):  # inf/nan scales decode to inf/nan, as in ggml
        values = gguf_quants.dequantize(rows, GGMLQuantizationType(ggml_type))
    return np.asarray(values, dtype=np.float32).reshape(shape)
