"""Gemma 2's soft-capping under the kernel-language emulation (tests/support/emulated_kernels.py), at warp 32
and 64, against the numpy references: softcap (the final logits, cap * tanh(x / cap)) and paged_attention's
`softcap` (every scaled score capped before the softmax)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hipcore.ops import softcap
from hipcore.ops.launch_checks import elementwise_grid
from support.emulated_kernels import U32, run
from support.forward_pass_samples import make_sample, windowed
from test_kernels_emulated_forward import run_attention


def softcap_tolerance(x: np.ndarray, cap: float) -> np.ndarray:
    """The kernel's cap * (1 - 2 / (1 + expf(x * (2 / cap)))): the argument carries 2 roundings (2 / cap and
    the product), so expf's result is off by |2x / cap| * 2u relatively plus its own 2 ulp; tanh's slope in
    log(e) is at most 1/2. The sum, the quotient, the difference and the product with cap add 4 roundings
    of values up to 2 cap. In all: cap * ((|2x / cap| + 2) u + 8u), and 25% margin."""
    return 1.25 * cap * ((np.abs(2 * x.astype(np.float64) / cap) + 2) + 8) * U32


def test_softcap(harnesses, warp, tmp_path):
    rng = np.random.default_rng([warp, 41])
    cap = 30.0
    for n in (1, 300, 1025):
        x = (rng.standard_normal(n) * 40).astype(np.float32)
        x[:min(n, 4)] = np.array([-1e30, 1e30, 0.0, 1e-3], np.float32)[:min(n, 4)]
        x.tofile(tmp_path / "x")
        grid, block = elementwise_grid(n)
        want = softcap.reference(x, cap)
        for g in sorted({grid, 1}):
            run(harnesses, warp, "softcap_f32", g, block, n, cap, tmp_path / "x", tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32)
            assert np.all(np.abs(got - want) <= softcap_tolerance(x, cap))
            if n >= 4:  # the far ends exactly +-cap, no NaN
                assert got[0] == -cap and got[1] == cap and got[2] == 0.0


def test_softcap_tolerance_catches_a_wrong_cap_and_no_cap():
    x = np.linspace(-60, 60, 241).astype(np.float32)
    want = softcap.reference(x, 30.0)
    tol = softcap_tolerance(x, 30.0)
    for name, wrong in (("cap 50", softcap.reference(x, 50.0)), ("no cap", x)):
        assert (np.abs(wrong - want) > tol).any(), name


# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), window)
SOFTCAP_CASES = [
    (8, 4, 64, 16, [(100, 1), (40, 1), (30, 6)], 0),  # decodes and a prompt chunk, no window
    (8, 2, 64, 16, [(700, 1)], 0),  # a long context split over workgroups: the cap before each split's max
    (4, 2, 256, 16, [(90, 1), (33, 3)], 16),  # Gemma 2's head size and a window, as its local layers
]
# Scores of several units before the cap, so that the cap reshapes the softmax: q drawn 8 times wider.
Q_SCALE = 8.0


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_paged_attention_softcap(harnesses, warp, kv, tmp_path):
    rng = np.random.default_rng([warp, 42, len(kv)])
    for n_heads, n_kv_heads, head_dim, block_size, seqs, window in SOFTCAP_CASES[:None if kv == "f16" else 1]:
        sample = make_sample(rng, kv, n_heads, n_kv_heads, head_dim, block_size, seqs, q_scale=Q_SCALE)
        sample = dataclasses.replace(windowed(sample, window) if window else sample, softcap=5.0)
        want, tol = sample.reference(), sample.tolerance()
        got, _, splits = run_attention(harnesses, warp, tmp_path, sample, workspace=True)
        bad = ~(np.abs(got - want) <= tol)
        assert not bad.any(), f"{kv} {n_heads}/{n_kv_heads}x{head_dim} splits {splits}: {int(bad.sum())} off"


def test_paged_attention_softcap_faults_are_caught(harnesses, tmp_path):
    """Planted faults: the kernel run without the cap, or with another cap, against the capped reference."""
    rng = np.random.default_rng(43)
    sample = dataclasses.replace(make_sample(rng, "f16", 8, 4, 64, 16, [(100, 1), (30, 6)], q_scale=Q_SCALE),
                                 softcap=5.0)
    want, tol = sample.reference(), sample.tolerance()
    for name, cap in (("no cap", 0.0), ("cap 6", 6.0)):
        got, _, _ = run_attention(harnesses, 32, tmp_path, dataclasses.replace(sample, softcap=cap), workspace=True)
        assert not np.all(np.abs(got - want) <= tol), name
