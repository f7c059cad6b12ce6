"""The mixture-of-experts models' GPU step plans on the CPU (tests/support/stand_in_gpu.py): the tiny qwen3moe with
Q4_K/Q6_K experts, and qwen2moe with its shared expert, stepped through each GPU architecture's plan, every launch
running its entry's host twin, against the cpu backend (prompt, batched prompts and decode steps); each plan reaches
the MoE entries (the router's product, moe_route_f32, moe_gate_up and the staged moe_down for Q4_K and Q6_K, per token and
grouped) with the experts kept in their file format; and the tiny gpt-oss (MXFP4 experts, attention with sinks)
likewise, its 40-token prompt through prompt_attention's sink entry where the GPU has matrix cores (paged_attention's
sink entries for the rest and for decode steps), its biases folded into head_norm_rope, the norm and the route."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.ops.matmul_mma import has_matrix_cores
from support.model_steps import step_batch
from support.moe_models import write_moe_model
from support.stand_in_gpu import StandInGpu, host_kernels_for_stand_ins

ARCHS = ("sm_90", "sm_80", "gfx942", "gfx1100", "gfx1030")
MAX_RELATIVE_LOGIT_DIFF = 1e-3  # the same host kernels; the paths differ in summation order and f16 staging only
# The steps whose quantized experts take the matrix cores (moe_experts_mma: 16 tokens or more, 32 pairs of 8 experts)
# round the experts' input to f16 where the cpu backend's expert products, as the GPU's other expert paths,
# round it to int8 per 32 values (moe_experts.QUANTIZED_X_TYPES): tests/gpu/test_moe_model_gpu.py's 4e-2 for such files;
# the decode steps attend to the prompts' keys and values, so they differ as much.
MATRIX_CORE_EXPERTS_DIFF = 4e-2
# per token (decode of a few), grouped by expert (batches: moe_experts.grouped_pays), on the matrix cores (prompts)
MOE_ENTRIES = ("moe_route_f32", "moe_gate_up_q4_k", "moe_down_staged_q6_k", "moe_gate_up_grouped_q4_k", "moe_down_grouped_q6_k")
MATRIX_CORE_ENTRIES = ("moe_mma_sort", "moe_mma_gate_q4_k", "moe_mma_up_q4_k", "moe_mma_down_q6_k", "moe_sum_slots_f32")
DIRECT_ENTRIES = ("moe_mma_gate_q4_k_direct", "moe_mma_up_q4_k_direct", "moe_mma_down_q6_k_direct")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe-gpu-plans")
    return {name: write_moe_model(name, folder) for name in ("qwen3moe-q4km", "qwen2moe-f32", "gpt-oss-mxfp4")}


def run_steps(path, device=None, expert_types=("q4_k", "q6_k")) -> list[np.ndarray]:
    opts = LoadOptions(device="cpu" if device is None else "auto", max_seqs=8, max_step_tokens=64, ctx_size=256,
                       kv_dtype="f16")
    rng = np.random.default_rng(2)
    draw = lambda n: [int(t) for t in rng.integers(0, 384, n)]  # noqa: E731
    with load_model(str(path), opts, **({} if device is None else {"device": device})) as model:
        layer = model.weights.layers[0]
        assert (layer.ffn_gate_exps.fmt, layer.ffn_down_exps.fmt) == expert_types
        logits = [model.runner.execute(step_batch(model.cache, [(1, draw(40), 0)]))]
        logits.append(model.runner.execute(step_batch(model.cache, [(s, draw(9), 0) for s in range(2, 6)])))
        logits.append(model.runner.execute(step_batch(model.cache, [(s, draw(1), 40 if s == 1 else 9)
                                                                    for s in range(1, 6)])))
        logits.append(model.runner.execute(step_batch(model.cache, [(1, draw(1), 41)])))  # below the grouped path
        # 16 tokens, 32 pairs: grouped where there are no matrix cores
        logits.append(model.runner.execute(step_batch(model.cache, [(s, draw(4), 10) for s in range(2, 6)])))
        return [step.astype(np.float64) for step in logits]


def assert_close(got, want, arch: str, quantized: bool = True) -> None:
    """Each step's logits within MAX_RELATIVE_LOGIT_DIFF of the largest, or MATRIX_CORE_EXPERTS_DIFF where the
    prompts' quantized experts took the matrix cores (on an `arch` that has them)."""
    loose = quantized and has_matrix_cores(arch)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        worst = float(np.max(np.abs(g - w)) / np.max(np.abs(w)))
        assert worst <= (MATRIX_CORE_EXPERTS_DIFF if loose else MAX_RELATIVE_LOGIT_DIFF), \
            f"{arch}: step {step}'s logits off by {worst:.2e} of the largest"


@pytest.fixture(scope="module")
def on_cpu(files):
    return run_steps(files["qwen3moe-q4km"])


