"""Which format each weight is stored in on a GPU, and what the memory plan reserves for it
(hipcore/model/weights.py), driven by a cpu device wearing a GPU backend's name: storage decisions
depend only on the backend, and the cpu device can hold the uploaded bytes."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.gguf.file import GGUFFile
from hipcore.gguf.quants import SUPPORTED_TYPES
from hipcore.model import weights
from hipcore.model.weights import neox_pair_order, planned_weight_bytes, storage_format, upload_weights
from hipcore.ops import embedding, rope
from support.gguf_factory import write_tiny_llama
from support.phi3_models import write_model
from support.stand_in_gpu import StandInGpu


def _file_bytes(plan, names) -> int:
    return sum(plan.tensor(n).nbytes for n in names)


@pytest.mark.parametrize("backend", ["hip", "cuda"])
@pytest.mark.parametrize("table_type", ["Q4_K", "Q5_K", "Q6_K"])
def test_a_tied_k_quant_table_stays_in_its_file_format(tmp_path, backend, table_type):
    """A Q4_K_M file ties its embeddings in Q6_K (Llama-3.2-1B/3B): the table (and so the output head,
    which reads the same Weight) is stored as the file holds it, not widened to f16, and the memory plan
    reserves exactly the file's bytes for the whole model."""
    path = write_tiny_llama(tmp_path / "m.gguf", hidden=256, ffn=256, n_heads=4, n_kv_heads=2, vocab=300,
                            tensor_type="Q4_K", embedding_type=table_type, tied=True)
    device = StandInGpu(backend)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        table = plan.tensor("token_embd.weight")
        assert table.type_name == table_type
        assert storage_format(device, table_type, is_table=True, is_vector=False) == table_type.lower()
        file_bytes = _file_bytes(plan, [t.name for t in plan.tensors])
        assert planned_weight_bytes(device, plan) == file_bytes
        weights = upload_weights(device, gguf)
        try:
            assert weights.token_embd.fmt == table_type.lower() and weights.output is weights.token_embd
            assert weights.nbytes == file_bytes and not weights.converted
            assert np.array_equal(weights.token_embd.buffer.download(np.uint8)[:table.nbytes], gguf.raw(table.name).reshape(-1))
        finally:
            weights.free()


def test_an_untied_k_quant_table_stays_in_its_file_format(tmp_path):
    """Llama-3.1-8B's untied token_embd is Q4_K: stored as Q4_K beside its own output matrix."""
    path = write_tiny_llama(tmp_path / "m.gguf", hidden=256, ffn=256, n_heads=4, n_kv_heads=2, vocab=300,
                            tensor_type="Q6_K", embedding_type="Q4_K", tied=False)
    device = StandInGpu("cuda")
    with GGUFFile.open(path) as gguf:
        assert planned_weight_bytes(device, gguf.plan) == _file_bytes(gguf.plan, [t.name for t in gguf.plan.tensors])


def test_the_plan_check_catches_a_table_widened_to_f16(tmp_path, monkeypatch):
    """The planted fault: without Q6_K among the table types (as before the K-quant lookup kernels) the
    table is planned as f16, 2 bytes an element, and the equality above fails."""
    monkeypatch.setattr(weights, "GPU_TABLE_TYPES", weights.GPU_TABLE_TYPES - {"q6_k"})
    path = write_tiny_llama(tmp_path / "m.gguf", hidden=256, ffn=256, n_heads=4, n_kv_heads=2, vocab=300,
                            tensor_type="Q4_K", embedding_type="Q6_K", tied=True)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        table = plan.tensor("token_embd.weight")
        others = _file_bytes(plan, [t.name for t in plan.tensors if t.name != table.name])
        planned = weights.planned_weight_bytes(StandInGpu("hip"), plan)
        assert planned == others + table.n_elements * 2 != _file_bytes(plan, [t.name for t in plan.tensors])


def test_every_gpu_table_type_has_a_lookup_kernel():
    """Every type the reader accepts has a lookup kernel, so no table is widened at load; but MXFP4, gpt-oss's expert
    format, which no published file uses for a table (one would be widened to F16 at load, and said)."""
    assert weights.GPU_TABLE_TYPES == set(embedding.TABLE_TYPES) == {t.lower() for t in SUPPORTED_TYPES} - {"mxfp4"}


