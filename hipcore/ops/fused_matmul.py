"""fused_matmul: matrix-matrix products with the layer's small ops folded in (prompts, large decode batches).

Kernels (kernels/fused_matmul.hip), for W of type q4_1, q5_0, q5_1, q8_0, f16, bf16 or f32 in its GGUF block layout; the
same operations as hipcore/ops/fused_matvec.py, with matmul.hip's tiling:

  matmul_norm_rope_<t>(q p, k p, v p, W p, x p, g p, positions p, freq_factors p, workspace p, q_rows i,
                       kv_rows i, cols i, n_tokens i, head_dim i, rope_dim i, tile_tokens i, splits i, eps f, theta f,
                       freq_scale f)
      [q | k | v] = rmsnorm(x) * g @ [W_q; W_k; W_v]^T, RoPE (NORM mode) on q and k; freq_factors float32
      [rope_dim / 2] divide the frequencies (rope.py), or a null pointer
  matmul_norm_swiglu_<t>(y p, W p, x p, g p, workspace p, rows i, cols i, n_tokens i, tile_tokens i, splits i, eps f)
      y = silu(n @ W_gate^T) * (n @ W_up^T), n = rmsnorm(x) * g, W = [W_gate; W_up]
  matmul_add_<t>(y p, W p, x p, workspace p, rows i, cols i, n_tokens i, tile_tokens i, splits i)
      y += x @ W^T (the residual connection)
  matmul_norm_<t>(y p, W p, x p, g p, workspace p, rows i, cols i, n_tokens i, tile_tokens i, splits i, eps f)
      y = rmsnorm(x) * g @ W^T (the output head)

The references are fused_matvec's (the chains of single ops in float64); the host kernels compute
what fused_matvec's do, so the cpu backend gives the same floats whichever of the two a plan picks.

Geometry (the launcher's): 256-thread workgroups over tiles of 64 rows (SwiGLU: 32 gate rows and the
same 32 up rows) x tile_tokens tokens (32, or 64 where that still makes FEW_TILES tiles). When the
tiles are few, each tile's columns are split into `splits` ranges of at least MIN_SPLIT_STEPS steps
of 32 columns, one workgroup each, up to BUSY_ITEMS workgroups in all (pick_splits), so that a decode
batch's few tiles still occupy the GPU; the last split of a tile to finish adds the partials in split
order (deterministic: a graph replay equals the eager launch bit for bit). Splitting needs a
workspace: a Buffer zeroed once after allocation (the kernels leave its counters at zero), of
WORKSPACE_BYTES for any launch; launches sharing it run on one stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import fused_matvec, rmsnorm, rope, silu_mul
from hipcore.ops.fused_matvec import (reference_add, reference_norm, reference_norm_rope,  # noqa: F401 (re-exported)
                                      reference_norm_swiglu)
from hipcore.ops.launch_checks import INT32_MAX, check_disjoint, check_memory, check_qkv_rope, check_sizes
from hipcore.ops.matvec import WEIGHT_ALIGNMENT
from hipcore.ops.weight_formats import host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.kernels import get_kernel

OP = "fused_matmul"
WEIGHT_TYPES = fused_matvec.WEIGHT_TYPES
SIGNATURES = {
    "matmul_norm_rope": "pppppppppiiiiiiiifff",
    "matmul_norm_swiglu": "pppppiiiiif",
    "matmul_add": "ppppiiiii",
    "matmul_norm": "pppppiiiiif",
}
THREADS = 256  # the kernel's thread layout is written for exactly this
TILE_ROWS = 64
TILE_TOKENS = (32, 64)
STEP_COLS = 32
BUSY_ITEMS = 264  # workgroups resident at once on an H100/H200: 132 SMs x 2 (256 threads, <= 128 registers)
FEW_TILES = 64  # below this many 64-token tiles, 32-token ones (pick_tile_tokens)
SMALL_SPLIT_TILES = 32  # below this many tiles, splits fill half of BUSY_ITEMS (pick_splits)
MIN_SPLIT_STEPS = 3  # a split shorter than this spends more on its partial tile than on products
MAX_GRID = 1 << 20
COUNTER_BYTES = 4096  # kCounterBytes: one int32 counter per tile, before the partials
MAX_SPLIT_TILES = COUNTER_BYTES // 4
VECTOR_ALIGNMENT = 16  # x and g are read with 16-byte loads
# Splits keep tiles * splits <= BUSY_ITEMS: partial tiles of at most 64 tokens x (64 outputs + 1 sum of
# squares) floats each. Twice that, for measurements that raise BUSY_ITEMS.
WORKSPACE_BYTES = COUNTER_BYTES + 2 * BUSY_ITEMS * TILE_TOKENS[-1] * (TILE_ROWS + 1) * 4


def supports(weight_type: str) -> bool:
    """True when the fused kernels read matrices of this type (others take the single ops)."""
    return weight_type in WEIGHT_TYPES


# ---- host kernels (the cpu backend): the same floats as fused_matvec's host kernels ------------


def _product(dev: CpuDevice, w: int, weight_type: str, xs: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.empty((xs.shape[0], rows), dtype=np.float32)
    host_product(dev.view(w, np.uint8, (rows, row_bytes(weight_type, cols))), weight_type, xs, cols, out)
    return out


def _normed(dev: CpuDevice, x: int, g: int, n_tokens: int, cols: int, eps: float) -> np.ndarray:
    return rmsnorm.reference(dev.view(x, np.float32, (n_tokens, cols)), dev.view(g, np.float32, cols),
                             eps).astype(np.float32)


def _register(weight_type: str) -> None:
    @cpu_kernel(f"matmul_norm_rope_{weight_type}", SIGNATURES["matmul_norm_rope"])
    def norm_rope(dev, grid, block, q, k, v, w, x, g, positions, freq_factors, workspace, q_rows, kv_rows, cols,
                  n_tokens, head_dim, rope_dim, tile_tokens, splits, eps, theta, freq_scale):
        y = _product(dev, w, weight_type, _normed(dev, x, g, n_tokens, cols, eps), q_rows + 2 * kv_rows, cols)
        pos = dev.view(positions, np.int32, n_tokens)
        factors = rope.host_factors(dev, freq_factors, rope_dim)
        for out, lo, hi, rotate in ((q, 0, q_rows, True), (k, q_rows, q_rows + kv_rows, True),
                                    (v, q_rows + kv_rows, q_rows + 2 * kv_rows, False)):
            part = y[:, lo:hi]
            if rotate:
                part = rope.reference(part.reshape(n_tokens, -1, head_dim), pos, rope_dim, theta,
                                      freq_scale, factors).reshape(n_tokens, -1)
            dev.view(out, np.float32, (n_tokens, hi - lo))[:] = part

    @cpu_kernel(f"matmul_norm_swiglu_{weight_type}", SIGNATURES["matmul_norm_swiglu"])
    def norm_swiglu(dev, grid, block, y, w, x, g, workspace, rows, cols, n_tokens, tile_tokens, splits, eps):
        both = _product(dev, w, weight_type, _normed(dev, x, g, n_tokens, cols, eps), 2 * rows, cols)
        dev.view(y, np.float32, (n_tokens, rows))[:] = silu_mul.reference(both[:, :rows], both[:, rows:])

    @cpu_kernel(f"matmul_add_{weight_type}", SIGNATURES["matmul_add"])
    def add(dev, grid, block, y, w, x, workspace, rows, cols, n_tokens, tile_tokens, splits):
        dev.view(y, np.float32, (n_tokens, rows))[:] += _product(
            dev, w, weight_type, dev.view(x, np.float32, (n_tokens, cols)), rows, cols)

    @cpu_kernel(f"matmul_norm_{weight_type}", SIGNATURES["matmul_norm"])
    def norm(dev, grid, block, y, w, x, g, workspace, rows, cols, n_tokens, tile_tokens, splits, eps):
        dev.view(y, np.float32, (n_tokens, rows))[:] = _product(
            dev, w, weight_type, _normed(dev, x, g, n_tokens, cols, eps), rows, cols)


for _type in WEIGHT_TYPES:
    _register(_type)


# ---- geometry ----------------------------------------------------------------------------------


def pick_tile_tokens(row_tiles: int, n_tokens: int) -> int:
    """32-token tiles up to 32 tokens (less padding); beyond, 64 (twice the products per shared load)
    unless that leaves fewer than FEW_TILES tiles: such launches are latency-bound, and twice the tiles
    of half the size finish sooner than the same tiles split further (measured on an H100 with the demo
    model's products, scripts/bench/measure_fused_matmul.py --tiles: at 64 tokens every product, 22.6
    against 24.1 us for gate|up's 48 tiles; at 128 and 512 tokens 64-token tiles from 30 tiles on)."""
    if n_tokens <= TILE_TOKENS[0] or tile_count(row_tiles, n_tokens, TILE_TOKENS[-1]) < FEW_TILES:
        return TILE_TOKENS[0]
    return TILE_TOKENS[-1]


def tile_count(tile_rows: int, n_tokens: int, tile_tokens: int) -> int:
    """Tiles of y: `tile_rows` (rows of W per tile: 64, or 32 gate rows for SwiGLU) x tile_tokens."""
    return tile_rows * -(-n_tokens // tile_tokens)


def pick_splits(tiles: int, cols: int, tile_tokens: int) -> int:
    """Column ranges per tile, each at least MIN_SPLIT_STEPS steps: as many as keep the workgroups within
    BUSY_ITEMS (one wave; a few more would run as a second, nearly empty one), within half of it for
    fewer than SMALL_SPLIT_TILES tiles, and a tile whole rather than in two halves. From the H100 figures
    of scripts/bench/measure_fused_matmul.py --variants on the demo model's products (the raw report is in git
    history: docs/gpu-runs/2026-11-22-fused-matmul-h100-run3.md at commit 855248c), where this picks the faster of the budgets measured in every
    case: a few tiles' work is short and the combine of many partials outweighs more parallelism beyond
    about one workgroup per SM (q|k|v at 64 tokens, 30 tiles: 11.8 us in 4 splits, 13.1 in 6), more
    tiles gain from a full wave (o at 512 tokens, 72 tiles: 23.6 us in 3 splits, 29.7 whole; ffn_down at
    128 tokens, 36 tiles: 19.4 in 7, 22.9 in 3), halves never paid (gate|up at 64 tokens: 18.6 us whole,
    21.2 in 2)."""
    if tiles > MAX_SPLIT_TILES:
        return 1
    budget = BUSY_ITEMS // 2 if tiles < SMALL_SPLIT_TILES else BUSY_ITEMS
    splits = max(1, min(budget // tiles, cols // STEP_COLS // MIN_SPLIT_STEPS))
    return 1 if splits == 2 else splits


def partial_bytes(tiles: int, splits: int, tile_tokens: int) -> int:
    """Workspace bytes a launch of `splits` > 1 needs: the counters and every split's partial tile."""
    return COUNTER_BYTES + tiles * splits * tile_tokens * (TILE_ROWS + 1) * 4


def geometry(row_tiles: int, cols: int, n_tokens: int, workspace_bytes: int, *, tile_tokens: int | None = None,
             splits: int | None = None) -> tuple[int, int, int, int]:
    """(grid, block, tile_tokens, splits) for `row_tiles` tiles of rows; tile_tokens and splits as given
    (measurements) or the launcher's choice, splits fewer while the workspace is too small for them."""
    tile = pick_tile_tokens(row_tiles, n_tokens) if tile_tokens is None else tile_tokens
    if tile not in TILE_TOKENS:
        raise ValueError(f"{OP}: tile_tokens must be one of {TILE_TOKENS}, got {tile!r}")
    tiles = tile_count(row_tiles, n_tokens, tile)
    split = pick_splits(tiles, cols, tile) if splits is None else splits
    if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= cols // STEP_COLS:
        raise ValueError(f"{OP}: splits must be an int in [1, {cols // STEP_COLS}] (steps of 32 columns), got {split!r}")
    if split > 1 and tiles > MAX_SPLIT_TILES:
        raise ValueError(f"{OP}: {tiles} tiles are more than the {MAX_SPLIT_TILES} counters a split launch has")
    while split > 1 and partial_bytes(tiles, split, tile) > workspace_bytes:
        split -= 1
    if tiles * split > INT32_MAX:  # the kernel counts (tile, split) items in int32
        raise ValueError(f"{OP}: {tiles} tiles x {split} splits is more work items than the kernel counts")
    return min(tiles * split, MAX_GRID), THREADS, tile, split


# ---- launchers ---------------------------------------------------------------------------------


def _check_matrix(op: str, w: Any, weight_type: str, rows: int, cols: int, n_tokens: int, x: Any, g: Any | None) -> None:
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"{op}: no fused kernel for weight type {weight_type!r}; have {', '.join(WEIGHT_TYPES)}")
    check_sizes(op, rows=rows, cols=cols, n_tokens=n_tokens)
    if cols % STEP_COLS:
        raise ValueError(f"{op}: cols must be a multiple of 32 (the GGUF block size), got {cols}")
    check_memory(op, "W", w, rows * row_bytes(weight_type, cols), WEIGHT_ALIGNMENT[weight_type])
    check_memory(op, "x", x, n_tokens * cols * 4, VECTOR_ALIGNMENT)
    if g is not None:
        check_memory(op, "g", g, cols * 4, VECTOR_ALIGNMENT)


def _launch(device: Device, stream: Stream | None, entry: str, weight_type: str, row_tiles: int, cols: int,
            n_tokens: int, workspace: Buffer | None, tile_tokens: int | None, splits: int | None, args_before: tuple,
            sizes: tuple, args_after: tuple) -> None:
    """Launch `entry` with (args_before, workspace, sizes, tile_tokens, splits, args_after)."""
    op = f"{entry}_{weight_type}"
    if workspace is not None and not isinstance(workspace, Buffer):
        raise ValueError(f"{op}: workspace must be a Buffer (its size decides how far columns are split)")
    grid, block, tile, split = geometry(row_tiles, cols, n_tokens, workspace.nbytes if workspace is not None else 0,
                                        tile_tokens=tile_tokens, splits=splits)
    if splits is not None and split != splits:
        raise ValueError(f"{op}: {splits} splits need a workspace of {partial_bytes(grid // split, splits, tile)} bytes")
    kernel = get_kernel(device, OP, op, SIGNATURES[entry])
    kernel.launch(grid, block, (*args_before, workspace if split > 1 else 0, *sizes, tile, split, *args_after),
                  stream=stream)


def launch_norm_rope(device: Device, stream: Stream | None, q: Any, k: Any, v: Any, w: Any, x: Any, g: Any,
                     positions: Any, *, q_rows: int, kv_rows: int, cols: int, n_tokens: int, head_dim: int,
                     rope_dim: int, eps: float, theta: float, freq_scale: float, weight_type: str,
                     workspace: Buffer | None = None, tile_tokens: int | None = None, splits: int | None = None,
                     freq_factors: Any = None) -> None:
    """[q | k | v] = rope(rmsnorm(x) * g @ W^T) for W = [W_q; W_k; W_v] (see the module docstring)."""
    op = f"matmul_norm_rope_{weight_type}"
    rows = q_rows + 2 * kv_rows
    _check_matrix(op, w, weight_type, rows, cols, n_tokens, x, g)
    check_qkv_rope(op, q, k, v, x, positions, q_rows=q_rows, kv_rows=kv_rows, cols=cols, n_tokens=n_tokens,
                   head_dim=head_dim, rope_dim=rope_dim)
    _launch(device, stream, "matmul_norm_rope", weight_type, -(-rows // TILE_ROWS), cols, n_tokens, workspace,
            tile_tokens, splits, (q, k, v, w, x, g, positions, rope.factors_arg(op, freq_factors, rope_dim)),
            (q_rows, kv_rows, cols, n_tokens, head_dim, rope_dim), (eps, theta, freq_scale))


def launch_norm_swiglu(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, g: Any, *, rows: int, cols: int,
                       n_tokens: int, eps: float, weight_type: str, workspace: Buffer | None = None,
                       tile_tokens: int | None = None, splits: int | None = None) -> None:
    """y[n_tokens, rows] = silu(n @ W_gate^T) * (n @ W_up^T), n = rmsnorm(x) * g, W = [W_gate; W_up]."""
    op = f"matmul_norm_swiglu_{weight_type}"
    _check_matrix(op, w, weight_type, 2 * rows, cols, n_tokens, x, g)
    check_memory(op, "y", y, n_tokens * rows * 4)
    check_disjoint(op, ("y", y, n_tokens * rows * 4), ("x", x, n_tokens * cols * 4))
    _launch(device, stream, "matmul_norm_swiglu", weight_type, -(-rows // (TILE_ROWS // 2)), cols, n_tokens,
            workspace, tile_tokens, splits, (y, w, x, g), (rows, cols, n_tokens), (eps,))


def launch_add(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, *, rows: int, cols: int, n_tokens: int,
               weight_type: str, workspace: Buffer | None = None, tile_tokens: int | None = None,
               splits: int | None = None) -> None:
    """y[n_tokens, rows] += x @ W^T."""
    op = f"matmul_add_{weight_type}"
    _check_matrix(op, w, weight_type, rows, cols, n_tokens, x, None)
    check_memory(op, "y", y, n_tokens * rows * 4)
    check_disjoint(op, ("y", y, n_tokens * rows * 4), ("x", x, n_tokens * cols * 4))
    _launch(device, stream, "matmul_add", weight_type, -(-rows // TILE_ROWS), cols, n_tokens, workspace, tile_tokens,
            splits, (y, w, x), (rows, cols, n_tokens), ())


def launch_norm(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, g: Any, *, rows: int, cols: int,
                n_tokens: int, eps: float, weight_type: str, workspace: Buffer | None = None,
                tile_tokens: int | None = None, splits: int | None = None) -> None:
    """y[n_tokens, rows] = rmsnorm(x) * g @ W^T."""
    op = f"matmul_norm_{weight_type}"
    _check_matrix(op, w, weight_type, rows, cols, n_tokens, x, g)
    check_memory(op, "y", y, n_tokens * rows * 4)
    check_disjoint(op, ("y", y, n_tokens * rows * 4), ("x", x, n_tokens * cols * 4))
    _launch(device, stream, "matmul_norm", weight_type, -(-rows // TILE_ROWS), cols, n_tokens, workspace, tile_tokens,
            splits, (y, w, x, g), (rows, cols, n_tokens), (eps,))
