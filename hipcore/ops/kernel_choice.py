"""Which kernel entry each product of a step takes, by weight type, device architecture and token count, and the
ROCMFORGE_* switches a user may set, read once.

hipcore/model/projections.py builds a layer's launches from these answers, in this order per product group:
  1. a fused family over a concatenated matrix (fused_family): fused_matvec up to FUSED_MATVEC_MAX_TOKENS tokens
     (HEAD_MATVEC_MAX_ROWS rows for the head), fused_matmul beyond, for the formats they read; none where the
     product takes fused_qmatvec first (qmatvec_first: one token of wide Q8_0, Q5_0, Q5_1) or the matrix cores
     first (mma_first: wide 32-element block formats, F16, BF16 on NVIDIA's fragment path);
  2. fused_qmatvec over the separate matrices (separate_fusable, up to qmatvec_limit tokens, head_qmatvec_limit
     rows for the head): the K-quants, Q8_0, Q4_0, MXFP4 (its own entries), and the one-token entries of Q5_0 and Q5_1
     where measured;
  3. the single ops: q, k and v in one launch on the fragment path (takes_qkv), a decode batch's gate, up and
     SwiGLU in one launch (swiglu_fragments_fit), a prompt's feed-forward on f16 activations with gate, up and the
     activation in one launch (silu_up_fits in 128-token tiles, else swiglu_fits), products reading f16 x
     (takes_f16_x); else one product each (project, single_product_op): matmul_mma on the matrix cores from
     matmul_mma.min_tokens tokens where the device has them, else matmul beyond matmul.MATVEC_MAX_TOKENS tokens,
     else matvec (qmatvec for MXFP4: QMATVEC_SINGLE_TYPES).
Inside a matrix-core product the launcher picks its entry from the tile, split and architecture
(matmul_mma.entry_name: the fragment path's direct or staged entry on NVIDIA sm_80+, else the shared tiles);
tests/test_kernel_choice.py pins every choice against tests/golden/kernel_choices.json.

Switches (environment variables, read once when this module is imported; README.md lists them):
  ROCMFORGE_STEP_OVERLAP=0   every decode step waits for its tokens before the next is prepared (no overlap of the
                             host's work with the device's: hipcore/engine/step_launch.py)
  ROCMFORGE_PROMPT_GRAPHS=0  prompt and mixed steps run eagerly at their own shape (no padded shapes replayed from
                             graphs: hipcore/model/prompt_graphs.py)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from hipcore.ops import (fused_matmul, fused_matvec, fused_qmatvec, kv_store, matmul, matmul_mma, matmul_mma_qkv,
                         matmul_mma_swiglu, matvec, moe_experts, moe_experts_mma, qmatvec)
from hipcore.runtime import settings
from hipcore.runtime.device import Buffer, Device, Stream


@dataclass(frozen=True)
class Switches:
    """The user's switches: each field on unless its variable (ENVIRONMENT) is "0"."""

    step_overlap: bool = True
    prompt_graphs: bool = True

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> "Switches":
        return cls(**{field: environ.get(name, "1").strip() != "0" for name, field in ENVIRONMENT.items()})


ENVIRONMENT = {"ROCMFORGE_STEP_OVERLAP": "step_overlap", "ROCMFORGE_PROMPT_GRAPHS": "prompt_graphs"}
SWITCHES = Switches.read(os.environ)


# Up to this many tokens fused_matvec is faster (measured on an NVIDIA H100 80GB HBM3 with the demo
# model's shapes: scripts/bench/measure_fused_matmul.py prints both kernels per token count).
FUSED_MATVEC_MAX_TOKENS = 8
# Up to this many tokens the separate K-quant matrices take fused_qmatvec (one pass over W for up to 8
# tokens), beyond it the single ops on matmul_mma, which take the K-quants from
# matmul_mma.MMA_MIN_TOKENS_KQUANT tokens: the two limits meet (see there for the measurement). Its own
# limit, not fused_matvec's, so that it can follow such measurements. It cannot exceed
# fused_qmatvec.MAX_TOKENS_PER_PASS without a second pass over W. Where matmul_mma takes the K-quants from
# fewer tokens (its fragment path), qmatvec_limit follows it down.
FUSED_QMATVEC_MAX_TOKENS = matmul_mma.MMA_MIN_TOKENS_KQUANT - 1
HEAD_MATVEC_MAX_ROWS = 8
# The K-quant head where matmul_mma has the fragment path leaves fused_qmatvec after 4 rows: on an NVIDIA
# H200, Llama 3's Q6_K head (128256 x 4096) took fused_qmatvec 312 us at 4 rows and 895 at 6, the fragment
# path 333 at 2 and 394 at 8 (docs/history/2026-11-27-fragment-path-kquant-batches.md).
HEAD_QMATVEC_MAX_ROWS_FRAGMENTS = 4

