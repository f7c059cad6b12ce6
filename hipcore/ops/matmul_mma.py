"""matmul_mma: y[t, r] = sum_c W[r, c] * x[t, c] on the matrix cores (prompt steps and large batches).

Kernels `matmul_mma_<type>(y p, W p, x p, workspace p, rows i, cols i, n_tokens i, tile_tokens i, splits i,
accumulate i)` for the types of WEIGHT_TYPES (kernels/matmul_mma.hip); operands, layouts and requirements as
matmul's; accumulate 1 adds the product to y (the residual connection) instead of storing it. W is decoded to f16
in shared memory, x rounded to f16, and 16x16x16 f16 products accumulate in f32 on the matrix instruction
hip_compat.h picks for the target (mma.sync on NVIDIA sm_80+, MFMA on CDNA, WMMA on RDNA3/RDNA4; plain
FMA elsewhere, where `has_matrix_cores` is false and kernel_choice.project keeps matmul's FP32 kernel instead).

x in f16 (`launch(..., x_f16=True)`): `matmul_mma_x16_<type>` for X16_TYPES, the same arguments with x f16
[n_tokens, cols] (rmsnorm's out_f16, or a SwiGLU pair's h16): half the bytes each tile reads, the same results
(the float32 kernels round x to f16 as they stage it). Shared tiles of 32 or 64 tokens (no fragment path), or
WIDE_TILE_TOKENS (128) where those tiles are many (`matmul_mma_x16_128_<type>`, pick_x16_tile_tokens); the block
formats, F16 and BF16 (X16_WIDE_ONLY_TYPES) have the 128-token entries only (kernel_choice.takes_f16_x).

The entries that end in a SwiGLU (a prompt step's feed-forward) have their launchers in matmul_mma_swiglu.py.

Geometry: 256-thread workgroups, each computing tiles of TILE_ROWS rows x tile_tokens tokens (a
grid-stride loop over the tiles); tile_tokens is 64, or 32 when the batch fits in 32 or 64-token tiles
would leave fewer than matmul.BUSY_WORKGROUPS workgroups. When the tiles are fewer than the GPU holds at
once (a decode batch: one token tile), each tile's columns are split into `splits` ranges, one
workgroup each (pick_splits), and the last to finish sums the partials in a workspace in split order
(deterministic); without a workspace large enough, fewer splits (down to 1, no workspace read).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from hipcore.ops import matmul, matvec
from hipcore.ops.launch_checks import INT32_MAX, address
from hipcore.ops.weight_formats import dequantize_rows, host_product, k_min_magnitudes, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.kernels import get_kernel

OP = "matmul_mma"
SIGNATURE = "ppppiiiiii"
WEIGHT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "f16", "bf16", "mxfp4")
THREADS = 256  # the kernel's warp tiling is written for exactly this
TILE_ROWS = 128
TILE_TOKENS = (32, 64)
MAX_GRID = 1 << 20
STEP_COLS = 32  # Narrow's kStepCols: a split is a range of whole steps
WIDE_STEP_COLS = 64  # Wide's and Wide6's: the K-quants read 64 columns of a super-block per step
WIDE_TYPES = ("q4_k", "q5_k", "q6_k")
# Wide reads 16-byte words of Q4_K / Q5_K super-blocks (144 and 176 bytes: multiples of 16); MXFP4's 17-byte blocks
# are read as the aligned words around them (matmul.WEIGHT_ALIGNMENT).
WEIGHT_ALIGNMENT = {**matmul.WEIGHT_ALIGNMENT, "q4_k": 16, "q5_k": 16}
# Workgroups resident at once on an H100/H200: 132 SMs x 2 (256 threads of at most 128 registers).
BUSY_ITEMS = 264
MIN_SPLIT_STEPS = 4  # a shorter split spends more on its partial tile than on its products
COUNTER_BYTES = 4096  # kCounterBytes: one int32 counter per tile, before the partials
MAX_SPLIT_TILES = COUNTER_BYTES // 4
# From this many tokens on kernel_choice.project takes the matrix cores where the device has them (measured on an
# NVIDIA H100 80GB HBM3 on the Llama-3.1-8B shapes against matmul's FP32 kernel:
# docs/history/2026-11-24-qmatvec-matmul-mma-llama3-baseline.md).
MMA_MIN_TOKENS = matmul.MATVEC_MAX_TOKENS + 1
# The K-quants from fewer: whole Llama-3.1-8B and Llama-3.2-1B Q4_K_M models on an H100 with their decode
# batches on the matrix cores from 2 tokens, against fused_qmatvec in the same run
# (docs/history/2026-11-24-split-k-gemma3-270m-serve.md):
# 8 tokens 723 against 653 t/s (8B) and 2,394 against 2,022 (1B); 4 tokens 383 against 536 and 1,247
# against 1,492. The step time of fused_qmatvec grows with the tokens and the matrix cores' barely does;
# between the two points measured, the lines cross near 7 (8B) and 6 (1B) tokens.
MMA_MIN_TOKENS_KQUANT = 7
# Where the K-quants take the fragment path (NVIDIA sm_80+), from 5 tokens: on an NVIDIA H200, per
# Llama-3.1-8B layer, fused_qmatvec's four launches take 146 us at 4 tokens and 333 at 6 (two passes over W),
# the fragment path's seven products 144 and 146 us plus ~18 us of the single ops' norm, RoPE and SwiGLU
# (~11 since rmsnorm moves float4s; scripts/bench/measure_qmatvec_decode.py beside measure_matmul_mma.py;
# docs/history/2026-11-27-fragment-path-kquant-batches.md).
MMA_MIN_TOKENS_KQUANT_FRAGMENTS = 5
KQUANT_TYPES = WIDE_TYPES
F16_MAX = 65504.0
U16 = 2.0**-11  # f16 unit roundoff
F16_HALF_SPACING = 2.0**-25  # half the spacing of f16's subnormals: the absolute rounding error near 0

_MATRIX_CORE_ARCH = re.compile(r"sm_(\d+)[af]?$|gfx(908|90a|94[012]|950|11[0-9a-f]{2}|12[0-9a-f]{2})$")


# Decode batches on NVIDIA's mma (32-token tiles): the fragment path of kernels/matmul_mma.hip (its parts
# matmul_mma_fragments.h and matmul_mma_block32_fragments.h), whose lanes decode their own A fragments in registers
# instead of staging the decoded tile in shared memory;
# a batch of at most DIRECT_MAX_TOKENS takes its direct entry (x read straight from memory, no barrier).
# The 32-element block formats, F16 and BF16 read two runs of 32 columns a step (PAIR32_STEP_COLS: the kernel's Pair32),
# so they take the path only where the columns are a multiple of it.
PAIR32_FRAGMENT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16")
PAIR32_STEP_COLS = 64
FRAGMENT_TYPES = WIDE_TYPES + PAIR32_FRAGMENT_TYPES
# The 2-byte aligned blocks (34, 18 and 22 bytes) are read there in 4-byte words, which needs each step to start
# 4-byte aligned (kernels/matmul_mma_block32_fragments.h CodeWords): whole steps make the rows so, and W's start must
# be (GGUF tensors and the row views of them are; a launch whose W is not takes the shared tiles).
WORD_ALIGNED_FRAGMENT_TYPES = ("q4_0", "q5_0", "q8_0")
DIRECT_MAX_TOKENS = 8
# Q6_K takes the direct entry only where each split covers at most this many steps. On an NVIDIA H100 at 8
# tokens, direct against staged: Llama-3.1-8B v (4 steps a split) 9.3 against 11.9 us, Llama-3.2-1B v (4)
# 8.0 / 9.4 and down (8) 18.5 / 22.2; but the 8B's down (28 steps) 51.0 / 45.2 and the head (64) 420.9 /
# 314.2. Q4_K's direct entry won over 32 steps (the 8B's gate/up: 31.0 / 41.8 us).
DIRECT_Q6K_MAX_SPLIT_STEPS = 8


def has_fragments(arch: str) -> bool:
    """Whether `arch` runs mma.sync's fragment layout (NVIDIA sm_80 and later), which the fragment paths are written
    in (this op's decode batches, moe_experts_mma's few-pairs tiles)."""
    return arch.startswith("sm_") and has_matrix_cores(arch)


def has_fragment_path(arch: str, weight_type: str, tile_tokens: int, cols: int | None = None) -> bool:
    """Whether kernels/matmul_mma.hip has the fragment path for this launch: FRAGMENT_TYPES in 32-token tiles
    on NVIDIA sm_80 and later (has_fragments); for PAIR32_FRAGMENT_TYPES, a product of `cols` columns only where they
    are whole steps of PAIR32_STEP_COLS (cols None: any product of the type that has them)."""
    if weight_type in PAIR32_FRAGMENT_TYPES and cols is not None and cols % PAIR32_STEP_COLS:
        return False
    return has_fragments(arch) and tile_tokens == 32 and weight_type in FRAGMENT_TYPES


PATHS = ("auto", "shared", "staged", "direct")


def entry_name(arch: str, weight_type: str, tile_tokens: int, n_tokens: int, path: str = "auto",
               split_steps: int = 1, cols: int | None = None) -> str:
    """The kernel of a launch of `cols` columns (None: any the fragment path takes) whose splits each cover
    `split_steps` steps of step_cols(weight_type, fragments) columns.
    path "auto" (the launcher's choice): where has_fragment_path, matmul_mma_direct_<type> for at most
    DIRECT_MAX_TOKENS tokens (Q6_K: over at most DIRECT_Q6K_MAX_SPLIT_STEPS steps a split) and
    matmul_mma_fragments_<type> (x staged) otherwise; else matmul_mma_<type>. "shared", "staged" and "direct"
    name one kernel (side-by-side measurements and tests); the last two exist only where has_fragment_path."""
    if path not in PATHS:
        raise ValueError(f"{OP}: path must be one of {PATHS}, got {path!r}")
    fragments = has_fragment_path(arch, weight_type, tile_tokens, cols)
    if path in ("staged", "direct") and not fragments:
        raise ValueError(f"{OP}_{weight_type}: no fragment path on {arch} for {tile_tokens}-token tiles")
    if path == "auto" and fragments:
        direct = n_tokens <= DIRECT_MAX_TOKENS and (weight_type != "q6_k" or split_steps <= DIRECT_Q6K_MAX_SPLIT_STEPS)
        path = "direct" if direct else "staged"
    return {"staged": f"{OP}_fragments_{weight_type}", "direct": f"{OP}_direct_{weight_type}"}.get(path, f"{OP}_{weight_type}")


def has_matrix_cores(arch: str) -> bool:
    """Whether kernels/matmul_mma.hip runs on matrix instructions on `arch` (hip_compat.h's RF_MMA_KIND)."""
    m = _MATRIX_CORE_ARCH.match(arch)
    return bool(m) and (m.group(1) is None or int(m.group(1)) >= 80)


# ---- reference ---------------------------------------------------------------------------------

reference = matmul.reference


def error_bound(w_raw: np.ndarray, weight_type: str, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float64 [n_tokens, rows]: how far the kernel's result may be from `reference`.

    Each weight reaches f16 with at most two roundings: |w' - w| <= u16 |w| + e + h (u16 = 2^-11, h = 2^-25
    where f16 is subnormal), e the second rounding the packed-f16 decoders of the K-quants do (Q4_K/Q5_K:
    dmin m rounded to f16 before it is subtracted, e <= u16 (1 + u16) |dmin m|; Q6_K: the sub-block scale
    d sc rounded to f16 before it multiplies, e <= u16 (1 + u16) |w|; the other formats: e = 0); x is
    rounded once: |x' - x| <= u16 |x| + h. So |w'x' - wx| <= (2 u16 + u16^2) |w x| + (1 + u16)(e |x| + h
    (|x| + |w|)) + 32 h |x| (a subnormal scale: 32 codes past it at most) + h^2.
    The products of f16 are exact in f32; their sum of `cols` terms passes each through at most cols
    roundings, and matrix units may truncate rather than round: (cols + 4) * 2^-23 relative to sum |w'x'|.
    A mis-decoded weight or a wrong fragment lane is off by O(|w x|), far above it.
    """
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    w_abs = np.abs(dequantize_rows(raw, weight_type, cols, np.float64))
    x_abs = np.abs(np.asarray(x, dtype=np.float64).reshape(-1, cols))
    wx = x_abs @ w_abs.T
    if weight_type == "q6_k":
        second = U16 * (1 + U16) * wx
    else:
        second = U16 * (1 + U16) * (x_abs @ k_min_magnitudes(raw, weight_type, cols).T)
    x_sum = x_abs.sum(1)[:, None]
    rounding = ((2 * U16 + U16 * U16) * wx + (1 + U16) * (second + F16_HALF_SPACING * (x_sum + w_abs.sum(1)[None, :]))
                + 32 * F16_HALF_SPACING * x_sum)
    summing = (cols + 4) * 2.0**-23 * (1 + 3 * U16) * (wx + second)
    return 1.01 * (rounding + summing) + 1e-30


# ---- host implementation (the cpu backend: matmul's float32 product) ---------------------------


def _host(weight_type: str, x_dtype=np.float32):
    """The cpu backend's kernel of an entry: x of x_dtype (float16 for the x16 entries) as float32."""
    def run(device: CpuDevice, grid, block, y: int, w: int, x: int, workspace: int, rows: int, cols: int,
            n_tokens: int, tile_tokens: int, splits: int, accumulate: int) -> None:
        raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
        result = np.empty((n_tokens, rows), dtype=np.float32)
        host_product(raw, weight_type, device.view(x, x_dtype, (n_tokens, cols)).astype(np.float32), cols, result)
        out = device.view(y, np.float32, (n_tokens, rows))
        if accumulate:
            out += result
        else:
            out[:] = result

    return run


for _type in WEIGHT_TYPES:
    cpu_kernel(f"{OP}_{_type}", SIGNATURE)(_host(_type))
for _type in FRAGMENT_TYPES:  # the fragment path's entries compute the same product
    cpu_kernel(f"{OP}_fragments_{_type}", SIGNATURE)(_host(_type))
    cpu_kernel(f"{OP}_direct_{_type}", SIGNATURE)(_host(_type))


# ---- launcher ----------------------------------------------------------------------------------


def tile_count(rows: int, n_tokens: int, tile_tokens: int) -> int:
    return -(-rows // TILE_ROWS) * -(-n_tokens // tile_tokens)


def pick_tile_tokens(rows: int, n_tokens: int) -> int:
    """32 tokens when they hold the batch or 64-token tiles would leave too few workgroups, else 64."""
    if n_tokens <= 32 or tile_count(rows, n_tokens, 64) < matmul.BUSY_WORKGROUPS:
        return 32
    return 64


def step_cols(weight_type: str, fragments: bool = False) -> int:
    """Columns the kernel reads per step for W of this type (a split is a range of whole steps); fragments: on the
    fragment path (entry_name's fragments_ and direct_ entries)."""
    if weight_type in WIDE_TYPES:
        return WIDE_STEP_COLS
    return PAIR32_STEP_COLS if fragments else STEP_COLS


def pick_splits(tiles: int, cols: int, step: int = STEP_COLS) -> int:
    """Column ranges per tile, each at least MIN_SPLIT_STEPS steps of `step` columns, as many as keep the
    workgroups within BUSY_ITEMS (one wave); 1 when the tiles alone fill it."""
    if tiles > MAX_SPLIT_TILES or tiles * 2 > BUSY_ITEMS:
        return 1
    return max(1, min(BUSY_ITEMS // tiles, cols // step // MIN_SPLIT_STEPS))


def partial_bytes(tiles: int, splits: int, tile_tokens: int) -> int:
    """Workspace bytes a launch of `splits` > 1 needs: the counters and every split's partial tile."""
    return COUNTER_BYTES + tiles * splits * TILE_ROWS * tile_tokens * 4


def geometry(rows: int, n_tokens: int, tile_tokens: int | None = None, *, cols: int | None = None,
             workspace_bytes: int = 0, splits: int | None = None, step: int = STEP_COLS) -> tuple[int, int, int, int]:
    """(grid, block, tile_tokens, splits) for y[n_tokens, rows]; tile_tokens as given or pick_tile_tokens';
    splits as given or pick_splits' (for `cols` columns in steps of `step`: step_cols of the weight type),
    fewer while the workspace is too small for them."""
    tile = pick_tile_tokens(rows, n_tokens) if tile_tokens is None else tile_tokens
    if tile not in TILE_TOKENS + (WIDE_TILE_TOKENS,):
        raise ValueError(f"{OP}: tile_tokens must be one of {TILE_TOKENS + (WIDE_TILE_TOKENS,)}, got {tile!r}")
    tiles = tile_count(rows, n_tokens, tile)
    steps = max(1, (cols or step) // step)
    split = (pick_splits(tiles, cols, step) if cols else 1) if splits is None else splits
    if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= steps:
        raise ValueError(f"{OP}: splits must be an int in [1, {steps}] (steps of {step} columns), got {split!r}")
    if split > 1 and tiles > MAX_SPLIT_TILES:
        raise ValueError(f"{OP}: {tiles} tiles are more than the {MAX_SPLIT_TILES} counters a split launch has")
    while split > 1 and partial_bytes(tiles, split, tile) > workspace_bytes:
        split -= 1
    if tiles * split > INT32_MAX:  # the kernel counts (tile, split) items in int32
        raise ValueError(f"{OP}: {rows} rows x {n_tokens} tokens in {split} splits is more work items than the kernel counts")
    return min(tiles * split, MAX_GRID), THREADS, tile, split


def supports(weight_type: str) -> bool:
    return weight_type in WEIGHT_TYPES


def launch(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, rows: int, cols: int, n_tokens: int, *,
           weight_type: str, tile_tokens: int | None = None, workspace: Any = None, splits: int | None = None,
           accumulate: bool = False, path: str = "auto", x_f16: bool = False) -> None:
    """y[n_tokens, rows] = x[n_tokens, cols] @ W[rows, cols]^T (y += when accumulate) on the matrix cores, W of
    `weight_type`; `workspace` a Buffer zeroed once after allocation (the kernels leave its counters at zero),
    or None for no splits; `path` as entry_name's ("auto": the launcher's choice of kernel); x_f16: x is f16
    (matmul_mma_x16_<type>, X16_TYPES only, the shared tiles; matmul_mma_x16_128_<type> where
    pick_x16_tile_tokens picks 128-token tiles, split as the others)."""
    if x_f16 and weight_type not in X16_TYPES + X16_WIDE_ONLY_TYPES:
        raise ValueError(f"{OP}: f16 x is read for {', '.join(X16_TYPES + X16_WIDE_ONLY_TYPES)} weights only, got "
                         f"{weight_type!r}")
    if x_f16 and path not in ("auto", "shared"):
        raise ValueError(f"{OP}: f16 x takes the shared tiles, not path {path!r}")
    matvec.check_operands(OP, weight_type, WEIGHT_TYPES, y, w, x, rows, cols, n_tokens, "n_tokens",
                          alignment=WEIGHT_ALIGNMENT, x_itemsize=F16_BYTES if x_f16 else 4)
    if workspace is not None and not isinstance(workspace, Buffer):
        raise ValueError(f"{OP}: workspace must be a Buffer (its size decides how far columns are split)")
    if x_f16 and tile_tokens is None:
        tile_tokens = pick_x16_tile_tokens(rows, n_tokens, device.arch)
    if tile_tokens == WIDE_TILE_TOKENS and not (x_f16 and has_wide_tiles(device.arch)):
        raise ValueError(f"{OP}: {WIDE_TILE_TOKENS}-token tiles read f16 x on NVIDIA sm_80 and later, not "
                         f"{'float32 x' if not x_f16 else device.arch}")
    if x_f16 and weight_type in X16_WIDE_ONLY_TYPES and tile_tokens != WIDE_TILE_TOKENS:
        raise ValueError(f"{OP}: f16 x of {weight_type} is read in {WIDE_TILE_TOKENS}-token tiles only, not "
                         f"{tile_tokens} (kernel_choice.takes_f16_x)")
    tile = pick_tile_tokens(rows, n_tokens) if tile_tokens is None else tile_tokens
    fragments = not x_f16 and path != "shared" and has_fragment_path(device.arch, weight_type, tile, cols)
    if fragments and weight_type in WORD_ALIGNED_FRAGMENT_TYPES and address(w) % 4:
        if path != "auto":
            raise ValueError(f"{OP}_{weight_type}: the {path} entry reads W in 4-byte words; W at {address(w):#x} is not "
                             "4-byte aligned")
        fragments, path = False, "shared"
    step = step_cols(weight_type, fragments)
    grid, block, tile, split = geometry(rows, n_tokens, tile, cols=cols,
                                        workspace_bytes=workspace.nbytes if workspace is not None else 0, splits=splits,
                                        step=step)
    if splits is not None and split != splits:
        raise ValueError(f"{OP}_{weight_type}: {splits} splits need a workspace of "
                         f"{partial_bytes(grid // split, splits, tile)} bytes")
    split_steps = -(-(cols // step) // split)
    entry = x16_entry(weight_type, tile) if x_f16 else entry_name(device.arch, weight_type, tile, n_tokens, path,
                                                                   split_steps, cols)
    if entry.startswith(f"{OP}_direct_") and split > 1 and tile_count(rows, n_tokens, DIRECT_MAX_TOKENS) > MAX_SPLIT_TILES:
        raise ValueError(f"{entry}: its {DIRECT_MAX_TOKENS}-token tiles are more than the {MAX_SPLIT_TILES} counters "
                         "a split launch has")
    # Programmatic: the entries wait for the kernel ahead (the fragment path once its first weights are loading).
    kernel = get_kernel(device, OP, entry, SIGNATURE, programmatic=True)
    kernel.launch(grid, block, (y, w, x, workspace if split > 1 else 0, rows, cols, n_tokens, tile, split,
                                int(bool(accumulate))), stream=stream)


# ---- f16 x ----------------------------------------------------------------------------------------

X16_TYPES = WIDE_TYPES
# The wide Q8_0, Q5_0, Q5_1, Q4_1, F16, BF16 (and Q4_0) layers' prompts (kernel_choice.mma_first) read f16 x in 128-token
# tiles only (their x16_128 and silu_up entries; no 64-token x16 entries): kernel_choice.takes_f16_x.
X16_WIDE_ONLY_TYPES = PAIR32_FRAGMENT_TYPES
F16_BYTES = 2


# f16-x products in tiles of 128 tokens (their own entries): each decoded step feeds twice the tokens and each warp's
# fragment reads twice the multiply-adds, where the 64-token tiles are bound by the SM's shared-memory pipe. On an
# NVIDIA H100 at 512 tokens, against the 64-token tiles (µs): the 8B's gate 351 -> 264 (448 tiles); with the columns
# split as pick_splits splits them (the tiles times splits near BUSY_ITEMS), down (Q6_K, 128 tiles) 471 -> 317 (2
# splits; 446 unsplit), q 100 -> 75 (2), k 32.2 -> 32.7 (32 tiles, 8 splits), v 43.2 -> 38.9; the 1B's down 164 -> 112
# (64 tiles, 4 splits), q 31.6 -> 29.4 (4); but its k and v (16 tiles) 16.1 -> 17.0 and 19.4 -> 19.6
# (docs/history/2026-11-28-wide-prompt-tiles.md). So from WIDE_MIN_TILES tiles of 128 tokens on, for steps of at least
# WIDE_MIN_TOKENS (prompts: nothing smaller was measured). NVIDIA's mma only (has_wide_tiles): on gfx1030 (FMA at wave
# 32) and gfx1100 (WMMA) the 128-token tiles spilled, and no AMD GPU has measured them.
WIDE_TILE_TOKENS = 128
WIDE_MIN_TILES = 32
WIDE_MIN_TOKENS = 128
# The workspace the 128-token tiles' splits need at most: BUSY_ITEMS partial tiles of 128 x 128 floats.
WIDE_WORKSPACE_BYTES = COUNTER_BYTES + BUSY_ITEMS * TILE_ROWS * WIDE_TILE_TOKENS * 4


def x16_entry(weight_type: str, tile_tokens: int = 64) -> str:
    return f"{OP}_x16_128_{weight_type}" if tile_tokens == WIDE_TILE_TOKENS else f"{OP}_x16_{weight_type}"


def has_wide_tiles(arch: str) -> bool:
    """Whether kernels/matmul_mma.hip has the 128-token entries (x16_128, silu_up) on `arch`: NVIDIA sm_80+."""
    return arch.startswith("sm_") and has_matrix_cores(arch)


def pick_x16_tile_tokens(rows: int, n_tokens: int, arch: str) -> int:
    """An f16-x product's tile: WIDE_TILE_TOKENS where `arch` has them, the step has at least WIDE_MIN_TOKENS and
    they make at least WIDE_MIN_TILES tiles, else pick_tile_tokens'."""
    if (has_wide_tiles(arch) and n_tokens >= WIDE_MIN_TOKENS and tile_count(rows, n_tokens, WIDE_TILE_TOKENS) >= WIDE_MIN_TILES):
        return WIDE_TILE_TOKENS
    return pick_tile_tokens(rows, n_tokens)


for _type in X16_TYPES:
    cpu_kernel(x16_entry(_type), SIGNATURE)(_host(_type, np.float16))
for _type in X16_TYPES + X16_WIDE_ONLY_TYPES:
    cpu_kernel(x16_entry(_type, WIDE_TILE_TOKENS), SIGNATURE)(_host(_type, np.float16))

def min_tokens(weight_type: str, arch: str = "") -> int:
    """The fewest tokens whose products kernel_choice.project runs on the matrix cores, for W of this type on `arch`
    (from fewer where the type takes the fragment path)."""
    if has_fragment_path(arch, weight_type, 32):
        return MMA_MIN_TOKENS_KQUANT_FRAGMENTS
    return MMA_MIN_TOKENS_KQUANT if weight_type in KQUANT_TYPES else MMA_MIN_TOKENS


def takes_matrix_cores(device: Device, n_tokens: int, weight_type: str) -> bool:
    """Whether kernel_choice.project runs this product on the matrix cores (else matmul's or matvec's)."""
    return (n_tokens >= min_tokens(weight_type, device.arch) and supports(weight_type)
            and has_matrix_cores(device.arch))


