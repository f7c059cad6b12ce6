"""kernels/block_formats.h, the one definition of each GGUF block format the kernels read (block_format_<type>.h):
every format's element decode (rf_blocks::F::element, through dequantize_block) run on the host against the host's
reference (hipcore/ops/weight_formats.py dequantize_rows, bit for bit) and MXFP4's against the gguf package's
(gguf.quants.MXFP4, ggml's dequantize_row_mxfp4), and MXFP4's int8 codes for dp4a against ggml's kvalues_mxfp4.
The harness (tests/kernel_emulation/harness_block_formats.cpp) is built with g++ against the headers as they are."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf.quants import MXFP4

from hipcore.ops.weight_formats import BLOCK_BYTES, BLOCK_ELEMENTS, dequantize_rows
from hipcore.runtime.kernels import COMPAT_HEADER, kernels_dir
from support.emulated_kernels import EMULATION, NEUTRAL_MARKER

HARNESS = "harness_block_formats.cpp"
TYPES = ("f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
HALF_OFFSETS = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,), "q4_k": (0, 2),
                "q5_k": (0, 2), "q6_k": (208,)}  # where each block's f16 scales sit
MXFP4_BYTES, MXFP4_VALUES = 17, 32


def build(work: Path, edit=None) -> Path:
    """The harness built in `work` from kernels/block_format*.h (edit(name, text) -> text: a planted fault)."""
    compiler = shutil.which("g++")
    assert compiler, "g++ (C++20) is needed to build the kernel emulation: apt-get install g++"
    for path in sorted(kernels_dir().glob("block_format*.h")):
        text = path.read_text()
        (work / path.name).write_text(edit(path.name, text) if edit else text)
    for name in ("emulation.h", "harness_io.h", HARNESS):
        shutil.copy(EMULATION / name, work)
    header = (kernels_dir() / COMPAT_HEADER).read_text()
    (work / COMPAT_HEADER).write_text('#pragma once\n#include "emulation.h"\n' + header[header.index(NEUTRAL_MARKER):])
    out = work / "harness_block_formats"
    proc = subprocess.run([compiler, "-std=c++20", "-O1", "-pthread", "-DWARP_SIZE=32", "-Wno-unknown-pragmas", "-o",
                           str(out), str(work / HARNESS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("block_formats"))


def decode(harness: Path, tmp_path: Path, mode: str, data: np.ndarray, dtype=np.float32) -> np.ndarray:
    src, dst = tmp_path / f"{mode}.in", tmp_path / f"{mode}.out"
    np.ascontiguousarray(data).tofile(src)
    proc = subprocess.run([str(harness), mode, str(src), str(dst)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"harness {mode} exited with {proc.returncode}: {proc.stderr[-2000:]}"
    return np.fromfile(dst, dtype=dtype)


def random_blocks(weight_type: str, n_blocks: int, rng) -> np.ndarray:
    """n_blocks of random bytes whose f16 scales are finite (of either sign, subnormals and zero among them)."""
    raw = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES[weight_type]), dtype=np.uint8)
    scales = rng.standard_normal(size=(n_blocks, 2)) * np.exp2(rng.integers(-20, 4, size=(n_blocks, 2)))
    scales[:4] = [[0.0, -0.0], [6e-8, -6e-8], [65504.0, 1.0], [-2.0**-14, 3.0]]
    halves = scales.astype(np.float16).view(np.uint8).reshape(n_blocks, 2, 2)
    for i, at in enumerate(HALF_OFFSETS.get(weight_type, ())):
        raw[:, at:at + 2] = halves[:, i]
    if weight_type in ("f16", "bf16"):
        raw[:, 1] &= 0xBF if weight_type == "f16" else 0xFF  # no f16 inf/NaN; bf16 NaNs compare equal to NaNs
    return raw


@pytest.mark.parametrize("weight_type", TYPES)
def test_each_format_decodes_as_the_host_reference(harness, tmp_path, weight_type):
    rng = np.random.default_rng(sum(map(ord, weight_type)))
    raw = random_blocks(weight_type, 64, rng)
    cols = 64 * BLOCK_ELEMENTS[weight_type]
    want = dequantize_rows(raw.reshape(1, -1), weight_type, cols)[0]
    got = decode(harness, tmp_path, weight_type, raw)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit, signed zeros too


def test_mxfp4_decodes_as_ggml(harness, tmp_path):
    rng = np.random.default_rng(39)
    raw = rng.integers(0, 256, size=(512, MXFP4_BYTES), dtype=np.uint8)
    raw[:256, 0] = np.arange(256)  # every E8M0 scale, the subnormal ones (0, 1) and 2^127 (255) among them
    raw[256:272, 1:] = (np.arange(16, dtype=np.uint8) * 0x11)[:, None]  # every code in both nibbles
    with np.errstate(over="ignore"):  # 12 * 2^127
        want = MXFP4.dequantize_blocks(raw).reshape(-1).astype(np.float32)
    got = decode(harness, tmp_path, "mxfp4", raw)
    assert np.isinf(want).any() and (want[:32 * 2] != 0).any()  # the extremes are in the sample
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # element j in the low nibble of qs[j], element 16 + j in its high nibble
    one = np.zeros((1, MXFP4_BYTES), np.uint8)
    one[0, 0], one[0, 1 + 3] = 128, 0x7 | (0xC << 4)  # scale 2^(128 - 128) = 1: codes 7 (12) and 12 (-4)
    values = decode(harness, tmp_path, "mxfp4", one)
    assert values[3] == 12.0 and values[16 + 3] == -4.0 and np.count_nonzero(values) == 2


def test_mxfp4_int8_codes_are_ggmls_values(harness, tmp_path):
    codes = np.arange(1 << 16, dtype=np.uint32)
    nibbles = (codes[:, None] >> (4 * np.arange(4, dtype=np.uint32))) & 15  # four codes, one per byte
    words = (nibbles << (8 * np.arange(4, dtype=np.uint32))).sum(axis=1).astype(np.uint32)
    got = decode(harness, tmp_path, "mxfp4_int8", words, np.uint32).view(np.int8).reshape(-1, 4)
    np.testing.assert_array_equal(got, np.array(MXFP4.kvalues, np.int8)[nibbles])


def test_a_wrong_nibble_order_is_caught(tmp_path):
    """A planted fault: MXFP4's elements 0..15 read from the high nibbles instead of the low ones."""
    def swap(name, text):
        return text.replace("k < 16 ? byte & 15u : byte >> 4", "k < 16 ? byte >> 4 : byte & 15u") if name == "block_format_mxfp4.h" else text

    broken = build(tmp_path, swap)
    assert "byte >> 4 : byte & 15u" in (tmp_path / "block_format_mxfp4.h").read_text()
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(8, MXFP4_BYTES), dtype=np.uint8)
    raw[:, 0] = 127
    want = MXFP4.dequantize_blocks(raw).reshape(-1).astype(np.float32)
    assert not np.array_equal(decode(broken, tmp_path, "mxfp4", raw), want)
