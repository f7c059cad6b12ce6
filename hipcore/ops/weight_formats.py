"""The GGUF weight formats the matrix kernels read (matvec, matmul): geometry and an exact decoder.

A matrix W [rows, cols] is stored row-major, each row cols / block_elements blocks back to back:

    f32, f16, bf16  plain values (block of 1)
    q4_0  32 per 18 bytes: {half d; uint8 qs[16]}               w = d * (q - 8)
    q4_1  32 per 20 bytes: {half d; half m; uint8 qs[16]}       w = d * q + m
    q5_0  32 per 22 bytes: {half d; uint8 qh[4]; uint8 qs[16]}  w = d * (q - 16)
    q5_1  32 per 24 bytes: {half d; half m; uint8 qh[4]; uint8 qs[16]}  w = d * q + m
    q8_0  32 per 34 bytes: {half d; int8 qs[32]}                w = d * q
          (in q4_0/q4_1/q5_0/q5_1, element j < 16 is the low nibble of qs[j], element 16 + j its high
          nibble; q5_0/q5_1 take bit j of qh, read as one little-endian 32-bit word, as element j's fifth bit)
    q4_k  256 per 144 bytes: {half d; half dmin; uint8 scales[12]; uint8 qs[128]}
    q5_k  256 per 176 bytes: {half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}
          eight sub-blocks of 32 with 6-bit scale sc and min m packed in `scales`;
          w = d * sc * q - dmin * m. Element 64j + l (l < 32) is the low nibble of qs[32j + l],
          element 64j + 32 + l its high nibble; q5_k adds bit (2j or 2j + 1) of qh[l] as the fifth bit.
    q6_k  256 per 210 bytes: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d}
          sixteen sub-blocks of 16 with an int8 scale; w = d * scale * (q - 32), q six bits: in half h
          (128 elements), element 128h + 32s + l takes nibble s >> 1 of ql[64h + 32(s & 1) + l] and
          bits 2s, 2s + 1 of qh[32h + l].
    mxfp4 32 per 17 bytes: {uint8 e; uint8 qs[16]}  (GGML type 39, OCP microscaling FP4)
          w = 2^(e - 128) * v[q], v = the e2m1 values doubled {0, 1, 2, 3, 4, 6, 8, 12} and their
          negatives for codes 8..15 (bit 3 the sign); element j < 16 is the low nibble of qs[j],
          16 + j its high nibble, as in q4_0 (ggml's dequantize_row_mxfp4: E8M0 scale halved).

This is ggml's layout (ggml-common.h; the gguf package's quants.py decodes the same). The decoder here
is written independently of the gguf package, which the tests check it against: it keeps the numpy
references usable where gguf is not installed (the GPU test machines). In float64 it is exact: every
product of a half, a 6- or 8-bit scale and a code is exact in float64 and so is each sum of two.
"""

from __future__ import annotations

import numpy as np

# Elements and bytes per block of each format (lower-case names = the kernels' variant suffixes).
BLOCK_ELEMENTS = {"f32": 1, "f16": 1, "bf16": 1, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32,
                  "q4_k": 256, "q5_k": 256, "q6_k": 256, "mxfp4": 32}
BLOCK_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34,
               "q4_k": 144, "q5_k": 176, "q6_k": 210, "mxfp4": 17}
# MXFP4's e2m1 codes as the doubled values the products use (their scale is 2^(e - 128), half of E8M0's 2^(e - 127)).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
FORMATS = tuple(BLOCK_ELEMENTS)


def check_format(op: str, weight_type: str, have: tuple[str, ...]) -> None:
    if weight_type not in have:
        raise ValueError(f"{op}: no kernel for weight type {weight_type!r}; have {', '.join(have)}")


def column_multiple(weight_type: str) -> int:
    """cols must be a multiple of this: the format's block, and at least 32 (the kernels' unit)."""
    return max(32, BLOCK_ELEMENTS[weight_type])


def row_bytes(weight_type: str, cols: int) -> int:
    return cols // BLOCK_ELEMENTS[weight_type] * BLOCK_BYTES[weight_type]


