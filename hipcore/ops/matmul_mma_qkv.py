"""matmul_mma's entries that compute a decode batch's attention input, q, k and v of one x, in one launch on
NVIDIA's fragment path (kernels/matmul_mma_fragments.h qkv_fragment_tiles, entries in
kernels/matmul_mma_fragment_entries.h; the products, tiles, splits and checks are matmul_mma.py's).

`matmul_mma_qkv_fragments` (32-token tiles) or `matmul_mma_qkv_direct` (at most DIRECT_MAX_TOKENS tokens), (y_q p, y_k
p, y_v p, W_q p, W_k p, W_v p, x p, workspace p, rows_q i, rows_k i, rows_v i, types i, cols i, n_tokens i, splits i):
each y = x @ W^T, float32; the three weights K-quants each of its own type, `types` their QKV_TYPE_CODES packed 4 bits
each (q's lowest). `matmul_mma_qkv_fragments_<type>` and `matmul_mma_qkv_direct_<type>` take the same arguments for
three weights of one 32-element format (SINGLE_TYPES: gpt-oss's Q8_0 attention), `types` unused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import matvec
from hipcore.ops.launch_checks import INT32_MAX
from hipcore.ops.matmul_mma import (DIRECT_MAX_TOKENS, MAX_GRID, MAX_SPLIT_TILES, OP, PAIR32_FRAGMENT_TYPES,
                                    PAIR32_STEP_COLS, THREADS, WEIGHT_ALIGNMENT, WEIGHT_TYPES, WIDE_STEP_COLS,
                                    has_fragment_path, partial_bytes, pick_splits, tile_count)
from hipcore.ops.weight_formats import host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.kernels import get_kernel

# A decode batch's attention input on the fragment path as one launch (matmul_mma_qkv_fragments, or
# matmul_mma_qkv_direct for at most DIRECT_MAX_TOKENS tokens: kernels/matmul_mma_fragments.h qkv_fragment_tiles):
# q, k and v of one x, K-quants each of its own type (a Q4_K_M file has Q4_K q and k, and Q6_K or Q4_K v by layer).
# Three launches gave k's and v's few row tiles (the 8B's 8 each) a launch, a ramp and a split-K tail of their own;
# here their tiles share the q tiles' waves, every tile split alike. Where a step takes it:
# hipcore/ops/kernel_choice.py takes_qkv.
QKV_SIGNATURE = "ppppppppiiiiiii"
QKV_TYPE_CODES = {"q4_k": 0, "q5_k": 1, "q6_k": 2}
# The 32-element formats take q, k and v in one launch where all three are of one type (an entry a type: no type
# switch, each entry's registers its format's). On an NVIDIA H100, gpt-oss-20b's Q8_0 q, k and v of 8 sequences took
# 15.0, 8.4 and 8.4 us a layer as three launches, k's and v's 4 row tiles latency-bound.
SINGLE_TYPES = PAIR32_FRAGMENT_TYPES
assert WIDE_STEP_COLS == PAIR32_STEP_COLS  # qkv_geometry's splits are whole steps of either


def takes_types(weight_types: tuple[str, str, str]) -> bool:
    """Whether one launch takes q, k and v of these types: K-quants each of its own, or one 32-element format."""
    return (all(t in QKV_TYPE_CODES for t in weight_types)
            or (weight_types[0] in SINGLE_TYPES and len(set(weight_types)) == 1))


def qkv_geometry(rows: tuple[int, int, int], n_tokens: int, cols: int, workspace_bytes: int,
                 splits: int | None = None, weight_type: str | None = None) -> tuple[int, int, int, str]:
    """(grid, block, splits, entry) of launch_qkv: the direct entry's 8-token tiles for at most DIRECT_MAX_TOKENS
    tokens, else 32-token tiles; the three products' tiles together split as pick_splits splits one product's (or
    `splits`), fewer while the workspace is too small (its slots sized for 32-token tiles). weight_type: the
    32-element format of all three (SINGLE_TYPES: its own entries), or None (K-quants)."""
    direct = n_tokens <= DIRECT_MAX_TOKENS
    tile = DIRECT_MAX_TOKENS if direct else 32
    tiles = sum(tile_count(r, n_tokens, tile) for r in rows)
    steps = cols // WIDE_STEP_COLS
    split = pick_splits(tiles, cols, WIDE_STEP_COLS) if splits is None else splits
    if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= steps:
        raise ValueError(f"{OP}_qkv: splits must be an int in [1, {steps}], got {split!r}")
    while split > 1 and partial_bytes(tiles, split, 32) > workspace_bytes:
        split -= 1
    if split > 1 and tiles > MAX_SPLIT_TILES:
        raise ValueError(f"{OP}_qkv: {tiles} tiles are more than the {MAX_SPLIT_TILES} counters a split launch has")
    if tiles * split > INT32_MAX:
        raise ValueError(f"{OP}_qkv: {rows} rows x {n_tokens} tokens is more work items than the kernel counts")
    entry = f"{OP}_qkv_{'direct' if direct else 'fragments'}"
    if weight_type is not None:
        if weight_type not in SINGLE_TYPES:
            raise ValueError(f"{OP}_qkv: one type for all three takes {', '.join(SINGLE_TYPES)}, not {weight_type!r}")
        entry += f"_{weight_type}"
    return min(tiles * split, MAX_GRID), THREADS, split, entry


def launch_qkv(device: Device, stream: Stream | None, ys: tuple[Any, Any, Any], ws: tuple[Any, Any, Any], x: Any,
               rows: tuple[int, int, int], cols: int, n_tokens: int, *, weight_types: tuple[str, str, str],
               workspace: Any = None) -> None:
    """ys[i][n_tokens, rows[i]] = x[n_tokens, cols] @ ws[i][rows[i], cols]^T for q, k and v (i = 0, 1, 2) in one
    launch on the fragment path (kernel_choice.takes_qkv: K-quants each of its own type, or three of one of
    SINGLE_TYPES; NVIDIA sm_80+); `workspace` as launch's."""
    if len(ys) != 3 or len(ws) != 3 or len(rows) != 3 or len(weight_types) != 3:
        raise ValueError(f"{OP}_qkv: three outputs, weights, row counts and types (q, k, v)")
    if not takes_types(tuple(weight_types)):
        raise ValueError(f"{OP}_qkv: takes {', '.join(QKV_TYPE_CODES)} each of its own, or one of "
                         f"{', '.join(SINGLE_TYPES)} for all three, not {tuple(weight_types)}")
    for t in weight_types:
        if not has_fragment_path(device.arch, t, 32, cols):
            raise ValueError(f"{OP}_qkv: {t} of {cols} columns has no fragment path on {device.arch}")
    for y, w, r, t in zip(ys, ws, rows, weight_types):
        matvec.check_operands(OP, t, WEIGHT_TYPES, y, w, x, r, cols, n_tokens, "n_tokens", alignment=WEIGHT_ALIGNMENT)
    if workspace is not None and not isinstance(workspace, Buffer):
        raise ValueError(f"{OP}: workspace must be a Buffer (its size decides how far columns are split)")
    single = weight_types[0] if weight_types[0] in SINGLE_TYPES else None
    grid, block, split, entry = qkv_geometry(rows, n_tokens, cols, workspace.nbytes if workspace is not None else 0,
                                             weight_type=single)
    types = 0 if single else sum(QKV_TYPE_CODES[t] << (4 * i) for i, t in enumerate(weight_types))
    kernel = get_kernel(device, OP, entry, QKV_SIGNATURE, programmatic=True)
    kernel.launch(grid, block, (*ys, *ws, x, workspace if split > 1 else 0, *rows, types, cols, n_tokens, split),
                  stream=stream)


def _host_qkv(single: str | None):
    def run(device: CpuDevice, grid, block, y_q: int, y_k: int, y_v: int, w_q: int, w_k: int, w_v: int, x: int,
            workspace: int, rows_q: int, rows_k: int, rows_v: int, types: int, cols: int, n_tokens: int,
            splits: int) -> None:
        """The cpu backend's q|k|v entries: the three products, as three launches would compute them."""
        names = {code: name for name, code in QKV_TYPE_CODES.items()}
        xs = device.view(x, np.float32, (n_tokens, cols))
        for i, (y, w, rows) in enumerate(((y_q, w_q, rows_q), (y_k, w_k, rows_k), (y_v, w_v, rows_v))):
            weight_type = single or names[(types >> (4 * i)) & 15]
            raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
            host_product(raw, weight_type, xs, cols, device.view(y, np.float32, (n_tokens, rows)))
    return run


for _single in (None, *SINGLE_TYPES):
    for _entry in (f"{OP}_qkv_fragments", f"{OP}_qkv_direct"):
        cpu_kernel(_entry + (f"_{_single}" if _single else ""), QKV_SIGNATURE)(_host_qkv(_single))
