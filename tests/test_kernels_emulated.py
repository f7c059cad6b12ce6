"""The HIP kernels themselves, run on the CPU under a host emulation of the kernel language
(tests/support/emulated_kernels.py), against the numpy references: CI has no GPU, but it can still catch a
wrong index, block layout, reduction or grid-stride loop in kernels/*.hip. This file: the single ops
and sampling (rmsnorm's entries: test_kernels_emulated_rmsnorm.py); test_kernels_emulated_fused.py the fused products; test_kernels_emulated_forward.py the
lookups, KV store and attention. The geometry is what the launchers choose, plus deliberately small
grids. Tolerances are those of the GPU tier (tests/gpu/test_ops_gpu.py), where they are justified.
"""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import add, add_bias, argmax, matmul, matvec, rope, sample, silu_mul
from hipcore.ops.launch_checks import elementwise_grid, row_block
from hipcore.ops.weight_formats import column_multiple
from support.weight_samples import random_weights
from support.emulated_kernels import ARCH_FOR_WARP, U32, run, write_inputs
from support.rope_factors import factors_arg, far_factors


@pytest.mark.parametrize("weight_type", matvec.WEIGHT_TYPES)
def test_matvec(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1])])
    # Rows shorter than a warp's items, odd row counts (a half-full last pair), 576 and 1536 columns,
    # batches within one pass (2..8) and over several (9, 11) with remainders. The K-quants' rows are
    # 1, 2 or 6 super-blocks of 256.
    shapes = [(7, 32, 1), (33, 64, 1), (65, 576, 1), (20, 1536, 1), (5, 96, 2), (17, 576, 8), (9, 64, 11), (3, 32, 9)]
    if column_multiple(weight_type) == 256:
        shapes = [(7, 256, 1), (33, 512, 1), (20, 1536, 1), (5, 256, 2), (17, 512, 8), (3, 256, 9)]
    for rows, cols, batch in shapes:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        raw.tofile(tmp_path / "w")
        x.tofile(tmp_path / "x")
        want = matvec.reference(raw, weight_type, x, rows, cols)
        w_abs = np.abs(matvec.dequantize_rows(raw, weight_type, cols, np.float64))
        bound = (cols + 2) * U32 * (np.abs(x.astype(np.float64)) @ w_abs.T) + 1e-30
        grid, block = matvec.geometry(ARCH_FOR_WARP[warp], rows, batch)
        for g in sorted({grid, 1, 2}):  # the launcher's grid, and grids the kernel must loop over
            run(harnesses, warp, f"matvec_{weight_type}", g, block, rows, cols, batch, tmp_path / "w", tmp_path / "x",
                tmp_path / "y")
            got = np.fromfile(tmp_path / "y", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= bound), f"{rows}x{cols} batch {batch} grid {g}"


@pytest.mark.parametrize("weight_type", matmul.WEIGHT_TYPES)
def test_matmul(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1]), 7])
    block = column_multiple(weight_type)
    # (rows, cols, n_tokens, tile_tokens or None for the launcher's): tiles cut in both directions, exact
    # tiles, a single token, every tile shape, one and several column steps of 32 (and super-blocks).
    cases = [(70, block, 5, None), (64, 2 * block, 64, 64), (130, block, 33, 32), (3, block, 1, 16),
             (65, 3 * block if block == 32 else block, 17, None)]
    for rows, cols, n_tokens, tile in cases:
        raw = random_weights(rng, weight_type, rows, cols)
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        raw.tofile(tmp_path / "w")
        x.tofile(tmp_path / "x")
        want = matmul.reference(raw, weight_type, x, rows, cols)
        bound = matmul.error_bound(raw, weight_type, x, rows, cols)
        grid, threads, tile = matmul.geometry(rows, n_tokens, tile)
        for g in sorted({grid, 1}):  # the launcher's grid, and one workgroup looping over every tile
            run(harnesses, warp, f"matmul_{weight_type}", g, threads, rows, cols, n_tokens, tile, tmp_path / "w",
                tmp_path / "x", tmp_path / "y")
            got = np.fromfile(tmp_path / "y", np.float32).reshape(n_tokens, rows)
            assert np.all(np.abs(got - want) <= bound), f"{rows}x{cols} tokens {n_tokens} tile {tile} grid {g}"


