"""The slopes matmul_mma_swiglu's error bounds assume for the gated activations (SILU_LIPSCHITZ, GELU_LIPSCHITZ):
each must bound |act'| everywhere, or the SwiGLU / GeGLU tests' bounds could pass a kernel they should fail; and
each must be tight (within 0.1%), or they would pass a worse one."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import gelu_mul, silu_mul
from hipcore.ops.matmul_mma_swiglu import ACTIVATIONS


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_bound_slope_is_the_activations_largest(activation):
    _, gated, lipschitz = ACTIVATIONS[activation]
    g = np.linspace(-30.0, 30.0, 6_000_001)
    act = gated(g, np.ones_like(g))
    slope = np.abs(np.diff(act) / np.diff(g)).max()  # secant slopes: each at most the derivative's largest
    assert slope <= lipschitz, (activation, slope)
    assert slope >= lipschitz * 0.999, (activation, slope)


def test_the_references_are_the_single_ops():
    g, u = np.array([-3.0, -0.5, 0.0, 1.4, 7.0]), np.array([2.0, -1.0, 3.0, 0.5, -2.0])
    assert np.array_equal(ACTIVATIONS["silu"][1](g, u), silu_mul.reference(g, u))
    assert np.array_equal(ACTIVATIONS["gelu"][1](g, u), gelu_mul.reference(g, u))