def _bf16_model(tmp_path):
    return write_tiny_llama(tmp_path / "bf16.gguf", hidden=256, ffn=256, n_heads=4, n_kv_heads=2, vocab=300,
                            tensor_type="BF16", tied=False)


def test_bf16_matrices_stay_bf16_where_f16_holds_their_values(tmp_path):
    """The matrix cores narrow BF16 weights to f16 (kernels/matmul_mma_formats.h BF16): a file whose values f16
    holds is stored as it is, byte for byte, nothing converted."""
    device = StandInGpu("cuda")
    with GGUFFile.open(_bf16_model(tmp_path)) as gguf:
        loaded = upload_weights(device, gguf)
        try:
            assert not loaded.converted
            assert {w.fmt for lw in loaded.layers for w in (lw.attn_q, lw.ffn_gate, lw.ffn_down)} == {"bf16"}
            assert loaded.output.fmt == "bf16"
            assert loaded.nbytes == planned_weight_bytes(device, gguf.plan)
        finally:
            loaded.free()


@pytest.mark.parametrize("bits, fits", [(0x477F, True), (0xC77F, True), (0x4780, False), (0xC780, False),
                                        (0x7F80, False), (0x7FC0, False), (0x0001, True)])
def test_the_bf16_range_check_draws_the_line_at_f16s_largest_value(bits, fits):
    """65,280 (0x477F) is the largest bfloat16 f16 holds; 65,536, infinities and NaNs are not; a tiny value is."""
    values = np.zeros(100, dtype=np.uint16)
    values[57] = bits
    assert weights.bf16_fits_f16(values.view(np.uint8)) is fits


def _plant_65536(path):
    """One weight of layer 0's gate at 65,536 (bfloat16 0x4780), which f16 cannot hold; its byte offset."""
    with GGUFFile.open(path) as gguf:
        offset = gguf.plan.tensor("blk.0.ffn_gate.weight").offset + 2 * 1000
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.array([0x4780], dtype=np.uint16).tobytes())


def test_without_matrix_cores_nothing_narrows_bf16_so_nothing_is_widened(tmp_path):
    """gfx1030 has no matrix cores: its BF16 products never narrow to f16, so the planted value stays BF16."""
    path = _bf16_model(tmp_path)
    _plant_65536(path)
    device = StandInGpu("hip")
    device.arch = "gfx1030"
    with GGUFFile.open(path) as gguf:
        loaded = upload_weights(device, gguf)
        try:
            assert loaded.layers[0].ffn_gate.fmt == "bf16" and not loaded.converted
        finally:
            loaded.free()


def test_a_bf16_matrix_beyond_f16s_range_is_stored_as_f32(tmp_path):
    """The planted value: one weight of layer 0's gate at 65,536 (bfloat16 0x4780), which f16 cannot hold. That
    matrix alone is stored as F32 (its values exact; the paths that read F32 never narrow) and the load says so;
    up, uploaded beside gate when both are BF16, now takes a buffer of its own."""
    path = _bf16_model(tmp_path)
    _plant_65536(path)
    with GGUFFile.open(path) as gguf:
        info = gguf.plan.tensor("blk.0.ffn_gate.weight")
        loaded = upload_weights(StandInGpu("cuda"), gguf)
        try:
            gate = loaded.layers[0].ffn_gate
            assert gate.fmt == "f32" and loaded.layers[0].ffn_up.fmt == "bf16" and loaded.layers[1].ffn_gate.fmt == "bf16"
            assert loaded.layers[0].ffn_gate_up is None
            assert loaded.converted == ["blk.0.ffn_gate.weight (BF16 -> F32: values beyond f16's range)"]
            stored = gate.buffer.download(np.float32)[:info.n_elements]
            assert stored[1000] == 65536.0 and np.array_equal(stored, gguf.dequantize(info.name).reshape(-1))
        finally:
            loaded.free()