def test_argmax(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for rows, n in [(1, 1), (3, 100), (2, 1025), (4, 5000)]:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        if n > 3:
            x[0, rng.choice(n, 3, replace=False)] = x.max() + 1  # a tie: the lowest index wins
        if rows > 2:
            x[1, [n - 1, n // 2]] = np.nan  # the first NaN wins
            x[2, :] = -np.inf  # all equal: index 0
        x.tofile(tmp_path / "x")
        run(harnesses, warp, "argmax_f32", rows, row_block(n, argmax.MAX_THREADS), n, tmp_path / "x", tmp_path / "o")
        assert np.array_equal(np.fromfile(tmp_path / "o", np.int32), argmax.reference(x)), f"{rows}x{n}"


@pytest.mark.parametrize("rope_type", ["norm", "neox"])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "freq_factors"])
def test_rope(harnesses, warp, with_factors, rope_type, tmp_path):
    rng = np.random.default_rng([warp, with_factors])
    for tokens, heads, head_dim, rope_dim, max_pos in [(3, 2, 64, 64, 4096), (2, 3, 6, 4, 100), (4, 1, 64, 32, 32768)]:
        first, second = rope.pair_slices(rope_dim, rope_type)
        x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
        positions = rng.integers(0, max_pos, tokens).astype(np.int32)
        factors = far_factors(rng, rope_dim) if with_factors else None
        x.tofile(tmp_path / "x")
        positions.tofile(tmp_path / "p")
        want = rope.reference(x, positions, rope_dim, 10000.0, 0.5, factors, rope_type)
        angle = rope.angles(positions, rope_dim, 10000.0, 0.5, factors)[:, None, :]
        pair = np.abs(x[..., first]).astype(np.float64) + np.abs(x[..., second])
        tol = pair * (32 * U32 * angle + 8 * U32) + 1e-30
        grid, block = elementwise_grid(tokens * heads * (rope_dim // 2))
        for g in sorted({grid, 1}):
            run(harnesses, warp, rope.ENTRIES[rope_type], g, block, tokens, heads, head_dim, rope_dim, 10000.0, 0.5,
                tmp_path / "x", tmp_path / "p", factors_arg(tmp_path, factors), tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(x.shape)
            for part in (first, second):
                assert np.all(np.abs(got[..., part] - want[..., part]) <= tol)
            assert np.array_equal(got[..., rope_dim:], x[..., rope_dim:])


def test_rope_modes_differ_where_the_pairs_do(harnesses, warp, tmp_path):
    """The NEOX kernel is not the NORM one: on the same input they agree only on what neither rotates."""
    rng = np.random.default_rng(warp)
    x = rng.standard_normal((2, 2, 8)).astype(np.float32)
    positions = np.array([3, 17], dtype=np.int32)
    out = {}
    for rope_type, entry in rope.ENTRIES.items():
        x.tofile(tmp_path / "x")
        positions.tofile(tmp_path / "p")
        run(harnesses, warp, entry, 1, 64, 2, 2, 8, 8, 10000.0, 1.0, tmp_path / "x", tmp_path / "p", "-",
            tmp_path / "o")
        out[rope_type] = np.fromfile(tmp_path / "o", np.float32).reshape(x.shape)
        want = rope.reference(x, positions, 8, 10000.0, 1.0, None, rope_type)
        assert np.abs(out[rope_type] - want).max() < 1e-5
    assert np.abs(out["norm"] - out["neox"]).max() > 0.1


def test_add_bias(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for rows, n in ((1, 1), (3, 40), (7, 300)):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        bias = (rng.standard_normal(n) * 3).astype(np.float32)
        grid, block = elementwise_grid(rows * n)
        for g in sorted({grid, 1}):
            x.tofile(tmp_path / "x")
            bias.tofile(tmp_path / "b")
            run(harnesses, warp, "add_bias_f32", g, block, rows, n, tmp_path / "x", tmp_path / "b", tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(rows, n)
            assert np.array_equal(got, add_bias.reference(x, bias))


def test_silu_mul_and_add(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    for n in (1, 300, 1000):
        gate = (rng.standard_normal(n) * 4).astype(np.float32)
        gate[0] = -1e30
        up = rng.standard_normal(n).astype(np.float32)
        gate.tofile(tmp_path / "a")
        up.tofile(tmp_path / "b")
        grid, block = elementwise_grid(n)
        for g in sorted({grid, 1}):
            run(harnesses, warp, "silu_mul_f32", g, block, n, tmp_path / "a", tmp_path / "b", tmp_path / "o")
            want = silu_mul.reference(gate, up)
            assert np.all(np.abs(np.fromfile(tmp_path / "o", np.float32) - want) <= 6 * U32 * np.abs(want) + 1e-30)
            run(harnesses, warp, "add_f32", g, block, n, tmp_path / "a", tmp_path / "b", tmp_path / "o")
            assert np.array_equal(np.fromfile(tmp_path / "o", np.float32), add.reference(gate, up))


# ---- sample.hip: the host sampler's rules on the device ----------------------------------------


def acceptable_picks(row, params, du_max=2e-6):
    """Tokens the reference picks when the draw and the top-p / min-p thresholds move by float32 rounding:
    the kernel sums in float32 where the host sums in float64, so at a boundary either side is right."""
    t, k, p, m, u = (float(v) for v in params)
    picks = set()
    for du in (-du_max, 0.0, du_max):
        for dp in (-2e-6, 0.0, 2e-6):
            for dm in (-2e-6, 0.0, 2e-6):
                picks.add(sample.pick(row, t, int(k), min(p + dp, 1.0) if p < 1 else 1.0, max(m + dm, 0.0) if m > 0 else 0.0,
                                      min(max(u + du, 0.0), 0.999999)))
    return picks


@pytest.mark.parametrize("vocab", [4096, 1001])
def test_sample_greedy_rows(harnesses, warp, vocab, tmp_path):
    """Greedy rows are numpy's argmax (the lowest id among equal maxima, the first NaN), whether a row is read four
    logits a load (16-byte aligned rows: every row of 4096; row 0 of 1001, with a one-logit tail) or one at a time
    (the other rows of 1001)."""
    rng = np.random.default_rng([warp, vocab])
    logits = (rng.standard_normal((8, vocab)) * 3).astype(np.float32)
    top = logits.max() + 1
    logits[0, [vocab - 1]] = top  # the largest logit in the tail (1001) or the last lane of the last load
    logits[1, [vocab - 2, 515, 6]] = top  # equal maxima in different threads and lanes: the lowest id
    logits[2, [9, 10, 11]] = top  # equal maxima in one load's lanes
    logits[3, [700, 40]] = np.nan  # the first NaN, before the largest value
    logits[4, :] = -np.inf
    logits[5, [vocab - 1, 3]] = np.nan
    logits[6, 1:] = logits[6, 0]  # one value everywhere: id 0
    params = np.zeros((8, 5), dtype=np.float32)  # temperature 0: greedy
    files = write_inputs(tmp_path, x=logits, p=params)
    for block in (64, 256):
        run(harnesses, warp, "sample_f32", len(params), block, vocab, *files, tmp_path / "o", 1, 0)
        got = np.fromfile(tmp_path / "o", np.int32)
        assert got.tolist() == [int(np.argmax(row)) for row in logits], f"vocab {vocab} block {block}"
    # Split over chunks (a workspace): every chunk count the launcher could pick for these rows, chunks past the
    # last logit (7 of 4096 -> 588 a chunk), and uneven ones; the counters are back at zero after each launch.
    for chunks in (2, 7, 64):
        nbytes = sample.workspace_bytes(len(params), chunks)
        run(harnesses, warp, "sample_f32", len(params) * chunks, 64, vocab, *files, tmp_path / "o", chunks, nbytes)
        got = np.fromfile(tmp_path / "o", np.int32)
        assert got[:len(params)].tolist() == [int(np.argmax(row)) for row in logits], f"vocab {vocab} chunks {chunks}"
        assert not got[len(params):].any(), f"counters left {got[len(params):]}"


@pytest.mark.parametrize("vocab", [4096, 1001])
def test_sample_whole_vocabulary_rows_split(harnesses, warp, vocab, tmp_path):
    """Whole-vocabulary rows without min-p (no top-k, no top-p: a server request with no sampling options) split
    over chunks as greedy rows are: the draw in token-id order across the chunks, the host's pick up to float32
    rounding at the draw, for draws spread over the distribution and at its ends, chunks past the last logit,
    rows with NaNs, a chunk or the whole row at -inf; rows with min-p or top-k stay one workgroup's and pick as
    without a workspace; the counters are back at zero."""
    rng = np.random.default_rng([warp, vocab, 7])
    base = (rng.standard_normal(vocab) * 2).astype(np.float32)
    draws = (np.arange(12) + 0.5) / 12
    logits = np.tile(base, (len(draws) + 7, 1))
    params = np.zeros((len(logits), 5), dtype=np.float32)
    params[:, 0], params[:, 2], params[:, 4] = 1.0, 1.0, rng.random(len(logits))
    params[:len(draws), 4] = draws  # 0-11: one row, draws across its distribution
    params[12, [0, 4]] = 0.7, 0.0  # the first token with a weight
    params[13, [0, 4]] = 1.5, 0.999999  # the end of the distribution
    logits[14, : vocab // 2] = -np.inf  # the first chunks carry no weight
    logits[15, rng.choice(vocab, 20, replace=False)] = np.nan  # NaNs have no weight
    logits[16, :] = -np.inf  # nothing has a weight: the last token, as the one-workgroup path picks
    params[17, 3] = 0.05  # min-p: one workgroup's
    params[18, 1] = 40  # top-k: one workgroup's
    files = write_inputs(tmp_path, x=logits, p=params)
    run(harnesses, warp, "sample_f32", len(params), 64, vocab, *files, tmp_path / "o", 1, 0)
    alone = np.fromfile(tmp_path / "o", np.int32)
    assert alone[16] == vocab - 1
    for chunks in (2, 7, 64):
        run(harnesses, warp, "sample_f32", len(params) * chunks, 64, vocab, *files, tmp_path / "o", chunks,
            sample.workspace_bytes(len(params), chunks))
        got = np.fromfile(tmp_path / "o", np.int32)
        assert not got[len(params):].any(), f"chunks {chunks}: counters left {got[len(params):]}"
        for i in (*range(16), 17, 18):
            row = np.where(np.isnan(logits[i]), -np.inf, logits[i])  # the device gives a NaN no weight
            assert int(got[i]) in acceptable_picks(row, params[i], du_max=1e-5), \
                f"vocab {vocab} chunks {chunks} row {i}: {got[i]}, draw {params[i, 4]}"
        assert got[16] == vocab - 1 and got[17] == alone[17] and got[18] == alone[18], got[16:]
        # in id order: the draws across the distribution pick ids that rise with the draw, over the whole range
        assert np.all(np.diff(got[:len(draws)]) >= 0) and got[0] < vocab // 4 and got[len(draws) - 1] > 3 * vocab // 4
        assert got[14] >= vocab // 2 and np.isfinite(logits[15, got[15]])


@pytest.mark.parametrize("vocab", [4096, 1001])
def test_sample_top_k_rows_split(harnesses, warp, vocab, tmp_path):
    """Rows with 1 <= top_k <= SPLIT_TOP_K (llama.cpp's sampling defaults among them) split over chunks: each
    chunk's own top k, then the row's among the chunks' candidates, in the same order and tie rule as one
    workgroup's selection, so the pick is one workgroup's exactly (and the host's, up to float32 rounding at the
    draw); ties at the k-th value across chunks keep the lowest ids; a top_k past SPLIT_TOP_K stays one
    workgroup's; rows with fewer finite logits than top_k; the counters are back at zero."""
    rng = np.random.default_rng([warp, vocab, 11])
    base = (rng.standard_normal(vocab) * 2).astype(np.float32)
    base[200:264] += 6.0  # the row's top 64 in few chunks: each must give all of its share, not a fair part
    draws = (np.arange(12) + 0.5) / 12
    logits = np.tile(base, (len(draws) + 8, 1))
    params = np.tile(np.array([0.8, 40, 0.95, 0.05, 0.0], dtype=np.float32), (len(logits), 1))  # llama.cpp's
    params[:, 4] = rng.random(len(logits))
    params[:len(draws), 4] = draws  # 0-11: one row, draws across its distribution
    params[12, :4] = 1.0, 1, 1.0, 0.0  # top-k 1
    params[13, :4] = 1.5, sample.SPLIT_TOP_K, 1.0, 0.0  # the largest split top-k, no other filter
    params[14, :4] = 1.5, sample.SPLIT_TOP_K + 1, 1.0, 0.0  # one workgroup's
    logits[15] = np.round(logits[15])  # ties everywhere: the k-th value cut through ties in every chunk
    params[15, :4] = 3.0, 40, 1.0, 0.0
    top = logits[16].max() + 1
    logits[16, rng.choice(vocab, 6, replace=False)] = top  # a six-way tie at the top, cut by k = 4
    params[16, :4] = 1.0, 4, 1.0, 0.0
    logits[17, :] = -np.inf
    logits[17, rng.choice(vocab, 10, replace=False)] = rng.standard_normal(10)  # 10 finite logits for k = 40
    params[17, 3] = 0.0
    params[18, 0] = 0.0  # greedy
    params[19, :4] = 1.0, 0, 1.0, 0.0  # the whole vocabulary
    files = write_inputs(tmp_path, x=logits, p=params)
    run(harnesses, warp, "sample_f32", len(params), 64, vocab, *files, tmp_path / "o", 1, 0)
    alone = np.fromfile(tmp_path / "o", np.int32)
    for i in range(19):
        assert int(alone[i]) in acceptable_picks(logits[i], params[i]), f"row {i}: {alone[i]}"
    picked_top = sorted(np.flatnonzero(logits[16] == top))[:4]  # the four lowest ids of the tie
    assert int(alone[16]) in picked_top and np.isfinite(logits[17, alone[17]])
    for chunks in (2, 7, 64):
        run(harnesses, warp, "sample_f32", len(params) * chunks, 64, vocab, *files, tmp_path / "o", chunks,
            sample.workspace_bytes(len(params), chunks))
        got = np.fromfile(tmp_path / "o", np.int32)
        assert not got[len(params):].any(), f"chunks {chunks}: counters left {got[len(params):]}"
        assert got[:19].tolist() == alone[:19].tolist(), f"vocab {vocab} chunks {chunks}: {got[:19]} != {alone[:19]}"
        assert int(got[19]) in acceptable_picks(logits[19], params[19], du_max=1e-5)
    # the draws across the distribution pick different candidates of the top 40, larger logits for smaller draws
    picked = logits[0, alone[:len(draws)]]
    assert len(set(alone[:len(draws)].tolist())) >= 3 and np.all(np.diff(picked) <= 0), picked


def test_sample(harnesses, warp, tmp_path):
    rng = np.random.default_rng(warp)
    vocab = 3000
    logits = (rng.standard_normal((13, vocab)) * 3).astype(np.float32)
    logits[3, rng.choice(vocab, 6, replace=False)] = logits[3].max() + 1  # six-way tie at the top: k = 4 cuts it
    logits[4, :] = np.round(logits[4])  # many ties everywhere
    logits[5, 100] = np.nan  # greedy row: the first NaN wins
    params = np.array([
        [0.8, 40, 0.95, 0.05, 0.0], [1.5, 1024, 1.0, 0.0, 0.0], [0.5, 5, 0.5, 0.0, 0.0], [1.0, 4, 1.0, 0.0, 0.0],
        [1.0, 30, 0.9, 0.0, 0.0], [0.0, 40, 0.95, 0.05, 0.0], [0.7, 1, 1.0, 0.0, 0.0], [2.0, 200, 0.8, 0.2, 0.0],
        [1.0, 64, 1.0, 0.5, 0.0], [1.2, 600, 0.99, 0.01, 0.0],
        # the whole vocabulary (no top-k, no top-p): drawn in id order, with min-p or without
        [1.0, 0, 1.0, 0.0, 0.0], [0.8, 0, 1.0, 0.05, 0.0], [1.5, -1, 1.0, 0.0, 0.0]], dtype=np.float32)
    params[:, 4] = rng.random(len(params))
    params[12, 4] = 0.999999  # the draw at the very end of the distribution: the last token with weight
    files = write_inputs(tmp_path, x=logits, p=params)
    for block in (64, 256):
        run(harnesses, warp, "sample_f32", len(params), block, vocab, *files, tmp_path / "o", 1, 0)
        got = np.fromfile(tmp_path / "o", np.int32)
        for i, (row, prm) in enumerate(zip(logits, params)):
            assert int(got[i]) in acceptable_picks(row, prm), f"row {i} block {block}: {got[i]}, params {prm}"
        assert got[5] == 100 and got[6] == int(np.argmax(logits[6]))
        # id order, not sorted order: the whole-vocabulary picks are spread over the ids as the draws are
        assert got[10] != int(np.argmax(logits[10])) and got[12] > vocab * 0.9, got[10:13]
    # With a workspace and 3 chunks a row: the greedy row and the whole-vocabulary rows without min-p (10, 12)
    # are split (those within rounding of the draw, as above), the others are their chunk 0's alone (the same
    # draws), and the counters are back at zero.
    run(harnesses, warp, "sample_f32", len(params) * 3, 256, vocab, *files, tmp_path / "o", 3,
        sample.workspace_bytes(len(params), 3))
    split = np.fromfile(tmp_path / "o", np.int32)
    one_workgroup = [i for i in range(len(params)) if i not in (10, 12)]  # top-k rows split too: the same picks
    assert split[one_workgroup].tolist() == got[one_workgroup].tolist() and not split[len(params):].any(), split
    for i in (10, 12):
        assert int(split[i]) in acceptable_picks(logits[i], params[i], du_max=1e-5), f"split row {i}: {split[i]}"
    # A vocabulary smaller than top_k: every token is a candidate.
    small = (rng.standard_normal((2, 50)) * 2).astype(np.float32)
    prm = np.array([[1.0, 1024, 1.0, 0.0, 0.3], [0.9, 100, 0.7, 0.1, 0.9]], dtype=np.float32)
    files = write_inputs(tmp_path, x=small, p=prm)
    run(harnesses, warp, "sample_f32", 2, 64, 50, *files, tmp_path / "o", 1, 0)
    got = np.fromfile(tmp_path / "o", np.int32)
    assert all(int(got[i]) in acceptable_picks(small[i], prm[i]) for i in range(2))


def _masked_sample_case(rng, vocab):
    """Rows of every path (greedy, top-k split and not, top-p, min-p, the whole vocabulary) under a random packed
    token mask (about a third allowed), one row allowing a single token, one allowing only tokens far below the
    row's largest logits."""
    rows = 10
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    params = np.array([
        [0.0, 0, 1.0, 0.0, 0.0], [0.8, 40, 0.95, 0.05, 0.0], [1.0, 200, 1.0, 0.0, 0.0], [0.7, 30, 0.8, 0.0, 0.0],
        [1.0, 0, 1.0, 0.0, 0.0], [0.9, 0, 1.0, 0.1, 0.0], [1.2, 64, 1.0, 0.0, 0.0], [0.0, 40, 0.95, 0.05, 0.0],
        [1.0, 0, 1.0, 0.0, 0.0], [0.8, 40, 0.95, 0.05, 0.0]], dtype=np.float32)
    params[:, 4] = rng.random(rows)
    allowed = rng.random((rows, vocab)) < 0.35
    allowed[7] = False
    allowed[7, rng.integers(vocab)] = True  # one token allowed: a greedy row must pick it
    order = np.argsort(logits[8])
    allowed[8] = False
    allowed[8, order[:20]] = True  # only the 20 smallest logits allowed
    allowed[9] = False
    allowed[9, order[:3]] = True  # fewer allowed than top_k
    packed = np.packbits(np.pad(allowed, ((0, 0), (0, sample.mask_words(vocab) * 32 - vocab))), axis=1,
                         bitorder="little").view(np.uint32)
    assert np.array_equal(sample.unpack_mask(packed, vocab), allowed)
    return logits, params, allowed, packed


def _masked_picks_wrong(harnesses, warp, vocab, logits, params, allowed, mask_file, tmp_path, chunks):
    """Rows whose pick is forbidden or not the host sampler's on the masked logits (up to float32 rounding)."""
    files = write_inputs(tmp_path, x=logits, p=params)
    nbytes = sample.workspace_bytes(len(params), chunks) if chunks > 1 else 0
    run(harnesses, warp, "sample_f32", len(params) * chunks, 64, vocab, *files, tmp_path / "o", chunks, nbytes,
        mask_file)
    got = np.fromfile(tmp_path / "o", np.int32)
    assert not got[len(params):].any(), f"counters left {got[len(params):]}"
    masked = np.where(allowed, logits, np.float32(-np.inf))
    return [i for i in range(len(params))
            if not allowed[i, got[i]] or int(got[i]) not in acceptable_picks(masked[i], params[i], du_max=1e-5)]


@pytest.mark.parametrize("vocab", [4096, 1001])
def test_sample_with_token_mask(harnesses, warp, vocab, tmp_path):
    """A grammar's packed token mask (llguidance's layout): every row's pick, one workgroup a row or split over
    chunks, is an allowed token and the host sampler's pick on the masked logits; the mask's bits read in reversed
    order within each word, or the mask ignored, are caught."""
    rng = np.random.default_rng([warp, vocab, 53])
    logits, params, allowed, packed = _masked_sample_case(rng, vocab)
    packed.tofile(tmp_path / "mask")
    for chunks in (1, 7):
        assert _masked_picks_wrong(harnesses, warp, vocab, logits, params, allowed, tmp_path / "mask", tmp_path,
                                   chunks) == [], f"chunks {chunks}"
    # the host twin (the cpu backend's kernel) picks the same way
    assert np.array_equal(sample.reference(logits, params, packed)[[0, 7]],
                          [int(np.argmax(np.where(allowed[i], logits[i], -np.inf))) for i in (0, 7)])
    # planted faults: bit 31 - b read for bit b, and no mask at all
    reversed_bits = np.packbits(np.unpackbits(packed.view(np.uint8), bitorder="little").reshape(-1, 32)[:, ::-1],
                                bitorder="little").view(np.uint32)
    reversed_bits.tofile(tmp_path / "reversed")
    for fault in (tmp_path / "reversed", "-"):
        for chunks in (1, 7):
            wrong = _masked_picks_wrong(harnesses, warp, vocab, logits, params, allowed, fault, tmp_path, chunks)
            assert len(wrong) >= len(params) // 2, f"{fault} chunks {chunks}: only rows {wrong} wrong"
