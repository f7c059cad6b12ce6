"""matmul_mma's entries that end in a SwiGLU, for a prompt step's feed-forward on f16 activations (kernels/
matmul_mma.hip; the products, tiles and checks are matmul_mma.py's).

SwiGLU pairs (`launch_swiglu`): `matmul_mma_swiglu_<type>(h16 p, gate p, up p, W_gate p, W_up p, x16 p,
workspace p, rows i, cols i, n_tokens i, tile_tokens i)` for SWIGLU_TYPES computes a prompt step's gate and up
products from f16 x in one launch, their tiles side by side, and h16 = silu(gate) * up as f16 where the second of
each pair ends (no silu_mul launch; the down product reads h16 with x_f16); gate and up receive the products
(float32 scratch). Where `kernel_choice.swiglu_fits` is false the caller keeps two products and silu_mul.

The SwiGLU in 128-token tiles (`launch_silu_up`, where `kernel_choice.silu_up_fits`): `matmul_mma_silu_up_<type>(h16 p, gate p,
W_up p, x16 p, rows i, cols i, n_tokens i, splits i)` computes the up product from f16 x and writes h16 =
silu(gate) * up as f16 from its epilogue, gate being the float32 gate product a launch before (matmul_mma.launch
with x_f16); splits is 1 (an argument only because nvcc spilled more without it). With activation "gelu" (Gemma's
GeGLU) `matmul_mma_gelu_up_<type>` (GELU_UP_TYPES), the same with gelu(gate) * up.

A decode batch's SwiGLU on the fragment path (`launch_swiglu_fragments`, where `kernel_choice.swiglu_fragments_fit`):
`matmul_mma_swiglu_fragments_<type>` (32-token tiles) or `matmul_mma_swiglu_direct_<type>` (at most 8 tokens), (gate
p, up p, W_gate p, W_up p, x p, workspace p, rows i, cols i, n_tokens i, splits i): gate = silu(x @ W_gate^T) * (x @
W_up^T) as float32 from float32 x (the down product's x on the fragment path), up the up product's scratch; the
columns split as a product's are, gate and up tiles side by side.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from hipcore.ops import gelu_mul, matvec, silu_mul
from hipcore.ops.launch_checks import check_disjoint, check_memory
from hipcore.ops.matmul_mma import (COUNTER_BYTES, DIRECT_MAX_TOKENS, F16_BYTES, F16_HALF_SPACING, INT32_MAX, MAX_GRID,
                                    MAX_SPLIT_TILES, OP, THREADS, U16, WEIGHT_ALIGNMENT, WIDE_STEP_COLS,
                                    WIDE_TILE_TOKENS, WIDE_TYPES, X16_WIDE_ONLY_TYPES, error_bound, has_fragment_path,
                                    has_wide_tiles, partial_bytes, pick_splits, pick_tile_tokens, reference, tile_count)
from hipcore.ops.weight_formats import host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.kernels import get_kernel

SWIGLU_SIGNATURE = "pppppppiiii"
# The gate and up types of Q4_K_M and Q5_K_M files.
SWIGLU_TYPES = ("q4_k", "q5_k")
# The up product with the SwiGLU in its epilogue (128-token tiles, NVIDIA) also reads the formats whose prompts take
# f16 x in those tiles only (matmul_mma.X16_WIDE_ONLY_TYPES: the wide Q8_0, Q5_0, Q5_1, Q4_1, F16, BF16 layers).
SILU_UP_TYPES = SWIGLU_TYPES + X16_WIDE_ONLY_TYPES
# The up product with GeGLU's GELU in its epilogue: the gate and up types of Gemma's Q4_K_M and Q5_K_M files (their
# Q8_0, F16 and BF16 files keep float32, two products and gelu_mul).
GELU_UP_TYPES = SWIGLU_TYPES
SILU_LIPSCHITZ = 1.0999  # max |silu'(g)|, reached near g = 2.4
GELU_LIPSCHITZ = 1.1290  # max |gelu'(g)| of the tanh form, reached near g = 1.42
# The up product's epilogue activations: name -> (the types its entries read, the float64 reference of act(g) * u,
# max |act'|).
ACTIVATIONS = {"silu": (SILU_UP_TYPES, silu_mul.reference, SILU_LIPSCHITZ),
               "gelu": (GELU_UP_TYPES, gelu_mul.reference, GELU_LIPSCHITZ)}


def swiglu_reference(w_gate: np.ndarray, w_up: np.ndarray, weight_type: str, x: np.ndarray, rows: int,
                     cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h, gate, up) of a SwiGLU pair in float64: silu(x W_gate^T) * (x W_up^T) and the two products, for x as
    the kernel reads it (f16 values)."""
    g = reference(w_gate, weight_type, x, rows, cols).astype(np.float64)
    u = reference(w_up, weight_type, x, rows, cols).astype(np.float64)
    return silu_mul.reference(g, u), g, u