# One-token products of these types take fused_qmatvec (each matrix apart, x quantized to int8 per 32 columns,
# integer dot products) rather than fused_matvec (weights decoded to floats, FMA), which both read them.
# Measured on an NVIDIA H200, Llama-3.1-8B shapes (4 layers), tg128: Q8_0 1,225-1,233 -> 1,899-1,922 t/s (gate|up
# 57.1 -> 37.1 us, the head 236.9 -> 142.3), Q5_0 1,148-1,151 -> 1,934-1,950, Q5_1 1,198 -> 2,023-2,035 (gate|up
# 72.3 -> 36.0 us) (docs/history/2026-11-29-staged-weights-per-type.md). Only as wide as measured
# (QMATVEC_FIRST_MIN_COLS): the demo model's tied Q8_0 head has 576 columns, and with its Q4_1 layers on
# fused_qmatvec too it lost 1,903 -> 1,757 t/s; Q4_1 stays on fused_matvec (no wide Q4_1 model was measured). From
# 2,880 columns: gpt-oss-20b's Q8_0 attention and head, tg128 407.7 -> 418.9 t/s on an NVIDIA H100 (2026-12-06,
# docs/history/2026-12-06-moe-narrow-steps-2880-columns.md); ROCMFORGE_QMATVEC_FIRST_MIN_COLS sets it.
QMATVEC_FIRST_TYPES = ("q8_0", "q5_0", "q5_1")
QMATVEC_FIRST_MIN_COLS = 2880

# Products of the 32-element block formats that the fused families read (Q8_0, Q5_0, Q5_1, Q4_1), of F16 and of BF16
# take the single ops instead, from matmul_mma.min_tokens tokens on, where matmul_mma has its fragment path for them
# (NVIDIA sm_80+): decode batches on that path, prompts on its shared tiles, both on the matrix cores where
# fused_matmul decodes to floats and multiplies on FMA. Measured on an NVIDIA H200, Llama-3.1-8B shapes (4 layers),
# against the fused families: Q8_0 pp512 15,423 -> 45,774 t/s, 8 sequences 2,818 -> 4,641, 32 sequences 5,139 ->
# 16,460; Q5_0, Q5_1 likewise; F16 14,845 -> 64,286, 2,930 -> 6,608 and 4,767 -> 21,529
# (docs/history/2026-11-29-block32-matrix-cores.md). In matrices of MMA_FIRST_MIN_COLS columns or more: the demo
# model's narrow ones keep the fused families, measured ahead of llama.cpp there. Not on AMD: no AMD GPU has measured
# the two side by side. From 2,880 columns (gpt-oss-20b's Q8_0 attention and head): 8 sequences 911.8 -> 973.9 t/s,
# 32 sequences 1,374.5 -> 1,473.5 on an NVIDIA H100 (2026-12-06, the head 995 -> 378 us at 8 rows;
# docs/history/2026-12-06-moe-narrow-steps-2880-columns.md); ROCMFORGE_MMA_FIRST_MIN_COLS sets it.
MMA_FIRST_MIN_COLS = QMATVEC_FIRST_MIN_COLS

# Types whose few-token single products take qmatvec (int8 activations, dp4a) where the others take matvec, which has
# no entry for them: MXFP4, whose codes are integers (the doubled e2m1 values) and so decode for dp4a in two byte
# permutes (kernels/mxfp4_q8_format.h, the expert products' reading), as llama.cpp's MMVQ path reads them too.
QMATVEC_SINGLE_TYPES = ("mxfp4",)


