"""kernels/qmatvec.hip (decode products on int8-quantized activations) run on the CPU under the host
emulation at wave 32 and wave 64 (tests/emulated_kernels.py), against hipcore/ops/qmatvec.py's float64
reference, which quantizes x exactly as the kernel does; the bound is qmatvec.error_bound's."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import qmatvec
from hipcore.ops.weight_formats import column_multiple
from support.weight_samples import random_weights
from support.emulated_kernels import ARCH_FOR_WARP, run


@pytest.mark.parametrize("weight_type", qmatvec.WEIGHT_TYPES)
def test_qmatvec(harnesses, warp, weight_type, tmp_path):
    rng = np.random.default_rng([warp, len(weight_type), ord(weight_type[-1]), 11])
    block = column_multiple(weight_type)
    # Rows shorter than a warp's slices and longer than two steps, odd row counts (a half-full last
    # pair), batches of 1, within one pass (2, 8) and over several (9); x with a zero slice and with
    # values of very different sizes.
    shapes = [(7, block, 1), (33, 2 * block, 1), (20, 6 * block if block == 256 else 96 * 32, 1), (5, block, 2),
              (17, 2 * block, 8), (3, block, 9)]
    for rows, cols, batch in shapes:
        raw = random_weights(rng, weight_type, rows, cols)
        x = (rng.standard_normal((batch, cols)) * rng.choice([1e-3, 1.0, 30.0], (batch, cols))).astype(np.float32)
        x[0, :32] = 0.0
        raw.tofile(tmp_path / "w")
        x.tofile(tmp_path / "x")
        want = qmatvec.reference(raw, weight_type, x, rows, cols)
        bound = qmatvec.error_bound(raw, weight_type, x, rows, cols)
        grid, threads = qmatvec.geometry(ARCH_FOR_WARP[warp], rows, batch)
        for g in sorted({grid, 1, 2}):  # the launcher's grid, and grids the kernel must loop over
            run(harnesses, warp, f"qmatvec_{weight_type}", g, threads, rows, cols, batch, tmp_path / "w",
                tmp_path / "x", tmp_path / "y")
            got = np.fromfile(tmp_path / "y", np.float32).reshape(batch, rows)
            assert np.all(np.abs(got - want) <= bound), f"{rows}x{cols} batch {batch} grid {g}"
