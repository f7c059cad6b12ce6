"""kernels/moe_experts_mma.hip on every matrix-core path of matrix_cores.h, run on the CPU (the NVIDIA mma.sync
fragments at 32 lanes, CDNA's MFMA at 64, RDNA3's and RDNA4's WMMA at 32, the FMA fallback at both widths): the sort
against sort_reference, each product against the float64 reference within matmul_mma's error bound carried through
the epilogue; the 32-element formats' 64-column steps (`_s64`) likewise, and NVIDIA's few-pairs entries (`_direct`:
tiles of 8 pairs, the weights decoded into mma.sync's fragments) for every type and mode, MXFP4's scales below f16's
normal range among them. Planted faults (an expert's weights taken from the wrong offset, a pair written to the tile's
column instead of its own row, the sort dropping an expert's last tile, a 64-column step loading only 32 columns, up's
h stored as float32 or the products reading their f16 x as float32; in the few-pairs entries every lane taking the
tile's first pair's x, the steps in flight refilled one step ahead instead of kDepth, MXFP4's sign bits or its small
scales' second factor dropped, x read as float32) must be caught. Every product's x is f16, as the model passes it."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import moe_experts, moe_experts_mma
from support.emulated_kernels import MMA_KINDS, assert_caught, build_mma_harnesses, run_mma
from support.weight_samples import random_weights

OP = "moe_experts_mma"
U32 = 2.0**-24


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    return build_mma_harnesses(tmp_path_factory.mktemp("moe_mma_emulation"), op=OP)


def skewed_ids(rng, tokens: int, k: int, n_expert: int) -> np.ndarray:
    """ids [tokens, k], distinct experts per token, expert 0 chosen by every token (a run of tiles), the rest random."""
    rows = [np.concatenate([[0], 1 + rng.permutation(n_expert - 1)[:k - 1]]) for _ in range(tokens)]
    return np.asarray(rows, dtype=np.int32)


def sort(harness, tmp_path, ids: np.ndarray, n_expert: int, tile: int):
    pairs = ids.size
    ids.astype(np.int32).tofile(tmp_path / "ids")
    run_mma(harness, "moe_mma_sort", 1, moe_experts_mma.THREADS, pairs, n_expert, tile, tmp_path / "ids",
            tmp_path / "sorted", tmp_path / "tiles")
    return np.fromfile(tmp_path / "sorted", np.int32), np.fromfile(tmp_path / "tiles", np.int32)


def check_sort(ids, n_expert, tile, sorted_, tiles) -> None:
    groups, want_tiles = moe_experts_mma.sort_reference(ids, n_expert, tile)
    count = int(tiles[0])
    assert count == len(want_tiles)
    table = tiles[1:1 + 3 * count].reshape(-1, 3)
    assert [(int(e), int(n)) for e, _, n in table] == want_tiles
    for e, ps in groups.items():
        mine = table[table[:, 0] == e]
        got = np.concatenate([sorted_[s:s + n] for _, s, n in mine])
        assert sorted(got.tolist()) == ps, e  # every pair of the expert once, in any order


def run_products(harness, tmp_path, rng, mode, weight_type, tokens, k, rows, cols, n_expert, tile, biases,
                 activation="swiglu", ids=None, check=True, suffix="", scales=None, x_scale=1.0):
    """(got, want, bound) of one product launch on fresh inputs, sorted by the emulated sort; suffix "_s64": the
    64-column steps' entry, "_direct" the few-pairs one (tile 8). scales (lo, hi): MXFP4's E8M0 bytes drawn from
    lo .. hi - 1 instead of random_weights' range; x_scale multiplies x (up's h must stay within f16's range)."""
    ids = skewed_ids(rng, tokens, k, n_expert) if ids is None else ids
    pairs = tokens * k
    sorted_, tiles = sort(harness, tmp_path, ids, n_expert, tile)
    if check:  # (the planted faults' test measures the products of a broken sort too)
        check_sort(ids, n_expert, tile, sorted_, tiles)
    raw = random_weights(rng, weight_type, n_expert * rows, cols)
    if scales is not None:
        blocks = raw.reshape(n_expert * rows, cols // 32, 17)
        blocks[..., 0] = rng.integers(*scales, blocks.shape[:2], dtype=np.uint8)
    raw.tofile(tmp_path / "w")
    x_per = 1 if mode == "down" else k
    # every product's x is f16: the copy of the token's normalized input, or up's h
    x = (rng.standard_normal((pairs // x_per, cols)) * rng.choice([0.1, 1.0, 3.0], (pairs // x_per, 1))
         * x_scale).astype(np.float16)
    x.tofile(tmp_path / "x")
    bias = (rng.standard_normal((n_expert, rows)) * 2).astype(np.float32) if biases else None
    g = (rng.standard_normal((pairs, rows)) * 2).astype(np.float32) if mode == "up" else None
    weights = rng.random(pairs).astype(np.float32) if mode == "down" else None
    files = []
    for name, arr in (("bias", bias), ("g", g), ("weights", weights)):
        if arr is None:
            files.append("-")
        else:
            arr.tofile(tmp_path / name)
            files.append(tmp_path / name)
    grid, block = moe_experts_mma.geometry(rows, pairs, n_expert, tile)
    run_mma(harness, f"moe_mma_{mode}_{weight_type}{suffix}", grid, block, rows, cols, pairs, x_per, n_expert, tile,
            moe_experts_mma.max_tiles(pairs, n_expert, tile), moe_experts.ACTIVATIONS[activation], tmp_path / "w",
            tmp_path / "x", tmp_path / "sorted", tmp_path / "tiles", *files, tmp_path / "out")
    got = np.fromfile(tmp_path / "out", np.float16 if mode == "up" else np.float32).reshape(pairs, rows)
    got = got.astype(np.float32)
    x_rows = x[np.arange(pairs) // x_per].astype(np.float64)
    y, bound = moe_experts_mma.products_reference(x_rows, raw, weight_type, ids, rows, cols)
    if bias is not None:
        y = y + bias[ids.reshape(-1)]
        bound = bound + U32 * np.abs(y)
    if mode == "gate":
        return got, y, bound + U32 * np.abs(y)
    if mode == "up":
        gd = g.astype(np.float64)
        h = moe_experts.activation_reference(gd, y, activation)
        factor = np.abs(gd) + 1.0 if activation == "swiglu_oai" else np.abs(gd)
        # h leaves as f16: one more rounding, half an f16 unit (2^-11 relative; 2^-25 among the subnormals)
        return got, h, 1.2 * factor * bound + 8 * U32 * np.abs(h) + 2.0**-11 * np.abs(h) + 2.0**-25
    w = weights.astype(np.float64)[:, None]
    return got, w * y, w * bound + 2 * U32 * np.abs(w * y) + 1e-30


def worst_excess(got, want, bound) -> float:
    return float(np.max(np.where(np.isnan(got), np.inf, np.abs(got - want) / bound)))


@pytest.mark.parametrize("kind", MMA_KINDS)
@pytest.mark.parametrize("tile", [32, 64])
def test_the_sort_lists_every_pair_once(harnesses, kind, tile, tmp_path):
    rng = np.random.default_rng([len(kind), tile])
    for tokens, k, n_expert in [(70, 2, 5), (9, 4, 128), (1, 1, 1), (33, 8, 300)]:
        ids = skewed_ids(rng, tokens, k, n_expert)
        check_sort(ids, n_expert, tile, *sort(harnesses[kind], tmp_path, ids, n_expert, tile))


@pytest.mark.parametrize("kind", MMA_KINDS)
@pytest.mark.parametrize("mode,weight_type,activation", [("gate", "q4_k", "swiglu"), ("up", "q4_k", "swiglu"),
                                                         ("down", "q6_k", "swiglu"), ("up", "mxfp4", "swiglu_oai")])
def test_each_path_matches_the_reference(harnesses, kind, mode, weight_type, activation, tmp_path):
    rng = np.random.default_rng([len(kind), len(mode), len(weight_type)])
    # expert 0 takes 40 pairs (two 32-pair tiles), 160 rows (a partial row tile), biases as gpt-oss has them
    got, want, bound = run_products(harnesses[kind], tmp_path, rng, mode, weight_type, 40, 2, 160, 256, 5, 32,
                                    biases=weight_type == "mxfp4", activation=activation)
    assert worst_excess(got, want, bound) <= 1.0


@pytest.mark.parametrize("weight_type", moe_experts_mma.TYPES)
@pytest.mark.parametrize("mode", moe_experts_mma.MODES)
def test_every_type_and_mode_on_nvidias_fragments(harnesses, weight_type, mode, tmp_path):
    rng = np.random.default_rng([len(weight_type), len(mode)])
    got, want, bound = run_products(harnesses["nvidia_mma"], tmp_path, rng, mode, weight_type, 70, 2, 130, 256, 3, 64,
                                    biases=True)
    assert worst_excess(got, want, bound) <= 1.0


@pytest.mark.parametrize("kind", MMA_KINDS)
@pytest.mark.parametrize("mode", moe_experts_mma.MODES)
def test_64_column_steps_match_the_reference_on_each_path(harnesses, kind, mode, tmp_path):
    """The `_s64` entries (two 32-column steps between barriers) of gpt-oss' MXFP4 experts on every matrix-core path:
    192 columns (three steps), a partial row tile, 32- and 64-pair tiles."""
    rng = np.random.default_rng([len(kind), len(mode), 64])
    for tile in (32, 64):
        got, want, bound = run_products(harnesses[kind], tmp_path, rng, mode, "mxfp4", 40, 2, 160, 192, 5, tile,
                                        biases=True, activation="swiglu_oai", suffix="_s64")
        assert worst_excess(got, want, bound) <= 1.0, tile


@pytest.mark.parametrize("weight_type", moe_experts_mma.NARROW_S64_TYPES)
@pytest.mark.parametrize("mode", moe_experts_mma.MODES)
def test_every_64_column_entry_on_nvidias_fragments(harnesses, weight_type, mode, tmp_path):
    rng = np.random.default_rng([len(weight_type), len(mode), 64])
    got, want, bound = run_products(harnesses["nvidia_mma"], tmp_path, rng, mode, weight_type, 70, 2, 130, 320, 3, 64,
                                    biases=True, suffix="_s64")
    assert worst_excess(got, want, bound) <= 1.0


DIRECT_COLS = {"q4_k": 512, "q5_k": 256, "q6_k": 512}  # whole super-blocks; the 32-element formats' 320: 5 steps


@pytest.mark.parametrize("weight_type", moe_experts_mma.DIRECT_TYPES)
@pytest.mark.parametrize("mode", moe_experts_mma.MODES)
def test_every_few_pairs_entry_on_nvidias_fragments(harnesses, weight_type, mode, tmp_path):
    """Tiles of at most 8 pairs: expert 0 takes all 19 tokens' first slots (three tiles, the last partial), the other
    experts one to a few pairs; 130 rows (a partial row tile); steps past a multiple of the steps in flight."""
    rng = np.random.default_rng([len(weight_type), len(mode), 8])
    got, want, bound = run_products(harnesses["nvidia_mma"], tmp_path, rng, mode, weight_type, 19, 3, 130,
                                    DIRECT_COLS.get(weight_type, 320), 9, 8, biases=True,
                                    activation="swiglu_oai" if weight_type == "mxfp4" else "swiglu", suffix="_direct")
    assert worst_excess(got, want, bound) <= 1.0


@pytest.mark.parametrize("mode", moe_experts_mma.MODES)
def test_mxfp4_few_pairs_scales_across_f16s_range(harnesses, mode, tmp_path):
    """MXFP4's E8M0 scales 2^-40 .. 2^11: values f16 holds as normals, as subnormals (the two-factor multiply) and
    not at all (rounded to zero), each rounded once as the shared tiles round them. up's x is smaller: its h, stored as
    f16, must stay within f16's range as a model's does (weights of 2^12 times x of 1 would not)."""
    rng = np.random.default_rng([len(mode), 39])
    got, want, bound = run_products(harnesses["nvidia_mma"], tmp_path, rng, mode, "mxfp4", 12, 4, 64, 256, 6, 8,
                                    biases=False, suffix="_direct", scales=(88, 140),
                                    x_scale=2.0**-10 if mode == "up" else 1.0)
    assert np.all(np.isfinite(want))
    assert worst_excess(got, want, bound) <= 1.0


PLANTED = {
    "the expert's offset dropped": ("const unsigned char* W = a.W + (unsigned long long)e * rows * row_bytes;",
                                    "const unsigned char* W = a.W;"),
    "a pair written at its tile column": ("store_pair<kMode>(a, e, a.sorted[start + t], r,",
                                          "store_pair<kMode>(a, e, start + t, r,"),
    "an expert's last tile not listed": ("tile += (count[e] + tile_tokens - 1) / tile_tokens;",
                                         "tile += count[e] / tile_tokens;"),
    "a 64-column step loading 32 columns": ("kGroupsPerRow = 2 * S::kGroupsPerRow;",
                                            "kGroupsPerRow = S::kGroupsPerRow;"),
    "up's h stored as float32": ("reinterpret_cast<unsigned short*>(a.out)[at] =", "a.out[at] ="),
    "the products reading x as float32": (
        "typedef typename HalfLoads<TN * Step::kStepCols % (8 * kThreads) == 0>::type XIn;", "typedef mmq::XF32 XIn;"),
}
DIRECT_PLANTED = {  # the few-pairs entries': (old, new, weight type, MXFP4 scales)
    "every lane taking the tile's first pair": ("const int pair = a.sorted[start + lesser(g, count - 1)];",
                                               "const int pair = a.sorted[start];", "q4_k", None),
    "the steps in flight refilled one step ahead": (
        "const int next = lesser(c0 + kDepth * kStepCols, cols - kStepCols);  // past the end",
        "const int next = lesser(c0 + kStepCols, cols - kStepCols);  // past the end", "q8_0", None),
    "MXFP4's sign bits dropped": ("| ((codes & 0x08080808u) << 4);", ";", "mxfp4", None),
    "MXFP4's small scales' second factor dropped": ("if (small) v = rf_h2_mul(v, second * 0x10001u);", "", "mxfp4",
                                                    (88, 110)),
    "the few-pairs entries reading x as float32": ("(pair / a.x_per) * cols * XIn::kBytes;\n  float acc[4]",
                                                   "(pair / a.x_per) * cols * 4;\n  float acc[4]", "q8_0", None),
}
PLANTED.update({fault: spec[:2] for fault, spec in DIRECT_PLANTED.items()})
PLANTED_SUFFIX = {"a 64-column step loading 32 columns": "_s64", **{fault: "_direct" for fault in DIRECT_PLANTED}}
PLANTED_MODE = {"up's h stored as float32": "up"}  # the others: gate


@pytest.mark.parametrize("fault", PLANTED)
def test_a_planted_fault_is_caught(fault, tmp_path):
    old, new = PLANTED[fault]
    harness = build_mma_harnesses(tmp_path, kinds=("nvidia_mma",), op=OP,
                                  kernel_edit=lambda text: text.replace(old, new))["nvidia_mma"]
    rng = np.random.default_rng(7)

    suffix = PLANTED_SUFFIX.get(fault, "")
    weight_type, scales = DIRECT_PLANTED[fault][2:] if fault in DIRECT_PLANTED else ("q8_0", None)
    tile, cols = (8, DIRECT_COLS.get(weight_type, 320)) if suffix == "_direct" else (32, 256)

    def measure():
        got, want, bound = run_products(harness, tmp_path, rng, PLANTED_MODE.get(fault, "gate"), weight_type, 40, 2,
                                        130, cols, 5, tile, biases=False, check=False, suffix=suffix, scales=scales)
        return worst_excess(got, want, bound)

    assert_caught(fault, measure)