def separate_fusable(n_tokens: int, *weights, max_tokens: int | None = None) -> bool:
    """True when fused_qmatvec takes these separate matrices for a step of n_tokens tokens (at most
    max_tokens, FUSED_QMATVEC_MAX_TOKENS unless given)."""
    limit = FUSED_QMATVEC_MAX_TOKENS if max_tokens is None else max_tokens
    if n_tokens > limit or any(w is None for w in weights):
        return False
    if all(w.fmt in fused_qmatvec.KQUANT_TYPES for w in weights):
        return True
    if all(w.fmt in fused_qmatvec.MXFP4_TYPES for w in weights):  # its own entries, chosen as Q4_0's are (unmeasured)
        return True
    # The one-token entries of the 32-element blocks (Q5_0, Q5_1, ...: fused_qmatvec.BLOCK32_TYPES) only where they
    # were measured faster than the other paths (qmatvec_first), so that a narrow model keeps what it ran on.
    return fused_qmatvec.supports(*(w.fmt for w in weights), tokens=n_tokens) and all(
        w.fmt in fused_qmatvec.KQUANT_TYPES or qmatvec_first(w.fmt, n_tokens, w.cols) for w in weights)


def takes_fused_qmatvec(device: Device, n_tokens: int, *weights) -> bool:
    """True when fused_qmatvec takes these separate matrices for a step of n_tokens tokens on `device`."""
    return separate_fusable(n_tokens, *weights, max_tokens=qmatvec_limit(device, *weights))


def head_takes_fused_qmatvec(device: Device, rows: int, weight) -> bool:
    """True when fused_qmatvec takes the output head for `rows` rows on `device`."""
    return separate_fusable(rows, weight, max_tokens=head_qmatvec_limit(device, weight))


def stores_kv_in_epilogue(kv_dtype: str) -> bool:
    """True when a product that stores k and v (fused_qmatvec's q|k|v, head_norm_rope) can write them into a cache of
    kv_dtype itself, so that the step has no kv_store launch: the element-wise KV formats."""
    return kv_store.epilogue_fusable(kv_dtype)


def qmatvec_limit(device: Device, *weights) -> int:
    """The most tokens fused_qmatvec takes these separate matrices for on `device`: FUSED_QMATVEC_MAX_TOKENS,
    or fewer where matmul_mma takes one of them from fewer (its fragment path)."""
    return min([FUSED_QMATVEC_MAX_TOKENS] + [matmul_mma.min_tokens(w.fmt, device.arch) - 1 for w in weights
                                             if w is not None])


def head_qmatvec_limit(device: Device, weight) -> int:
    """The most rows fused_qmatvec takes the head for on `device` (HEAD_QMATVEC_MAX_ROWS_FRAGMENTS where
    matmul_mma has the fragment path for its type, else HEAD_MATVEC_MAX_ROWS)."""
    if matmul_mma.has_fragment_path(device.arch, weight.fmt, 32):
        return HEAD_QMATVEC_MAX_ROWS_FRAGMENTS
    return HEAD_MATVEC_MAX_ROWS


def qmatvec_first(weight_type: str, n_tokens: int, cols: int) -> bool:
    """True when a one-token product of a type both fused families read, over `cols` columns, goes to fused_qmatvec
    (int8 activations, dp4a) rather than fused_matvec (float weights, FMA): see QMATVEC_FIRST_TYPES."""
    return n_tokens == 1 and weight_type in QMATVEC_FIRST_TYPES and cols >= qmatvec_first_min_cols()


def mma_first(weight_type: str, n_tokens: int, cols: int, arch: str) -> bool:
    """True when a product of a type the fused families read, n_tokens tokens over `cols` columns, takes the single
    ops on the matrix cores on `arch` instead (see MMA_FIRST_MIN_COLS)."""
    return (weight_type in matmul_mma.PAIR32_FRAGMENT_TYPES
            and matmul_mma.has_fragment_path(arch, weight_type, 32, cols)
            and n_tokens >= matmul_mma.min_tokens(weight_type, arch) and cols >= mma_first_min_cols())


def check_settings() -> None:
    """Read every numeric setting (the README's table) once, so that a bad value is refused (UsageError) when a model
    loads, before anything is allocated, rather than inside its first step."""
    mma_first_min_cols()
    moe_experts.grouped_min_pairs()
    moe_experts_mma.min_pairs_per_expert(())
    moe_experts_mma.direct_min_pairs(())
    moe_experts_mma.direct_max_pairs(())
    moe_experts_mma.narrow_step_cols()
    moe_experts_mma.wide_tile_pairs()
    qmatvec_first_min_cols()


def qmatvec_first_min_cols() -> int:
    """QMATVEC_FIRST_MIN_COLS, or ROCMFORGE_QMATVEC_FIRST_MIN_COLS where set."""
    return int(settings.number("ROCMFORGE_QMATVEC_FIRST_MIN_COLS", QMATVEC_FIRST_MIN_COLS, whole=True))


