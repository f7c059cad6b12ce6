"""Q5_0 and Q5_1: both host decoders (hipcore.gguf.quants.dequantize, the file reader's, and
hipcore.ops.weight_formats.dequantize_rows, the kernels' reference) against a decoder written here, one
element at a time, from ggml's block layout (ggml-common.h):

    block_q5_0: half d; uint8 qh[4]; uint8 qs[16]          (22 bytes)  w = d * (q - 16)
    block_q5_1: half d; half m; uint8 qh[4]; uint8 qs[16]  (24 bytes)  w = d * q + m

q is five bits: for j < 16 the low nibble of qs[j], for j >= 16 the high nibble of qs[j - 16]; the fifth
bit is bit j of qh read as a little-endian 32-bit word. Random blocks cover every code and high-bit
pattern; the scales include signed zeros, subnormals and the largest finite halves.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hipcore.gguf import quants
from hipcore.ops import weight_formats
from support.gguf_quantize import max_abs_error, quantize

LAYOUT = {"Q5_0": (22, False), "Q5_1": (24, True)}  # bytes per block, has a min
# Halves (as bit patterns) at the edges: +0, -0, the smallest subnormal, the largest subnormal, the
# smallest normal, 1, the largest finite, and their negatives.
EDGE_HALVES = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]


def decode_block(block: bytes, type_name: str) -> list[float]:
    """The 32 weights of one block, from the layout alone (float32 arithmetic, as ggml's C)."""
    has_min = LAYOUT[type_name][1]
    d = np.float32(np.frombuffer(block[0:2], "<f2")[0])
    m = np.float32(np.frombuffer(block[2:4], "<f2")[0]) if has_min else np.float32(0)
    at = 4 if has_min else 2
    (qh,) = struct.unpack("<I", block[at:at + 4])
    qs = block[at + 4:at + 20]
    out = []
    for j in range(32):
        nibble = qs[j] & 15 if j < 16 else qs[j - 16] >> 4
        q = nibble | (((qh >> j) & 1) << 4)
        # q * d is exact in float32 (5 x 11 bits), so the one rounding is the addition of m
        out.append(np.float32(q) * d + m if has_min else np.float32(q - 16) * d)
    return out


def random_q5_blocks(rng: np.random.Generator, type_name: str, n_blocks: int) -> np.ndarray:
    """n_blocks random blocks: random codes and high bits; d (and m) random halves with the edge values
    planted in the first blocks (every pair of an edge d with an edge m for Q5_1)."""
    nbytes, has_min = LAYOUT[type_name]
    blocks = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    scales = (rng.standard_normal((n_blocks, 2)) * 0.05).astype(np.float16).view(np.uint16)
    pairs = [(d, m) for d in EDGE_HALVES for m in (EDGE_HALVES if has_min else [0])]
    assert n_blocks >= len(pairs)
    for i, (d, m) in enumerate(pairs):
        scales[i] = (d, m)
    blocks[:, 0:2] = scales[:, 0:1].copy().view(np.uint8)
    if has_min:
        blocks[:, 2:4] = scales[:, 1:2].copy().view(np.uint8)
    qh_at = 4 if has_min else 2
    blocks[-2, qh_at:qh_at + 4] = 0xFF  # all fifth bits set, then none
    blocks[-1, qh_at:qh_at + 4] = 0
    return blocks


@pytest.mark.parametrize("type_name", sorted(LAYOUT))
def test_both_host_decoders_equal_the_layout(type_name):
    rng = np.random.default_rng([5, len(type_name), ord(type_name[-1])])
    rows, blocks_per_row = 16, 8
    blocks = random_q5_blocks(rng, type_name, rows * blocks_per_row)
    raw = blocks.reshape(rows, -1)
    want = np.array([decode_block(bytes(b), type_name) for b in blocks], np.float32).reshape(rows, -1)

    read = quants.dequantize(raw, quants.type_id(type_name), (rows, blocks_per_row * 32))
    kernels_reference = weight_formats.dequantize_rows(raw, type_name.lower(), blocks_per_row * 32)
    for name, got in (("quants.dequantize", read), ("weight_formats.dequantize_rows", kernels_reference)):
        assert got.dtype == np.float32 and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert np.array_equal(np.signbit(got), np.signbit(want)), f"{name}: the sign of a zero differs"
    # and the float64 reference is the exact value: rounding it to float32 gives the above
    exact = weight_formats.dequantize_rows(raw, type_name.lower(), blocks_per_row * 32, np.float64)
    np.testing.assert_array_equal(exact.astype(np.float32), want)


def test_the_fifth_bit_is_bit_j_of_qh():
    """One block per element j with only bit j of qh set, d = 1 and every nibble 0: only element j is 0."""
    for j in range(32):
        block = np.zeros(22, np.uint8)
        block[0:2] = np.array([1.0], "<f2").view(np.uint8)
        block[2:6] = np.array([1 << j], "<u4").view(np.uint8)
        got = quants.dequantize(block, quants.type_id("Q5_0"), (32,))
        want = np.full(32, -16.0, np.float32)
        want[j] = 0.0
        np.testing.assert_array_equal(got, want, err_msg=f"bit {j}")
        np.testing.assert_array_equal(weight_formats.dequantize_rows(block.reshape(1, 22), "q5_0", 32)[0], want)


def test_high_nibbles_are_the_second_half():
    """qs[j] = 0x5A: element j reads the low nibble (10), element j + 16 the high one (5)."""
    block = np.zeros(24, np.uint8)
    block[0:2] = np.array([1.0], "<f2").view(np.uint8)  # d = 1, m = 0
    block[8 + 3] = 0x5A
    got = weight_formats.dequantize_rows(block.reshape(1, 24), "q5_1", 32)[0]
    assert got[3] == 10 and got[19] == 5 and np.count_nonzero(got) == 2


@pytest.mark.parametrize("type_name", sorted(LAYOUT))
def test_quantizer_round_trip(type_name):
    """The test factory's quantizer (gguf's) writes blocks our decoder reads back within a step."""
    rng = np.random.default_rng(9)
    values = (rng.standard_normal((3, 256)) * 0.05).astype(np.float32)
    raw = quantize(values, type_name)
    assert raw.shape == (3, 8 * LAYOUT[type_name][0])
    decoded = weight_formats.dequantize_rows(raw, type_name.lower(), 256)
    error = float(np.abs(decoded - values).max())
    assert 0 < error <= max_abs_error(values, type_name)
    # five bits: about twice as fine as the four-bit types on the same data
    four_bit = quants.dequantize(quantize(values, type_name.replace("5", "4")), quants.type_id(type_name.replace("5", "4")),
                                 values.shape)
    assert np.sqrt(np.mean((decoded - values) ** 2)) < 0.7 * np.sqrt(np.mean((four_bit - values) ** 2))
