"""The kernel build that tests/test_kernel_build.py and tests/test_kernel_resources.py read: every op of the
suite for every default target of each vendor whose compiler is here (clang-22 for AMD, no ROCm; nvcc for
NVIDIA), once per test run into a temporary folder (tests/conftest.py's `built` fixture), and the entry points
each code object must hold."""

from __future__ import annotations

from pathlib import Path

from support.compiler_gate import TARGETS, available_vendors, require_compiler
from hipcore.ops import prompt_attention
from rocmforge_kernels import build as kbuild

# The ops of this suite and the entry points each code object must hold.
EXPECTED_KERNELS = {
    "add": ["add_f32"],
    "add_bias": ["add_bias_f32"],
    "argmax": ["argmax_f32"],
    "embedding": ["embedding_bf16", "embedding_f16", "embedding_f32", "embedding_q4_0", "embedding_q4_1",
                  "embedding_q5_0", "embedding_q5_1", "embedding_q4_k", "embedding_q5_k", "embedding_q6_k",
                  "embedding_q8_0"],
    "gelu_mul": ["gelu_mul_f32"],
    "head_norm_rope": ["head_norm_rope_f32"],
    "fused_matmul": [f"matmul_{kind}_{t}" for kind in ("norm_rope", "norm_swiglu", "add", "norm")
                     for t in ("q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32")],
    "fused_matvec": [f"matvec_{kind}_{t}" for kind in ("norm_rope", "norm_swiglu", "add", "norm",
                                                        "norm_rope_split", "norm_swiglu_split", "add_split")
                     for t in ("q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32")],
    "fused_qmatvec": [f"qmatvec_{kind}_{tokens}" for kind in ("norm_rope", "norm_swiglu", "add", "norm")
                      for tokens in ("1", "n", "1b", "1m", "nm")] + ["qmatvec_norm_swiglu_split_1"],
    "kv_store": ["kv_store_bf16", "kv_store_f16", "kv_store_f32", "kv_store_q8_0"],
    "matmul": ["matmul_bf16", "matmul_f16", "matmul_f32", "matmul_q4_0", "matmul_q4_1", "matmul_q5_0", "matmul_q5_1",
               "matmul_q4_k", "matmul_q5_k", "matmul_q6_k", "matmul_q8_0", "matmul_mxfp4"],
    "matmul_mma": [f"matmul_mma_{t}" for t in ("q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q8_0", "f16", "bf16",
                                               "mxfp4")]
                  + [f"matmul_mma_x16_{t}" for t in ("q4_k", "q5_k", "q6_k")]
                  + [f"matmul_mma_swiglu_{t}" for t in ("q4_k", "q5_k")],
    "moe_experts": [f"moe_{projection}_{t}"
                    for projection in ("gate_up", "down", "down_slots", "gate_up_grouped", "down_grouped")
                    for t in ("q4_k", "q5_k", "q6_k", "q8_0", "mxfp4", "f16", "bf16", "f32")]
                   + [f"moe_down_staged_{t}" for t in ("q4_k", "q5_k", "q6_k", "q8_0", "mxfp4")] + ["moe_sum_slots_f32"],
    "moe_route": ["moe_route_f32"],
    "moe_experts_mma": ["moe_mma_sort"] + [f"moe_mma_{mode}_{t}" for mode in ("gate", "up", "down")
                                           for t in ("q4_k", "q5_k", "q6_k", "q8_0", "mxfp4", "f16", "bf16",
                                                     "q8_0_s64", "mxfp4_s64", "f16_s64", "bf16_s64")],
    "matvec": ["matvec_bf16", "matvec_f16", "matvec_f32", "matvec_q4_0", "matvec_q4_1", "matvec_q5_0", "matvec_q5_1",
               "matvec_q4_k", "matvec_q5_k", "matvec_q6_k", "matvec_q8_0", "matvec_split_f16", "matvec_split_bf16",
               "matvec_split_f32"],
    "paged_attention": [f"paged_attention_{kv}{cap}{sinks}" for kv in ("bf16", "f16", "f32", "q8_0") for cap in ("", "_softcap")
                        for sinks in ("", "_sinks")],
    "prompt_attention": list(prompt_attention.KERNEL_NAMES),
    "qmatvec": ["qmatvec_q4_0", "qmatvec_q4_k", "qmatvec_q5_k", "qmatvec_q6_k", "qmatvec_q8_0", "qmatvec_mxfp4"],
    "rmsnorm": ["rmsnorm_add_f32", "rmsnorm_bias_f32", "rmsnorm_bias_f32_and_f16", "rmsnorm_f32", "rmsnorm_f32_and_f16",
                "rmsnorm_f32_f16"],
    "rope": ["rope_f32", "rope_neox_f32"],
    "sample": ["sample_f32"],
    "scale": ["scale_f32"],
    "select_rows": ["select_rows_f32"],
    "silu_mul": ["silu_mul_f32"],
    "softcap": ["softcap_f32"],
}
# Entries only NVIDIA's objects have: matmul_mma's fragment path (written in mma.sync's fragment layout: each product,
# a batch's q|k|v in one launch (K-quants, or one 32-element format), its SwiGLU gate and up in one launch) and its
# 128-token tiles (they spilled on gfx1030 and gfx1100), for the K-quants and for the 32-element block formats, F16 and
# BF16; moe_experts_mma's few-pairs tiles (the same fragment layout).
PAIR32_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16")
NVIDIA_ONLY_KERNELS = {
    "matmul_mma": [f"matmul_mma_{entry}_{t}" for entry in ("fragments", "direct", "x16_128")
                   for t in ("q4_k", "q5_k", "q6_k") + PAIR32_TYPES]
                  + [f"matmul_mma_silu_up_{t}" for t in ("q4_k", "q5_k") + PAIR32_TYPES]
                  + [f"matmul_mma_gelu_up_{t}" for t in ("q4_k", "q5_k")]
                  + ["matmul_mma_qkv_fragments", "matmul_mma_qkv_direct"]
                  + [f"matmul_mma_qkv_{entry}_{t}" for entry in ("fragments", "direct") for t in PAIR32_TYPES]
                  + [f"matmul_mma_swiglu_{entry}_{t}" for entry in ("fragments", "direct") for t in ("q4_k", "q5_k", "q6_k")],
    "moe_experts_mma": [f"moe_mma_{mode}_{t}_direct" for mode in ("gate", "up", "down")
                        for t in ("q4_k", "q5_k", "q6_k", "q8_0", "mxfp4", "f16", "bf16")],
}


def expected_entries(target: str, op: str) -> list[str]:
    """The entry points `op`'s code object for `target` holds."""
    return EXPECTED_KERNELS[op] + (NVIDIA_ONLY_KERNELS.get(op, []) if target.startswith("sm_") else [])


def all_targets() -> list[str]:
    """The default targets of the vendors whose compilers are here."""
    return [target for vendor in available_vendors() for target in TARGETS[vendor]]


def build_every_op(out: Path) -> tuple[Path, kbuild.BuildReport, list[str]]:
    """The code objects of every vendor whose compiler is here (the tests that need one vendor ask for it):
    (the output folder, the build's report, its progress lines)."""
    vendors = available_vendors()
    if not vendors:
        require_compiler("amd")
    lines: list[str] = []
    report = kbuild.build(out_dir=out, ops=sorted(EXPECTED_KERNELS), progress=lines.append,
                          amd_targets=None if "amd" in vendors else "none",
                          nvidia_targets=None if "nvidia" in vendors else "none")
    return out, report, lines
