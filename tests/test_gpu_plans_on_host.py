"""Each GPU architecture's step plans for every family, run on the CPU (no GPU in CI): a StandInGpu
(tests/support/stand_in_gpu.py) says it is NVIDIA sm_90 / sm_80 or AMD gfx942 / gfx1100 / gfx1201 / gfx1030, so the
weights take their GPU formats and the launchers the paths that architecture has (NVIDIA's fragment path, q|k|v
and the SwiGLU in one launch, f16 activations, prompt attention on the matrix cores; AMD's MFMA and WMMA tiles; none
of them on gfx1030), and each launch runs the cpu backend's host kernel behind its entry. A reduced model of each
family (scripts/models/synthetic_models.py in Q4_K_M) steps through a 256-token prompt, a step of nine 12-token prompts,
and decode steps of 10, 3 and 1 sequences: every step's logits must be the plain cpu backend's within the GPU tier's
bound for the quantized families (4e-2 of the largest logit over the top 10: the f16 and int8 activations those
paths round to; 1.9e-2 the largest seen here). What this checks is the plumbing of the GPU paths (which buffers,
row counts, offsets and entries each launch gets), which until now only a GPU run could; the kernels' arithmetic is
the kernel emulation's and the GPU tier's. A crossed buffer in one GPU-only launcher is caught (planted below)."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.ops import matmul_mma_qkv
from support.model_steps import step_batch
from support.stand_in_gpu import StandInGpu, host_kernels_for_stand_ins
from test_synthetic_models import write_reduced, write_tiktoken

MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2
# Two layers each (Gemma 3: six, so that one is global); a feed-forward of 4,096 rows so that the 256-token
# prompt's products make NVIDIA's SwiGLU pairs and f16 tiles.
FAMILIES = {"Llama-3.1-8B": 2, "Qwen2.5-7B": 2, "Qwen3-8B": 2, "Gemma-2-9B": 2, "Gemma-3-4B": 6, "Phi-3-mini": 2}
ARCHS = ("sm_90", "sm_80", "gfx942", "gfx1100", "gfx1201", "gfx1030")
VOCAB = 516  # write_tiktoken's 256 bytes, 4 merges and 256 special tokens


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (model path, the cpu backend's logits of STEPS), each made once."""
    tmp = tmp_path_factory.mktemp("gpu_plans")
    tiktoken = write_tiktoken(tmp / "tokenizer.model")
    made = {}

    def get(family: str):
        if family not in made:
            path = write_reduced(tmp, tiktoken, family, 5, layers=FAMILIES[family], ffn=4096)
            made[family] = (path, run_steps(path, None))
        return made[family]

    return get


def run_steps(path, device) -> list[np.ndarray]:
    """The logits of each step: sequence 1's 256-token prompt; sequences 2-10's 12-token prompts in one step;
    decode steps of sequences 1-10, 1-3 and 1 (token ids drawn once, the same on every device)."""
    opts = LoadOptions(device="cpu" if device is None else "auto", max_seqs=16, max_step_tokens=256, ctx_size=320,
                       kv_dtype="f16")
    rng = np.random.default_rng(1)
    draw = lambda n: [int(t) for t in rng.integers(0, VOCAB, n)]  # noqa: E731
    with load_model(str(path), opts, **({} if device is None else {"device": device})) as model:
        lengths, logits = {}, []

        def step(items):
            for seq, tokens, first in items:
                lengths[seq] = first + len(tokens)
            logits.append(model.runner.execute(step_batch(model.cache, items)).astype(np.float64))

        step([(1, draw(256), 0)])
        step([(seq, draw(12), 0) for seq in range(2, 11)])
        for last in (10, 3, 1):
            step([(seq, draw(1), lengths[seq]) for seq in range(1, last + 1)])
    return logits


def worst_relative_top10(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max over steps and rows of max |got - want| over want's top 10, over the row's largest |want|."""
    worst = 0.0
    for g_step, w_step in zip(got, want, strict=True):
        for g, w in zip(g_step, w_step, strict=True):
            top = np.argsort(w)[-10:]
            worst = max(worst, float(np.max(np.abs(g[top] - w[top])) / np.max(np.abs(w))))
    return worst


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_gpu_plan_steps_as_the_cpu_backend(models, monkeypatch, family, arch):
    host_kernels_for_stand_ins(monkeypatch)
    path, on_cpu = models(family)
    device = StandInGpu(arch=arch)
    got = run_steps(path, device)
    assert all(np.isfinite(step).all() for step in got)
    worst = worst_relative_top10(got, on_cpu)
    assert worst <= MAX_RELATIVE_QUANT_LOGIT_DIFF, f"{family} on {arch}: top-10 logits off by {worst:.2e} of the largest"


# Entries each architecture's plan must reach in these steps, so that the test above checks those paths and not
# only the paths every device shares (a planner change that sent an architecture elsewhere would show here).
REACHED = {
    "sm_90": ("matmul_mma_qkv_fragments", "matmul_mma_swiglu_fragments_q4_k", "matmul_mma_fragments_q4_k",
              "matmul_mma_swiglu_q4_k", "matmul_mma_x16_q4_k", "prompt_attention_f16_d64", "qmatvec_norm_rope_1"),
    "gfx942": ("matmul_mma_q4_k", "matmul_mma_swiglu_q4_k", "matmul_mma_x16_q4_k", "prompt_attention_f16_d64"),
    "gfx1030": ("matmul_q4_k", "paged_attention_f16", "qmatvec_norm_rope_1"),
}
NOT_REACHED = {"gfx942": ("matmul_mma_qkv_fragments", "matmul_mma_fragments_q4_k"),
               "gfx1030": ("matmul_mma_q4_k", "prompt_attention_f16_d64")}


@pytest.mark.parametrize("arch", REACHED)
def test_each_architecture_takes_its_own_paths(models, monkeypatch, arch):
    host_kernels_for_stand_ins(monkeypatch)
    device = StandInGpu(arch=arch)
    run_steps(models("Llama-3.1-8B")[0], device)
    assert set(REACHED[arch]) <= device.entries, sorted(set(REACHED[arch]) - device.entries)
    assert not set(NOT_REACHED.get(arch, ())) & device.entries, sorted(device.entries)


def test_a_crossed_buffer_in_a_gpu_only_launcher_is_caught(models, monkeypatch):
    """Planted: launch_qkv (NVIDIA's decode batches only) writes k's product into v's buffer and v's into k's."""
    host_kernels_for_stand_ins(monkeypatch)
    path, on_cpu = models("Llama-3.1-8B")
    real = matmul_mma_qkv.launch_qkv

    def crossed(device, stream, ys, ws, x, rows, cols, n_tokens, **kw):
        real(device, stream, (ys[0], ys[2], ys[1]), ws, x, rows, cols, n_tokens, **kw)

    monkeypatch.setattr(matmul_mma_qkv, "launch_qkv", crossed)
    device = StandInGpu(arch="sm_90")
    worst = worst_relative_top10(run_steps(path, device), on_cpu)
    assert "matmul_mma_qkv_fragments" in device.entries
    assert worst > MAX_RELATIVE_QUANT_LOGIT_DIFF, f"the crossed q|k|v went unnoticed ({worst:.2e})"
