"""Quantize float32 weights into any supported ggml type, for writing test GGUF files.

The gguf package quantizes F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 itself; it cannot quantize the K-quants, so
Q4_K, Q5_K and Q6_K get simple quantizers here (min/max per sub-block, not llama.cpp's search for
the best scales: a coarser approximation, but bit-exact in layout, which is what tests need). Each
one is the exact inverse of the gguf package's dequantize_blocks layout, and tests/test_quants.py
checks the round trip. Also: `random_blocks`, valid random blocks of a type (random codes, sane
fp16 scales), for checking decoders on every bit pattern rather than on smooth data.
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

QK_K = 256


def quantize(values: np.ndarray, type_name: str) -> np.ndarray:
    """float32 array (..., n) -> uint8 array (..., n // block * block_bytes) in the type's layout."""
    qtype = GGMLQuantizationType[type_name]
    values = np.ascontiguousarray(values, dtype=np.float32)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if values.shape[-1] % block:
        raise ValueError(f"{type_name} rows need a multiple of {block} elements, got {values.shape[-1]}")
    if type_name in _K_QUANTIZERS:
        blocks = _K_QUANTIZERS[type_name](values.reshape(-1, block))
        return blocks.reshape(*values.shape[:-1], values.shape[-1] // block * block_bytes)
    out = gguf_quants.quantize(values, qtype)
    return np.ascontiguousarray(out).view(np.uint8).reshape(*values.shape[:-1], -1)


def max_abs_error(values: np.ndarray, type_name: str) -> float:
    """An upper bound on |dequantize(quantize(x)) - x| for these values: one quantization step of the
    coarsest block (plus the fp16 rounding of the scales), used as the tolerance in round-trip tests."""
    amax = float(np.max(np.abs(values))) if values.size else 0.0
    span = 2 * amax
    step = {"F32": 0.0, "F16": amax * 2**-10, "BF16": amax * 2**-7,
            "Q8_0": amax / 127, "Q4_0": amax / 8, "Q4_1": span / 15, "Q5_0": amax / 16, "Q5_1": span / 31,
            "Q4_K": span / 15, "Q5_K": span / 31, "Q6_K": amax / 31,
            # MXFP4: a block's largest value 1.5 * 2^floor(log2 amax) clips up to amax / 2; steps are at most amax / 2
            "MXFP4": amax / 2}[type_name]
    # K-quant sub-block scales are themselves quantized (6 bits under an fp16 d for Q4_K/Q5_K,
    # int8 for Q6_K): a rounded-down scale can clip the extreme code by up to half a scale unit per level.
    scale_error = {"Q4_K": span / 63, "Q5_K": span / 63, "Q6_K": amax / 127}.get(type_name, 0.0)
    return 1.01 * (step + scale_error) + amax * 2**-9 + 1e-12


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def _min_max_scales(sub: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Per 32-element sub-block affine scales, packed as Q4_K/Q5_K do: 6-bit sc and m under fp16 d, dmin."""
    lo = np.minimum(sub.min(axis=-1), 0.0)
    hi = np.maximum(sub.max(axis=-1), 0.0)
    scale = (hi - lo) / levels
    neg_min = -lo
    d = _f16(scale.max(axis=-1) / 63)
    dmin = _f16(neg_min.max(axis=-1) / 63)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(neg_min, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    eff_scale = d.astype(np.float32)[:, None] * sc
    eff_min = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint(_safe_div(sub + eff_min[..., None], eff_scale[..., None])), 0, levels).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> the 12-byte layout that Q4_K.get_scale_min unpacks."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def _quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin, sc, m, q = _min_max_scales(blocks.reshape(n, 8, 32), 15)
    pairs = q.reshape(n, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2),
                           _pack_k_scales(sc, m), qs], axis=1)


def _quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin, sc, m, q = _min_max_scales(blocks.reshape(n, 8, 32), 31)
    low = (q & 15).reshape(n, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    high = (q >> 4) & 1                                  # (n, 8 sub-blocks, 32)
    qh = np.zeros((n, 32), np.uint8)
    for i in range(8):
        qh |= high[:, i, :] << i
    return np.concatenate([d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2),
                           _pack_k_scales(sc, m), qh, qs], axis=1)


def _quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31
    d = _f16(scale.max(axis=-1) / 127)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[:, None])), -128, 127).astype(np.int8)
    eff = d.astype(np.float32)[:, None] * sc
    q = np.clip(np.rint(_safe_div(sub, eff[..., None])), -32, 31).astype(np.int16) + 32
    qq = q.reshape(n, QK_K).astype(np.uint8)
    ql = np.empty((n, 128), np.uint8)
    qh = np.zeros((n, 64), np.uint8)
    for h in range(2):
        base = h * 128
        ql[:, h * 64:(h + 1) * 64] = (qq[:, base:base + 64] & 15) | ((qq[:, base + 64:base + 128] & 15) << 4)
        for s in range(4):
            qh[:, h * 32:(h + 1) * 32] |= ((qq[:, base + s * 32:base + (s + 1) * 32] >> 4) & 3) << (2 * s)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(n, 2)], axis=1)


_K_QUANTIZERS = {"Q4_K": _quantize_q4_k, "Q5_K": _quantize_q5_k, "Q6_K": _quantize_q6_k}

# Where the fp16 scales sit in each block format: (byte offset, count). Everything else is codes.
_SCALE_FIELDS = {
    "Q4_0": [(0, 1)], "Q4_1": [(0, 2)], "Q5_0": [(0, 1)], "Q5_1": [(0, 2)], "Q8_0": [(0, 1)],
    "Q4_K": [(0, 2)], "Q5_K": [(0, 2)], "Q6_K": [(208, 1)],
    "F16": [], "BF16": [], "F32": [],
}


def random_blocks(type_name: str, n_blocks: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """n_blocks valid random blocks (uint8, (n_blocks, block_bytes)): random codes, fp16 scales of
    magnitude ~scale. Float types get random finite values instead."""
    qtype = GGMLQuantizationType[type_name]
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if type_name in ("F32", "F16", "BF16"):
        values = rng.standard_normal(n_blocks * block).astype(np.float32)
        return quantize(values, type_name).reshape(n_blocks, block_bytes)
    out = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if type_name == "MXFP4":  # an E8M0 exponent byte first: 2^(e - 128) within a factor of 4 of `scale`
        out[:, 0] = np.clip(np.round(np.log2(scale)) + 128 + rng.integers(-2, 3, size=n_blocks), 1, 254)
        return out
    for start, count in _SCALE_FIELDS[type_name]:
        scales = (rng.uniform(0.25, 1.0, size=(n_blocks, count)) * scale).astype(np.float16)
        out[:, start:start + 2 * count] = scales.view(np.uint8).reshape(n_blocks, 2 * count)
    return out
