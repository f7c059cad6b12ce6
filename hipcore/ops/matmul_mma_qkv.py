"""matmul_mma's entries that compute a decode batch's attention input, q, k and v of one x, in one launch on
NVIDIA's fragment path (kernels/matmul_mma_fragments.h qkv_fragment_tiles, entries in
kernels/matmul_mma_fragment_entries.h; the products, tiles, splits and checks are matmul_mma.py's).

`matmul_mma_qkv_fragments` (32-token tiles) or `matmul_mma_qkv_direct` (at most DIRECT_MAX_TOKENS tokens), (y_q p, y_k
p, y_v p, W_q p, W_k p, W_v p, x p, workspace p, rows_q i, rows_k i, rows_v i, types i, cols i, n_tokens i, splits i):
each y = x @ W^T, float32; the three weights K-quants each of its own type, `types` their QKV_TYPE_CODES packed 4 bits
each (q's lowest).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import matvec
from hipcore.ops.launch_checks import INT32_MAX
from hipcore.ops.matmul_mma import (DIRECT_MAX_TOKENS, MAX_GRID, MAX_SPLIT_TILES, OP, THREADS, WEIGHT_ALIGNMENT,
                                    WEIGHT_TYPES, WIDE_STEP_COLS, has_fragment_path, partial_bytes, pick_splits,
                                    tile_count)
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


def qkv_geometry(rows: tuple[int, int, int], n_tokens: int, cols: int, workspace_bytes: int,
                 splits: int | None = None) -> tuple[int, int, int, str]:
    """(grid, block, splits, entry) of launch_qkv: the direct entry's 8-token tiles for at most DIRECT_MAX_TOKENS
    tokens, else 32-token tiles; the three products' tiles together split as pick_splits splits one product's (or
    `splits`), fewer while the workspace is too small (its slots sized for 32-token tiles)."""
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
    return min(tiles * split, MAX_GRID), THREADS, split, f"{OP}_qkv_{'direct' if direct else 'fragments'}"


def launch_qkv(device: Device, stream: Stream | None, ys: tuple[Any, Any, Any], ws: tuple[Any, Any, Any], x: Any,
               rows: tuple[int, int, int], cols: int, n_tokens: int, *, weight_types: tuple[str, str, str],
               workspace: Any = None) -> None:
    """ys[i][n_tokens, rows[i]] = x[n_tokens, cols] @ ws[i][rows[i], cols]^T for q, k and v (i = 0, 1, 2) in one
    launch on the fragment path (kernel_choice.takes_qkv: K-quants, NVIDIA sm_80+); `workspace` as launch's."""
    if len(ys) != 3 or len(ws) != 3 or len(rows) != 3 or len(weight_types) != 3:
        raise ValueError(f"{OP}_qkv: three outputs, weights, row counts and types (q, k, v)")
    for t in weight_types:
        if t not in QKV_TYPE_CODES or not has_fragment_path(device.arch, t, 32, cols):
            raise ValueError(f"{OP}_qkv: takes {', '.join(QKV_TYPE_CODES)} on NVIDIA's fragment path, not {t!r} on "
                             f"{device.arch}")
    for y, w, r, t in zip(ys, ws, rows, weight_types):
        matvec.check_operands(OP, t, WEIGHT_TYPES, y, w, x, r, cols, n_tokens, "n_tokens", alignment=WEIGHT_ALIGNMENT)
    if workspace is not None and not isinstance(workspace, Buffer):
        raise ValueError(f"{OP}: workspace must be a Buffer (its size decides how far columns are split)")
    grid, block, split, entry = qkv_geometry(rows, n_tokens, cols, workspace.nbytes if workspace is not None else 0)
    types = sum(QKV_TYPE_CODES[t] << (4 * i) for i, t in enumerate(weight_types))
    kernel = get_kernel(device, OP, entry, QKV_SIGNATURE, programmatic=True)
    kernel.launch(grid, block, (*ys, *ws, x, workspace if split > 1 else 0, *rows, types, cols, n_tokens, split),
                  stream=stream)


def _host_qkv(device: CpuDevice, grid, block, y_q: int, y_k: int, y_v: int, w_q: int, w_k: int, w_v: int, x: int,
              workspace: int, rows_q: int, rows_k: int, rows_v: int, types: int, cols: int, n_tokens: int,
              splits: int) -> None:
    """The cpu backend's q|k|v entries: the three products, as three launches would compute them."""
    names = {code: name for name, code in QKV_TYPE_CODES.items()}
    xs = device.view(x, np.float32, (n_tokens, cols))
    for i, (y, w, rows) in enumerate(((y_q, w_q, rows_q), (y_k, w_k, rows_k), (y_v, w_v, rows_v))):
        weight_type = names[(types >> (4 * i)) & 15]
        raw = device.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
        host_product(raw, weight_type, xs, cols, device.view(y, np.float32, (n_tokens, rows)))


for _entry in (f"{OP}_qkv_fragments", f"{OP}_qkv_direct"):
    cpu_kernel(_entry, QKV_SIGNATURE)(_host_qkv)
