"""kernels/moe_route.hip and kernels/moe_experts.hip run on the CPU under the host emulation at wave 32 and wave 64
(tests/kernel_emulation/harness_moe.cpp), against hipcore/ops/moe_route.py's and moe_experts.py's float64
references and their bounds; planted faults (a misread MXFP4 sign, the down sum's weights dropped) must be caught."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import moe_experts, moe_route
from hipcore.ops.weight_formats import column_multiple
from support.emulated_kernels import ARCH_FOR_WARP, build_op_harnesses, run, write_inputs
from support.weight_samples import random_weights

OPS = ("moe_route", "moe_experts")
HARNESS = "harness_moe.cpp"
U32 = 2.0**-24


@pytest.fixture(scope="module")
def moe_harnesses(tmp_path_factory):
    return build_op_harnesses(tmp_path_factory.mktemp("moe_emulation"), OPS, HARNESS)


@pytest.mark.parametrize("mode,normalize", [("softmax_topk", True), ("softmax_topk", False), ("topk_softmax", False)])
def test_route(moe_harnesses, warp, mode, normalize, tmp_path):
    rng = np.random.default_rng([warp, len(mode), int(normalize)])
    for tokens, n_expert, k in [(3, 128, 8), (5, 32, 4), (2, 256, 32), (1, 7, 7), (9, 64, 1)]:
        logits = (rng.standard_normal((tokens, n_expert)) * 4).astype(np.float32)
        logits[0, 5] = logits[0, 2] = logits[0].max() + 1  # a tie for the first place
        logits[-1, 0] = np.nan  # never chosen (ggml would rank it anywhere)
        (path,) = write_inputs(tmp_path, logits=logits)
        want_ids, want_weights = moe_route.reference(np.where(np.isnan(logits), -np.inf, logits), k, mode, normalize)
        grid, block = moe_route.geometry(ARCH_FOR_WARP[warp], tokens)
        for g in sorted({grid, 1}):
            run(moe_harnesses, warp, "moe_route_f32", g, block, tokens, n_expert, k, moe_route.MODES[mode],
                int(normalize), path, "-", tmp_path / "ids", tmp_path / "weights")
            ids = np.fromfile(tmp_path / "ids", np.int32).reshape(tokens, k)
            weights = np.fromfile(tmp_path / "weights", np.float32).reshape(tokens, k)
            assert np.array_equal(ids, want_ids), (tokens, n_expert, k, g)
            assert np.all(np.abs(weights - want_weights) <= moe_route.error_bound(logits, want_weights)), (tokens, k)
            assert want_ids[0, :2].tolist() == [2, 5][:k]


def test_route_adds_the_router_bias(moe_harnesses, warp, tmp_path):
    """With a bias the choice and weights are those of the logits plus the bias (add_bias's sum, the same bits as
    routing a biased copy); a bias that changes the winner proves it is read, and the planted fault (the bias left
    out) chooses other experts."""
    rng = np.random.default_rng([warp, 41])
    tokens, n_expert, k = 6, 32, 4
    logits = rng.standard_normal((tokens, n_expert)).astype(np.float32)
    bias = (rng.standard_normal(n_expert) * 3).astype(np.float32)
    biased_path, plain_path, bias_path = write_inputs(tmp_path, biased=logits + bias, plain=logits, bias=bias)
    grid, block = moe_route.geometry(ARCH_FOR_WARP[warp], tokens)
    outputs = []
    for path, bias_file in ((plain_path, bias_path), (biased_path, "-"), (plain_path, "-")):
        run(moe_harnesses, warp, "moe_route_f32", grid, block, tokens, n_expert, k, moe_route.MODES["topk_softmax"], 0,
            path, bias_file, tmp_path / "ids", tmp_path / "weights")
        outputs.append(((tmp_path / "ids").read_bytes(), (tmp_path / "weights").read_bytes()))
    with_bias, routed_biased, without = outputs
    assert with_bias == routed_biased
    assert with_bias[0] != without[0], "the bias changed no choice: it was not read"


def expert_files(tmp_path, rng, weight_type, n_expert, rows, cols, name):
    raw = random_weights(rng, weight_type, n_expert * rows, cols)
    raw.tofile(tmp_path / name)
    return raw, tmp_path / name


def run_gate_up(harnesses, warp, tmp_path, rng, weight_type, tokens, k, ff, hidden, n_expert, activation, biases,
                grid=None, grouped=False):
    gate, gate_path = expert_files(tmp_path, rng, weight_type, n_expert, ff, hidden, "gate")
    up, up_path = expert_files(tmp_path, rng, weight_type, n_expert, ff, hidden, "up")
    x = (rng.standard_normal((tokens, hidden)) * rng.choice([1e-2, 1.0, 4.0], (tokens, hidden))).astype(np.float32)
    x[0, :32] = 0.0  # a zero slice
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    bias = [(rng.standard_normal((n_expert, ff)) * 2).astype(np.float32) if biases else None for _ in range(2)]
    paths = write_inputs(tmp_path, x=x, ids=ids, **{f"b{i}": b for i, b in enumerate(bias) if b is not None})
    bias_paths = [tmp_path / f"b{i}" if b is not None else "-" for i, b in enumerate(bias)]
    g, block = (moe_experts.grouped_geometry(n_expert, ff) if grouped
                else moe_experts.geometry(ARCH_FOR_WARP[warp], tokens, k, ff, moe_experts.GATE_UP_ROWS))
    entry = f"moe_gate_up_grouped_{weight_type}" if grouped else f"moe_gate_up_{weight_type}"
    run(harnesses, warp, entry, grid or g, block, tokens, k, ff, hidden, n_expert,
        moe_experts.ACTIVATIONS[activation], paths[0], gate_path, up_path, paths[1], *bias_paths, tmp_path / "h")
    got = np.fromfile(tmp_path / "h", np.float32).reshape(tokens, k, ff)
    want, bound = moe_experts.gate_up_reference(x, gate, up, weight_type, ids, ff, hidden, activation, *bias,
                                                with_bound=True)
    return got, want, bound


def run_down(harnesses, warp, tmp_path, rng, weight_type, tokens, k, hidden, ff, n_expert, biases, grid=None,
             grouped=False, slots=False, form=None):
    down, down_path = expert_files(tmp_path, rng, weight_type, n_expert, hidden, ff, "down")
    h = (rng.standard_normal((tokens, k, ff)) * rng.choice([1e-2, 1.0, 4.0], (tokens, k, ff))).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    weights = rng.random((tokens, k)).astype(np.float32)
    bias = rng.standard_normal((n_expert, hidden)).astype(np.float32) if biases else None
    residual = rng.standard_normal((tokens, hidden)).astype(np.float32)
    paths = write_inputs(tmp_path, h=h, ids=ids, weights=weights, residual=residual,
                         **({"bias": bias} if biases else {}))
    arch = ARCH_FOR_WARP[warp]
    g, block = (moe_experts.grouped_geometry(n_expert, hidden) if grouped
                else moe_experts.geometry(arch, tokens, k, hidden, moe_experts.SLOT_ROWS) if slots
                else moe_experts.serial_geometry(arch, tokens, hidden))
    if form == "staged":
        g, block = moe_experts.staged_geometry(arch, tokens, hidden)
    entry = f"moe_down_{'grouped_' if grouped else 'slots_' if slots else f'{form}_' if form else ''}{weight_type}"
    run(harnesses, warp, entry, grid or g, block, tokens, k, hidden, ff, n_expert, paths[0],
        down_path, paths[1], paths[2], tmp_path / "bias" if biases else "-", paths[3], tmp_path / "out")
    got = np.fromfile(tmp_path / "out", np.float32).reshape(tokens, hidden)
    added, bound = moe_experts.down_reference(h, down, weight_type, ids, weights, hidden, ff, bias, with_bound=True)
    return got, residual + added, bound + U32 * np.abs(residual + added)


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
def test_gate_up(moe_harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1]), 1])
    block = column_multiple(weight_type)
    for tokens, k, ff, hidden, n_expert, activation, biases, grid in [
            (1, 4, 9, 2 * block, 6, "swiglu", False, None), (3, 2, 4, block, 5, "swiglu_oai", True, None),
            (2, 3, 5, 3 * block if block == 256 else 96 * 32 // 8, 4, "swiglu_oai", False, 1),
            (1, 9, 3, block, 10, "swiglu", False, None)]:  # more slots than a workgroup's warps: a warp takes several
        got, want, bound = run_gate_up(moe_harnesses, warp, tmp_path, rng, weight_type, tokens, k, ff, hidden, n_expert,
                                       activation, biases, grid)
        assert np.all(np.abs(got - want) <= bound), (tokens, k, ff, hidden, activation, grid)


@pytest.mark.parametrize("form,weight_type",
                         [(f, t) for f in ("serial", "slots") for t in moe_experts.EXPERT_TYPES]
                         + [("staged", t) for t in moe_experts.QUANTIZED_X_TYPES])
def test_down(moe_harnesses, warp, weight_type, form, tmp_path):
    """The per-pair downs: slot-serial (moe_down; also an odd k), slot-serial with h staged (moe_down_staged, the
    quantized types: two slots at once and an odd k's last alone, a token's rows in several chunks, and a grid that
    loops over them) and slot-parallel (moe_down_slots: also more slots than warps, and a token's slices of h past its
    shared memory, in two passes of slots)."""
    slots = form == "slots"
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1]), 2, len(form)])
    block = column_multiple(weight_type)
    wide = -(-(moe_experts.MAX_STAGED_COLUMNS // 3 + 1) // block) * block
    cases = [(1, 4, 7, 2 * block, 6, True, None), (3, 2, 4, block, 5, False, 1)]
    if form != "slots":  # odd k; staged: 40 rows in chunks of 16 (wave 64: 8), the last partial
        cases.append((2, 3, 40, block, 5, True, None))
    if slots:
        cases.append((1, 9, 3, block, 10, True, None))
        if weight_type in moe_experts.QUANTIZED_X_TYPES:
            cases.append((1, 4, 3, wide, 5, False, None))
    for tokens, k, hidden, ff, n_expert, biases, grid in cases:
        got, want, bound = run_down(moe_harnesses, warp, tmp_path, rng, weight_type, tokens, k, hidden, ff, n_expert,
                                    biases, grid, slots=slots, form=None if form in ("serial", "slots") else form)
        assert np.all(np.abs(got - want) <= bound), (tokens, k, hidden, ff, grid)


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
def test_grouped(moe_harnesses, warp, weight_type, tmp_path):
    """The grouped entries: experts chosen by several pairs (groups of 4 and partial ones) or by none; a tile of 64 rows
    and a partial one; a grid that loops over the (expert, tile) items. A quantized type's inputs staged a pass at a time:
    inputs of 200 slices, one a pass (an expert's pairs in several passes), and inputs wider than the staged slices
    hold, quantized in the loop."""
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1]), 3])
    block = column_multiple(weight_type)
    cases = [(4, 2, 5, block, 3, False, 2)]
    if weight_type == "q4_k":  # a second tile (the emulation's warps take seconds a tile)
        cases.append((5, 2, 66, block, 3, True, None))
    if weight_type in moe_experts.QUANTIZED_X_TYPES:
        one_a_pass = 200 * 32
        assert moe_experts.MAX_STAGED_COLUMNS // one_a_pass == 1
        cases.append((3, 2, 2, one_a_pass, 2, True, None))
        if weight_type in ("q4_k", "mxfp4"):
            cases.append((2, 1, 2, moe_experts.MAX_STAGED_COLUMNS + 256, 2, False, None))
    for tokens, k, ff, hidden, n_expert, biases, grid in cases:
        got, want, bound = run_gate_up(moe_harnesses, warp, tmp_path, rng, weight_type, tokens, k, ff, hidden, n_expert,
                                       "swiglu_oai", biases, grid, grouped=True)
        assert np.all(np.abs(got - want) <= bound), (tokens, k, ff, hidden, grid)
        got, want, bound = run_down(moe_harnesses, warp, tmp_path, rng, weight_type, tokens, k, ff, hidden, n_expert,
                                    biases, grid, grouped=True)
        assert np.all(np.abs(got - want) <= bound), (tokens, k, ff, hidden, grid)


@pytest.mark.parametrize("old,new,projection,weight_type", [
    ("((codes >> 3) & kByteOnes)", "((codes >> 2) & kByteOnes)", "gate_up", "mxfp4"),  # the sign from the wrong bit
    ("total[r] = fmaf(weight, y, total[r]);", "total[r] += y;", "down", "q4_k"),  # the routing weights dropped
    ("total = fmaf(slot_weight[j], slot_terms[j][r], total);", "total += slot_terms[j][r];", "down_slots", "q4_k"),
    ("slot_weight[j] = chosen ? weights[pair] : 0.0f;", "slot_weight[j] = 1.0f;", "down_slots", "q8_0"),
    # a staged pass's inputs taken from the first pass's pairs
    ("base + (unsigned long long)(g.pairs[p0 + b] / per)", "base + (unsigned long long)(g.pairs[b] / per)",
     "grouped", "q8_0"),
    # the grouped path's later slices in flight: dropped, or their weights loaded from the first slice's
    ("if (slice + f * WARP_SIZE < slices) apply_staged<N, NB>(raw[f], slice + f * WARP_SIZE, s, at, acc);",
     "apply_staged<N, NB>(raw[0], slice, s, at, acc);", "grouped", "mxfp4"),
    # the staged down's second slot of two: its rows loaded from the first slot's expert, or its slices from the first's
    ("down_rows_of(w + kRows, down, e1, r0, hidden, row_bytes);",
     "down_rows_of(w + kRows, down, e0, r0, hidden, row_bytes);", "down_staged", "q6_k"),
    ("(j + 1) * slot_slices, ff, acc);", "j * slot_slices, ff, acc);", "down_staged", "mxfp4"),
    ("for (int r = 0; r < N; ++r) raw[f][r] = Format::load(w[r], at_f);",
     "for (int r = 0; r < N; ++r) raw[f][r] = Format::load(w[r], slice);", "grouped", "q4_k"),
])
def test_planted_faults_are_caught(tmp_path, old, new, projection, weight_type):
    work = tmp_path / "planted"
    work.mkdir()
    harnesses = build_op_harnesses(work, OPS, HARNESS, kernel_edit=lambda text: text.replace(old, new))
    rng = np.random.default_rng(5)
    if projection == "gate_up":
        got, want, bound = run_gate_up(harnesses, 32, tmp_path, rng, weight_type, 2, 2, 4, 64, 4, "swiglu", False)
    elif projection == "grouped":  # inputs of 200 slices: one pair a staged pass
        got, want, bound = run_gate_up(harnesses, 32, tmp_path, rng, weight_type, 3, 2, 2, 200 * 32, 2, "swiglu", False,
                                       grouped=True)
    else:
        got, want, bound = run_down(harnesses, 32, tmp_path, rng, weight_type, 2, 2, 4, 256, 4, False,
                                    slots=projection == "down_slots",
                                    form="staged" if projection == "down_staged" else None)
    assert not np.all(np.abs(got - want) <= bound)


FIXED_LAST_WORD = "w[N] = load_weights4(base + N - (shift == 0 ? 1 : 0));"


def q8_0_experts_ending_at_a_page(harnesses, warp, tmp_path, grouped):
    """Q8_0 experts of 4 x 6 rows x 64 columns: 48 blocks, 1,632 bytes (a multiple of 16, so the harness puts their
    end at a guarded page's start) and the last block's codes at a word boundary, every expert chosen: the last
    row's last block is read, and a load past it dies."""
    rng = np.random.default_rng([warp, 8])
    got, want, bound = run_gate_up(harnesses, warp, tmp_path, rng, "q8_0", 1, 4, 6, 64, 4, "swiglu", False,
                                   grouped=grouped)
    assert np.all(np.abs(got - want) <= bound)
    got, want, bound = run_down(harnesses, warp, tmp_path, rng, "q8_0", 1, 4, 6, 64, 4, False, grouped=grouped)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("grouped", [False, True])
def test_q8_0_experts_ending_at_a_page_are_read_to_their_last_byte_and_no_further(moe_harnesses, warp, tmp_path,
                                                                                   grouped):
    assert (4 * 6 * 2 * 34) % 16 == 0 and (34 * (4 * 6 * 2 - 1) + 2) % 4 == 0
    q8_0_experts_ending_at_a_page(moe_harnesses, warp, tmp_path, grouped)


def test_a_load_past_the_last_block_is_caught(tmp_path):
    """The planted fault: qmatvec_formats.h's load_words reading the word past a run that starts at a word boundary
    (as it did when a Q8_0 expert tensor of Qwen3-30B-A3B's shape faulted on an NVIDIA H100)."""
    work = tmp_path / "planted"
    work.mkdir()
    harnesses = build_op_harnesses(work, OPS, HARNESS,
                                   kernel_edit=lambda text: text.replace(FIXED_LAST_WORD, "w[N] = load_weights4(base + N);"))
    with pytest.raises(AssertionError, match="exited with -11"):
        q8_0_experts_ending_at_a_page(harnesses, 32, tmp_path, False)
