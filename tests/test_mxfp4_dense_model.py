"""A dense model whose matrices are MXFP4 (GGML type 39, gpt-oss's expert type; here q, k, v, o, gate, up, down and
the head). On the cpu backend, which decodes each to float32 at load (the gguf package's decoder), its logits are those
of the same model written as F32 holding hipcore/ops/weight_formats.py's decoding of those tensors (the GPU references'
decoder, written apart from gguf's); a planted fault there (the FP4 sign bit misread) must part the two. On each GPU
architecture's plan (tests/support/stand_in_gpu.py: every launch runs its entry's host twin) the matrices stay MXFP4 and
the products take fused_qmatvec's MXFP4 entries or qmatvec_mxfp4 (a few tokens) and matmul_mma_mxfp4 or, without
matrix cores, matmul_mxfp4 (prompts), with the cpu backend's logits. A matrix with weights beyond f16's range is stored
as F32 where the matrix cores would narrow it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.gguf.file import GGUFFile
from hipcore.model import weights
from hipcore.model.weights import upload_weights
from hipcore.ops import weight_formats
from support.gguf_factory import TensorSpec, _encode, tiny_llama_spec, write_gguf
from support.model_steps import step_batch
from support.stand_in_gpu import StandInGpu, host_kernels_for_stand_ins

PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output")
# The GPU plans' few-token products (qmatvec: the decode step's, and every step's head of one row a sequence) quantize
# x to int8 per 32 values (up to 1/254 of each slice's largest value off per element), which the cpu backend's float
# products do not: through two layers and the head the logits move up to 1.6% of the largest here (0.7% in the
# prompt steps, from the head alone). A sign misread moves them past 10% (test_a_misread_sign_bit_is_caught).
MAX_RELATIVE_LOGIT_DIFF = 0.03
# The prompt product each architecture's plan takes for MXFP4 (no matrix cores on sm_75 and gfx1030: matmul's FP32
# tiles); every plan takes fused_qmatvec's MXFP4 entries for one token and qmatvec beyond its limit (8 tokens).
ENTRIES = {"sm_90": "matmul_mma_mxfp4", "gfx942": "matmul_mma_mxfp4", "gfx1100": "matmul_mma_mxfp4",
           "sm_75": "matmul_mxfp4", "gfx1030": "matmul_mxfp4"}


def mxfp4_spec():
    return tiny_llama_spec(n_layers=2, hidden=64, ffn=128, tied=False, seed=5, tensor_types=dict.fromkeys(PARTS, "MXFP4"))


def decoded_as_f32(spec):
    """The spec with each MXFP4 tensor replaced by F32 holding weight_formats' decoding of its bytes."""
    def f32(t: TensorSpec) -> TensorSpec:
        if t.type_name != "MXFP4":
            return t
        rows, cols = t.values.shape
        values = weight_formats.dequantize_rows(t.data.reshape(rows, -1), "mxfp4", cols)
        return _encode(t.name, values, "F32")
    return replace(spec, tensors=tuple(f32(t) for t in spec.tensors))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mxfp4-dense")
    spec = mxfp4_spec()
    assert sum(t.type_name == "MXFP4" for t in spec.tensors) == 7 * 2 + 1
    return {"mxfp4": write_gguf(folder / "mxfp4.gguf", spec), "f32": write_gguf(folder / "f32.gguf", decoded_as_f32(spec)),
            "folder": folder}


def run_steps(path, device=None, weight_type="f32") -> list[np.ndarray]:
    """Logits of a prompt of 40 tokens, a batch of four 9-token prompts, a decode step of five sequences (a step of 8
    tokens: the runner pads a decode step to its graph's shape) and one of a single sequence."""
    opts = LoadOptions(device="cpu" if device is None else "auto", max_seqs=8, max_step_tokens=64, ctx_size=256,
                       kv_dtype="f16")
    rng = np.random.default_rng(3)
    draw = lambda n: [int(t) for t in rng.integers(0, 384, n)]  # noqa: E731
    with load_model(str(path), opts, **({} if device is None else {"device": device})) as model:
        layer = model.weights.layers[0]
        assert (layer.attn_output.fmt, layer.ffn_down.fmt, model.weights.output.fmt) == (weight_type,) * 3
        logits = [model.runner.execute(step_batch(model.cache, [(1, draw(40), 0)]))]
        logits.append(model.runner.execute(step_batch(model.cache, [(s, draw(9), 0) for s in range(2, 6)])))
        logits.append(model.runner.execute(step_batch(model.cache, [(s, draw(1), 40 if s == 1 else 9)
                                                                    for s in range(1, 6)])))
        logits.append(model.runner.execute(step_batch(model.cache, [(1, draw(1), 41)])))
        return [step.astype(np.float64) for step in logits]


