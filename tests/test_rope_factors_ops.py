"""RoPE frequency factors (rope_freqs.weight) in every op that rotates, on the cpu backend.

Each op's numpy reference with factors is held to an independent computation: the angle of pair i at
position p written out as p * freq_scale * theta^(-2i/d) / factor[i], and the test suite's own llama.cpp
model of RoPE (tests/support/reference_rope.py). The launchers (the cpu host kernels) are held to those,
through the projection planner's every path (fused_matvec, fused_matmul, fused_qmatvec and the single
rope op), and refuse a factors buffer too small for rope_dim / 2 floats.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.model.projections import ProjectionPlanner
from hipcore.model.weights import Weight
from hipcore.ops import fused_matmul, fused_matvec, fused_qmatvec, matvec, rmsnorm, rope
from support.reference_rope import RotaryEmbedding
from support.rope_factors import far_factors
from support.weight_samples import random_weights

THETA, FREQ_SCALE, EPS = 10000.0, 0.5, 1e-5


def rotated_by_hand(x: np.ndarray, positions, rope_dim: int, theta: float, freq_scale: float, factors) -> np.ndarray:
    """x [tokens, heads, head_dim] with pair i of each head turned by pos * freq_scale * theta^(-2i/d) / factors[i]."""
    out = np.array(x, dtype=np.float64)
    for t, pos in enumerate(positions):
        for i in range(rope_dim // 2):
            angle = float(pos) * freq_scale * theta ** (-2.0 * i / rope_dim) / float(factors[i])
            c, s = math.cos(angle), math.sin(angle)
            a, b = out[t, :, 2 * i].copy(), out[t, :, 2 * i + 1].copy()
            out[t, :, 2 * i], out[t, :, 2 * i + 1] = a * c - b * s, a * s + b * c
    return out


def llama_cpp_rope(x: np.ndarray, positions, rope_dim: int, factors) -> np.ndarray:
    """tests/support/reference_rope.py's RoPE (float32 tables, as llama.cpp computes them)."""
    emb = RotaryEmbedding(rope_dim=rope_dim, theta_base=THETA, freq_scale=FREQ_SCALE, freq_factors=factors)
    return emb.apply(np.asarray(x, dtype=np.float32), *emb.tables(np.asarray(positions)))


@pytest.fixture
def put(cpu_device):
    buffers = []

    def upload(array: np.ndarray):
        buf = cpu_device.allocate(max(np.asarray(array).nbytes, 4), "activations")
        buf.upload(np.ascontiguousarray(array))
        buffers.append(buf)
        return buf

    yield upload
    for buf in buffers:
        buf.free()


