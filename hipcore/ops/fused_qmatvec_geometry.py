"""How a fused_qmatvec launch spreads its tiles over the device (kernels/fused_qmatvec.hip): the block, the rows a
warp takes, the grid cap per SM (CU), the column split of the residual and q|k|v products at one token and the row
groups of a q|k|v tile. hipcore/ops/fused_qmatvec.py asks geometry() for every launch; the figures behind each
choice are in the comments beside it. Any grid, split and group count is correct (the kernels loop over the
tiles and add the split warps' sums in a fixed order): these choices move only the speed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from hipcore.runtime.kernels import wavefront_size

# The kernels' launch bounds and block (kBlockThreads): the workgroup quantizes x once into shared memory for
# all its warps, so the more warps share it, the less x is read per weight byte.
BLOCK_THREADS = 256
# Rows of each matrix a warp takes at a time (WarpRows): four (gate|up: two of each) for one token, half in passes.
ROWS_PER_WARP = {"1": 4, "n": 2}
GATE_UP_ROWS_PER_WARP = {"1": 2, "n": 1}
# At most WORKGROUPS_PER_MULTIPROCESSOR workgroups per SM (CU), each taking its share of the tiles in turn: a
# workgroup stages x once for every tile of one type when x fits one staging (kStageSliceTokens / tokens slices),
# so more tiles per workgroup means less staging; launches with fewer tiles keep one workgroup per tile. Two is
# what an SM holds of the one-token entries (256 threads of 106-128 registers): more leave a second, partial
# round of workgroups behind the first, fewer leave loads unissued. Measured on an NVIDIA H100 80GB HBM3 (132
# SMs; scripts/bench/measure_qmatvec_decode.py --max-workgroups 132,264,396, one token, µs): norm+head 1B
# 126.6 / 88.1 / 107.8, 8B 238.4 / 171.4 / 204.1; norm+gate|up+swiglu 1B 12.5 / 9.4 / 10.3, 8B 35.2 / 29.2 /
# 29.8; the rest equal within 1.5% at 264 and 396. (An earlier 396 had beaten one workgroup per tile.)
# DEFAULT_MULTIPROCESSORS: where the device does not say (the cpu backend, the emulation), an H100's.
# MAX_WORKGROUPS: a fixed cap for measuring, None in use.
WORKGROUPS_PER_MULTIPROCESSOR = 2
DEFAULT_MULTIPROCESSORS = 132
MAX_WORKGROUPS: int | None = None
# The residual product at one token splits its row groups (k_split warps share a row's columns,
# kernels/fused_qmatvec.hip: tile_dot): few tiles leave too few weight loads in flight per SM (an 8B's o and
# down have 128 tiles of 32 rows for 132 SMs). k_split doubles, up to MAX_K_SPLIT, while the tiles stay
# within the workgroup cap and each warp keeps SPLIT_MIN_SLICES of a row. Measured on an NVIDIA H100 80GB HBM3
# (scripts/bench/measure_qmatvec_decode.py --k-split): 8B o 8.30 -> 7.44 us at 2 (9.49 at 4), down 25.7 ->
# 24.4 at 2 (26.3 at 4); 1B o 5.21 -> 4.74 at 2, down 14.4 -> 9.5 at 4. gate|up lost at 2 and stays whole.
# norm+q|k|v+RoPE at one token splits the same way: a 1B's q|k|v has 96 tiles for 132 SMs, 5.50 -> 5.09 us
# at 2 (8.65 at 4); an 8B's 192 tiles would become 384, more than the cap (11.9 -> 15.3 us when it ran so).
# SPLIT_ENTRIES: the entries that take a k_split (after their other arguments).
# FORCED_K_SPLIT: a fixed k_split for measuring and tests, None in use.
MAX_K_SPLIT = 4
SPLIT_ENTRIES = ("qmatvec_add", "qmatvec_norm_rope")
SPLIT_MIN_SLICES = 32
FORCED_K_SPLIT: int | None = None
# norm+q|k|v+RoPE at one token also sets the row groups of a tile (tile_groups, its last argument; the other
# warps of the block stage x and read nothing): where its whole tiles outnumber the SMs (an 8B's 192 tiles of
# 32 rows on 132 SMs put two on 60 SMs and one on 72), tiles of the fewest groups, at least
# MIN_TILE_GROUPS_SHARE of the block's, whose count fits the workgroup cap (8B: 6 of 8 groups, 257 tiles; 3B:
# 5 of 8, 258; 1B at k_split 2: 3 of 4, 257), so that nearly every SM holds two. Measured on an NVIDIA H200
# (docs/history/2026-11-28-qkv-tiles-attention-prefetch.md): alone the 8B's launch is no faster (9.90 us at 8 groups,
# 10.21 at 6, 10.27 at 7; 5 groups, 308 tiles past the cap, 15.44), but in the decode step it is: tg128 8B
# 434.5 -> 438.0, 3B 749.3 -> 758.7, 1B 1,529 -> 1,535 t/s, the same in a second round.
# FORCED_TILE_GROUPS: a fixed tile_groups for measuring and tests (0: all the groups), None in use.
TILE_GROUP_ENTRIES = ("qmatvec_norm_rope",)
MIN_TILE_GROUPS_SHARE = 0.5
FORCED_TILE_GROUPS: int | None = None

def rows_per_warp(entry: str, entry_variant: str) -> int:
    """Rows of each matrix a warp of entry_<entry_variant> takes at a time (kernels/fused_qmatvec.hip: WarpRows)."""
    return (GATE_UP_ROWS_PER_WARP if entry == "qmatvec_norm_swiglu" else ROWS_PER_WARP)[entry_variant]


def max_workgroups(multiprocessors: int | None) -> int:
    """The grid cap on a device of `multiprocessors` SMs (CUs; None: not known)."""
    if MAX_WORKGROUPS is not None:
        return MAX_WORKGROUPS
    return WORKGROUPS_PER_MULTIPROCESSOR * (multiprocessors or DEFAULT_MULTIPROCESSORS)


class Geometry(NamedTuple):
    grid: int
    block: int
    k_split: int
    tile_groups: int  # row groups a tile (0: all of the block's; see MIN_TILE_GROUPS_SHARE)


def geometry(arch: str, entry: str, entry_variant: str, cols: int, *matrix_rows: int,
             multiprocessors: int | None = None) -> Geometry:
    """(grid, block, k_split, tile_groups): one workgroup per tile (BLOCK_THREADS / wavefront / k_split row
    groups of rows_per_warp rows each, or tile_groups of them) of every matrix, at most
    max_workgroups(multiprocessors); the kernel loops over the tiles, so any grid is correct. k_split is 1
    but for SPLIT_ENTRIES at one token (see MAX_K_SPLIT); tile_groups 0 (all) but for TILE_GROUP_ENTRIES at
    one token (see MIN_TILE_GROUPS_SHARE)."""
    cap = max_workgroups(multiprocessors)
    warps = BLOCK_THREADS // wavefront_size(arch)
    rows_per_group = rows_per_warp(entry, entry_variant)

    def tiles(split: int, groups: int = 0) -> int:
        tile_rows = (groups or warps // split) * rows_per_group
        return sum(-(-rows // tile_rows) for rows in matrix_rows)

    split = 1
    if entry in SPLIT_ENTRIES and entry_variant == "1":
        if FORCED_K_SPLIT is not None:
            split = FORCED_K_SPLIT
        else:
            while (2 * split <= min(MAX_K_SPLIT, warps) and cols // 32 >= 2 * split * SPLIT_MIN_SLICES
                   and tiles(2 * split) <= cap):
                split *= 2
        if split not in (1, 2, 4) or warps % split:
            raise ValueError(f"fused_qmatvec: k_split must be 1, 2 or 4 and divide the block's {warps} warps, "
                             f"got {split}")
    groups = 0
    if entry in TILE_GROUP_ENTRIES and entry_variant == "1":
        every = warps // split
        if FORCED_TILE_GROUPS is not None:
            groups = FORCED_TILE_GROUPS
            if not 0 <= groups <= every:
                raise ValueError(f"fused_qmatvec: tile_groups must be 0 .. {every} (the block's row groups), "
                                 f"got {groups}")
        elif tiles(split) > cap // WORKGROUPS_PER_MULTIPROCESSOR:  # some SMs would take two tiles, others one
            fewest = max(1, math.ceil(every * MIN_TILE_GROUPS_SHARE))
            for g in range(fewest, every):
                if tiles(split, g) <= cap:
                    groups = g
                    break
        if groups == every:
            groups = 0
    return Geometry(min(tiles(split, groups), cap), BLOCK_THREADS, split, groups)


def splits_last_round(arch: str, rows: int, grid: int) -> bool:
    """True when one-token gate|up of `rows` rows on `grid` workgroups has a last round of tiles that would leave
    at least half the workgroups idle: the launch then takes qmatvec_norm_swiglu_split_1, whose last round goes as
    tiles of split row groups (kernels/fused_qmatvec.hip: norm_swiglu_pass, the same test). An 8B's 14,336 rows
    make 896 tiles, 3 rounds of 264 and 104 left: split; a 3B's or a 1B's 8,192 make 512, 1 round and 248 left."""
    tile_rows = BLOCK_THREADS // wavefront_size(arch) * GATE_UP_ROWS_PER_WARP["1"]
    rounds, last = divmod(-(-rows // tile_rows), grid)
    return rounds > 0 and last > 0 and 2 * last <= grid
