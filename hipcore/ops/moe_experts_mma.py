"""moe_experts_mma: the expert products of prompts and batches on the matrix cores (kernels/moe_experts_mma.hip).

The (token, slot) pairs of a step, p = t * k + j choosing expert ids[p], are sorted by expert on the device
(`moe_mma_sort`: sorted pair numbers and a list of token tiles, no host synchronization), and each expert's pairs are
multiplied as a matrix, tile_tokens (32 or 64) pairs at a time, with 128-row tiles of the expert's weights decoded to
f16 in shared memory, as matmul_mma multiplies a dense prompt. moe_experts' per-pair and grouped paths decode a slice
of an expert for one or two pairs; a prompt of 512 tokens gives Qwen3-30B-A3B's 128 experts 32 pairs each on average.

Three products a layer, each `moe_mma_<mode>_<type>[_s64](out p, g p, W p, x p, sorted p, tiles p, bias p, weights p,
rows i, cols i, pairs i, x_per i, n_expert i, tile_tokens i, max_tiles i, activation i)`:
  gate: G[p] = gate_e . x[t] + gate_bias_e                   float32 [pairs, ff] (the down workspace, reused)
  up:   h[p] = act(G[p], up_e . x[t] + up_bias_e)             f16 [pairs, ff] (in moe_experts' h buffer)
  down: terms[p] = weights[p] (down_e . h[p] + down_bias_e)   then moe_experts' moe_sum_slots_f32 adds the k terms of
                                                              each token into the residual stream, in slot order
Every product's x is f16 (X_BYTES): gate's and up's the token's normalized input (the feed-forward's norm writes an
f16 copy beside the router's float32 rows, rmsnorm's also_f16), down's the h up writes. The products round their
input to f16 in any case, so the same bits in half the bytes (a float32 x, read once per 128-row tile, was four times
an MXFP4 expert's weight bytes a step).
Precision as matmul_mma's (W and the input rounded to f16, exact products, f32 sums): `error_bound`. The result of
a pair does not depend on where the sort put it. Taken where the device has matrix cores, the experts' type has
entries (TYPES) and the pairs average at least min_pairs_per_expert an expert (`pays`: 4, 8 for MXFP4); BF16 and
MXFP4 experts only where their weights fit f16 (hipcore/model/weights.py marks them).

On NVIDIA, where the pairs average a few an expert (`direct_pays`: 2 to 8, 4 to 16 for MXFP4; decode batches:
gpt-oss-20b's 32 sequences give its 32 experts 4 pairs each), the same three products run in tiles of at most
DIRECT_TILE_PAIRS (8) pairs with the weights decoded straight into mma.sync's fragments (`moe_mma_<mode>_<type>_direct`,
as matmul_mma's direct entries multiply a dense batch of 8 tokens): each selected expert's weights are read once for
all its pairs, where the 32-pair tiles are mostly padding and moe_experts' grouped path walks each row once per two
pairs. The caller asks `direct_pays` before `pays`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import matmul, matmul_mma, moe_experts
from hipcore.ops.launch_checks import check_disjoint, check_memory, check_sizes
from hipcore.ops.weight_formats import column_multiple, row_bytes
from hipcore.runtime import settings
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.errors import UsageError
from hipcore.runtime.kernels import get_kernel

OP = "moe_experts_mma"
SORT_ENTRY, SORT_SIGNATURE = "moe_mma_sort", "pppiii"
SIGNATURE = "ppppppppiiiiiiii"
MODES = ("gate", "up", "down")
TYPES = ("q4_k", "q5_k", "q6_k", "q8_0", "mxfp4", "f16", "bf16")
THREADS = 256
TILE_ROWS = 128
MAX_EXPERTS = 512  # kMaxExperts: the sort's shared counters
# The matrix-core path once the pairs average this many an expert; below it moe_experts' grouped path (from
# moe_experts.GROUPED_MIN_PAIRS_PER_EXPERT) beats it, for longer with MXFP4 experts. Measured on an NVIDIA H100
# (2026-12-06, 5057825, t/s of batched decode, grouped against matrix cores): Qwen3-30B-A3B (Q4_K/Q6_K) at 32 sequences
# (2 pairs an expert) 1,469 against 1,306, at 64 (4) 1,983 against 2,267, at 128 (8) 2,275 against 4,059;
# gpt-oss-20b (MXFP4) at 16 (2) 1,007 against 569, at 32 (4) 1,373 against 1,018, at 64 (8) 1,697 against 1,939.
# ROCMFORGE_MOE_MMA_MIN_PAIRS sets it for every type, for a measurement.
MIN_PAIRS_PER_EXPERT = 4
MXFP4_MIN_PAIRS_PER_EXPERT = 8
# 64-pair tiles once the pairs average this many an expert (ROCMFORGE_MOE_MMA_WIDE_PAIRS for a measurement: a
# 512-token prompt of gpt-oss-20b averages 64 an expert, and with random routing about half its 32 experts then hold
# a second tile of a few pairs, whose workgroups cost nearly a full tile's steps; 32-pair tiles pad less and decode
# each weight tile twice as often)
WIDE_TILE_PAIRS = 48
TILE_PAIRS = (8, 32, 64)  # the sort's tiles: the few-pairs entries' (8) and the shared tiles' (32, 64)
MAX_GRID = 1 << 20
X_BYTES = 2  # every product's input and up's output h: f16
# The 32-element formats' steps (Q8_0, MXFP4, F16, BF16: matmul_mma's Narrow steps of 32 columns) also have `_s64`
# entries reading two steps at once, 64 columns between two barriers: the 32-column steps were latency-bound (1.8-2.1
# us a step of gpt-oss-20b's prompt on an H100, docs/history/2026-12-06-moe-grouped-staged.md). Taken where cols is a
# multiple of 64 and ROCMFORGE_MOE_MMA_NARROW_STEP (NARROW_STEP_COLS unless set) is 64: gpt-oss-20b's pp512 8,202.7 ->
# 8,933.9 t/s on an NVIDIA H100, the experts' gate|up|down 36.1 -> 32.6 ms of the step (2026-12-06,
# docs/history/2026-12-06-moe-narrow-steps-2880-columns.md).
NARROW_S64_TYPES = ("q8_0", "mxfp4", "f16", "bf16")
NARROW_STEP_COLS = 64
# The few-pairs tiles (NVIDIA's fragments): at most this many pairs of one expert, mma.sync's n.
DIRECT_TILE_PAIRS = 8
DIRECT_TYPES = TYPES
DIRECT_STEP_COLS = 64  # every format's fragment step: a K-quant chunk, or two 32-element blocks
# The 2-byte aligned blocks are read in aligned 4-byte words there, as matmul_mma's fragment path reads them.
DIRECT_WEIGHT_ALIGNMENT = {t: max(a, 4) if t in matmul_mma.WORD_ALIGNED_FRAGMENT_TYPES else a
                           for t, a in matmul_mma.WEIGHT_ALIGNMENT.items()}
# The few-pairs tiles from this many pairs an expert on average (MXFP4_: where an expert tensor is MXFP4); below it
# moe_experts' paths. Measured on an NVIDIA H100 (2026-12-07, scripts/bench/measure_moe_experts.py, gate|up + down us
# a layer, direct against the path it replaces): gpt-oss-20b (MXFP4) at 8 tokens (1 an expert) 388 against grouped
# 234, 16 (2) 459 / 381, 32 (4) 502 / 636; Qwen3-30B-A3B (Q4_K/Q6_K) at 8 (0.5) 169 / 118 per pair, 32 (2) 303 / 390
# grouped. ROCMFORGE_MOE_DIRECT_MIN_PAIRS sets both for a measurement.
DIRECT_MIN_PAIRS_PER_EXPERT = 2.0
MXFP4_DIRECT_MIN_PAIRS_PER_EXPERT = 4.0
# And up to this many, where they beat the 32- and 64-pair tiles (which `pays` takes from fewer pairs on devices
# without them): the same measurement, direct against matrix-core tiles, Qwen3-30B-A3B at 64 tokens (4 an expert)
# 334 / 480 us, 96 (6) 399 / 517, 128 (8) 450 / 537; gpt-oss-20b at 64 (8) 725 / 1,043, 96 (12) 897 / 1,107, 128 (16)
# 1,074 / 1,151. Past 8 pairs an expert re-reads its weights a tile at a time; beyond the measured points the
# matrix-core tiles take the steps (prompts). ROCMFORGE_MOE_DIRECT_MAX_PAIRS sets both for a measurement.
DIRECT_MAX_PAIRS_PER_EXPERT = 8.0
MXFP4_DIRECT_MAX_PAIRS_PER_EXPERT = 16.0


def step_cols(weight_type: str) -> int:
    return matmul_mma.WIDE_STEP_COLS if weight_type in matmul_mma.WIDE_TYPES else matmul_mma.STEP_COLS


def supports(weight_type: str, cols: int) -> bool:
    return weight_type in TYPES and cols % step_cols(weight_type) == 0 and cols % column_multiple(weight_type) == 0


def pays(arch: str, tokens: int, k: int, n_expert: int, weight_types: tuple[str, ...], widths: tuple[int, ...]) -> bool:
    """Whether a step of `tokens` tokens takes the matrix-core path: matrix cores on `arch`, entries for every expert
    type (gate|up's and down's) at their column counts (hidden for gate|up, ff for down), at most MAX_EXPERTS experts,
    and at least min_pairs_per_expert(weight_types) pairs an expert on average."""
    return (matmul_mma.has_matrix_cores(arch) and n_expert <= MAX_EXPERTS
            and all(supports(t, c) for t, c in zip(weight_types, widths))
            and tokens * k >= min_pairs_per_expert(weight_types) * n_expert)


def _pairs_setting(variable: str, weight_types: tuple[str, ...], default: float, mxfp4_default: float) -> float:
    """A threshold in pairs an expert: mxfp4_default where an expert tensor is MXFP4, else default; `variable`
    overrides both."""
    return settings.number(variable, mxfp4_default if "mxfp4" in weight_types else default)


def min_pairs_per_expert(weight_types: tuple[str, ...]) -> float:
    """The pairs an expert from which the matrix-core path pays: MXFP4_MIN_PAIRS_PER_EXPERT where an expert tensor is
    MXFP4, else MIN_PAIRS_PER_EXPERT (ROCMFORGE_MOE_MMA_MIN_PAIRS overrides both)."""
    return _pairs_setting("ROCMFORGE_MOE_MMA_MIN_PAIRS", weight_types, MIN_PAIRS_PER_EXPERT, MXFP4_MIN_PAIRS_PER_EXPERT)


def has_direct(arch: str, weight_type: str, cols: int) -> bool:
    """Whether the few-pairs entries take experts of this type and column count on `arch`: NVIDIA with matrix
    cores (mma.sync's fragment layout), DIRECT_TYPES, cols whole fragment steps."""
    return (matmul_mma.has_fragments(arch) and weight_type in DIRECT_TYPES and cols % DIRECT_STEP_COLS == 0
            and supports(weight_type, cols))


def direct_pays(arch: str, tokens: int, k: int, n_expert: int, weight_types: tuple[str, ...],
                widths: tuple[int, ...]) -> bool:
    """Whether a step of `tokens` tokens takes the few-pairs tiles: has_direct for every expert type at its columns,
    at most MAX_EXPERTS experts, and from direct_min_pairs() to direct_max_pairs() pairs an expert on average (the
    caller asks this before `pays`)."""
    return (n_expert <= MAX_EXPERTS and all(has_direct(arch, t, c) for t, c in zip(weight_types, widths))
            and direct_min_pairs(weight_types) * n_expert <= tokens * k <= direct_max_pairs(weight_types) * n_expert)


def direct_max_pairs(weight_types: tuple[str, ...]) -> float:
    """MXFP4_DIRECT_MAX_PAIRS_PER_EXPERT where an expert tensor is MXFP4, else DIRECT_MAX_PAIRS_PER_EXPERT
    (ROCMFORGE_MOE_DIRECT_MAX_PAIRS overrides both)."""
    return _pairs_setting("ROCMFORGE_MOE_DIRECT_MAX_PAIRS", weight_types, DIRECT_MAX_PAIRS_PER_EXPERT,
                          MXFP4_DIRECT_MAX_PAIRS_PER_EXPERT)


def direct_min_pairs(weight_types: tuple[str, ...]) -> float:
    """MXFP4_DIRECT_MIN_PAIRS_PER_EXPERT where an expert tensor is MXFP4, else DIRECT_MIN_PAIRS_PER_EXPERT
    (ROCMFORGE_MOE_DIRECT_MIN_PAIRS overrides both)."""
    return _pairs_setting("ROCMFORGE_MOE_DIRECT_MIN_PAIRS", weight_types, DIRECT_MIN_PAIRS_PER_EXPERT,
                          MXFP4_DIRECT_MIN_PAIRS_PER_EXPERT)


def narrow_step_cols() -> int:
    """NARROW_STEP_COLS, or ROCMFORGE_MOE_MMA_NARROW_STEP where set (32 or 64; anything else is a UsageError)."""
    step = int(settings.number("ROCMFORGE_MOE_MMA_NARROW_STEP", NARROW_STEP_COLS, whole=True))
    if step not in (32, 64):
        raise UsageError(f"ROCMFORGE_MOE_MMA_NARROW_STEP must be 32 or 64, got {step}; unset it for the default "
                         f"({NARROW_STEP_COLS})")
    return step


def entry_name(mode: str, weight_type: str, cols: int, tile: int = 32) -> str:
    """The kernel entry of one product: moe_mma_<mode>_<type>, with `_direct` for the few-pairs tiles (tile
    DIRECT_TILE_PAIRS), `_s64` where a 32-element format's experts take 64-column steps (narrow_step_cols, cols a
    multiple of 64)."""
    if tile == DIRECT_TILE_PAIRS:
        return f"moe_mma_{mode}_{weight_type}_direct"
    s64 = weight_type in NARROW_S64_TYPES and cols % 64 == 0 and narrow_step_cols() == 64
    return f"moe_mma_{mode}_{weight_type}" + ("_s64" if s64 else "")


def wide_tile_pairs() -> float:
    """WIDE_TILE_PAIRS, or ROCMFORGE_MOE_MMA_WIDE_PAIRS where set."""
    return settings.number("ROCMFORGE_MOE_MMA_WIDE_PAIRS", WIDE_TILE_PAIRS)


def tile_tokens(pairs: int, n_expert: int) -> int:
    """The shared tiles' pairs for a step of `pairs` pairs: 64 once they average wide_tile_pairs() an expert, else 32."""
    return 64 if pairs >= wide_tile_pairs() * n_expert else 32


def max_tiles(pairs: int, n_expert: int, tile: int) -> int:
    """The most token tiles a sort can list: each expert's last tile may be partial."""
    return -(-pairs // tile) + min(n_expert, pairs)


def sort_bytes(pairs: int, n_expert: int) -> tuple[int, int]:
    """Bytes of (sorted, tiles) for `pairs` pairs: int32 [pairs] and int32 [1 + 3 max_tiles] at the smallest tile."""
    return pairs * 4, (1 + 3 * max_tiles(pairs, n_expert, DIRECT_TILE_PAIRS)) * 4


# ---- reference -------------------------------------------------------------------------------


def sort_reference(ids: np.ndarray, n_expert: int, tile: int) -> tuple[dict[int, list[int]], list[tuple[int, int]]]:
    """What a sort must produce, up to the order within an expert: expert -> its pairs (ascending), and the tiles'
    (expert, pairs in it) in expert order."""
    flat = np.asarray(ids, dtype=np.int64).reshape(-1)
    groups = {e: np.flatnonzero(flat == e).tolist() for e in range(n_expert) if np.any(flat == e)}
    tiles = [(e, min(tile, len(ps) - j)) for e, ps in groups.items() for j in range(0, len(ps), tile)]
    return groups, tiles


def products_reference(x_rows: np.ndarray, raw: np.ndarray, weight_type: str, ids: np.ndarray, rows: int, cols: int):
    """(float64 [pairs, rows] exact products W_{ids[p]} . x_rows[p], float64 [pairs, rows] their error bound on the
    matrix cores, matmul_mma.error_bound's per expert)."""
    flat = np.asarray(ids, dtype=np.int64).reshape(-1)
    per_expert = rows * row_bytes(weight_type, cols)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    y, bound = np.zeros((flat.size, rows)), np.zeros((flat.size, rows))
    for e in np.unique(flat):
        at = np.flatnonzero(flat == e)
        w = raw[e * per_expert:(e + 1) * per_expert]
        y[at] = matmul.reference(w, weight_type, x_rows[at], rows, cols)
        bound[at] = matmul_mma.error_bound(w, weight_type, x_rows[at], rows, cols)
    return y, bound


# ---- host implementation (the cpu backend: what a stand-in GPU with matrix cores runs) -----------


@cpu_kernel(SORT_ENTRY, SORT_SIGNATURE)
def _host_sort(device: CpuDevice, grid, block, sorted_: int, tiles: int, ids: int, pairs: int, n_expert: int,
               tile: int) -> None:
    flat = device.view(ids, np.int32, pairs)
    order = np.argsort(flat, kind="stable")
    order = order[(flat[order] >= 0) & (flat[order] < n_expert)]
    device.view(sorted_, np.int32, order.size)[:] = order
    listed, at = [], 0
    for e in range(n_expert):
        count = int(np.count_nonzero(flat == e))
        listed += [(e, at + j, min(tile, count - j)) for j in range(0, count, tile)]
        at += count
    out = device.view(tiles, np.int32, 1 + 3 * len(listed))
    out[0] = len(listed)
    if listed:
        out[1:] = np.asarray(listed, dtype=np.int32).reshape(-1)


def _host_products(weight_type: str, mode: str):
    def run(device: CpuDevice, grid, block, out: int, g: int, W: int, x: int, sorted_: int, tiles: int, bias: int,
            weights: int, rows: int, cols: int, pairs: int, x_per: int, n_expert: int, tile: int, most: int,
            activation: int) -> None:
        listed = int(device.view(tiles, np.int32, 1)[0])
        table = device.view(tiles, np.int32, 1 + 3 * listed)[1:].reshape(-1, 3)[:most]
        order = device.view(sorted_, np.int32, pairs)
        per_row = row_bytes(weight_type, cols)
        raw = device.view(W, np.uint8, n_expert * rows * per_row)
        result = device.view(out, np.float16 if mode == "up" else np.float32, (pairs, rows))
        for e, start, count in table.tolist():
            ps = order[start:start + count].astype(np.int64)
            xs = device.view(x, np.float16, (pairs // x_per, cols))[ps // x_per]
            w = moe_experts.expert_matrix(raw, weight_type, e, rows, cols)
            y = _f16(xs) @ _f16(w).T
            if bias:
                y = y + device.view(bias, np.float32, (n_expert, rows))[e]
            if mode == "gate":
                result[ps] = y
            elif mode == "up":
                act = "swiglu_oai" if activation else "swiglu"
                h = moe_experts.activation_reference(device.view(g, np.float32, (pairs, rows))[ps], y, act)
                result[ps] = h.astype(np.float32).astype(np.float16)  # float32 then f16, as the kernel rounds it
            else:
                result[ps] = device.view(weights, np.float32, pairs)[ps][:, None].astype(np.float64) * y

    return run


def _f16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float64)


for _type in TYPES:
    for _mode in MODES:
        for _suffix in ("", "_direct", "_s64") if _type in NARROW_S64_TYPES else ("", "_direct"):
            cpu_kernel(f"moe_mma_{_mode}_{_type}{_suffix}", SIGNATURE)(_host_products(_type, _mode))


# ---- launchers ---------------------------------------------------------------------------------


def geometry(rows: int, pairs: int, n_expert: int, tile: int) -> tuple[int, int]:
    """(grid, block): a workgroup an item (listed tile, 128-row tile) of at most max_tiles tiles (those past the
    sort's count find nothing to do)."""
    return max(1, min(-(-rows // TILE_ROWS) * max_tiles(pairs, n_expert, tile), MAX_GRID)), THREADS


def launch_sort(device: Device, stream: Stream | None, sorted_: Any, tiles: Any, ids: Any, pairs: int, n_expert: int,
                tile: int) -> None:
    """sorted int32 [pairs] and tiles int32 [1 + 3 max_tiles] from ids int32 [pairs] (the module docstring)."""
    check_sizes(OP, pairs=pairs, n_expert=n_expert, tile=tile)
    if n_expert > MAX_EXPERTS or tile not in TILE_PAIRS:
        raise ValueError(f"{OP}: at most {MAX_EXPERTS} experts and tiles of 8, 32 or 64 pairs, got {n_expert} and "
                         f"{tile}")
    check_memory(OP, "sorted", sorted_, pairs * 4)
    check_memory(OP, "tiles", tiles, (1 + 3 * max_tiles(pairs, n_expert, tile)) * 4)
    check_memory(OP, "ids", ids, pairs * 4)
    get_kernel(device, OP, SORT_ENTRY, SORT_SIGNATURE).launch(1, THREADS, (sorted_, tiles, ids, pairs, n_expert, tile),
                                                              stream=stream)


def launch_products(device: Device, stream: Stream | None, mode: str, out: Any, W: Any, x: Any, sorted_: Any,
                    tiles: Any, *, weight_type: str, rows: int, cols: int, pairs: int, x_per: int, n_expert: int,
                    tile: int, bias: Any = None, g: Any = None, weights: Any = None, activation: str = "swiglu") -> None:
    """One of the three products (the module docstring): out [pairs, rows] (f16 for "up", else float32) from x f16
    [pairs / x_per, cols] and W [n_expert, rows, cols] of weight_type; g float32 [pairs, rows] for "up", weights
    float32 [pairs] for "down"; bias float32 [n_expert, rows] or None."""
    if mode not in MODES:
        raise ValueError(f"{OP}: mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not supports(weight_type, cols):
        raise ValueError(f"{OP}: no entry for {weight_type} experts of {cols} columns")
    direct = tile == DIRECT_TILE_PAIRS
    if direct and not has_direct(device.arch, weight_type, cols):
        raise ValueError(f"{OP}: no few-pairs entry for {weight_type} experts of {cols} columns on {device.arch} "
                         f"(NVIDIA with matrix cores, whole steps of {DIRECT_STEP_COLS} columns)")
    if activation not in moe_experts.ACTIVATIONS:
        raise ValueError(f"{OP}: activation must be one of {', '.join(moe_experts.ACTIVATIONS)}, not {activation!r}")
    check_sizes(OP, rows=rows, cols=cols, pairs=pairs, x_per=x_per, n_expert=n_expert, tile=tile)
    if pairs % x_per:
        raise ValueError(f"{OP}: pairs ({pairs}) must be a multiple of x_per ({x_per})")
    check_memory(OP, "W", W, n_expert * rows * row_bytes(weight_type, cols),
                 alignment=(DIRECT_WEIGHT_ALIGNMENT if direct else matmul_mma.WEIGHT_ALIGNMENT)[weight_type])
    x_bytes = pairs // x_per * cols * X_BYTES
    out_bytes = pairs * rows * (X_BYTES if mode == "up" else 4)
    check_memory(OP, "x", x, x_bytes, alignment=16)
    check_memory(OP, "out", out, out_bytes)
    check_memory(OP, "sorted", sorted_, pairs * 4)
    check_memory(OP, "tiles", tiles, (1 + 3 * max_tiles(pairs, n_expert, tile)) * 4)
    check_disjoint(OP, ("out", out, out_bytes), ("x", x, x_bytes))
    if mode == "up":
        check_memory(OP, "g", g, pairs * rows * 4)
    if mode == "down":
        check_memory(OP, "weights", weights, pairs * 4)
    if bias is not None:
        check_memory(OP, "bias", bias, n_expert * rows * 4)
    grid, block = geometry(rows, pairs, n_expert, tile)
    kernel = get_kernel(device, OP, entry_name(mode, weight_type, cols, tile), SIGNATURE)
    kernel.launch(grid, block, (out, g if mode == "up" else 0, W, x, sorted_, tiles, 0 if bias is None else bias,
                                weights if mode == "down" else 0, rows, cols, pairs, x_per, n_expert, tile,
                                max_tiles(pairs, n_expert, tile), moe_experts.ACTIVATIONS[activation]), stream=stream)