def test_rope_reference_divides_each_angle_by_its_factor():
    rng = np.random.default_rng(1)
    tokens, heads, head_dim, rope_dim = 3, 2, 16, 12
    x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    positions = np.array([0, 5, 3000])
    factors = far_factors(rng, rope_dim)
    got = rope.reference(x, positions, rope_dim, THETA, FREQ_SCALE, factors)
    np.testing.assert_allclose(got, rotated_by_hand(x, positions, rope_dim, THETA, FREQ_SCALE, factors), rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(got, llama_cpp_rope(x, positions, rope_dim, factors), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(got[..., rope_dim:], x[..., rope_dim:])
    expected_angles = positions[:, None] * FREQ_SCALE * THETA ** (-np.arange(0, rope_dim, 2) / rope_dim) / factors
    np.testing.assert_allclose(rope.angles(positions, rope_dim, THETA, FREQ_SCALE, factors), expected_angles, rtol=1e-12)
    # Factors of 1 are no factors at all.
    np.testing.assert_array_equal(rope.reference(x, positions, rope_dim, THETA, FREQ_SCALE, np.ones(rope_dim // 2)),
                                  rope.reference(x, positions, rope_dim, THETA, FREQ_SCALE))


def test_rope_launch_applies_the_factors(cpu_device, put):
    rng = np.random.default_rng(2)
    tokens, heads, head_dim, rope_dim = 4, 3, 32, 32
    x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, 4096, tokens).astype(np.int32)
    factors = far_factors(rng, rope_dim)
    xs = put(x)
    rope.launch(cpu_device, None, xs, put(positions), tokens, heads, head_dim, rope_dim, THETA, FREQ_SCALE, put(factors))
    got = xs.download(np.float32).reshape(x.shape)
    want = rotated_by_hand(x, positions, rope_dim, THETA, FREQ_SCALE, factors)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert np.abs(got - rope.reference(x, positions, rope_dim, THETA, FREQ_SCALE)).max() > 0.1  # the factors matter


def test_launchers_refuse_a_factors_buffer_too_small(cpu_device, put):
    x, positions, small = put(np.zeros(64, np.float32)), put(np.zeros(1, np.int32)), put(np.ones(31, np.float32))
    with pytest.raises(ValueError, match="freq_factors needs 128 bytes"):
        rope.launch(cpu_device, None, x, positions, 1, 1, 64, 64, THETA, 1.0, small)
    q, k, v = put(np.zeros(64, np.float32)), put(np.zeros(64, np.float32)), put(np.zeros(64, np.float32))
    w, xs, g = put(np.zeros((192, 64), np.float32)), put(np.zeros(64, np.float32)), put(np.ones(64, np.float32))
    for family in (fused_matvec, fused_matmul):
        extra = {"batch": 1} if family is fused_matvec else {"n_tokens": 1}
        with pytest.raises(ValueError, match="freq_factors needs 128 bytes"):
            family.launch_norm_rope(cpu_device, None, q, k, v, w, xs, g, positions, q_rows=64, kv_rows=64, cols=64,
                                    head_dim=64, rope_dim=64, eps=EPS, theta=THETA, freq_scale=1.0, weight_type="f32",
                                    freq_factors=small, **extra)


def chain(raw, weight_type, x, g, rows, cols):
    """rmsnorm(x) * g @ W^T in float64, from the weights' own decoder."""
    w = matvec.dequantize_rows(raw.reshape(rows, -1), weight_type, cols, np.float64)
    return rmsnorm.reference(x, g, EPS) @ w.T


@pytest.mark.parametrize("family", [fused_matvec, fused_matmul], ids=["fused_matvec", "fused_matmul"])
def test_fused_norm_rope_references_and_host_kernels_apply_the_factors(cpu_device, put, family):
    rng = np.random.default_rng(3)
    head_dim, rope_dim, q_rows, kv_rows, cols, batch = 16, 16, 48, 16, 64, 3
    rows = q_rows + 2 * kv_rows
    raw = random_weights(rng, "q8_0", rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    positions = np.array([1, 40, 2500], np.int32)
    factors = far_factors(rng, rope_dim)
    y = chain(raw, "q8_0", x, g, rows, cols)
    want_q = rotated_by_hand(y[:, :q_rows].reshape(batch, -1, head_dim), positions, rope_dim, THETA, FREQ_SCALE, factors)
    want_k = rotated_by_hand(y[:, q_rows:q_rows + kv_rows].reshape(batch, -1, head_dim), positions, rope_dim, THETA,
                             FREQ_SCALE, factors)
    ref_q, ref_k, ref_v = family.reference_norm_rope(raw, "q8_0", x, g, EPS, positions, q_rows, kv_rows, cols, head_dim,
                                                     rope_dim, THETA, FREQ_SCALE, factors)
    np.testing.assert_allclose(ref_q, want_q.reshape(batch, -1), rtol=0, atol=1e-9)
    np.testing.assert_allclose(ref_k, want_k.reshape(batch, -1), rtol=0, atol=1e-9)

    q, k, v = (put(np.zeros(batch * n, np.float32)) for n in (q_rows, kv_rows, kv_rows))
    extra = {"batch": batch} if family is fused_matvec else {"n_tokens": batch}
    family.launch_norm_rope(cpu_device, None, q, k, v, put(raw), put(x), put(g), put(positions), q_rows=q_rows,
                            kv_rows=kv_rows, cols=cols, head_dim=head_dim, rope_dim=rope_dim, eps=EPS, theta=THETA,
                            freq_scale=FREQ_SCALE, weight_type="q8_0", freq_factors=put(factors), **extra)
    scale = np.abs(y).max()
    for buf, want, width in ((q, want_q, q_rows), (k, want_k, kv_rows), (v, ref_v, kv_rows)):
        got = buf.download(np.float32, batch * width).reshape(batch, width)
        np.testing.assert_allclose(got, want.reshape(batch, width), rtol=0, atol=1e-5 * scale)


def test_fused_qmatvec_reference_and_host_kernel_apply_the_factors(cpu_device, put):
    rng = np.random.default_rng(4)
    types = ("q4_k", "q4_k", "q6_k")
    head_dim, rope_dim, q_rows, kv_rows, cols, batch = 16, 16, 32, 16, 256, 2
    raws = [random_weights(rng, t, r, cols) for t, r in zip(types, (q_rows, kv_rows, kv_rows))]
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    positions = np.array([7, 3000], np.int32)
    factors = far_factors(rng, rope_dim)
    # Unrotated products from the op's own norm reference, rotated independently.
    unrotated = [fused_qmatvec.reference_norm(r, t, x, g, EPS, n, cols) for r, t, n in zip(raws, types, (q_rows, kv_rows,
                                                                                                          kv_rows))]
    want = [rotated_by_hand(unrotated[0].reshape(batch, -1, head_dim), positions, rope_dim, THETA, FREQ_SCALE, factors),
            rotated_by_hand(unrotated[1].reshape(batch, -1, head_dim), positions, rope_dim, THETA, FREQ_SCALE, factors),
            unrotated[2]]
    refs = fused_qmatvec.reference_norm_rope(list(zip(raws, types)), x, g, EPS, positions, q_rows, kv_rows, cols,
                                             head_dim, rope_dim, THETA, FREQ_SCALE, factors)
    outs = [put(np.zeros(batch * n, np.float32)) for n in (q_rows, kv_rows, kv_rows)]
    fused_qmatvec.launch_norm_rope(cpu_device, None, *outs, [(put(r), t) for r, t in zip(raws, types)], put(x), put(g),
                                   put(positions), q_rows=q_rows, kv_rows=kv_rows, cols=cols, batch=batch,
                                   head_dim=head_dim, rope_dim=rope_dim, eps=EPS, theta=THETA, freq_scale=FREQ_SCALE,
                                   freq_factors=put(factors))
    for ref, w, buf, width in zip(refs, want, outs, (q_rows, kv_rows, kv_rows)):
        w = w.reshape(batch, width)
        np.testing.assert_allclose(ref, w, rtol=0, atol=1e-9)
        got = buf.download(np.float32, batch * width).reshape(batch, width)
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-5 * np.abs(w).max())


# ---- the projection planner passes the factors on every path --------------------------------------

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 256, 2, 1, 32


def planner_layer(put, cpu_device, rng, weight_type: str, concatenated: bool, factors):
    q_rows, kv_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    raws = {n: random_weights(rng, weight_type, r, HIDDEN) for n, r in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))}
    lw = SimpleNamespace(attn_norm=Weight(put((1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)), "f32",
                                          (HIDDEN,)), attn_qkv=None)
    for n, r in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
        setattr(lw, f"attn_{n}", Weight(put(raws[n]), weight_type, (r, HIDDEN)))
    if concatenated:
        lw.attn_qkv = Weight(put(np.concatenate([raws["q"], raws["k"], raws["v"]])), weight_type,
                             (q_rows + 2 * kv_rows, HIDDEN))
    t_max = 16
    sizes = {"x": HIDDEN, "xn": HIDDEN, "q": q_rows, "k": kv_rows, "v": kv_rows}
    buffers = {n: put(np.zeros(t_max * width, np.float32)) for n, width in sizes.items()}
    buffers["matmul_workspace"] = put(np.zeros(fused_matmul.WORKSPACE_BYTES // 4, np.float32))
    config = SimpleNamespace(n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN,
                             rms_norm_eps=EPS, rope_dim=HEAD_DIM, rope_theta=THETA, qkv_bias=False)
    planner = ProjectionPlanner(cpu_device, None, config, buffers, FREQ_SCALE, put(factors))
    return planner, lw, raws, buffers


# (weight type, q|k|v in one buffer, tokens) -> the launch the planner picks
PATHS = {"fused_matvec": ("q8_0", True, 3), "fused_matmul": ("q8_0", True, 12),
         "fused_qmatvec": ("q4_k", False, 2), "single ops": ("q8_0", False, 12)}


@pytest.mark.parametrize("path", list(PATHS))
def test_projection_planner_passes_the_factors_on_every_path(cpu_device, put, path):
    weight_type, concatenated, t = PATHS[path]
    rng = np.random.default_rng(len(path))
    factors = far_factors(rng, HEAD_DIM)
    planner, lw, raws, b = planner_layer(put, cpu_device, rng, weight_type, concatenated, factors)
    x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
    positions = rng.integers(0, 3000, t).astype(np.int32)
    b["x"].upload(x)
    plan = planner.attention_input(lw, t, put(positions))
    assert (len(plan) == 1) == (path != "single ops"), [name for name, _ in plan]
    for _, launch in plan:
        launch()
    g = lw.attn_norm.buffer.download(np.float32, HIDDEN)
    for name, heads in (("q", HEADS), ("k", KV_HEADS)):
        if path == "fused_qmatvec":  # int8 activations: its own norm reference gives the unrotated product
            y = fused_qmatvec.reference_norm(raws[name], weight_type, x, g, EPS, heads * HEAD_DIM, HIDDEN)
        else:
            y = chain(raws[name], weight_type, x, g, heads * HEAD_DIM, HIDDEN)
        want = rotated_by_hand(y.reshape(t, heads, HEAD_DIM), positions, HEAD_DIM, THETA, FREQ_SCALE, factors)
        got = b[name].download(np.float32, t * heads * HEAD_DIM).reshape(t, heads, HEAD_DIM)
        tolerance = 1e-5 * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance, err_msg=f"{path}: {name}")
