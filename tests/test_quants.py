"""Tensor types: the type table, and dequantization of every supported type against the gguf package
(the reference) and against the original float data (within each format's error)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from support.gguf_factory import tiny_llama_spec, write_gguf
from support.gguf_quantize import max_abs_error, quantize, random_blocks
from hipcore.gguf import quants
from hipcore.gguf.file import GGUFFile

SUPPORTED = sorted(quants.SUPPORTED_TYPES)
K_TYPES = {"Q4_K", "Q5_K", "Q6_K"}


def test_supported_set_is_the_issue_minimum():
    assert {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"} <= quants.SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", list(GGMLQuantizationType), ids=lambda t: t.name)
def test_geometry_matches_gguf_table(qtype):
    assert quants.type_name(int(qtype)) == qtype.name
    assert quants.block_geometry(int(qtype)) == GGML_QUANT_SIZES[qtype]
    assert quants.type_kind(int(qtype)) == ("supported" if qtype.name in quants.SUPPORTED_TYPES else "unsupported")


def test_removed_and_unknown_ids_are_told_apart():
    assert quants.type_kind(4) == "removed" and quants.type_name(4) == "Q4_2"
    assert quants.type_kind(5) == "removed" and quants.type_name(5) == "Q4_3"
    assert quants.type_kind(31) == "removed"
    assert quants.type_kind(200) == "unknown" and "200" in quants.type_name(200)
    assert quants.type_kind(2**32 - 1) == "unknown"
    with pytest.raises(ValueError):
        quants.block_geometry(4)


@pytest.mark.parametrize("name,cols,expected", [("F32", 3, 12), ("Q4_1", 64, 40), ("Q8_0", 32, 34), ("Q6_K", 512, 420)])
def test_row_bytes(name, cols, expected):
    assert quants.row_bytes(quants.type_id(name), cols) == expected


@pytest.mark.parametrize("name,cols", [("Q4_0", 33), ("Q4_K", 128), ("F16", 0)])
def test_row_bytes_rejects_partial_blocks(name, cols):
    with pytest.raises(ValueError):
        quants.row_bytes(quants.type_id(name), cols)


@pytest.mark.parametrize("name", SUPPORTED)
def test_dequantize_random_blocks_matches_gguf_reference(name):
    rng = np.random.default_rng(1)
    type_id = quants.type_id(name)
    block, _ = quants.block_geometry(type_id)
    rows, blocks_per_row = 3, max(1, 256 // block)
    raw = random_blocks(name, rows * blocks_per_row, rng).reshape(rows, -1)
    ours = quants.dequantize(raw, type_id, (rows, blocks_per_row * block))
    reference = gguf_quants.dequantize(raw, GGMLQuantizationType[name])
    assert ours.dtype == np.float32 and ours.shape == (rows, blocks_per_row * block)
    np.testing.assert_array_equal(ours, reference.reshape(ours.shape))


@pytest.mark.parametrize("name", SUPPORTED)
def test_quantize_round_trip_within_format_error(name):
    rng = np.random.default_rng(2)
    values = (rng.standard_normal((4, 512)) * 0.05).astype(np.float32)
    raw = quantize(values, name)
    restored = quants.dequantize(raw, quants.type_id(name), values.shape)
    error = float(np.max(np.abs(restored - values)))
    assert error <= max_abs_error(values, name)
    if name not in ("F32",):
        assert error > 0  # a lossy format that reproduced the data exactly would mean we compared a copy
    # and the format's error is a small fraction of the signal, not just "bounded" (MXFP4's e2m1 values under a
    # power-of-two scale: 0.12 of it on these values)
    assert np.sqrt(np.mean((restored - values) ** 2)) < (0.15 if name == "MXFP4" else 0.1) * values.std()


@pytest.mark.parametrize("name", SUPPORTED)
def test_tensors_read_back_from_a_file(tmp_path, name):
    """Each type written into a real GGUF by gguf.GGUFWriter and read back through GGUFFile."""
    spec = tiny_llama_spec(tensor_type=name, hidden=256, n_heads=4, n_kv_heads=2, ffn=256, n_layers=1,
                           tied=False, seed=3)
    path = write_gguf(tmp_path / f"{name}.gguf", spec)
    with GGUFFile.open(path) as f:
        for t in spec.tensors:
            info = f.plan.tensor(t.name)
            assert info.type_name == t.type_name and info.shape == t.shape
            np.testing.assert_array_equal(f.raw(t.name), t.data.reshape(-1))
            ours = f.dequantize(t.name)
            reference = gguf_quants.dequantize(t.data, GGMLQuantizationType[t.type_name]).reshape(t.shape)
            np.testing.assert_array_equal(ours, reference)
            assert np.max(np.abs(ours - t.values)) <= max_abs_error(t.values, t.type_name)


def test_dequantize_checks_the_byte_count():
    with pytest.raises(ValueError, match="needs 68 bytes"):
        quants.dequantize(np.zeros(67, np.uint8), quants.type_id("Q8_0"), (2, 32))


def test_dequantize_refuses_unsupported_types():
    with pytest.raises(ValueError, match="IQ4_NL"):
        quants.dequantize(np.zeros(18, np.uint8), quants.type_id("IQ4_NL"), (32,))


def test_bf16_is_the_high_half_of_f32():
    values = np.array([1.0, -2.5, 3.140625, 2.0**100, -0.0], np.float32)  # all exact in bf16
    raw = (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    np.testing.assert_array_equal(quants.dequantize(raw, quants.type_id("BF16"), (5,)), values)
