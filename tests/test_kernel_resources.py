"""What each code object of the kernel build uses (tests/support/kernel_builds.py, one build per test run):
registers without spills where the kernels' speed depends on it, the shared memory their tiles take, and the
matrix instruction matmul_mma runs on each AMD target. Read from the build's manifest and, for the matrix
instructions, from llvm-objdump's disassembly."""

from __future__ import annotations

import json
import shutil

from support.kernel_builds import all_targets
from hipcore.ops import moe_experts, prompt_attention
from rocmforge_kernels import build as kbuild


def test_attention_kernels_keep_their_registers(built):
    """paged_attention holds four query heads' q and outputs in registers: no target may spill them to
    memory (the kernel's launch bounds of 4 warps leave every compiler room for them), and each keeps
    its shared-memory workspace for merging warps."""
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for target in all_targets():
        for name, usage in manifest["objects"][target]["paged_attention"]["kernels"].items():
            spilled = usage.get("vgpr_spills", 0) + usage.get("scratch_bytes", 0) + usage.get("spill_store_bytes", 0)
            assert spilled == 0, f"{target} {name} spills: {usage}"
            assert usage["shared_bytes"] >= 4 * 4 * 256 * 4, f"{target} {name}: {usage}"


def test_prompt_attention_keeps_its_outputs_and_next_rows_in_registers(built):
    """No spill on any matrix-core target where the entry runs (gfx1030 has no matrix cores and RDNA4's heads of 256
    spill their WMMA fragments: prompt_attention.takes keeps paged_attention there, so those builds never run);
    each entry's shared memory is its tile's (below), the wide one's within a static allocation's 48 KB."""
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for target in all_targets():
        kernels = manifest["objects"][target]["prompt_attention"]["kernels"]
        assert sorted(kernels) == sorted(prompt_attention.KERNEL_NAMES), target
        for name, usage in kernels.items():
            head_dim = int(name.removesuffix("_sinks").removesuffix("_softcap").rsplit("_d", 1)[1])
            if not prompt_attention.takes(target, 512, "f16", head_dim):
                assert target == "gfx1030" or (target.startswith("gfx12") and head_dim == 256), target
                continue
            off_chip = sum(usage.get(key, 0) for key in ("vgpr_spills", "sgpr_spills", "scratch_bytes",
                                                         "spill_store_bytes", "stack_bytes"))
            assert off_chip == 0, f"{target} {name}: {usage}"
            if head_dim <= 128:
                # q of 64 rows and K of 32 keys (136 halves a row), V^T (128 x 40), 4 warps' weights (16 x 40),
                # tokens
                assert usage["shared_bytes"] == (64 * 136 + 32 * 136 + 128 * 40 + 4 * 16 * 40) * 2 + 2 * 64 * 4, usage
            else:  # q of 32 rows and K of 16 keys (264 halves a row), V^T (256 x 24), 2 row tiles' weights, tokens
                assert usage["shared_bytes"] == (32 * 264 + 16 * 264 + 256 * 24 + 2 * 16 * 24) * 2 + 2 * 32 * 4 \
                    <= 48 * 1024, usage