def swiglu_error_bound(w_gate: np.ndarray, w_up: np.ndarray, weight_type: str, x: np.ndarray, rows: int,
                       cols: int, activation: str = "silu") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How far a pair's (h16, gate, up) may be from swiglu_reference's (with activation "gelu": from GeGLU's). The
    products are error_bound's (eg, eu); then |act(g') u' - act(g) u| <= L eg (|u| + eu) + |act(g)| eu with L =
    max |act'|, float32's rounding of act and the product (4 units of 2^-24 of the result's size), and h16's
    rounding to f16 (u16 of its size, or half the spacing of f16's subnormals)."""
    _, gated, lipschitz = ACTIVATIONS[activation]
    g = reference(w_gate, weight_type, x, rows, cols).astype(np.float64)
    u = np.abs(reference(w_up, weight_type, x, rows, cols).astype(np.float64))
    eg, eu = (error_bound(w, weight_type, x, rows, cols) for w in (w_gate, w_up))
    act_g = np.abs(gated(g, np.ones_like(g)))
    h = (lipschitz * eg * (u + eu) + act_g * eu
         + 4 * 2.0**-24 * (act_g + lipschitz * eg) * (u + eu))
    h = 1.01 * (h + U16 * (act_g * u + h)) + F16_HALF_SPACING
    return h, eg, eu


def swiglu_entry(weight_type: str) -> str:
    return f"{OP}_swiglu_{weight_type}"


def _host_swiglu(weight_type: str):
    def run(device: CpuDevice, grid, block, h16: int, gate: int, up: int, w_gate: int, w_up: int, x: int,
            workspace: int, rows: int, cols: int, n_tokens: int, tile_tokens: int) -> None:
        xs = device.view(x, np.float16, (n_tokens, cols)).astype(np.float32)
        outs = [device.view(p, np.float32, (n_tokens, rows)) for p in (gate, up)]
        for w, out in zip((w_gate, w_up), outs):
            host_product(device.view(w, np.uint8, (rows, row_bytes(weight_type, cols))), weight_type, xs, cols, out)
        h = silu_mul.reference(*outs).astype(np.float32)  # float32 first, as the kernel
        device.view(h16, np.float16, (n_tokens, rows))[:] = h

    return run


for _type in SWIGLU_TYPES:
    cpu_kernel(swiglu_entry(_type), SWIGLU_SIGNATURE)(_host_swiglu(_type))


def launch_swiglu(device: Device, stream: Stream | None, h16: Any, gate: Any, up: Any, w_gate: Any, w_up: Any,
                  x16: Any, rows: int, cols: int, n_tokens: int, *, weight_type: str, workspace: Any) -> None:
    """h16[n_tokens, rows] = silu(x16 @ W_gate^T) * (x16 @ W_up^T) as f16 in one launch, x16 f16 [n_tokens,
    cols]; gate and up receive the two products (float32 scratch); both W [rows, cols] of `weight_type`;
    `workspace` as launch's (its counters). Only where kernel_choice.swiglu_fits."""
    if weight_type not in SWIGLU_TYPES:
        raise ValueError(f"{OP}: SwiGLU pairs take {', '.join(SWIGLU_TYPES)} weights, got {weight_type!r}")
    if not isinstance(workspace, Buffer) or workspace.nbytes < COUNTER_BYTES:
        raise ValueError(f"{OP}: a SwiGLU pair needs a workspace Buffer of at least {COUNTER_BYTES} bytes (its counters)")
    tile = pick_tile_tokens(rows, n_tokens)
    tiles = tile_count(rows, n_tokens, tile)
    if tiles > MAX_SPLIT_TILES:
        raise ValueError(f"{OP}: {tiles} tiles of a SwiGLU pair are more than its {MAX_SPLIT_TILES} counters")
    entry = swiglu_entry(weight_type)
    for y, w in ((gate, w_gate), (up, w_up), (gate, w_up), (up, w_gate)):  # each output apart from x and both W
        matvec.check_operands(f"{OP}_swiglu", weight_type, SWIGLU_TYPES, y, w, x16, rows, cols, n_tokens, "n_tokens",
                              alignment=WEIGHT_ALIGNMENT, x_itemsize=F16_BYTES)
    out_bytes = n_tokens * rows * 4
    check_memory(entry, "h16", h16, n_tokens * rows * F16_BYTES)
    for (name_a, a, size_a), (name_b, b, size_b) in itertools.combinations(
            (("h16", h16, n_tokens * rows * F16_BYTES), ("gate", gate, out_bytes), ("up", up, out_bytes),
             ("x16", x16, n_tokens * cols * F16_BYTES)), 2):
        check_disjoint(entry, (name_a, a, size_a), (name_b, b, size_b))
    kernel = get_kernel(device, OP, entry, SWIGLU_SIGNATURE, programmatic=True)
    kernel.launch(min(2 * tiles, MAX_GRID), THREADS, (h16, gate, up, w_gate, w_up, x16, workspace, rows, cols,
                                                       n_tokens, tile), stream=stream)


# ---- the up product with the SwiGLU in its epilogue (128-token tiles) ------------------------------

SILU_UP_SIGNATURE = "ppppiiii"


def gated_up_entry(weight_type: str, activation: str = "silu") -> str:
    """The up product's entry with `activation` in its epilogue: matmul_mma_silu_up_<type> or
    matmul_mma_gelu_up_<type>."""
    return f"{OP}_{activation}_up_{weight_type}"


def silu_up_error_bound(w_gate: np.ndarray, w_up: np.ndarray, weight_type: str, x: np.ndarray, rows: int,
                        cols: int, activation: str = "silu") -> np.ndarray:
    """How far launch_silu_up's h16 may be from swiglu_reference's h (GeGLU's with activation "gelu"), the gate read
    from a float32 product made by the x16 kernel (within error_bound of the reference, as the pair's): the pair's
    bound for h."""
    return swiglu_error_bound(w_gate, w_up, weight_type, x, rows, cols, activation)[0]


def _host_silu_up(weight_type: str, activation: str):
    gated = ACTIVATIONS[activation][1]

    def run(device: CpuDevice, grid, block, h16: int, gate: int, w_up: int, x: int, rows: int, cols: int,
            n_tokens: int, splits: int) -> None:
        xs = device.view(x, np.float16, (n_tokens, cols)).astype(np.float32)
        up = np.empty((n_tokens, rows), dtype=np.float32)
        host_product(device.view(w_up, np.uint8, (rows, row_bytes(weight_type, cols))), weight_type, xs, cols, up)
        h = gated(device.view(gate, np.float32, (n_tokens, rows)), up).astype(np.float32)
        device.view(h16, np.float16, (n_tokens, rows))[:] = h

    return run


for _activation, (_types, _, _) in ACTIVATIONS.items():
    for _type in _types:
        cpu_kernel(gated_up_entry(_type, _activation), SILU_UP_SIGNATURE)(_host_silu_up(_type, _activation))


def launch_silu_up(device: Device, stream: Stream | None, h16: Any, gate: Any, w_up: Any, x16: Any, rows: int,
                   cols: int, n_tokens: int, *, weight_type: str, activation: str = "silu") -> None:
    """h16[n_tokens, rows] = silu(gate) * (x16 @ W_up^T) as f16, in 128-token tiles (activation "gelu": GeGLU's
    gelu(gate) * (x16 @ W_up^T)); gate float32 [n_tokens, rows] (the gate product), x16 f16 [n_tokens, cols], W_up
    [rows, cols] of `weight_type` (SILU_UP_TYPES; GELU_UP_TYPES for "gelu")."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"{OP}: the up product's activation is one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    types = ACTIVATIONS[activation][0]
    if weight_type not in types:
        raise ValueError(f"{OP}: the up product with {activation} takes {', '.join(types)} weights, "
                         f"got {weight_type!r}")
    entry = gated_up_entry(weight_type, activation)
    if not has_wide_tiles(device.arch):
        raise ValueError(f"{entry}: exists on NVIDIA sm_80 and later, not {device.arch}")
    check_memory(entry, "gate", gate, n_tokens * rows * 4)
    matvec.check_operands(f"{OP}_{activation}_up", weight_type, types, gate, w_up, x16, rows, cols, n_tokens,
                          "n_tokens", alignment=WEIGHT_ALIGNMENT, x_itemsize=F16_BYTES)
    check_memory(entry, "h16", h16, n_tokens * rows * F16_BYTES)
    for (name_a, a, size_a), (name_b, b, size_b) in itertools.combinations(
            (("h16", h16, n_tokens * rows * F16_BYTES), ("gate", gate, n_tokens * rows * 4),
             ("x16", x16, n_tokens * cols * F16_BYTES), ("W_up", w_up, rows * row_bytes(weight_type, cols))), 2):
        check_disjoint(entry, (name_a, a, size_a), (name_b, b, size_b))
    grid = min(tile_count(rows, n_tokens, WIDE_TILE_TOKENS), MAX_GRID)
    get_kernel(device, OP, entry, SILU_UP_SIGNATURE, programmatic=True).launch(
        grid, THREADS, (h16, gate, w_up, x16, rows, cols, n_tokens, 1), stream=stream)


# ---- a decode batch's SwiGLU on the fragment path ---------------------------------------------------

# Gate, up and SwiGLU of a decode batch in one launch (kernels/matmul_mma_fragments.h swiglu_fragment_tiles) instead
# of two fragment-path products and silu_mul: the two products share their waves and the activation its launch.
SWIGLU_FRAGMENT_SIGNATURE = "ppppppiiii"
SWIGLU_FRAGMENT_TYPES = WIDE_TYPES


def swiglu_fragments_geometry(weight_type: str, rows: int, n_tokens: int, cols: int, workspace_bytes: int,
                              splits: int | None = None) -> tuple[int, int, int, str]:
    """(grid, block, splits, entry) of launch_swiglu_fragments: the direct entry's 8-token tiles for at most
    DIRECT_MAX_TOKENS tokens, else 32-token tiles; gate's and up's tiles together split as pick_splits splits one
    product's (or `splits`), fewer while the workspace is too small (slots sized for 32-token tiles)."""
    direct = n_tokens <= DIRECT_MAX_TOKENS
    tiles = tile_count(rows, n_tokens, DIRECT_MAX_TOKENS if direct else 32)
    if 3 * tiles > MAX_SPLIT_TILES:
        raise ValueError(f"{OP}: {tiles} tiles of a SwiGLU pair need more than the {MAX_SPLIT_TILES} counters")
    steps = cols // WIDE_STEP_COLS
    split = pick_splits(2 * tiles, cols, WIDE_STEP_COLS) if splits is None else splits
    if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= steps:
        raise ValueError(f"{OP}: splits must be an int in [1, {steps}], got {split!r}")
    while split > 1 and partial_bytes(2 * tiles, split, 32) > workspace_bytes:
        split -= 1
    if 2 * tiles * split > INT32_MAX:
        raise ValueError(f"{OP}: {rows} rows x {n_tokens} tokens is more work items than the kernel counts")
    entry = f"{OP}_swiglu_{'direct' if direct else 'fragments'}_{weight_type}"
    return min(2 * tiles * split, MAX_GRID), THREADS, split, entry


def launch_swiglu_fragments(device: Device, stream: Stream | None, gate: Any, up: Any, w_gate: Any, w_up: Any, x: Any,
                            rows: int, cols: int, n_tokens: int, *, weight_type: str, workspace: Any) -> None:
    """gate[n_tokens, rows] = silu(x @ W_gate^T) * (x @ W_up^T) in one launch (up: the up product, scratch), x
    float32 [n_tokens, cols], both W [rows, cols] of `weight_type`; `workspace` a Buffer zeroed once (the kernels
    leave its counters at zero). Only where kernel_choice.swiglu_fragments_fit."""
    if weight_type not in SWIGLU_FRAGMENT_TYPES or not has_fragment_path(device.arch, weight_type, 32, cols):
        raise ValueError(f"{OP}: the fragment path's SwiGLU takes {', '.join(SWIGLU_FRAGMENT_TYPES)} on NVIDIA, not "
                         f"{weight_type!r} on {device.arch}")
    if not isinstance(workspace, Buffer) or workspace.nbytes < COUNTER_BYTES:
        raise ValueError(f"{OP}: a SwiGLU pair needs a workspace Buffer of at least {COUNTER_BYTES} bytes (its counters)")
    grid, block, split, entry = swiglu_fragments_geometry(weight_type, rows, n_tokens, cols, workspace.nbytes)
    for y, w in ((gate, w_gate), (up, w_up), (gate, w_up), (up, w_gate)):  # each output apart from x and both W
        matvec.check_operands(entry, weight_type, SWIGLU_FRAGMENT_TYPES, y, w, x, rows, cols, n_tokens, "n_tokens",
                              alignment=WEIGHT_ALIGNMENT)
    check_disjoint(entry, ("gate", gate, n_tokens * rows * 4), ("up", up, n_tokens * rows * 4))
    kernel = get_kernel(device, OP, entry, SWIGLU_FRAGMENT_SIGNATURE, programmatic=True)
    kernel.launch(grid, block, (gate, up, w_gate, w_up, x, workspace, rows, cols, n_tokens, split), stream=stream)


def _host_swiglu_fragments(weight_type: str):
    def run(device: CpuDevice, grid, block, gate: int, up: int, w_gate: int, w_up: int, x: int, workspace: int,
            rows: int, cols: int, n_tokens: int, splits: int) -> None:
        xs = device.view(x, np.float32, (n_tokens, cols))
        g, u = np.empty((n_tokens, rows), np.float32), device.view(up, np.float32, (n_tokens, rows))
        for w, out in ((w_gate, g), (w_up, u)):
            host_product(device.view(w, np.uint8, (rows, row_bytes(weight_type, cols))), weight_type, xs, cols, out)
        device.view(gate, np.float32, (n_tokens, rows))[:] = silu_mul.reference(g, u)  # as silu_mul's host kernel

    return run


for _type in SWIGLU_FRAGMENT_TYPES:
    for _kind in ("fragments", "direct"):
        cpu_kernel(f"{OP}_swiglu_{_kind}_{_type}", SWIGLU_FRAGMENT_SIGNATURE)(_host_swiglu_fragments(_type))