def mma_first_min_cols() -> int:
    """MMA_FIRST_MIN_COLS, or ROCMFORGE_MMA_FIRST_MIN_COLS where set."""
    return int(settings.number("ROCMFORGE_MMA_FIRST_MIN_COLS", MMA_FIRST_MIN_COLS, whole=True))


def fused_family(weight_type: str, n_tokens: int, max_matvec_tokens: int = FUSED_MATVEC_MAX_TOKENS, *, cols: int = 0,
                 arch: str = ""):
    """The fused op module for a product of n_tokens tokens with W of weight_type and `cols` columns on `arch`, or
    None (single ops: mma_first, or formats neither family reads; or fused_qmatvec on the matrices apart:
    qmatvec_first)."""
    if not fused_matvec.supports(weight_type) or qmatvec_first(weight_type, n_tokens, cols) \
            or mma_first(weight_type, n_tokens, cols, arch):
        return None
    if n_tokens <= max_matvec_tokens:
        return fused_matvec
    return fused_matmul if fused_matmul.supports(weight_type) else None


def single_product_op(device: Device, n_tokens: int, weight_type: str):
    """The op module that computes a product alone (no fused norm, activation or residual): matmul_mma where the
    matrix cores take it (matmul_mma.takes_matrix_cores), else matmul beyond matmul.MATVEC_MAX_TOKENS tokens (W
    decoded once per tile of tokens), else matvec (a pass over W per 8 tokens, as fast as W can be read), or qmatvec
    for QMATVEC_SINGLE_TYPES."""
    if matmul_mma.takes_matrix_cores(device, n_tokens, weight_type):
        return matmul_mma
    if n_tokens > matmul.MATVEC_MAX_TOKENS:
        return matmul
    return qmatvec if weight_type in QMATVEC_SINGLE_TYPES else matvec


def project_op(device: Device, n_tokens: int, weight_type: str, rows: int, cols: int):
    """The op module `project` launches: single_product_op's, but matvec (its split entry) where matmul would take
    a product of few rows that matvec.split_takes_batch keeps (a decode batch's MoE router)."""
    op = single_product_op(device, n_tokens, weight_type)
    if op is matmul and matvec.split_takes_batch(weight_type, rows, cols, n_tokens):
        return matvec
    return op


def project(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, n_tokens: int, *,
            weight_type: str, workspace: Any = None) -> None:
    """y[n_tokens, rows] = x @ W^T by project_op's kernel; `workspace` is matmul_mma's (its splits)."""
    op = project_op(device, n_tokens, weight_type, rows, cols)
    extra = {"workspace": workspace} if op is matmul_mma else {}
    op.launch(device, stream, y, w, x, rows, cols, n_tokens, weight_type=weight_type, **extra)


def family_of(weight, n_tokens: int, arch: str):
    """fused_family of a product of `weight` (a model weight: its fmt and cols) for n_tokens tokens on `arch`."""
    return fused_family(weight.fmt, n_tokens, cols=weight.cols, arch=arch)


def head_family(weight, rows: int, arch: str):
    """fused_family of the output head of `weight` for `rows` rows on `arch` (fused_matvec up to
    HEAD_MATVEC_MAX_ROWS rows)."""
    return fused_family(weight.fmt, rows, HEAD_MATVEC_MAX_ROWS, cols=weight.cols, arch=arch)


def takes_qkv(device: Device, n_tokens: int, weight_types: tuple[str, str, str], cols: int,
              rows: tuple[int, int, int]) -> bool:
    """Whether a step of n_tokens tokens computes q, k and v of these types and row counts in one
    matmul_mma_qkv.launch_qkv (K-quants, or three of one 32-element format, on NVIDIA's fragment path)."""
    return matmul_mma_qkv.takes_types(weight_types) and all(
        matmul_mma.has_fragment_path(device.arch, t, 32, cols)
        and matmul_mma.takes_matrix_cores(device, n_tokens, t) for t in weight_types) and all(
        matmul_mma.pick_tile_tokens(r, n_tokens) == 32 for r in rows)  # where each product alone takes the fragments