def test_matrix_product_kernels_keep_everything_in_registers(built):
    """matvec, qmatvec, matmul and fused_matmul hold their accumulators and prefetched weights / x in registers on every target:
    no spills and no private (scratch) arrays, which would put memory traffic in their inner loops (a
    whole-struct copy once left matmul's prefetched x in scratch on AMD). matmul's shared tiles: 18 KiB; matmul_mma's 27 KiB (the widest step's); matvec's split entries the warps' sums
    (256 bytes, 128 at wave 64)."""
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for target in all_targets():
        # fused_matvec is not held to it yet: matvec_norm_rope_q8_0 spills 16 bytes on sm_80 under its
        # launch bounds' register cap (80)
        for op in ("matvec", "qmatvec", "matmul", "fused_matmul", "matmul_mma"):
            for name, usage in manifest["objects"][target][op]["kernels"].items():
                off_chip = sum(usage.get(key, 0) for key in ("vgpr_spills", "sgpr_spills", "scratch_bytes",
                                                             "spill_store_bytes", "stack_bytes"))
                if target == "sm_90" and name.startswith(("matmul_mma_silu_up_", "matmul_mma_gelu_up_")):
                    # The one exception, measured: at two workgroups per SM (128 registers) nvcc spills 40-56
                    # bytes; at one (173 registers, none spilled) the 8B's gate + up+SwiGLU took 779.9 against
                    # 618.8 us on an NVIDIA H100 (docs/history/2026-11-28-wide-prompt-tiles.md). Held to that size.
                    assert usage.get("spill_store_bytes", 0) <= 64 and usage.get("stack_bytes", 0) <= 64, f"{target} {name}: {usage}"
                elif target.startswith("sm_") and name == "matmul_mma_swiglu_fragments_q4_k":
                    # gate, up and SwiGLU in one launch (Q4_K's three steps of loads in flight and the pair's
                    # epilogue): nvcc 13 spills 4 bytes at 128 registers; measured so on an NVIDIA H200, faster than
                    # the two products and silu_mul (the 8B at 32 sequences 4,822 -> 5,025 t/s,
                    # docs/history/2026-12-02-decode-batches-one-launch.md).
                    # Held to that size.
                    assert usage.get("spill_store_bytes", 0) <= 4 and usage.get("stack_bytes", 0) <= 8, f"{target} {name}: {usage}"
                elif target == "sm_80" and name == "matmul_mma_x16_128_bf16":
                    # BF16's conversion to f16 as the 128-token tiles stage it: nvcc 13 spills 4 bytes on sm_80 at
                    # 128 registers (none on sm_90; two 8-byte stores instead of one of 16 changed nothing). No
                    # sm_80 GPU has measured it. Held to that size.
                    assert usage.get("spill_store_bytes", 0) <= 4 and usage.get("stack_bytes", 0) <= 8, f"{target} {name}: {usage}"
                else:
                    assert off_chip == 0, f"{target} {name}: {usage}"
                if op == "matmul_mma":
                    # shared-tile entries: f16 tiles of 128 rows and 64 tokens (128 for the x16_128, silu_up and
                    # gelu_up entries) of 72 halves, the split flag (silu_up and gelu_up have none); the fragment
                    # path's staged entries: x of 32 tokens of 80 halves, the flag; its direct ones: the flag
                    wide = name.startswith(("matmul_mma_x16_128_", "matmul_mma_silu_up_", "matmul_mma_gelu_up_"))
                    gated_up = (128 + 128) * 72 * 2
                    # (the fragment path's entries: matmul_mma_[qkv_|swiglu_]fragments / direct...)
                    kind = "fragments" if "_fragments" in name else "direct" if "_direct" in name else name.split("_")[2]
                    shared = {"fragments": 32 * 80 * 2 + 4, "direct": 4, "silu": gated_up, "gelu": gated_up}.get(
                        kind, (128 + (128 if wide else 64)) * 72 * 2 + 4)
                    assert usage["shared_bytes"] == shared, f"{target} {name}: {usage}"
                if op in ("matvec", "qmatvec", "matmul"):
                    # matvec's split entries: each warp's sums of 8 batch rows (256 threads' warps)
                    split = (256 // (64 if target.startswith("gfx9") else 32)) * 8 * 4
                    shared = 2 * 64 * 36 * 4 if op == "matmul" else split if name.startswith("matvec_split_") else 0
                    assert usage["shared_bytes"] == shared, f"{target} {name}: {usage}"


QUANTIZED = tuple(f"_{t}" for t in moe_experts.QUANTIZED_X_TYPES)


def test_moe_kernels_keep_everything_in_registers(built):
    """The experts' products (a decode step runs gate|up and down in every layer) and the router hold their rows' loads,
    accumulators and logits in registers on every target: no spills, no scratch. Shared memory: the grouped entries'
    gathered pairs (2,048 ints and their count) and a quantized type's staged inputs (384 slices of 11 words); the per-pair gate|up's, moe_down_staged's and moe_down_slots' input slices of a quantized
    type (384 slices of 11 words) and moe_down_slots' slot terms (32 slots x 32 rows and 32 weights)."""
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for target in all_targets():
        for op in ("moe_experts", "moe_route"):
            for name, usage in manifest["objects"][target][op]["kernels"].items():
                off_chip = sum(usage.get(key, 0) for key in ("vgpr_spills", "sgpr_spills", "scratch_bytes",
                                                             "spill_store_bytes", "stack_bytes"))
                stages = name.startswith(("moe_gate_up_", "moe_down_slots_", "moe_down_staged_")) and "_grouped_" not in name
                staged = 384 * 11 * 4 if name.endswith(QUANTIZED) and stages else 0
                terms = (32 * 32 + 32) * 4 if name.startswith("moe_down_slots_") else 0
                staged_pairs = 384 * 11 * 4 if "_grouped_" in name and name.endswith(QUANTIZED) else 0
                shared = 2048 * 4 + 4 + staged_pairs if "_grouped_" in name else staged + terms if "_sum_" not in name else 0
                if "_grouped_" in name and target.startswith("gfx9"):
                    # CDNA's 64-bit execution masks: the grouped entries' nested loops (items, segments, staged passes,
                    # rows) leave a few scalar values in vector lanes (v_writelane, no memory); none in scratch
                    sgprs = usage.get("sgpr_spills", 0)
                    assert sgprs <= 16, f"{target} {name}: {usage}"
                    off_chip -= sgprs
                assert off_chip == 0 and usage["shared_bytes"] == shared, f"{target} {name}: {usage}"


def test_moe_matrix_core_products_stay_on_chip(built):
    """moe_experts_mma (a prompt's experts on the matrix cores): shared memory of a 128-row tile and a 64-pair tile of
    72 halves each, the sort's four counters per expert (512 each); no spills on any AMD target. Since every product
    reads f16 x (two registers a four-value load where float32 took four), nvcc 13 spills nothing in the 32-column
    entries (Q4_K's up spilled 12-16 bytes at 128 registers before). The `_s64` entries (64-column steps of the
    32-element formats, held to two workgroups an SM by __launch_bounds__(256, 2)) spill up to 28 bytes on NVIDIA
    (sm_80's MXFP4 down, sm_90's F16 up and down; sm_90's MXFP4 down and gate|up none, 96 bytes in its down before),
    none on AMD. The few-pairs entries (`_direct`, NVIDIA only) use no shared memory and spill nothing (MXFP4's the
    most registers: 112 on sm_80, 114 on sm_90), but for F16's up and down on sm_80: nvcc 13 holds them to 80
    registers with 4 bytes spilled (a stack of 8), where it chose 80 without a spill for float32 x; F16 experts on an
    sm_80 card at 2-8 pairs an expert, not measured."""
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for target in all_targets():
        kernels = manifest["objects"][target]["moe_experts_mma"]["kernels"]
        direct = {name for name in kernels if name.endswith("_direct")}
        assert len(direct) == (3 * 7 if target.startswith("sm_") else 0), f"{target}: {sorted(direct)}"
        for name, usage in kernels.items():
            off_chip = sum(usage.get(key, 0) for key in ("vgpr_spills", "sgpr_spills", "scratch_bytes",
                                                         "spill_store_bytes", "stack_bytes"))
            held = target == "sm_80" and name in ("moe_mma_up_f16_direct", "moe_mma_down_f16_direct")
            s64 = target.startswith("sm_") and name.endswith("_s64")
            assert off_chip <= (12 if held else 28 if s64 else 0), f"{target} {name}: {usage}"
            shared = 4 * 512 * 4 if name == "moe_mma_sort" else 0 if name in direct else (128 + 64) * 72 * 2
            assert usage["shared_bytes"] == shared, f"{target} {name}: {usage}"


def test_one_token_k_quant_products_keep_everything_in_registers_on_amd(built):
    """The decode step's one-token fused_qmatvec entries (the K-quants' `_1`, the 32-element blocks' `_1b`) run every
    layer of every token: no AMD target may spill them. (The head's slice loop is unrolled by two on NVIDIA only, fused_qmatvec.hip kHeadUnroll: the
    unrolled head spilled 80-108 bytes of scratch on the wave32 targets.)"""
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for target in all_targets():
        if not target.startswith("gfx"):
            continue
        for name, usage in manifest["objects"][target]["fused_qmatvec"]["kernels"].items():
            if not name.endswith(("_1", "_1b")):
                continue  # the batched entries spill on RDNA3/4 under their register cap (not yet held to it)
            off_chip = sum(usage.get(key, 0) for key in ("vgpr_spills", "scratch_bytes", "spill_store_bytes", "stack_bytes"))
            assert off_chip == 0, f"{target} {name}: {usage}"


# The matrix instruction matmul_mma must use on each AMD target (hip_compat.h's RF_MMA_KIND), or none.
AMD_MATRIX_INSTRUCTION = {"gfx90a": "v_mfma_f32_16x16x16", "gfx942": "v_mfma_f32_16x16x16", "gfx1100": "v_wmma_f32_16x16x16_f16",
                          "gfx1201": "v_wmma_f32_16x16x16_f16", "gfx1030": None}


def test_matmul_mma_runs_on_each_amd_targets_matrix_instructions(built):
    """A wrong target test in hip_compat.h would silently fall back to the FMA path: the disassembly says
    which instruction each code object uses (llvm-objdump-22, Debian's llvm-22, which .ci/run installs)."""
    import subprocess
    objdump = shutil.which("llvm-objdump-22") or shutil.which("llvm-objdump")
    assert objdump, "llvm-objdump (apt-get install llvm-22) is needed to read the AMD code objects"
    out, _, _ = built
    for target, instruction in AMD_MATRIX_INSTRUCTION.items():
        text = subprocess.run([objdump, "-d", str(out / target / f"matmul_mma.{kbuild.code_object_suffix(target)}")],
                              capture_output=True, text=True, check=True).stdout
        matrix = [line for line in text.splitlines() if "v_mfma" in line or "v_wmma" in line]
        if instruction is None:
            assert not matrix, f"{target}: {matrix[:2]}"
        else:
            assert matrix and all(instruction in line for line in matrix), f"{target}: {matrix[:2]}"