def _halves(blocks: np.ndarray, offset: int, dtype: type) -> np.ndarray:
    """The half at byte `offset` of each block, as [..., 1] of dtype."""
    return blocks[..., offset:offset + 2].copy().view(np.float16).astype(dtype)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """Codes of bytes qs [..., n] packed two per byte in chunks of `chunk` bytes: each chunk's low nibbles
    are `chunk` consecutive elements, its high nibbles the next `chunk`."""
    shape = qs.shape[:-1]
    grouped = qs.reshape(*shape, -1, 1, chunk)
    return ((grouped >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15).reshape(*shape, -1)


def five_bit_codes(blocks: np.ndarray, qh_offset: int) -> np.ndarray:
    """The 32 five-bit codes [..., 32] of q5_0 / q5_1 blocks [..., block_bytes]: the nibbles of the 16 bytes
    after the 4 qh bytes at `qh_offset`, with bit j of qh (a little-endian word) on top of element j."""
    low = _nibbles(blocks[..., qh_offset + 4:qh_offset + 20], 16).astype(np.int64)
    qh = blocks[..., qh_offset:qh_offset + 4].copy().view("<u4").astype(np.int64)  # [..., 1]
    return low | (((qh >> np.arange(32)) & 1) << 4)


def k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit (sc, m) of the eight sub-blocks of q4_k / q5_k from their 12 packed bytes [..., 12]:
    sub-block i < 4 has sc = scales[i] & 63 and m = scales[i + 4] & 63; sub-block i >= 4 has the low four
    bits in scales[i + 4] (sc low nibble, m high nibble) and the top two in bits 6-7 of scales[i - 4]
    (sc) and scales[i] (m)."""
    s = scales.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, m


def dequantize_rows(raw: np.ndarray, weight_type: str, cols: int, dtype: type = np.float32) -> np.ndarray:
    """[rows, cols] of `dtype` from raw bytes [rows, row_bytes]: decoded exactly in float64, then
    rounded once to `dtype`."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rows = raw.shape[0]
    if weight_type in ("f16", "f32"):
        return raw.view(np.float16 if weight_type == "f16" else np.float32).astype(dtype).reshape(rows, cols)
    if weight_type == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(dtype).reshape(rows, cols)
    blocks = raw.reshape(rows, cols // BLOCK_ELEMENTS[weight_type], BLOCK_BYTES[weight_type])
    f64 = np.float64
    if weight_type == "q8_0":
        w = _halves(blocks, 0, f64) * blocks[..., 2:34].view(np.int8)
    elif weight_type == "q4_0":
        w = _halves(blocks, 0, f64) * (_nibbles(blocks[..., 2:18], 16).astype(f64) - 8)
    elif weight_type == "q4_1":
        w = _halves(blocks, 0, f64) * _nibbles(blocks[..., 4:20], 16) + _halves(blocks, 2, f64)
    elif weight_type == "q5_0":
        w = _halves(blocks, 0, f64) * (five_bit_codes(blocks, 2).astype(f64) - 16)
    elif weight_type == "q5_1":
        w = _halves(blocks, 0, f64) * five_bit_codes(blocks, 4) + _halves(blocks, 2, f64)
    elif weight_type == "mxfp4":
        scale = np.ldexp(1.0, blocks[..., 0:1].astype(np.int64) - 128)  # exact in float64 for every e
        w = scale * MXFP4_VALUES[_nibbles(blocks[..., 1:17], 16)].astype(f64)
    elif weight_type in ("q4_k", "q5_k"):
        sc, m = k_scales(blocks[..., 4:16])  # [rows, nb, 8]
        qs = blocks[..., 16:144] if weight_type == "q4_k" else blocks[..., 48:176]
        q = _nibbles(qs, 32).astype(np.int64).reshape(rows, -1, 8, 32)
        if weight_type == "q5_k":
            qh = blocks[..., 16:48]  # bit i of qh[l] is the fifth bit of element l of sub-block i
            q |= ((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1).astype(np.int64) << 4
        d, dmin = _halves(blocks, 0, f64)[..., None], _halves(blocks, 2, f64)[..., None]
        w = (d * sc[..., None]) * q - dmin * m[..., None]
    elif weight_type == "q6_k":
        ql = _nibbles(blocks[..., 0:128], 64).astype(np.int64).reshape(rows, -1, 2, 4, 32)  # [.., half, s, l]
        qh = blocks[..., 128:192].reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
        q = (ql | ((qh & 3).astype(np.int64) << 4)) - 32
        scale = blocks[..., 192:208].view(np.int8).astype(f64).reshape(rows, -1, 2, 4, 2, 1)
        d = _halves(blocks, 208, f64).reshape(rows, -1, 1, 1, 1, 1)
        w = (d * scale) * q.reshape(rows, -1, 2, 4, 2, 16)
    else:
        raise ValueError(f"unknown weight format {weight_type!r}; known: {', '.join(FORMATS)}")
    return w.reshape(rows, cols).astype(dtype)


def k_min_magnitudes(raw: np.ndarray, weight_type: str, cols: int) -> np.ndarray:
    """float64 [rows, cols]: |dmin * m| of each weight's sub-block, the subtracted term of q4_k / q5_k
    (w = d sc q - dmin m); zero for the other formats, which subtract nothing rounded on its own."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rows = raw.shape[0]
    if weight_type not in ("q4_k", "q5_k"):
        return np.zeros((rows, cols))
    blocks = raw.reshape(rows, cols // BLOCK_ELEMENTS[weight_type], BLOCK_BYTES[weight_type])
    _, m = k_scales(blocks[..., 4:16])  # [rows, nb, 8]
    dmin = np.abs(_halves(blocks, 2, np.float64))  # [rows, nb, 1]
    return np.repeat(dmin * m, 32, axis=-1).reshape(rows, cols)


HOST_ROWS_PER_CHUNK = 4096  # the host product decodes this many rows of W at a time


def host_product(raw: np.ndarray, weight_type: str, x: np.ndarray, cols: int, out: np.ndarray) -> None:
    """out[n, rows] = x[n, cols] @ W^T in float32 for raw W bytes [rows, row_bytes]: the cpu backend's
    matvec and matmul. W is decoded a chunk of rows at a time (bounded temporary memory), F32 not at all."""
    if weight_type == "f32":  # already decoded: one BLAS call, no temporary
        np.matmul(x, raw.view(np.float32).T, out=out)
        return
    for start in range(0, raw.shape[0], HOST_ROWS_PER_CHUNK):
        chunk = dequantize_rows(raw[start:start + HOST_ROWS_PER_CHUNK], weight_type, cols)
        out[:, start:start + chunk.shape[0]] = x @ chunk.T
