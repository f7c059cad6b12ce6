"""kernels/qmatvec.hip on a real GPU against hipcore/ops/qmatvec.py's float64 reference (x quantized as the
kernel does), on fresh random inputs, with poisoned outputs: Llama-3.1-8B's shapes and small odd ones."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import qmatvec
from hipcore.ops.weight_formats import column_multiple
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu


def run_qmatvec(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((batch, cols)) * rng.choice([1e-3, 1.0, 30.0], (batch, cols))).astype(np.float32)
    w, xs, y = mem.upload(raw, "weights"), mem.upload(x), mem.poisoned(batch * rows * 4)
    qmatvec.launch(gpu, None, y, w, xs, rows, cols, batch, weight_type=weight_type)
    got = y.download(np.float32).reshape(batch, rows)
    want = qmatvec.reference(raw, weight_type, x, rows, cols)
    bad = ~(np.abs(got - want) <= qmatvec.error_bound(raw, weight_type, x, rows, cols))
    assert not bad.any(), (f"seed {seed}: {int(bad.sum())} of {bad.size} outputs off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {want[bad][0]!r}")


@pytest.mark.parametrize("weight_type", qmatvec.WEIGHT_TYPES)
@pytest.mark.parametrize("rows,cols,batch", [
    (4096, 4096, 1), (1024, 4096, 1), (2048, 14336, 1), (1024, 4096, 2), (512, 4096, 5), (300, 4096, 8), (7, 256, 1),
    (33, 512, 3), (65, 1536, 11),
])
def test_qmatvec(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    assert cols % column_multiple(weight_type) == 0
    run_qmatvec(gpu, mem, rng, seed, weight_type, rows, cols, batch)