def takes_f16_x(device: Device, weight_type: str, rows: int, n_tokens: int) -> bool:
    """Whether `matmul_mma.launch(x_f16=True)` takes this product on `device`: on the matrix cores, a type of
    X16_TYPES, or of X16_WIDE_ONLY_TYPES where pick_x16_tile_tokens picks the 128-token tiles."""
    if not matmul_mma.takes_matrix_cores(device, n_tokens, weight_type):
        return False
    if weight_type in matmul_mma.X16_TYPES:
        return True
    return (weight_type in matmul_mma.X16_WIDE_ONLY_TYPES
            and matmul_mma.pick_x16_tile_tokens(rows, n_tokens, device.arch) == matmul_mma.WIDE_TILE_TOKENS)


def swiglu_fits(device: Device, n_tokens: int, rows: int, weight_type: str, workspace: Any) -> bool:
    """Whether matmul_mma_swiglu.launch_swiglu takes this pair: matrix cores, a type of SWIGLU_TYPES, a step the
    launcher tiles in 64 tokens (a prompt step; decode batches keep their split and fragment paths), at most
    MAX_SPLIT_TILES tiles (one counter each) and a workspace for the counters."""
    return (matmul_mma.takes_matrix_cores(device, n_tokens, weight_type)
            and weight_type in matmul_mma_swiglu.SWIGLU_TYPES
            and isinstance(workspace, Buffer) and workspace.nbytes >= matmul_mma.COUNTER_BYTES
            and matmul_mma.pick_tile_tokens(rows, n_tokens) == 64
            and matmul_mma.tile_count(rows, n_tokens, 64) <= matmul_mma.MAX_SPLIT_TILES)


def silu_up_fits(device: Device, n_tokens: int, rows: int, weight_type: str, activation: str = "silu") -> bool:
    """Whether a feed-forward of `rows` gate/up rows takes the 128-token SwiGLU (matmul_mma.launch with x_f16 for the
    gate, then matmul_mma_swiglu.launch_silu_up; activation "gelu": the GeGLU): matrix cores, a type of the
    activation's entries (SILU_UP_TYPES, GELU_UP_TYPES), 128-token tiles (pick_x16_tile_tokens) so many that no
    product of them is split (the epilogue needs the whole sum)."""
    wide = matmul_mma.WIDE_TILE_TOKENS
    return (matmul_mma.takes_matrix_cores(device, n_tokens, weight_type)
            and weight_type in matmul_mma_swiglu.ACTIVATIONS[activation][0]
            and matmul_mma.pick_x16_tile_tokens(rows, n_tokens, device.arch) == wide
            and matmul_mma.pick_splits(matmul_mma.tile_count(rows, n_tokens, wide), 1 << 30) == 1)


def swiglu_fragments_fit(device: Device, n_tokens: int, rows: int, cols: int, weight_types: tuple[str, str],
                         workspace: Any) -> bool:
    """Whether matmul_mma_swiglu.launch_swiglu_fragments takes gate and up of these types: one type of
    SWIGLU_FRAGMENT_TYPES on NVIDIA's fragment path at n_tokens tokens, a workspace Buffer for the counters (two
    products' tiles and the pairs')."""
    weight_type = weight_types[0]
    if weight_types[1] != weight_type:
        return False
    direct = n_tokens <= matmul_mma.DIRECT_MAX_TOKENS
    tiles = matmul_mma.tile_count(rows, n_tokens, matmul_mma.DIRECT_MAX_TOKENS if direct else 32)
    fits = (weight_type in matmul_mma_swiglu.SWIGLU_FRAGMENT_TYPES
            and matmul_mma.has_fragment_path(device.arch, weight_type, 32, cols)
            and matmul_mma.takes_matrix_cores(device, n_tokens, weight_type) and isinstance(workspace, Buffer)
            and workspace.nbytes >= matmul_mma.COUNTER_BYTES and 3 * tiles <= matmul_mma.MAX_SPLIT_TILES
            and matmul_mma.pick_tile_tokens(rows, n_tokens) == 32)  # where each product alone takes the fragments
    if fits and weight_type == "q6_k" and direct:
        # Q6_K's direct entry only over the short splits it was measured faster on (matmul_mma.entry_name's rule;
        # the pair's direct entry has no staged twin to fall back on)
        splits = matmul_mma_swiglu.swiglu_fragments_geometry(weight_type, rows, n_tokens, cols, workspace.nbytes)[2]
        return -(-(cols // matmul_mma.WIDE_STEP_COLS) // splits) <= matmul_mma.DIRECT_Q6K_MAX_SPLIT_STEPS
    return fits
