"""Gemma 3's kernels under the kernel-language emulation (tests/support/emulated_kernels.py), at warp 32
and 64, against their numpy references: gelu_mul (GeGLU's gate), fused_qmatvec's gate|up with GeGLU, scale (the
embedding scale), and the sliding window of paged_attention (Gemma's local layers), which must never read a key
outside it."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import fused_qmatvec, gelu_mul, paged_attention, scale
from hipcore.ops.launch_checks import elementwise_grid
from support.emulated_kernels import U32, run, write_inputs
from support.weight_samples import random_weights
from test_kernels_emulated_fused_qmatvec import EPS, SLACK, grids, inputs, product_bound, suffixes
from support.forward_pass_samples import make_sample, windowed
from test_kernels_emulated_forward import run_attention


def gelu_tolerance(gate: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The kernel computes u = sqrt(2/pi) (g + 0.044715 g^3) with about 4 roundings (the float32 constants
    included), so exp(-2u) is off by |2u| * 4u32 relatively, plus 2 ulp of expf; the sum, the quotient and
    the product with up add 3 roundings. (1 + E) is off by at most E's relative error, so the output's
    relative error is at most (8 |u| + 5) u32; 25% margin for second-order terms."""
    g = gate.astype(np.float64)
    u = np.abs(gelu_mul.SQRT_2_OVER_PI * (g + gelu_mul.GELU_COEF_A * g ** 3))
    return 1.25 * (8 * np.minimum(u, 1e6) + 5) * U32 * np.abs(want) + 1e-37


def test_gelu_mul(harnesses, warp, tmp_path):
    rng = np.random.default_rng([warp, 31])
    for n in (1, 300, 1000):
        gate = (rng.standard_normal(n) * 4).astype(np.float32)
        gate[:min(n, 4)] = np.array([-1e30, 1e30, 0.0, -9.0], np.float32)[:min(n, 4)]
        up = rng.standard_normal(n).astype(np.float32)
        gate.tofile(tmp_path / "a")
        up.tofile(tmp_path / "b")
        grid, block = elementwise_grid(n)
        want = gelu_mul.reference(gate, up)
        for g in sorted({grid, 1}):
            run(harnesses, warp, "gelu_mul_f32", g, block, n, tmp_path / "a", tmp_path / "b", tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32)
            assert np.all(np.abs(got - want) <= gelu_tolerance(gate, want)), \
                float(np.max(np.abs(got - want) / gelu_tolerance(gate, want)))
            if n >= 4:  # the limits: -0 far left, the gate itself far right, no NaN
                assert got[0] == 0.0 and got[1] == np.float32(1e30) * up[1] and got[2] == 0.0


def test_gelu_tolerance_catches_silu_and_the_exact_gelu(harnesses, tmp_path):
    """The bound is far tighter than the functions the kernel could be confused with: SwiGLU's silu, and
    the erf form of GELU (which differs from the tanh form by up to ~5e-4)."""
    import math
    gate = np.linspace(-4, 4, 257).astype(np.float32)
    up = np.ones_like(gate)
    want = gelu_mul.reference(gate, up)
    tol = gelu_tolerance(gate, want)
    silu = gate / (1 + np.exp(-gate.astype(np.float64)))
    erf_gelu = np.array([0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in gate.astype(np.float64)])
    for name, wrong in (("silu", silu), ("erf gelu", erf_gelu)):
        assert (np.abs(wrong - want) > tol).any(), name


def test_scale_is_exact(harnesses, warp, tmp_path):
    rng = np.random.default_rng([warp, 32])
    for n in (1, 640, 1025):
        x = rng.standard_normal(n).astype(np.float32)
        x.tofile(tmp_path / "x")
        factor = float(np.float32(np.sqrt(640.0)))
        grid, block = elementwise_grid(n)
        for g in sorted({grid, 1}):
            run(harnesses, warp, "scale_f32", g, block, n, factor, tmp_path / "x", tmp_path / "o")
            assert np.array_equal(np.fromfile(tmp_path / "o", np.float32), scale.reference(x, factor))


# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), window)
WINDOW_CASES = [
    (9, 3, 64, 16, [(100, 1), (40, 1), (30, 6)], 24),  # decodes past and within the window; a prompt chunk across it
    (8, 2, 64, 16, [(700, 1)], 200),  # a long context split over workgroups: only the window's keys split
    (4, 1, 256, 16, [(90, 1), (33, 3)], 16),  # Gemma 3's head size (256: 32 lanes per key), window == block
    (4, 4, 32, 8, [(45, 20)], 7),  # a long prompt chunk: every token its own window, a window within one block or two
]


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_paged_attention_window(harnesses, warp, kv, tmp_path):
    """Tokens see exactly their last `window` positions; block-table entries before the windows point at
    the null block, whose rows are NaN, so a read outside the window would show."""
    rng = np.random.default_rng([warp, 33, len(kv)])
    for n_heads, n_kv_heads, head_dim, block_size, seqs, window in WINDOW_CASES[:None if kv == "f16" else 1]:
        sample = windowed(make_sample(rng, kv, n_heads, n_kv_heads, head_dim, block_size, seqs, q_scale=2.0), window)
        assert (sample.block_tables == 0).any(), "the case must have blocks wholly before the window"
        want, tol = sample.reference(), sample.tolerance()
        got, _, splits = run_attention(harnesses, warp, tmp_path, sample, workspace=True)
        bad = ~(np.abs(got - want) <= tol)
        assert not bad.any(), (f"{kv} {n_heads}/{n_kv_heads}x{head_dim} window {window} splits {splits}: "
                               f"{int(bad.sum())} off")


def test_paged_attention_window_faults_are_caught(harnesses, tmp_path):
    """Planted faults: no window at all (reads the NaN null block), a window one key wider (reads the key
    the window just dropped) or one key narrower (drops the oldest key of the window) all fail the bound."""
    rng = np.random.default_rng(34)
    sample = windowed(make_sample(rng, "f16", 9, 3, 64, 16, [(100, 1), (30, 6)], q_scale=2.0), 24)
    want, tol = sample.reference(), sample.tolerance()
    for name, window in (("no window", 0), ("one key wider", 25), ("one key narrower", 23)):
        faulty = type(sample)(**{**sample.__dict__, "window": window})
        got, _, _ = run_attention(harnesses, 32, tmp_path, faulty, workspace=True)
        assert not np.all(np.abs(got - want) <= tol), name


@pytest.mark.parametrize("types", [("q4_k", "q4_k"), ("q4_k", "q6_k"), ("q5_0", "q5_0")], ids=lambda t: "-".join(t))
def test_norm_geglu(harnesses, warp, types, tmp_path):
    """Gemma's GeGLU through the activation code in `types`: gelu(gate) * up, GELU's tanh form, on every entry that
    reads it (the split entry, SwiGLU only, is never launched with it); the bound is far tighter than SwiGLU's
    result on the same products."""
    rng = np.random.default_rng([warp, 8, *map(ord, "".join(types))])
    packed = fused_qmatvec.pack_types(types) | fused_qmatvec.ACTIVATIONS["gelu"][0] << fused_qmatvec.ACTIVATION_SHIFT
    for rows, cols, batch in [(20, 256, 1), (9, 512, 2), (6, 256, 5)]:
        wg, wu = (random_weights(rng, t, rows, cols) for t in types)
        x, g = inputs(rng, batch, cols)
        files = write_inputs(tmp_path, wg=wg, wu=wu, x=x, g=g)
        pair = [(wg, types[0]), (wu, types[1])]
        want = fused_qmatvec.reference_norm_swiglu(pair, x, g, EPS, rows, cols, activation="gelu")
        xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
        gate = fused_qmatvec.reference_norm(wg, types[0], x, g, EPS, rows, cols)
        up = fused_qmatvec.reference_norm(wu, types[1], x, g, EPS, rows, cols)
        tol_gate, _ = product_bound(wg, types[0], xg, s, rows, cols)
        tol_up, _ = product_bound(wu, types[1], xg, s, rows, cols)
        # gelu(a) * u: |d/da| <= 1.13 |u| (GELU's slope peaks at 1.129), |d/du| = |gelu(a)| <= |a|; then the
        # float32 roundings of the result (gelu_mul's: test_kernels_emulated_gemma.py).
        bound = 1.13 * np.abs(up) * tol_gate + np.abs(gate) * tol_up + tol_gate * tol_up + 4 * SLACK * np.abs(want)
        silu = fused_qmatvec.reference_norm_swiglu(pair, x, g, EPS, rows, cols)
        assert np.any(np.abs(silu - want) > bound), "the bound cannot tell GeGLU from SwiGLU"
        for variant in suffixes(batch, types):
            for grid, block, *_ in grids(warp, "qmatvec_norm_swiglu", variant, cols, rows, more=(2,)):
                run(harnesses, warp, f"qmatvec_norm_swiglu_{variant}", grid, block, packed, rows, cols, batch, EPS,
                    *files, tmp_path / "o")
                got = np.fromfile(tmp_path / "o", np.float32).reshape(batch, rows)
                assert np.all(np.abs(got - want) <= bound), f"{types} {rows}x{cols} batch {batch} {variant} grid {grid}"
