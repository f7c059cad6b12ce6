"""kernels/moe_route.hip's two ways of choosing, under the host emulation at wave 32 and 64
(tests/kernel_emulation/harness_moe.cpp): up to 8 choices by lists merged across the warp, more by rounds of a
warp-wide arg-max. The lists choose exactly moe_route.select's experts and give the rounds' weights to the bit (the
rounds forced on by an edit of the source), on random logits, logits with many ties, -inf and NaN; planted faults in
the lists' merge (the partner's list not reversed, ties not broken by index) must be caught."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import moe_route
from support.emulated_kernels import ARCH_FOR_WARP, build_op_harnesses, run, write_inputs

OPS = ("moe_route", "moe_experts")  # harness_moe.cpp runs both
HARNESS = "harness_moe.cpp"
LISTS = "k <= kMaxListK"  # the dispatch: the lists up to kMaxListK choices
# (tokens, n_expert, k): Qwen3-30B-A3B's 8 of 128 and fewer, gpt-oss-20b's 4 of 32, Qwen1.5-MoE's 4 of 60, the
# widest router, lists longer than the experts (5 of 6), one and two choices, the rounds (12 of 64)
CASES = [(3, 128, 8), (3, 128, 5), (4, 128, 3), (5, 32, 4), (3, 60, 4), (2, 256, 8), (2, 7, 7), (2, 6, 5), (3, 40, 1),
         (2, 9, 2), (2, 64, 12)]


@pytest.fixture(scope="module")
def route_harnesses(tmp_path_factory):
    return build_op_harnesses(tmp_path_factory.mktemp("route"), OPS, HARNESS)


@pytest.fixture(scope="module")
def rounds_harnesses(tmp_path_factory):
    """The same harness with the rounds taken for every k."""
    return build_op_harnesses(tmp_path_factory.mktemp("rounds"), OPS, HARNESS,
                              kernel_edit=lambda text: text.replace(LISTS, "k < 0 && " + LISTS))


def logits_of(rng, kind: str, tokens: int, n_expert: int) -> np.ndarray:
    """random: distinct values; ties: a few values repeated (and a row all equal); extremes: -inf rows, NaN, +inf."""
    if kind == "random":
        return (rng.standard_normal((tokens, n_expert)) * 4).astype(np.float32)
    if kind == "ties":
        logits = rng.integers(-2, 3, (tokens, n_expert)).astype(np.float32)
        logits[-1] = 1.5
        return logits
    logits = rng.standard_normal((tokens, n_expert)).astype(np.float32)
    logits[0] = -np.inf
    logits[0, n_expert // 2] = np.nan
    logits[-1, rng.choice(n_expert, min(3, n_expert), replace=False)] = [np.nan, -np.inf, np.inf][:min(3, n_expert)]
    return logits


def route(harnesses, warp, tmp_path, logits, k, mode, normalize):
    """(ids, weights' bytes) of moe_route_f32 at the launcher's geometry."""
    tokens, n_expert = logits.shape
    (path,) = write_inputs(tmp_path, logits=logits)
    grid, block = moe_route.geometry(ARCH_FOR_WARP[warp], tokens)
    run(harnesses, warp, "moe_route_f32", grid, block, tokens, n_expert, k, moe_route.MODES[mode], int(normalize),
        path, "-", tmp_path / "ids", tmp_path / "weights")
    return np.fromfile(tmp_path / "ids", np.int32).reshape(tokens, k), (tmp_path / "weights").read_bytes()


def wanted_ids(logits, k):
    return moe_route.select(np.where(np.isnan(logits), -np.inf, logits), k)


@pytest.mark.parametrize("mode,normalize", [("softmax_topk", True), ("softmax_topk", False), ("topk_softmax", False)])
def test_lists_choose_as_the_reference_and_weigh_as_the_rounds(route_harnesses, rounds_harnesses, warp, mode,
                                                                normalize, tmp_path):
    rng = np.random.default_rng([warp, len(mode), int(normalize), 17])
    for tokens, n_expert, k in CASES:
        for kind in ("random", "ties", "extremes"):
            logits = logits_of(rng, kind, tokens, n_expert)
            ids, weights = route(route_harnesses, warp, tmp_path, logits, k, mode, normalize)
            assert np.array_equal(ids, wanted_ids(logits, k)), (tokens, n_expert, k, kind)
            rounds_ids, rounds_weights = route(rounds_harnesses, warp, tmp_path, logits, k, mode, normalize)
            assert np.array_equal(rounds_ids, ids) and rounds_weights == weights, (tokens, n_expert, k, kind)


@pytest.mark.parametrize("old,new", [
    # the partner's list taken unreversed: not the best K of the two
    ("if (beats(pv_j, pe_j, top_v[i], top_e[i])) top_v[i] = pv_j, top_e[i] = pe_j;",
     "if (beats(pv_i, pe_i, top_v[i], top_e[i])) top_v[i] = pv_i, top_e[i] = pe_i;"),
    # equal logits left in whatever order the network leaves them
    ("const bool swap = beats(bv, be, av, ae);", "const bool swap = bv > av;"),
])
def test_planted_faults_in_the_lists_are_caught(tmp_path, old, new):
    work = tmp_path / "planted"
    work.mkdir()
    harnesses = build_op_harnesses(work, OPS, HARNESS, kernel_edit=lambda text: text.replace(old, new))
    rng = np.random.default_rng(23)
    wrong = 0
    for tokens, n_expert, k in [(4, 128, 8), (4, 32, 4)]:
        for kind in ("random", "ties"):
            logits = logits_of(rng, kind, tokens, n_expert)
            ids, _ = route(harnesses, 32, tmp_path, logits, k, "softmax_topk", True)
            wrong += int(not np.array_equal(ids, wanted_ids(logits, k)))
    assert wrong > 0