@pytest.mark.parametrize("tensor_type", ["Q4_K", "F32"])
def test_qwen2s_q_and_k_rows_are_uploaded_with_each_neox_pair_side_by_side(tmp_path, tensor_type):
    """qwen2 (NEOX RoPE, NEOX_AS_NORM): attn_q, attn_k and their biases go up with the rows of each head in
    neox_pair_order (pair i's rows i and i + head_dim / 2 at 2i and 2i + 1), so that NORM-mode RoPE on them is the
    file's NEOX RoPE, reordered; v, o and the rest keep the file's bytes. llama (NORM already) is stored as it is."""
    heads, kv_heads, head_dim = 4, 2, 64
    for architecture in ("qwen2", "llama"):
        path = write_tiny_llama(tmp_path / f"{architecture}.gguf", architecture=architecture, hidden=256, ffn=256,
                                n_heads=heads, n_kv_heads=kv_heads, vocab=300, tensor_type=tensor_type)
        with GGUFFile.open(path) as gguf:
            loaded = upload_weights(StandInGpu("cuda"), gguf)
            try:
                assert loaded.rope_pairs_adjacent == (architecture == "qwen2")
                lw = loaded.layers[1]
                checked = [("attn_q.weight", lw.attn_q, heads), ("attn_k.weight", lw.attn_k, kv_heads),
                           ("attn_v.weight", lw.attn_v, None), ("attn_output.weight", lw.attn_output, None)]
                if architecture == "qwen2":
                    checked += [("attn_q.bias", lw.attn_q_bias, heads), ("attn_k.bias", lw.attn_k_bias, kv_heads),
                                ("attn_v.bias", lw.attn_v_bias, None)]
                for part, weight, reordered_heads in checked:
                    info = gguf.plan.tensor(f"blk.1.{part}")
                    rows = info.shape[0]
                    stored = weight.buffer.download(np.uint8)[weight.offset:weight.offset + info.nbytes]
                    file_rows = np.asarray(gguf.raw(info.name)).reshape(rows, -1)
                    if reordered_heads is None or architecture != "qwen2":
                        want = file_rows
                    else:
                        order = neox_pair_order(head_dim, head_dim)
                        want = file_rows.reshape(reordered_heads, head_dim, -1)[:, order].reshape(rows, -1)
                        assert not np.array_equal(want, file_rows)
                    assert np.array_equal(stored.reshape(rows, -1), want), (architecture, part)
            finally:
                loaded.free()


def test_norm_rope_on_rows_in_neox_pair_order_is_neox_rope_reordered():
    """The identity the reordering rests on, at a partial rotation too (rope_dim < head_dim: the rest stays)."""
    rng = np.random.default_rng(3)
    for head_dim, rope_dim in ((64, 64), (16, 8)):
        y = rng.standard_normal((3, 2, head_dim))
        positions = np.array([0, 7, 1234], dtype=np.int32)
        order = neox_pair_order(head_dim, rope_dim)
        neox = rope.reference(y, positions, rope_dim, 10000.0, 1.0, rope_type="neox")
        norm = rope.reference(y[..., order], positions, rope_dim, 10000.0, 1.0, rope_type="norm")
        np.testing.assert_allclose(norm, neox[..., order], rtol=0, atol=1e-12)
        assert sorted(order) == list(range(head_dim)) and list(order[rope_dim:]) == list(range(rope_dim, head_dim))


def test_phi3s_q_and_k_rows_of_its_qkv_are_reordered_and_v_is_not(tmp_path):
    """phi3 (NEOX, NEOX_AS_NORM) holds q|k|v as one file tensor: its q rows (per q head) and k rows (per kv head) go
    up in neox_pair_order, its v rows as the file has them; the row views still cover q, k and v."""
    path = write_model("phi3-f32", tmp_path)
    with GGUFFile.open(path) as gguf:
        config = gguf.config
        loaded = upload_weights(StandInGpu("cuda"), gguf)
        try:
            assert loaded.rope_pairs_adjacent
            qkv = loaded.layers[0].attn_qkv
            info = gguf.plan.tensor("blk.0.attn_qkv.weight")
            file_rows = np.asarray(gguf.dequantize(info.name)).reshape(info.shape[0], -1)
            stored = qkv.buffer.download(np.float32)[:info.n_elements].reshape(info.shape[0], -1)
            q, k, hd = config.q_size, config.q_size + config.kv_size, config.head_dim
            order = neox_pair_order(hd, config.rope_dim)
            want_q = file_rows[:q].reshape(config.n_heads, hd, -1)[:, order].reshape(q, -1)
            want_k = file_rows[q:k].reshape(config.n_kv_heads, hd, -1)[:, order].reshape(k - q, -1)
            assert not np.array_equal(want_q, file_rows[:q])
            assert np.array_equal(stored[:q], want_q) and np.array_equal(stored[q:k], want_k)
            assert np.array_equal(stored[k:], file_rows[k:])
        finally:
            loaded.free()
