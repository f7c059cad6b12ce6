"""The GGUF reader on valid files: the real demo model (against the gguf package's own reader) and
tiny files from the factory; the frozen plan; phase-2 views; limits; file-level errors."""

from __future__ import annotations

import dataclasses
import os
import time

import gguf
import numpy as np
import pytest

from support.gguf_factory import raw_tiny_llama, tiny_llama_spec, write_gguf, write_tiny_llama
from hipcore.errors import EXIT_USAGE, UsageError
from hipcore.gguf.file import GGUFError, GGUFFile, Limits, read_plan, read_plan_from_bytes


@pytest.fixture(scope="module")
def demo_plan(demo_model_path):
    start = time.perf_counter()
    plan = read_plan(demo_model_path)
    elapsed = time.perf_counter() - start
    print(f"\ndemo model header parsed and validated in {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0
    return plan


@pytest.fixture(scope="module")
def gguf_package_reader(demo_model_path):
    return gguf.GGUFReader(demo_model_path)  # ~3 s: parse once for the module


def test_demo_model_config(demo_plan):
    c = demo_plan.config
    assert (c.architecture, c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (c.head_dim, c.ffn_size, c.vocab_size, c.tie_embeddings) == (64, 1536, 49152, True)
    assert c.rope_scaling == "none" and c.rope_dim == 64
    assert len(demo_plan.tensors) == len(c.expected_tensor_shapes())


def test_demo_model_plan_agrees_with_the_gguf_package(demo_plan, gguf_package_reader):
    """An independent parser of the same (valid) file must see the same tensors and metadata."""
    reference = gguf_package_reader
    assert [t.name for t in demo_plan.tensors] == [t.name for t in reference.tensors]
    for ours, theirs in zip(demo_plan.tensors, reference.tensors):
        assert ours.type_name == theirs.tensor_type.name
        assert ours.dims == tuple(int(d) for d in theirs.shape)
        assert ours.offset == int(theirs.data_offset)
        assert ours.nbytes == int(theirs.n_bytes)
    assert demo_plan.total_tensor_bytes == sum(int(t.n_bytes) for t in reference.tensors)
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        value = demo_plan.metadata[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert len(value) == len(field.data)
        else:
            contents = field.contents()
            assert value == (pytest.approx(contents) if isinstance(contents, float) else contents), key


def test_demo_model_tensor_bytes_agree_with_the_gguf_package(demo_model_path, gguf_package_reader):
    reference = {t.name: t for t in gguf_package_reader.tensors}
    with GGUFFile.open(demo_model_path) as f:
        for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"):
            ours = f.raw(name)
            assert ours.tobytes() == np.asarray(reference[name].data).tobytes()
            values = f.dequantize(name)
            assert values.shape == f.plan.tensor(name).shape and values.dtype == np.float32


@pytest.mark.parametrize("kwargs", [
    dict(tokenizer="gpt2"), dict(tokenizer="llama", tied=False), dict(tokenizer=None, tensor_type="Q8_0"),
    dict(tensor_type="F16", alignment=64), dict(tensor_type="BF16", n_layers=3, n_heads=8, n_kv_heads=8),
])
def test_factory_files_read_back_exactly(tmp_path, kwargs):
    spec = tiny_llama_spec(**kwargs)
    path = write_gguf(tmp_path / "m.gguf", spec)
    with GGUFFile.open(path) as f:
        plan = f.plan
        assert [t.name for t in plan.tensors] == [t.name for t in spec.tensors]
        assert plan.alignment == kwargs.get("alignment", 32)
        end = plan.data_offset
        for info, t in zip(plan.tensors, spec.tensors):
            assert info.shape == t.shape and info.dims == t.shape[::-1] and info.type_name == t.type_name
            assert info.offset == end + (-(end - plan.data_offset) % plan.alignment)
            assert (info.offset - plan.data_offset) % plan.alignment == 0
            assert info.nbytes == t.data.nbytes and info.n_elements == t.values.size
            np.testing.assert_array_equal(f.raw(t.name), t.data.reshape(-1))
            end = info.offset + info.nbytes
        assert plan.total_tensor_bytes == sum(t.data.nbytes for t in spec.tensors)
        assert end <= plan.file_size == path.stat().st_size


def test_plan_from_bytes_equals_plan_from_file(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", tokenizer="llama")
    from_file = read_plan(path)
    from_bytes = read_plan_from_bytes(path.read_bytes())
    assert from_file.tensors == from_bytes.tensors and from_file.config == from_bytes.config
    assert dict(from_file.metadata) == dict(from_bytes.metadata)
    assert from_file.metadata_types["tokenizer.ggml.scores"] == "array[float32]"
    assert from_file.metadata_types["llama.block_count"] == "uint32"


def test_plan_is_frozen_and_read_only(tmp_path):
    plan = read_plan(write_tiny_llama(tmp_path / "m.gguf"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.alignment = 64  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tensors[0].offset = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.metadata["general.name"] = "x"  # type: ignore[index]
    assert isinstance(plan.metadata["tokenizer.ggml.tokens"], tuple)


def test_missing_tensor_is_a_gguf_error(tmp_path):
    plan = read_plan(write_tiny_llama(tmp_path / "m.gguf"))
    with pytest.raises(GGUFError, match="no tensor 'output.weight'"):
        plan.tensor("output.weight")


def test_views_are_read_only_and_outlive_close(tmp_path):
    spec = tiny_llama_spec()
    f = GGUFFile.open(write_gguf(tmp_path / "m.gguf", spec))
    view = f.raw("token_embd.weight")
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1
    f.close()
    np.testing.assert_array_equal(view, spec.tensor("token_embd.weight").data.reshape(-1))
    with pytest.raises(ValueError, match="closed"):
        f.raw("token_embd.weight")
    f.close()  # closing twice is harmless


def test_dequantize_f32_gives_the_written_values(tmp_path):
    spec = tiny_llama_spec(tied=False)
    with GGUFFile.open(write_gguf(tmp_path / "m.gguf", spec)) as f:
        for t in spec.tensors:
            np.testing.assert_array_equal(f.dequantize(t.name), t.values)


def test_limits_are_configurable(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layers=1)
    with pytest.raises(GGUFError, match="tensor_count"):
        read_plan(path, Limits(max_tensors=5))
    with pytest.raises(GGUFError, match="tokenizer.chat_template length"):
        read_plan(path, Limits(max_string_bytes=100))
    with pytest.raises(GGUFError, match="tokenizer.ggml.tokens array length"):
        read_plan(path, Limits(max_array_elements=100))
    with pytest.raises(GGUFError, match="llama.block_count"):
        read_plan(path, Limits(max_layers=0))


@pytest.mark.parametrize("make", ["missing", "directory", "fifo"])
def test_unopenable_path_is_a_usage_error(tmp_path, make):
    path = tmp_path / "nothing.gguf"
    if make == "directory":
        path.mkdir()
    elif make == "fifo":
        os.mkfifo(path)  # opening it for reading would block forever
    with pytest.raises(UsageError) as info:
        read_plan(path)
    assert info.value.exit_code == EXIT_USAGE and "cannot open model file" in str(info.value)


def test_version_2_files_are_read(tmp_path):
    raw = raw_tiny_llama(n_layers=1)
    raw.version = 2
    assert read_plan_from_bytes(raw.to_bytes()).version == 2


def test_alignment_declared_in_metadata_is_used(tmp_path):
    raw = raw_tiny_llama(n_layers=1, alignment=256)
    plan = read_plan_from_bytes(raw.to_bytes())
    assert plan.alignment == 256 and plan.data_offset % 256 == 0
    assert all((t.offset - plan.data_offset) % 256 == 0 for t in plan.tensors)
