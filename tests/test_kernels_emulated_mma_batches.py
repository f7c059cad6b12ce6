"""The decode batches' one-launch entries of kernels/matmul_mma.hip on NVIDIA's fragment path, run on the CPU
against the emulated mma.sync (tests/kernel_emulation/emulation.h, 32 lanes): q, k and v of one x in one launch
(matmul_mma_qkv) and a SwiGLU's gate, up and silu in one launch (matmul_mma_swiglu's fragment entries), against
the numpy references within matmul_mma.error_bound and matmul_mma_swiglu.swiglu_error_bound; planted faults prove
that a misplaced tile, a wrong format, a dropped SwiGLU and crossed weights are caught."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import matmul_mma, matmul_mma_qkv, matmul_mma_swiglu
from support.emulated_kernels import assert_caught, build_mma_harnesses, nvidia_harness_with, run_mma
from support.weight_samples import random_weights


@pytest.fixture(scope="module")
def nvidia_harness(tmp_path_factory):
    return build_mma_harnesses(tmp_path_factory.mktemp("kernel_emulation_batches"), ("nvidia_mma",))["nvidia_mma"]


# The attention input's q|k|v in one launch (NVIDIA's fragment path): (types, rows, n_tokens, splits): the 32-token
# tiles with every row tile cut short and three splits; the direct entry (5 tokens) with four; Q6_K q and k with a
# Q4_K v, whole tiles, unsplit.
QKV_CASES = [(("q4_k", "q4_k", "q6_k"), (130, 36, 20), 9, 3), (("q5_k", "q5_k", "q6_k"), (64, 40, 140), 5, 4),
             (("q6_k", "q6_k", "q4_k"), (256, 128, 128), 32, 1)]


def qkv_worst_excess(harness, types, rows, n_tokens, splits, rng, tmp_path, cols: int = 512) -> float:
    """max |got - want| / bound over the three products of one matmul_mma_qkv launch (NaN: unwritten)."""
    raws = [random_weights(rng, t, r, cols) for t, r in zip(types, rows)]
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    (tmp_path / "w").write_bytes(b"".join(raw.tobytes() for raw in raws))
    x.tofile(tmp_path / "x")
    tile = 8 if n_tokens <= matmul_mma.DIRECT_MAX_TOKENS else 32
    tiles = sum(matmul_mma.tile_count(r, n_tokens, tile) for r in rows)
    ws_bytes = matmul_mma.partial_bytes(tiles, splits, 32) if splits > 1 else 0
    single = types[0] if types[0] in matmul_mma_qkv.SINGLE_TYPES else None
    grid, threads, used, entry = matmul_mma_qkv.qkv_geometry(rows, n_tokens, cols, ws_bytes, splits, single)
    assert used == splits
    codes = 0 if single else sum(matmul_mma_qkv.QKV_TYPE_CODES[t] << (4 * i) for i, t in enumerate(types))
    run_mma(harness, entry, grid, threads, ",".join(map(str, rows)), cols, n_tokens, codes, splits, 0, ws_bytes,
            tmp_path / "w", tmp_path / "x", "-", tmp_path / "y", tmp_path / "ws")
    got, at, worst = np.fromfile(tmp_path / "y", np.float32), 0, 0.0
    for raw, t, r in zip(raws, types, rows):
        part = got[at:at + n_tokens * r].reshape(n_tokens, r)
        at += n_tokens * r
        want = matmul_mma.reference(raw, t, x, r, cols)
        bound = matmul_mma.error_bound(raw, t, x, r, cols)
        worst = max(worst, float(np.max(np.where(np.isfinite(part), np.abs(part - want) / bound, np.inf))))
    if ws_bytes:
        counters = np.fromfile(tmp_path / "ws", np.int32)[:matmul_mma.COUNTER_BYTES // 4]
        assert not counters.any(), f"{types} {splits} splits: the counters were not left at zero"
    return worst


def test_qkv_in_one_launch_matches_the_reference(nvidia_harness, tmp_path):
    rng = np.random.default_rng(17)
    for types, rows, n_tokens, splits in QKV_CASES:
        excess = qkv_worst_excess(nvidia_harness, types, rows, n_tokens, splits, rng, tmp_path)
        assert excess <= 1.0, f"{types} rows {rows} tokens {n_tokens} splits {splits}: {excess:.3g} x the bound"


# The one-type entries (gpt-oss's Q8_0 q, k, v): the direct entry (8 tokens, 448 columns: 7 steps in three splits)
# and the 32-token tiles (9 tokens, unsplit), row tiles cut short.
@pytest.mark.parametrize("weight_type", matmul_mma_qkv.SINGLE_TYPES)
def test_qkv_of_one_type_in_one_launch_matches_the_reference(nvidia_harness, weight_type, tmp_path):
    rng = np.random.default_rng([18, len(weight_type), ord(weight_type[-1])])
    for rows, n_tokens, splits in [((136, 24, 24), 8, 3), ((64, 16, 40), 9, 1)]:
        excess = qkv_worst_excess(nvidia_harness, (weight_type,) * 3, rows, n_tokens, splits, rng, tmp_path, cols=448)
        assert excess <= 1.0, f"{weight_type} rows {rows} tokens {n_tokens} splits {splits}: {excess:.3g} x the bound"


@pytest.mark.parametrize("fault", ["v's tiles counted from k's", "Q4_K read as Q5_K",
                                   "one type's tiles numbered across all three"])
def test_a_wrong_qkv_item_is_caught(fault, tmp_path):
    old, new = {"v's tiles counted from k's": ("m == 1 ? first_k : first_v);", "m == 1 ? first_k : first_k);"),
                "Q4_K read as Q5_K": ("case 0: fragment_item<WideFragments<false>, TN>",
                                      "case 0: fragment_item<WideFragments<true>, TN>"),
                "one type's tiles numbered across all three": ("fragment_item<Single, TN>(a, tile, split, key,",
                                                               "fragment_item<Single, TN>(a, key, split, key,")}[fault]
    harness = nvidia_harness_with(old, new, tmp_path)
    rng = np.random.default_rng(19)
    if fault.startswith("one type"):  # k's and v's tiles read past their rows: nothing written
        assert_caught(fault, lambda: qkv_worst_excess(harness, ("q8_0",) * 3, (136, 24, 24), 8, 3, rng, tmp_path,
                                                      cols=448))
    else:
        assert_caught(fault, lambda: qkv_worst_excess(harness, *QKV_CASES[0][:2], 9, 3, rng, tmp_path))


# The fragment path's SwiGLU (gate, up and silu in one launch): (type, rows, n_tokens, splits): 32-token tiles, row
# tiles cut short, three splits; the direct entry unsplit; Q6_K's 32-token tiles, two splits.
SWIGLU_FRAGMENT_CASES = [("q4_k", 130, 9, 3), ("q5_k", 200, 6, 1), ("q6_k", 64, 20, 2)]


def swiglu_fragments_worst_excess(harness, weight_type, rows, n_tokens, splits, rng, tmp_path, cols: int = 512):
    """max over silu(gate) * up and the up product of |got - want| / bound of one launch (NaN: unwritten)."""
    w_gate, w_up = (random_weights(rng, weight_type, rows, cols) for _ in range(2))
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    (tmp_path / "w").write_bytes(w_gate.tobytes() + w_up.tobytes())
    x.tofile(tmp_path / "x")
    tile = 8 if n_tokens <= matmul_mma.DIRECT_MAX_TOKENS else 32
    ws_bytes = matmul_mma.partial_bytes(2 * matmul_mma.tile_count(rows, n_tokens, tile), splits, 32)
    grid, threads, used, entry = matmul_mma_swiglu.swiglu_fragments_geometry(weight_type, rows, n_tokens, cols,
                                                                             ws_bytes, splits)
    assert used == splits
    run_mma(harness, entry, grid, threads, rows, cols, n_tokens, 0, splits, 0, ws_bytes, tmp_path / "w",
            tmp_path / "x", "-", tmp_path / "y", tmp_path / "ws")
    got = np.fromfile(tmp_path / "y", np.float32).reshape(2, n_tokens, rows)
    want_h, _, want_u = matmul_mma_swiglu.swiglu_reference(w_gate, w_up, weight_type, x, rows, cols)
    bound_h, _, bound_u = matmul_mma_swiglu.swiglu_error_bound(w_gate, w_up, weight_type, x, rows, cols)
    counters = np.fromfile(tmp_path / "ws", np.int32)[:matmul_mma.COUNTER_BYTES // 4]
    assert not counters.any(), f"{weight_type} {splits} splits: the counters were not left at zero"
    return max(float(np.max(np.where(np.isfinite(g), np.abs(g - w) / b, np.inf)))
               for g, w, b in ((got[0], want_h, bound_h), (got[1], want_u, bound_u)))


def test_the_fragment_paths_swiglu_matches_the_reference(nvidia_harness, tmp_path):
    rng = np.random.default_rng(23)
    for weight_type, rows, n_tokens, splits in SWIGLU_FRAGMENT_CASES:
        excess = swiglu_fragments_worst_excess(nvidia_harness, weight_type, rows, n_tokens, splits, rng,
                                               tmp_path)
        assert excess <= 1.0, f"{weight_type} rows {rows} tokens {n_tokens} splits {splits}: {excess:.3g} x the bound"


@pytest.mark.parametrize("fault", ["the pair's SwiGLU left out", "up for gate"])
def test_a_wrong_swiglu_pair_is_caught(fault, tmp_path):
    old, new = {"the pair's SwiGLU left out": ("  if constexpr (kPair) swiglu_pair<TN, true>(*pair, pair_key, r0, t0, tid, last);\n",
                                               ""),
                "up for gate": ("const Launch own = {product ? a.y_up : a.y, product ? a.W_up : a.W,",
                                "const Launch own = {product ? a.y_up : a.y, a.W_up,")}[fault]
    harness = nvidia_harness_with(old, new, tmp_path)
    rng = np.random.default_rng(29)
    assert_caught(fault, lambda: swiglu_fragments_worst_excess(harness, "q4_k", 130, 9, 3, rng, tmp_path))