def worst(got, want) -> float:
    return max(float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def on_cpu(files):
    return run_steps(files["mxfp4"])


def test_the_cpu_backend_runs_mxfp4_matrices_as_their_decoded_values(files, on_cpu):
    assert all(np.isfinite(step).all() for step in on_cpu)
    assert worst(on_cpu, run_steps(files["f32"])) <= 1e-5


def test_a_misread_sign_bit_is_caught(files, on_cpu, monkeypatch):
    """Planted: weight_formats decodes codes 8..15 as positive; its twin's logits must part from the cpu backend's."""
    monkeypatch.setattr(weight_formats, "MXFP4_VALUES", np.abs(weight_formats.MXFP4_VALUES))
    broken = write_gguf(files["folder"] / "broken.gguf", decoded_as_f32(mxfp4_spec()))
    assert worst(run_steps(broken), on_cpu) > 0.1


@pytest.mark.parametrize("arch", ENTRIES)
def test_each_gpu_plan_keeps_mxfp4_and_matches_the_cpu_backend(files, on_cpu, monkeypatch, arch):
    host_kernels_for_stand_ins(monkeypatch)
    device = StandInGpu(arch=arch)
    got = run_steps(files["mxfp4"], device, "mxfp4")
    assert worst(got, on_cpu) <= MAX_RELATIVE_LOGIT_DIFF, arch
    fused = {f"qmatvec_{kind}_1m" for kind in ("norm_rope", "norm_swiglu", "add", "norm")}
    assert {"qmatvec_mxfp4", ENTRIES[arch], *fused} <= device.entries, sorted(device.entries)


def _plant_scale(source, target, scale: int) -> None:
    """A copy of `source` with the scale byte of block 3 of layer 0's o matrix set to `scale`."""
    target.write_bytes(source.read_bytes())
    with GGUFFile.open(target) as gguf:
        offset = gguf.plan.tensor("blk.0.attn_output.weight").offset + 3 * weights.MXFP4_BLOCK_BYTES
    with open(target, "r+b") as f:
        f.seek(offset)
        f.write(bytes([scale]))


@pytest.mark.parametrize("scale,arch,stored", [(140, "sm_90", "mxfp4"), (141, "sm_90", "f32"), (141, "gfx942", "f32"),
                                               (141, "gfx1030", "mxfp4")])
def test_an_mxfp4_matrix_beyond_f16s_range_is_stored_as_f32_where_the_matrix_cores_narrow(files, scale, arch, stored):
    """A block scale of 2^(141 - 128) puts a weight at up to 98,304, which the matrix cores' f16 tiles cannot hold:
    that matrix alone is stored as F32 (its values exact) and the load says so; 140 (up to 49,152) stays MXFP4, and so
    does 141 on gfx1030 (no matrix cores: matmul's float32 tiles)."""
    path = files["folder"] / f"scale{scale}.gguf"
    _plant_scale(files["mxfp4"], path, scale)
    device = StandInGpu(arch=arch)
    with GGUFFile.open(path) as gguf:
        loaded = upload_weights(device, gguf)
        try:
            o = loaded.layers[0].attn_output
            assert (o.fmt, loaded.layers[1].attn_output.fmt, loaded.layers[0].ffn_down.fmt) == (stored, "mxfp4", "mxfp4")
            converted = ["blk.0.attn_output.weight (MXFP4 -> F32: values beyond f16's range)"] if stored == "f32" else []
            assert loaded.converted == converted
            if stored == "f32":
                values = o.buffer.download(np.float32)[:64 * 64]
                assert np.array_equal(values, gguf.dequantize("blk.0.attn_output.weight").reshape(-1))
                assert np.abs(values).max() > 65504
        finally:
            loaded.free()
