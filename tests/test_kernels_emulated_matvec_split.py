"""kernels/matvec.hip's split entries (a workgroup a row, its warps' sums added in a fixed order: products of few rows
such as the MoE routers), run under the host emulation at wave 32 and 64 through their own harness
(tests/kernel_emulation/harness_matvec.cpp), against matvec.reference within matvec.error_bound; their bits do not
depend on the grid; planted faults (a warp's sum left out, a thread's second item skipped) must be caught."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import matvec
from support.emulated_kernels import ARCH_FOR_WARP, build_op_harnesses, run, write_inputs
from support.weight_samples import random_weights

HARNESS = "harness_matvec.cpp"
# (rows, cols, batch): Qwen3-30B-A3B's router (128 x 2048) at one token and a decode batch of 8 (cut to fewer rows:
# every row runs the same code), gpt-oss-20b's (32 x 2880: 360 items, not a multiple of the block's threads), a
# shared expert's gate (1 row), a row of fewer items than the block has threads, batches of 3 and of 11 (two passes),
# decode batches past 8 tokens as kernel_choice.project hands them over (32 tokens: four passes, each a workgroup's
# item; 20: the last pass of 4)
SHAPES = [(4, 2048, 1), (3, 2048, 8), (3, 2880, 1), (1, 2048, 1), (5, 1056, 1), (2, 1024, 3), (2, 1024, 11),
          (2, 2048, 32), (3, 2880, 20)]


@pytest.fixture(scope="module")
def matvec_harnesses(tmp_path_factory):
    return build_op_harnesses(tmp_path_factory.mktemp("matvec_harness"), ("matvec",), HARNESS)


def split_product(harnesses, warp, tmp_path, rng, weight_type, rows, cols, batch, grid=None):
    """(got, want, bound, bytes of y) of the split entry at the launcher's block (the launcher's grid unless given)."""
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    files = write_inputs(tmp_path, w=raw, x=x)
    entry, launcher_grid, block = matvec.choose(ARCH_FOR_WARP[warp], weight_type, rows, cols, batch)
    assert entry == f"matvec_split_{weight_type}", (rows, cols, batch)
    run(harnesses, warp, entry, grid or launcher_grid, block, rows, cols, batch, *files, tmp_path / "y")
    y = (tmp_path / "y").read_bytes()
    got = np.frombuffer(y, np.float32).reshape(batch, rows)
    return got, matvec.reference(raw, weight_type, x, rows, cols), matvec.error_bound(raw, weight_type, x, rows, cols), y


@pytest.mark.parametrize("weight_type", matvec.SPLIT_TYPES)
def test_split_matvec_matches_reference_with_the_same_bits_on_any_grid(matvec_harnesses, warp, weight_type, tmp_path):
    for rows, cols, batch in SHAPES:
        seed = [warp, rows, cols, batch, len(weight_type)]
        got, want, bound, launched = split_product(matvec_harnesses, warp, tmp_path, np.random.default_rng(seed),
                                                   weight_type, rows, cols, batch)
        assert np.all(np.abs(got - want) <= bound), f"{rows}x{cols} batch {batch}"
        for grid in (1, 2, 5):  # workgroups looping over (row, pass) items: each summed as before, to the bit
            *_, looped = split_product(matvec_harnesses, warp, tmp_path, np.random.default_rng(seed), weight_type,
                                       rows, cols, batch, grid)
            assert looped == launched, f"{rows}x{cols} batch {batch} grid {grid}"


@pytest.mark.parametrize("old,new,batch", [
    ("for (int i = 0; i < warps; ++i) s += partial", "for (int i = 1; i < warps; ++i) s += partial", 1),  # warp 0 lost
    ("const bool has_item2 = kItemsPerStep == 2 && item + threads < items;",
     "const bool has_item2 = false;", 1),  # a decoding thread's second item dropped
    ("const int passes = (batch + kMaxBatchPerPass - 1) / kMaxBatchPerPass;",
     "const int passes = batch / kMaxBatchPerPass;", 20),  # a batch's last, partial pass dropped
    ("const int r = item % rows, b0 = (item / rows) * kMaxBatchPerPass;",
     "const int r = item % rows, b0 = 0;", 20),  # every item's pass taken as the first
])
def test_planted_faults_are_caught(tmp_path, old, new, batch):
    work = tmp_path / "planted"
    work.mkdir()
    harnesses = build_op_harnesses(work, ("matvec",), HARNESS, kernel_edit=lambda text: text.replace(old, new))
    rng = np.random.default_rng(11)
    got, want, bound, _ = split_product(harnesses, 32, tmp_path, rng, "f32", 3, 2880, batch)
    assert not np.all(np.abs(got - want) <= bound)