@pytest.mark.parametrize("arch", ARCHS)
def test_qwen3moe_steps_through_each_gpu_plan_as_on_the_cpu_backend(files, on_cpu, monkeypatch, arch):
    host_kernels_for_stand_ins(monkeypatch)
    device = StandInGpu(arch=arch)
    got = run_steps(files["qwen3moe-q4km"], device)
    assert_close(got, on_cpu, arch)
    grouped = {"moe_gate_up_grouped_q4_k", "moe_down_grouped_q6_k"}  # where the matrix cores take the steps
    assert set(MOE_ENTRIES) - (grouped if has_matrix_cores(arch) else set()) <= device.entries, sorted(device.entries)
    assert (set(MATRIX_CORE_ENTRIES) <= device.entries) == has_matrix_cores(arch), sorted(device.entries)
    # the decode steps of 5 sequences, whose graphs run 8 token rows (16 pairs of 8 experts): NVIDIA's few-pairs tiles
    assert (set(DIRECT_ENTRIES) <= device.entries) == arch.startswith("sm_"), sorted(device.entries)


@pytest.mark.parametrize("arch", ("sm_90", "gfx942", "gfx1030"))
def test_qwen2moe_shared_expert_steps_through_each_gpu_plan(files, monkeypatch, arch):
    host_kernels_for_stand_ins(monkeypatch)
    want = run_steps(files["qwen2moe-f32"], expert_types=("f32", "f32"))
    device = StandInGpu(arch=arch)
    got = run_steps(files["qwen2moe-f32"], device, expert_types=("f32", "f32"))
    assert_close(got, want, arch, quantized=False)  # F32 experts: no matrix-core entries
    assert {"moe_gate_up_f32", "moe_down_f32", "scale_f32", "softcap_f32"} <= device.entries, sorted(device.entries)


GPT_OSS_ENTRIES = ("paged_attention_f16_sinks", "moe_route_f32", "moe_gate_up_mxfp4", "moe_down_staged_mxfp4",
                   "moe_gate_up_grouped_mxfp4", "moe_down_grouped_mxfp4")


@pytest.mark.parametrize("arch", ARCHS)
def test_gpt_oss_steps_through_each_gpu_plan_as_on_the_cpu_backend(files, monkeypatch, arch):
    on_cpu = run_steps(files["gpt-oss-mxfp4"], expert_types=("mxfp4", "mxfp4"))
    host_kernels_for_stand_ins(monkeypatch)
    device = StandInGpu(arch=arch)
    got = run_steps(files["gpt-oss-mxfp4"], device, expert_types=("mxfp4", "mxfp4"))
    assert_close(got, on_cpu, arch)
    # hidden and expert width 64: the 64-column steps' entries (moe_experts_mma.NARROW_STEP_COLS) where the GPU has
    # matrix cores; on NVIDIA its 8-pair tiles take every step of up to 16 pairs an expert (these steps' 10 at most)
    nvidia = arch.startswith("sm_")
    assert ("moe_mma_up_mxfp4_s64" in device.entries) == (has_matrix_cores(arch) and not nvidia), sorted(device.entries)
    assert "moe_mma_up_mxfp4" not in device.entries, sorted(device.entries)
    assert ("moe_mma_up_mxfp4_direct" in device.entries) == nvidia, sorted(device.entries)
    grouped = {"moe_gate_up_grouped_mxfp4", "moe_down_grouped_mxfp4"}  # where the matrix cores take the steps
    assert set(GPT_OSS_ENTRIES) - (grouped if has_matrix_cores(arch) else set()) <= device.entries, sorted(device.entries)
    prompt_entry = "prompt_attention_f16_d32_sinks"  # the prompt step of 40 tokens, heads of 32
    assert (prompt_entry in device.entries) == has_matrix_cores(arch), sorted(device.entries)
    # the biases folded: q's, k's and v's with RoPE and the f16 cache's store in head_norm_rope, the o bias in the
    # feed-forward's norm, the router's in moe_route; no add_bias, rope or kv_store launch is left
    assert {"head_norm_rope_f32", "rmsnorm_bias_f32"} <= device.entries, sorted(device.entries)
    assert not {"add_bias_f32", "rope_neox_f32", "kv_store_f16"} & device.entries, sorted(device.entries)


@pytest.mark.parametrize("arch", ("sm_90", "gfx1030"))
def test_a_gpt_oss_whose_every_layer_slides_steps_through_each_gpu_plan(tmp_path, monkeypatch, arch):
    """The one-layer gpt-oss (its only layer slides; the KV cache's global group holds no layer): each plan reads the
    local group's pools and tables, its 40-token prompt past the 16-key window as on the cpu backend."""
    path = write_moe_model("gpt-oss-window-only", tmp_path)
    on_cpu = run_steps(path, expert_types=("f16", "f16"))
    host_kernels_for_stand_ins(monkeypatch)
    device = StandInGpu(arch=arch)
    got = run_steps(path, device, expert_types=("f16", "f16"))
    assert_close(got, on_cpu, arch, quantized=False)
    assert ("prompt_attention_f16_d32_sinks" in device.entries) == has_matrix_cores(arch), sorted(device.entries)
