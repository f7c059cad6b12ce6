"""kernels/matmul_mma.hip on every matrix-core path of matrix_cores.h, run on the CPU: the NVIDIA mma.sync
fragments at 32 lanes, CDNA's MFMA at 64, RDNA3's and RDNA4's WMMA at 32 and the FMA fallback at both
widths, each against tests/kernel_emulation/emulation.h's emulation of its instruction (the lane layouts
the vendors document), against the numpy reference within matmul_mma.error_bound. Planted faults (a
matrix_cores.h with one layout detail of one path wrong) prove the comparison catches a wrong lane layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import matmul_mma, matmul_mma_swiglu
from hipcore.ops.weight_formats import column_multiple
from support.emulated_kernels import MMA_KINDS, assert_caught, build_mma_harnesses, nvidia_harness_with, run_mma
from support.weight_samples import random_weights


@pytest.fixture(scope="module")
def mma_harnesses(tmp_path_factory):
    return build_mma_harnesses(tmp_path_factory.mktemp("kernel_emulation_mma"))


def worst_excess(harness, weight_type: str, rows: int, cols: int, n_tokens: int, tile, grid_override, rng, tmp_path,
                 splits: int = 1, accumulate: bool = False, path: str = "auto", x_f16: bool = False):
    """max |got - want| / bound of one launch on fresh random inputs (<= 1 passes; an output left unwritten,
    NaN as the harness fills y, counts as infinitely far). With splits > 1 the workspace is exactly what they
    need, and its counters must be left at zero; with accumulate, y starts as random values the product is
    added to; `path` as matmul_mma.entry_name's (NVIDIA's harness stands for sm_90, the others for gfx942);
    x_f16: the x16 entry, x written as f16 (the reference takes those values)."""
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    raw.tofile(tmp_path / "w")
    if x_f16:
        x = x.astype(np.float16)
        x.tofile(tmp_path / "x")
        x = x.astype(np.float32)
    else:
        x.tofile(tmp_path / "x")
    y_in = rng.standard_normal((n_tokens, rows)).astype(np.float32) if accumulate else None
    if accumulate:
        y_in.tofile(tmp_path / "y_in")
    tile = matmul_mma.pick_tile_tokens(rows, n_tokens) if tile is None else tile
    tiles = matmul_mma.tile_count(rows, n_tokens, tile)
    ws_bytes = matmul_mma.partial_bytes(tiles, splits, tile) if splits > 1 else 0
    arch = "sm_90" if harness.name.endswith("nvidia_mma") else "gfx942"  # NVIDIA's harness runs its fragment path
    fragments = not x_f16 and path != "shared" and matmul_mma.has_fragment_path(arch, weight_type, tile, cols)
    step = matmul_mma.step_cols(weight_type, fragments)
    grid, threads, tile, used = matmul_mma.geometry(rows, n_tokens, tile, cols=cols, workspace_bytes=ws_bytes,
                                                    splits=splits, step=step)
    assert used == splits
    split_steps = -(-(cols // step) // splits)
    entry = matmul_mma.x16_entry(weight_type, tile) if x_f16 else matmul_mma.entry_name(arch, weight_type, tile,
                                                                                          n_tokens, path, split_steps, cols)
    run_mma(harness, entry, grid_override or grid, threads, rows, cols, n_tokens, tile, splits,
            int(accumulate), ws_bytes, tmp_path / "w", tmp_path / "x", tmp_path / "y_in" if accumulate else "-",
            tmp_path / "y", tmp_path / "ws")
    got = np.fromfile(tmp_path / "y", np.float32).reshape(n_tokens, rows)
    want = matmul_mma.reference(raw, weight_type, x, rows, cols)
    bound = matmul_mma.error_bound(raw, weight_type, x, rows, cols)
    if accumulate:  # one more rounding: the add to y
        want = want + y_in
        bound = bound + 2.0**-24 * np.abs(want)
    if ws_bytes:
        counters = np.fromfile(tmp_path / "ws", np.int32)[:matmul_mma.COUNTER_BYTES // 4]
        assert not counters.any(), f"{weight_type} {splits} splits: the counters were not left at zero"
    return float(np.max(np.where(np.isfinite(got), np.abs(got - want) / bound, np.inf)))


@pytest.mark.parametrize("kind", MMA_KINDS)
@pytest.mark.parametrize("weight_type", matmul_mma.WEIGHT_TYPES)
def test_matmul_mma_matches_the_reference(mma_harnesses, kind, weight_type, tmp_path):
    rng = np.random.default_rng([len(kind), ord(kind[0]), ord(weight_type[-1]), len(weight_type)])
    block = column_multiple(weight_type)
    # (rows, cols, n_tokens, tile or None, grid or None): a row tile cut short and a token tile cut short,
    # both tile shapes, several column steps; then one workgroup looping over every tile; a batch of 5
    # (NVIDIA's direct entry for the K-quants).
    cases = [(130, 2 * block if block == 256 else 3 * block, 70, None, None), (64, block, 33, 32, None),
             (20, block, 9, None, 1), (36, 2 * block, 5, None, None)]
    for rows, cols, n_tokens, tile, grid in cases:
        excess = worst_excess(mma_harnesses[kind], weight_type, rows, cols, n_tokens, tile, grid, rng, tmp_path)
        assert excess <= 1.0, f"{kind} {weight_type} {rows}x{cols} tokens {n_tokens}: {excess:.3g} x the bound"


# (rows, cols, n_tokens, tile, grid or None, splits, accumulate): a decode batch split over the columns
# (3 uneven splits of 8 steps, one token tile cut short), a split launch whose 2 workgroups each loop over
# several (tile, split) items, the residual add without and with splits; a batch of 8 split and added
# (NVIDIA's direct entry for the K-quants, its partials a quarter of a slot).
SPLIT_CASES = [(130, 256, 9, 32, None, 3, False), (64, 512, 20, 32, 2, 4, False), (72, 256, 12, 32, None, 1, True),
               (130, 512, 40, 64, 3, 5, True), (130, 512, 8, 32, 3, 4, True)]


@pytest.mark.parametrize("kind", ["nvidia_mma", "cdna_mfma", "rdna3_wmma", "fma32"])
@pytest.mark.parametrize("weight_type", ["q4_k", "q6_k", "q8_0"])
def test_split_columns_and_the_residual_add_match_the_reference(mma_harnesses, kind, weight_type, tmp_path):
    rng = np.random.default_rng([7, len(kind), ord(weight_type[1])])
    for rows, cols, n_tokens, tile, grid, splits, accumulate in SPLIT_CASES:
        excess = worst_excess(mma_harnesses[kind], weight_type, rows, cols, n_tokens, tile, grid, rng, tmp_path,
                              splits=splits, accumulate=accumulate)
        assert excess <= 1.0, (f"{kind} {weight_type} {rows}x{cols} tokens {n_tokens} splits {splits} "
                               f"accumulate {accumulate}: {excess:.3g} x the bound")


@pytest.mark.parametrize("weight_type", ["q4_k", "q6_k"])
def test_nvidias_shared_tile_kernel_at_32_token_tiles_still_matches(mma_harnesses, weight_type, tmp_path):
    """On NVIDIA the K-quants' 32-token tiles take the fragment path; the shared-tile kernel's (path "shared",
    the measurement baseline; Q6_K's with one step in flight there) still computes the product, split too."""
    rng = np.random.default_rng([11, ord(weight_type[1])])
    for rows, cols, n_tokens, splits in ((130, 512, 9, 1), (64, 512, 32, 3)):
        excess = worst_excess(mma_harnesses["nvidia_mma"], weight_type, rows, cols, n_tokens, 32, None, rng, tmp_path,
                              splits=splits, path="shared")
        assert excess <= 1.0, f"{weight_type} {rows}x{cols} tokens {n_tokens} splits {splits}: {excess:.3g} x the bound"


# Faults of the split combine each detector must catch: a split's partial left out of the sum (one split at a
# time: Q4_0's fragment entry; four a round trip: the K-quants'), the counter not reset for the next launch, the
# residual add dropped. Each with the weight type whose entry runs the faulty code.
SPLIT_FAULTS = {
    "a split left out": ("for (int s = 0; s < splits; ++s) {  // in split order",
                         "for (int s = 1; s < splits; ++s) {  // in split order", "q4_0"),
    "a split left out of a batch": ("for (int s0 = 0; s0 < splits; s0 += kBatch) {",
                                    "for (int s0 = 1; s0 < splits; s0 += kBatch) {", "q4_k"),
    "counter not reset": ("if (tid == 0) counters[tile] = 0;  // ready for the next launch", "", "q4_k"),
    "no residual add": ("*out = a.accumulate ? *out + v : v;", "*out = v;", "q4_k"),
}


@pytest.mark.parametrize("fault", SPLIT_FAULTS)
def test_a_broken_split_combine_is_caught(fault, tmp_path):
    old, new, weight_type = SPLIT_FAULTS[fault]
    harness = nvidia_harness_with(old, new, tmp_path)
    rng = np.random.default_rng(11)
    assert_caught(fault, lambda: worst_excess(harness, weight_type, 130, 512, 9, 32, None, rng, tmp_path, splits=4,
                                              accumulate=True))


# One plausible mistake per path, each the layout of a neighbouring path or a transposed index; NVIDIA's
# fragment loads twice more: ldmatrix's matrices 1 and 2 of B swapped (A's order), its k halves swapped.
PLANTED = {
    "nvidia_mma": ("nvidia_mma", "return (lane >> 2) + 8 * ((i >> 1) & 1);", "return (lane >> 2) + 8 * (i & 1);"),
    "nvidia_mma B in A's order": ("nvidia_mma", "tile + ((lane & 7) + 8 * (lane >> 4)) * stride + 8 * ((lane >> 3) & 1)",
                                  "tile + ((lane & 7) + 8 * ((lane >> 3) & 1)) * stride + 8 * (lane >> 4)"),
    "nvidia_mma A's k halves swapped": ("nvidia_mma", "* stride + 8 * (lane >> 4));", "* stride + 8 * (1 - (lane >> 4)));"),
    "cdna_mfma": ("cdna_mfma", "rf_mma_k_first(int lane) { return 4 * (lane >> 4); }",
                  "rf_mma_k_first(int lane) { return 4 * (lane & 3); }"),
    "rdna3_wmma": ("rdna3_wmma", "return 2 * i + (lane >> 4); }", "return 8 * (lane >> 4) + i; }"),
    "rdna4_wmma": ("rdna4_wmma", "rf_mma_acc_row(int lane, int i) { return 8 * (lane >> 4) + i; }",
                   "rf_mma_acc_row(int lane, int i) { return 2 * i + (lane >> 4); }"),
}


@pytest.mark.parametrize("fault", PLANTED)
def test_a_wrong_fragment_layout_is_caught(fault, tmp_path):
    kind, old, new = PLANTED[fault]
    harness = build_mma_harnesses(tmp_path, (kind,), kernel_edit=lambda text: text.replace(old, new))[kind]
    rng = np.random.default_rng(5)
    # Q4_0 in 64-token tiles: the shared-tile path on every kind (NVIDIA's decode batches, 32-token tiles, take the
    # fragment path).
    excess = worst_excess(harness, "q4_0", 64, 256, 64, 64, None, rng, tmp_path)
    assert excess > 10.0, f"{fault}: the planted layout fault went unnoticed ({excess:.3g} x the bound)"


# Faults of NVIDIA's fragment path (K-quant decode batches; 32 tokens take its staged entry, 8 its direct
# one): staged x in the wrong k order, direct x at the wrong k positions or of the wrong token, the A
# fragment's rows and k halves crossed, results written to the wrong token, Q6_K's scale of the wrong 16
# elements, the direct Q4_K item's second super-block decoded with the first one's weights (superblock_item).
FRAGMENT_FAULTS = {
    "staged x in the wrong k order": ("q4_k", 32, "return 16 * (2 * half + ((c >> 2) & 1)) + 4 * (c >> 3) + (c & 3);",
                                      "return 16 * (half + 2 * ((c >> 2) & 1)) + 4 * (c >> 3) + (c & 3);"),
    "direct x at the wrong k positions": ("q4_k", 8, "return 32 * (s >> 1) + 8 * t + 4 * (s & 1);",
                                          "return 32 * (s & 1) + 8 * t + 4 * (s >> 1);"),
    "direct x of the wrong token": ("q6_k", 7, "const int token = kStaged ? v / kXPerToken : g;",
                                    "const int token = kStaged ? v / kXPerToken : 0;"),
    "A's rows and k halves crossed": ("q5_k", 32, "fa[4] = {pairs[0][2 * s], pairs[1][2 * s], pairs[0][2 * s + 1], pairs[1][2 * s + 1]};",
                                      "fa[4] = {pairs[0][2 * s], pairs[0][2 * s + 1], pairs[1][2 * s], pairs[1][2 * s + 1]};"),
    "the wrong token": ("q4_k", 32, "t0 + 8 * j + 2 * t + (e & 1), acc[4 * j + e]);", "t0 + 8 * j + 2 * t + (e >> 1), acc[4 * j + e]);"),
    "Q6_K's scale of the wrong elements": ("q6_k", 8, "r.scale_a = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * u + (t >> 1)];",
                                           "r.scale_a = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * u + (t & 1)];"),
    # (768 columns: with two super-blocks the last load refills both buffers with the second)
    "a direct super-block decoded from the other buffer": ("q4_k", 8, "    run(blk[1], sb + 256);",
                                                           "    run(blk[0], sb + 256);", 768),
}


def nvidia_excess_with(old: str, new: str, weight_type: str, n_tokens: int, seed: int, tmp_path,
                       cols: int = 512) -> float:
    """worst_excess of a 64 x cols product of n_tokens on NVIDIA's harness built with `old` replaced by `new`
    in matmul_mma's sources (kernels/matmul_mma.hip and the parts it includes)."""
    return worst_excess(nvidia_harness_with(old, new, tmp_path), weight_type, 64, cols, n_tokens, 32, None,
                        np.random.default_rng(seed), tmp_path)


@pytest.mark.parametrize("fault", FRAGMENT_FAULTS)
def test_a_broken_fragment_path_is_caught(fault, tmp_path):
    weight_type, n_tokens, old, new, *cols = FRAGMENT_FAULTS[fault]
    excess = nvidia_excess_with(old, new, weight_type, n_tokens, 29, tmp_path, *cols)
    assert excess > 10.0, f"{fault}: the planted fault went unnoticed ({excess:.3g} x the bound)"


# Faults of the K-quants' packed-f16 decoders (kernels/matmul_mma.hip Wide, Wide6), each plausible and each
# off by O(|w x|) somewhere: two columns of a pair swapped, the min added instead of subtracted, the two top
# bits of sub-blocks 4..7's scales shifted into the wrong place, Q5_K's fifth bit taken from the neighbouring
# sub-block, Q6_K's codes centred on 31 instead of 32 in one lane, the sign of a Q6_K scale dropped.
DECODE_FAULTS = {
    "columns of a pair swapped": ("q4_k", "out[1] = rf_byte_perm(w, 0x64646464u, 0x4342u);",
                                  "out[1] = rf_byte_perm(w, 0x64646464u, 0x4243u);"),
    "the min added": ("q4_k", "rf_byte_perm(head.x, 0u, 0x3232u) ^ 0x80008000u;", "rf_byte_perm(head.x, 0u, 0x3232u);"),
    "a scale's top bits of the wrong place": ("q4_k", "(c & 0x0f0fu) | ((a & 0xc0c0u) >> 2)", "(c & 0x0f0fu) | ((a & 0xc0c0u) >> 4)"),
    "a Q6_K scale's sign dropped": ("q6_k", "f16_pair(d * (float)r.scale_a)", "f16_pair(d * (float)(r.scale_a & 0x7f))"),
    "the fifth bit of the next sub-block": ("q5_k", "lo |= ((h >> (2 * c)) & kByteOnes) << 4;",  # block_format_q5_k.h
                                            "lo |= ((h >> (2 * c + 1)) & kByteOnes) << 4;"),
    "a Q6_K lane centred on 31": ("q6_k", "k1056 = 0x64206420u;", "k1056 = 0x641f6420u;"),
}


@pytest.mark.parametrize("fault", DECODE_FAULTS)
def test_a_broken_packed_decode_is_caught(fault, tmp_path):
    weight_type, old, new = DECODE_FAULTS[fault]
    excess = nvidia_excess_with(old, new, weight_type, 16, 23, tmp_path)  # 16 tokens: the staged entry
    # The ordinary check fails above 1; a one-code shift of half of Q6_K's columns lands near 8 here.
    assert excess > 2.0, f"{fault}: the planted decode fault went unnoticed ({excess:.3g} x the bound)"


# ---- The 32-element block formats and F16 on NVIDIA's fragment path (kernels/matmul_mma_block32_fragments.h) ----

# (rows, cols, n_tokens, grid or None, splits, accumulate): 32 tokens staged over three steps of two blocks, a batch
# of 8 split and added (the direct entry), one token, a row tile cut short in one workgroup looping over the tiles,
# 20 tokens split four ways by two workgroups.
BLOCK32_FRAGMENT_CASES = [(64, 192, 32, None, 1, False), (130, 256, 8, None, 3, True), (40, 128, 1, None, 1, False),
                          (130, 128, 13, 1, 1, False), (72, 512, 20, 2, 4, False)]


@pytest.mark.parametrize("weight_type", matmul_mma.PAIR32_FRAGMENT_TYPES)
def test_the_block_formats_fragment_path_matches_the_reference(mma_harnesses, weight_type, tmp_path):
    assert matmul_mma.entry_name("sm_90", weight_type, 32, 8, cols=128) == f"matmul_mma_direct_{weight_type}"
    assert matmul_mma.entry_name("sm_90", weight_type, 32, 9, cols=128) == f"matmul_mma_fragments_{weight_type}"
    # Columns that are not whole steps of two blocks keep the shared tiles.
    assert matmul_mma.entry_name("sm_90", weight_type, 32, 8, cols=96) == f"matmul_mma_{weight_type}"
    rng = np.random.default_rng([13, ord(weight_type[1]), ord(weight_type[-1])])
    for rows, cols, n_tokens, grid, splits, accumulate in BLOCK32_FRAGMENT_CASES + [(64, 96, 8, None, 1, False)]:
        excess = worst_excess(mma_harnesses["nvidia_mma"], weight_type, rows, cols, n_tokens, 32, grid, rng, tmp_path,
                              splits=splits, accumulate=accumulate)
        assert excess <= 1.0, (f"{weight_type} {rows}x{cols} tokens {n_tokens} splits {splits} accumulate {accumulate}: "
                               f"{excess:.3g} x the bound")


# Faults of the block formats' lane decoders, each off by O(|w x|) somewhere: Q4_0's nibbles of the other lanes,
# Q8_0's codes read unsigned, Q5_0's and Q5_1's fifth bits of the neighbouring pair, or of lane 0's columns in
# every lane, Q4_1's min left out, a step's second block decoded as its first, the words of a step's first block (at 2
# mod 4) joined the wrong way, F16's halves of the neighbouring lane, BF16's two values of a word swapped.
BLOCK32_FAULTS = {
    "Q4_0's nibbles of the other lanes": ("q4_0", 8, "shift = 4u * (unsigned int)(t >> 1);",
                                          "shift = 4u * (unsigned int)(t & 1);"),
    "Q8_0's codes read unsigned": ("q8_0", 16, "r.q.word(p >> 1) ^ 0x80808080u", "r.q.word(p >> 1)"),
    "a fifth bit of the neighbouring pair": ("q5_1", 8, "fifth_bit_pair(h >> (2 * p))", "fifth_bit_pair(h >> (2 * p + 1))"),
    "lane 0's fifth bits in every lane": ("q5_0", 16, "b[B::kQhAt + t], CodeWords", "b[B::kQhAt], CodeWords"),
    "Q4_1's min left out": ("q4_1", 8, "rf_h2_fma(code_pair(codes, k1024, 0), d, m)",
                            "rf_h2_mul(code_pair(codes, k1024, 0), d)"),
    "the second block decoded as the first": ("q8_0", 8, "L::decode(r.second, t, pairs + 4);",
                                              "L::decode(r.first, t, pairs + 4);"),
    "a first block's words joined the wrong way": ("q4_0", 16, "(w[i] >> 16) | (w[i + 1] << 16)",
                                                   "(w[i] << 16) | (w[i + 1] >> 16)"),
    "F16's halves of the neighbouring lane": ("f16", 16, "reinterpret_cast<const uint4*>(b + 16 * t)",
                                              "reinterpret_cast<const uint4*>(b + 16 * (t ^ 1))"),
    "BF16's two values of a word swapped": ("bf16", 8, "out[p] = BF16::narrow(r.w[p]);",
                                            "out[p] = BF16::narrow((r.w[p] << 16) | (r.w[p] >> 16));"),
}


@pytest.mark.parametrize("fault", BLOCK32_FAULTS)
def test_a_broken_block_format_fragment_is_caught(fault, tmp_path):
    weight_type, n_tokens, old, new = BLOCK32_FAULTS[fault]
    excess = nvidia_excess_with(old, new, weight_type, n_tokens, 31, tmp_path)
    assert excess > 10.0, f"{fault}: the planted fault went unnoticed ({excess:.3g} x the bound)"


def test_a_broken_bf16_tile_decode_is_caught(tmp_path):
    """The shared tiles' BF16 (matmul_mma_formats.h, 96 columns: not whole fragment steps) with two words of a group
    stored in each other's place."""
    assert matmul_mma.entry_name("sm_90", "bf16", 32, 16, cols=96) == "matmul_mma_bf16"
    harness = nvidia_harness_with("uint4{BF16::narrow(r.x), BF16::narrow(r.y),",
                                  "uint4{BF16::narrow(r.y), BF16::narrow(r.x),", tmp_path)
    excess = worst_excess(harness, "bf16", 64, 96, 16, 32, None, np.random.default_rng(37), tmp_path)
    assert excess > 10.0, f"the planted BF16 decode fault went unnoticed ({excess:.3g} x the bound)"


# ---- SwiGLU pairs (matmul_mma_swiglu_<type>: a prompt step's gate and up in one launch) -----------------

def swiglu_excess(harness, weight_type: str, rows: int, cols: int, n_tokens: int, grid, rng, tmp_path,
                  tile: int = 64) -> float:
    """max |got - want| / bound over h16 = silu(gate) * up and the gate and up products of one pair launch on
    f16 x (<= 1 passes; an output left unwritten, NaN as the harness fills it, counts as infinitely far), the
    bounds matmul_mma_swiglu.swiglu_error_bound's. The pair's counters must be left at zero."""
    gate_raw, up_raw = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    x = rng.standard_normal((n_tokens, cols)).astype(np.float16)
    np.concatenate([gate_raw.reshape(-1), up_raw.reshape(-1)]).tofile(tmp_path / "w")
    x.tofile(tmp_path / "x")
    tiles = matmul_mma.tile_count(rows, n_tokens, tile)
    run_mma(harness, matmul_mma_swiglu.swiglu_entry(weight_type), grid or 2 * tiles, matmul_mma.THREADS, rows, cols, n_tokens,
            tile, 1, 0, matmul_mma.COUNTER_BYTES, tmp_path / "w", tmp_path / "x", "-", tmp_path / "y", tmp_path / "ws")
    raw_out = np.fromfile(tmp_path / "y", np.uint8)
    n = n_tokens * rows
    got = [raw_out[:2 * n].view(np.float16).astype(np.float64).reshape(n_tokens, rows)]
    got += list(raw_out[2 * n:].view(np.float32).astype(np.float64).reshape(2, n_tokens, rows))
    x32 = x.astype(np.float32)
    want = matmul_mma_swiglu.swiglu_reference(gate_raw, up_raw, weight_type, x32, rows, cols)
    bounds = matmul_mma_swiglu.swiglu_error_bound(gate_raw, up_raw, weight_type, x32, rows, cols)
    counters = np.fromfile(tmp_path / "ws", np.int32)
    assert not counters.any(), f"{weight_type} pair: the counters were not left at zero"
    excess = [np.where(np.isfinite(g), np.abs(g - w) / b, np.inf) for g, w, b in zip(got, want, bounds)]
    return float(max(np.max(e) for e in excess))


# (rows, cols, n_tokens, grid or None, tile): a row tile and a token tile cut short, one workgroup per item
# (the up tile of each pair ends it); three workgroups looping over the items (either of a pair ends it); one
# workgroup for all; 32-token tiles.
SWIGLU_CASES = [(130, 512, 70, None, 64), (130, 512, 70, 3, 64), (64, 256, 64, 1, 64), (72, 256, 40, None, 32)]


@pytest.mark.parametrize("kind", MMA_KINDS)
@pytest.mark.parametrize("weight_type", matmul_mma_swiglu.SWIGLU_TYPES)
def test_swiglu_pairs_match_the_reference(mma_harnesses, kind, weight_type, tmp_path):
    rng = np.random.default_rng([13, len(kind), ord(kind[0]), ord(weight_type[1])])
    for rows, cols, n_tokens, grid, tile in SWIGLU_CASES:
        excess = swiglu_excess(mma_harnesses[kind], weight_type, rows, cols, n_tokens, grid, rng, tmp_path, tile)
        assert excess <= 1.0, f"{kind} {weight_type} {rows}x{cols} tokens {n_tokens} grid {grid}: {excess:.3g} x the bound"


# NVIDIA's 128-token tiles (x16_128: the only kind with them): tiles cut short; one workgroup looping, the residual
# added; three uneven splits of a tile's columns, the residual added.
WIDE_X16_CASES = {"nvidia_mma": ((130, 512, 150, 128, None, 1, False), (72, 256, 140, 128, 1, 1, True),
                                 (130, 512, 150, 128, None, 3, True))}


@pytest.mark.parametrize("kind", MMA_KINDS)
@pytest.mark.parametrize("weight_type", matmul_mma.X16_TYPES)
def test_f16_x_products_match_the_reference(mma_harnesses, kind, weight_type, tmp_path):
    """matmul_mma_x16: both tile sizes, tiles cut short, a small grid looping, splits with the residual add; the
    x16_128 entries' 128-token tiles (NVIDIA's) cut short and looped over by one workgroup with the residual add."""
    rng = np.random.default_rng([19, len(kind), ord(kind[0]), ord(weight_type[1])])
    for rows, cols, n_tokens, tile, grid, splits, accumulate in ((130, 512, 70, 64, None, 1, False),
                                                                  (64, 256, 33, 32, None, 1, False),
                                                                  (130, 512, 100, 64, 3, 1, True),
                                                                  (130, 512, 20, 32, None, 3, True),
                                                                  *WIDE_X16_CASES.get(kind, ())):
        excess = worst_excess(mma_harnesses[kind], weight_type, rows, cols, n_tokens, tile, grid, rng, tmp_path,
                              splits=splits, accumulate=accumulate, x_f16=True)
        assert excess <= 1.0, f"{kind} {weight_type} {rows}x{cols} tokens {n_tokens} tile {tile}: {excess:.3g} x the bound"


@pytest.mark.parametrize("weight_type", matmul_mma.X16_WIDE_ONLY_TYPES)
def test_the_block_formats_f16_x_128_token_tiles_match_the_reference(mma_harnesses, weight_type, tmp_path):
    """The block formats' and F16's only f16-x entries (matmul_mma_x16_128_<type>, NVIDIA): the wide cases above."""
    rng = np.random.default_rng([37, ord(weight_type[1]), ord(weight_type[-1])])
    for rows, cols, n_tokens, tile, grid, splits, accumulate in WIDE_X16_CASES["nvidia_mma"]:
        excess = worst_excess(mma_harnesses["nvidia_mma"], weight_type, rows, cols, n_tokens, tile, grid, rng, tmp_path,
                              splits=splits, accumulate=accumulate, x_f16=True)
        assert excess <= 1.0, f"{weight_type} {rows}x{cols} tokens {n_tokens} splits {splits}: {excess:.3g} x the bound"


# ---- the up product with the SwiGLU in its epilogue (matmul_mma_silu_up_<type>, 128-token tiles) ----------

def silu_up_excess(harness, weight_type: str, rows: int, cols: int, n_tokens: int, grid, rng, tmp_path,
                   activation: str = "silu") -> float:
    """max |got - want| / bound of h16 = silu(gate) * up (activation "gelu": gelu(gate) * up) from one
    matmul_mma_silu_up launch on f16 x, the gate given as the reference's float32 gate product (<= 1 passes; an h16
    left unwritten, NaN, is infinitely far); the bound matmul_mma_swiglu.silu_up_error_bound's."""
    gated = matmul_mma_swiglu.ACTIVATIONS[activation][1]
    gate_raw, up_raw = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    x = rng.standard_normal((n_tokens, cols)).astype(np.float16)
    x32 = x.astype(np.float32)
    up_raw.tofile(tmp_path / "w")
    x.tofile(tmp_path / "x")
    gate = matmul_mma.reference(gate_raw, weight_type, x32, rows, cols).astype(np.float32)
    gate.tofile(tmp_path / "gate")
    tiles = matmul_mma.tile_count(rows, n_tokens, matmul_mma.WIDE_TILE_TOKENS)
    run_mma(harness, matmul_mma_swiglu.gated_up_entry(weight_type, activation), grid or tiles, matmul_mma.THREADS, rows, cols, n_tokens,
            matmul_mma.WIDE_TILE_TOKENS, 1, 0, 0, tmp_path / "w", tmp_path / "x", tmp_path / "gate", tmp_path / "y",
            tmp_path / "ws")
    got = np.fromfile(tmp_path / "y", np.float16).astype(np.float64).reshape(n_tokens, rows)
    _, g, u = matmul_mma_swiglu.swiglu_reference(gate_raw, up_raw, weight_type, x32, rows, cols)
    want = gated(g, u)
    bound = matmul_mma_swiglu.silu_up_error_bound(gate_raw, up_raw, weight_type, x32, rows, cols, activation)
    return float(np.max(np.where(np.isfinite(got), np.abs(got - want) / bound, np.inf)))


@pytest.mark.parametrize("weight_type", matmul_mma_swiglu.SILU_UP_TYPES)
def test_the_up_product_with_the_swiglu_matches_the_reference(mma_harnesses, weight_type, tmp_path):
    """NVIDIA's mma (the entry's only kind): a row tile and a token tile cut short, one workgroup per tile; then
    one workgroup looping over four."""
    rng = np.random.default_rng([23, ord(weight_type[1])])
    for rows, cols, n_tokens, grid in ((130, 512, 150, None), (72, 256, 140, 1)):
        excess = silu_up_excess(mma_harnesses["nvidia_mma"], weight_type, rows, cols, n_tokens, grid, rng, tmp_path)
        assert excess <= 1.0, f"{weight_type} {rows}x{cols} tokens {n_tokens} grid {grid}: {excess:.3g} x the bound"


@pytest.mark.parametrize("weight_type", matmul_mma_swiglu.GELU_UP_TYPES)
def test_the_up_product_with_the_geglu_matches_the_reference(mma_harnesses, weight_type, tmp_path):
    """matmul_mma_gelu_up_<type> (Gemma's GeGLU): gelu(gate) * up within the GeGLU bound."""
    rng = np.random.default_rng([29, ord(weight_type[1])])
    excess = silu_up_excess(mma_harnesses["nvidia_mma"], weight_type, 130, 512, 150, None, rng, tmp_path, "gelu")
    assert excess <= 1.0, f"{weight_type}: {excess:.3g} x the bound"


# Faults of the wide SwiGLU: silu of the up product instead of the gate's, the gate read at the token's first row.
# (A 128-token entry built with other tiles is no fault: the grid-stride loop covers every tile of any size.)
SILU_UP_FAULTS = {
    "silu of up": ("rf_float_to_f16(rf_gated(g, up, kGelu))", "rf_float_to_f16(rf_gated(up, g, kGelu))"),
    "the gate of the first token": ("const float g = a.y[at];", "const float g = a.y[r];"),
}
# A fault of the GeGLU measure: the activation left out (silu where the GeGLU entry asks gelu).
GELU_UP_FAULTS = {"the activation ignored": ("rf_float_to_f16(rf_gated(g, up, kGelu))",
                                             "rf_float_to_f16(rf_gated(g, up, false))")}


# Faults of the pairs and of f16 x: the gate's tile taken for up's, no item of a pair ending it, silu of the up
# product instead of the gate's, the pair's counter not reset, both items reading the gate's weights, f16
# x read a token's row too far on (float32's row stride).
SWIGLU_FAULTS = {
    "the gate's tile read as up's": ("u = load_partial(a.y_up + i);", "u = load_partial(a.y + i);"),
    "nobody ends a pair": ("*last = atomicAdd(counters + tile, 1) == 1;", "*last = atomicAdd(counters + tile, 1) == 2;"),
    "silu of up": ("a.h16[i] = rf_float_to_f16(rf_silu_gated(g, u));", "a.h16[i] = rf_float_to_f16(rf_silu_gated(u, g));"),
    "f16 x at float32's row stride": ("* cols * XIn::kBytes;", "* cols * 4;"),
    "counter not reset": ("if (tid == 0) counters[tile] = 0;  // the pair's counter, ready for the next launch", ""),
    "gate's weights twice": ("const unsigned char* W = product ? a.W_up : a.W;", "const unsigned char* W = a.W;"),
}


# Each kind of SwiGLU's faults, its seed and its measure: the pair's (a small grid looping over its items), the
# wide SwiGLU's (128-token tiles cut short).
SWIGLU_KINDS = {
    "pair": (SWIGLU_FAULTS, 17, lambda harness, rng, path: swiglu_excess(harness, "q4_k", 130, 512, 70, 3, rng, path)),
    "wide": (SILU_UP_FAULTS, 31, lambda harness, rng, path: silu_up_excess(harness, "q4_k", 130, 512, 150, None, rng, path)),
    "wide GeGLU": (GELU_UP_FAULTS, 37,
                   lambda harness, rng, path: silu_up_excess(harness, "q4_k", 130, 512, 150, None, rng, path, "gelu")),
}


@pytest.mark.parametrize("kind,fault", [(kind, fault) for kind, (faults, _, _) in SWIGLU_KINDS.items() for fault in faults])
def test_a_broken_swiglu_is_caught(kind, fault, tmp_path):
    faults, seed, measure = SWIGLU_KINDS[kind]
    harness = nvidia_harness_with(*faults[fault], tmp_path)
    rng = np.random.default_rng(seed)
    assert_caught(fault, lambda: measure(harness, rng, tmp_path))

