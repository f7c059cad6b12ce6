"""RoPE frequency factors for the tests: the per-pair divisors Llama 3.1/3.2 files carry as rope_freqs.weight.

Real files hold 1 for the high frequencies and up to 8 for the low ones; the tests use values far from 1 in
both directions, so that a kernel that drops the factors, multiplies by them or reads the wrong pair's
factor is off by far more than rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def far_factors(rng: np.random.Generator, rope_dim: int) -> np.ndarray:
    """float32 [rope_dim // 2], log-uniform in [1/4, 32], no two alike."""
    while True:
        factors = np.exp(rng.uniform(np.log(0.25), np.log(32.0), rope_dim // 2)).astype(np.float32)
        if np.unique(factors).size == factors.size:
            return factors


def factors_arg(tmp_path: Path, factors: np.ndarray | None) -> Path | str:
    """The emulation harness's factors argument: a file of the floats, or "-" for none (a null pointer)."""
    if factors is None:
        return "-"
    path = tmp_path / "freq_factors"
    np.ascontiguousarray(factors, dtype=np.float32).tofile(path)
    return path
