"""hipcore/model/projections.py's prompt steps on f16 activations, on the Q4_K_M-shaped layer of
tests/support/kquant_layer.py run on the cpu backend (its host kernels), the GPU's arch set by hand: the SwiGLU
pairs (64-token tiles), the 128-token tiles (the gate, then the up product with the SwiGLU; f16 q, k, v; the o
product reading the attention as f16), and the launchers' refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.model.projections import ProjectionPlanner
from hipcore.model.weights import Weight
from hipcore.ops import matmul_mma_swiglu
from support.kquant_layer import (FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, TYPES, layer, read,  # noqa: F401 (layer: a fixture)
                                  run)
from support.weight_samples import random_weights


def feed_forward_buffers(layer, cpu_device, t: int):
    """(buffers, workspace, config) of a feed-forward step of t tokens on the f16 paths: x, xn, gate, up, ffn_h16,
    and a workspace of the pairs' counters (zeroed; the caller frees it)."""
    from hipcore.ops import matmul_mma

    buffers = {name: layer.put(np.zeros(t * n, np.float32)) for name, n in (("x", HIDDEN), ("xn", HIDDEN),
                                                                            ("gate", FFN), ("up", FFN))}
    buffers["ffn_h16"] = layer.put(np.zeros(t * FFN, np.float16))
    workspace = cpu_device.allocate(matmul_mma.COUNTER_BYTES, "scratch")
    workspace.fill(0)
    return buffers, workspace, SimpleNamespace(hidden_size=HIDDEN, ffn_size=FFN, rms_norm_eps=1e-5)


def test_prompt_steps_on_matrix_cores_run_the_feed_forward_in_f16_with_swiglu_pairs(layer, cpu_device, monkeypatch):
    """A prompt step (64-token tiles) on a device with matrix cores norms x to f16, computes a Q4_K gate and up
    in one matmul_mma_swiglu launch that leaves silu(gate) * up as f16 in b["ffn_h16"] (no silu_mul launch),
    and the Q6_K down product reads it (x16 entry, the residual added); without the workspace its counters
    live in, without the ffn_h16 buffer, with Q6_K gate and up, or on a device
    without matrix cores the step keeps float32, two products and silu_mul."""
    from hipcore.ops import matmul, matmul_mma, silu_mul

    t = 70
    lw, rng = layer.lw, layer.rng
    monkeypatch.setattr(matmul, "BUSY_WORKGROUPS", 1)  # 64-token tiles for this small layer, as for a model's
    assert matmul_mma.pick_tile_tokens(FFN, t) == 64
    buffers, workspace, config = feed_forward_buffers(layer, cpu_device, t)

    def planner(without=()):
        b = {k: v for k, v in {**buffers, "matmul_workspace": workspace}.items() if k not in without}
        return ProjectionPlanner(cpu_device, None, config, b, 1.0)

    def names(without=()):
        p = planner(without)
        return [n for plan in (p.feed_forward_input(lw, t), p.feed_forward_output(lw, t)) for n, _ in plan]

    try:
        single = ["ffn_norm", "gate_proj", "up_proj", "silu_mul", "ffn_down+residual"]
        monkeypatch.setattr(cpu_device, "arch", "gfx1030")
        assert names()[:4] == single[:4]
        monkeypatch.setattr(cpu_device, "arch", "sm_90")
        assert names(without=("matmul_workspace",)) == single
        assert names(without=("ffn_h16",)) == single
        p = planner()
        plan = p.feed_forward_input(lw, t) + p.feed_forward_output(lw, t)
        assert [n for n, _ in plan] == ["ffn_norm", "gate_up+silu", "ffn_down+residual"]

        x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
        buffers["x"].upload(x)
        run(plan)
        g_ffn = read(layer.norms["ffn_norm"].buffer, (HIDDEN,))
        xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * g_ffn
        x16 = buffers["xn"].download(np.float16, t * HIDDEN).reshape(t, HIDDEN).astype(np.float32)
        np.testing.assert_allclose(x16, xn, rtol=2.0**-10, atol=1e-6)  # rmsnorm's f16 output
        g = matmul.reference(layer.raw["ffn_gate"], "q4_k", x16, FFN, HIDDEN)
        u = matmul.reference(layer.raw["ffn_up"], "q4_k", x16, FFN, HIDDEN)
        h = silu_mul.reference(g, u)
        h16 = buffers["ffn_h16"].download(np.float16, t * FFN).reshape(t, FFN).astype(np.float32)
        np.testing.assert_allclose(h16, h, rtol=2.0**-10, atol=1e-4 * np.abs(h).max())
        want = x + matmul.reference(layer.raw["ffn_down"], "q6_k", h16, HIDDEN, FFN)
        np.testing.assert_allclose(read(buffers["x"], (t, HIDDEN)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())

        # A Q6_K pair (not one of SWIGLU_TYPES) keeps the two products.
        q6 = {name: Weight(layer.put(random_weights(rng, "q6_k", FFN, HIDDEN)), "q6_k", (FFN, HIDDEN))
              for name in ("ffn_gate", "ffn_up")}
        monkeypatch.setattr(lw, "ffn_gate", q6["ffn_gate"])
        monkeypatch.setattr(lw, "ffn_up", q6["ffn_up"])
        assert names() == single
    finally:
        workspace.free()


def test_a_swiglu_pair_refuses_what_its_kernel_cannot_take(cpu_device):
    """launch_swiglu's checks: a type without a pair entry, no workspace for the counters, more tiles than
    counters, outputs overlapping; and launch's f16 x only for its types, the block formats, F16 and BF16 only in
    128-token tiles."""
    from hipcore.ops import matmul_mma

    rng = np.random.default_rng(3)
    rows, cols, t = 128, 256, 64
    bufs = []

    def put(array):
        buf = cpu_device.allocate(array.nbytes, "activations")
        buf.upload(np.ascontiguousarray(array))
        bufs.append(buf)
        return buf

    try:
        wg, wu = (put(random_weights(rng, "q4_k", rows, cols)) for _ in range(2))
        x16, h16 = put(np.zeros(t * cols, np.float16)), put(np.zeros(t * rows, np.float16))
        gate, up = put(np.zeros(t * rows, np.float32)), put(np.zeros(t * rows, np.float32))
        ws = put(np.zeros(matmul_mma.COUNTER_BYTES // 4, np.int32))
        args = (cpu_device, None, h16, gate, up, wg, wu, x16, rows, cols, t)
        with pytest.raises(ValueError, match="SwiGLU pairs take"):
            matmul_mma_swiglu.launch_swiglu(*args, weight_type="q6_k", workspace=ws)
        with pytest.raises(ValueError, match="workspace"):
            matmul_mma_swiglu.launch_swiglu(*args, weight_type="q4_k", workspace=None)
        with pytest.raises(ValueError, match="counters"):
            matmul_mma_swiglu.launch_swiglu(cpu_device, None, h16, gate, up, wg, wu, x16, rows * 1025, cols, t,
                                     weight_type="q4_k", workspace=ws)
        with pytest.raises(ValueError, match="overlap"):
            matmul_mma_swiglu.launch_swiglu(cpu_device, None, h16, gate, gate, wg, wu, x16, rows, cols, t, weight_type="q4_k",
                                     workspace=ws)
        with pytest.raises(ValueError, match="f16 x is read for"):  # (every matmul_mma type reads f16 x: not F32)
            matmul_mma.launch(cpu_device, None, gate, put(random_weights(rng, "f32", rows, cols)), x16, rows, cols, t,
                              weight_type="f32", x_f16=True)
        with pytest.raises(ValueError, match="128-token tiles only"):  # the block formats have no 64-token x16 entries
            matmul_mma.launch(cpu_device, None, gate, put(random_weights(rng, "q8_0", rows, cols)), x16, rows, cols, t,
                              weight_type="q8_0", x_f16=True)
        matmul_mma_swiglu.launch_swiglu(*args, weight_type="q4_k", workspace=ws)  # and the good launches run
        matmul_mma.launch(cpu_device, None, gate, wg, x16, rows, cols, t, weight_type="q4_k", x_f16=True)
    finally:
        for buf in bufs:
            buf.free()


def run_wide_feed_forward(layer, buffers, plan, t: int):
    """Runs `plan` (a feed-forward on the 128-token tiles of the Q4_K gate and up) on a random x: (x, the gate and up
    products of its f16 norm as the reference computes them, and the f16 result the plan left in ffn_h16)."""
    from hipcore.ops import matmul

    x = layer.rng.standard_normal((t, HIDDEN)).astype(np.float32)
    buffers["x"].upload(x)
    run(plan)
    x16 = buffers["xn"].download(np.float16, t * HIDDEN).reshape(t, HIDDEN).astype(np.float32)
    g = matmul.reference(layer.raw["ffn_gate"], "q4_k", x16, FFN, HIDDEN)
    u = matmul.reference(layer.raw["ffn_up"], "q4_k", x16, FFN, HIDDEN)
    h16 = buffers["ffn_h16"].download(np.float16, t * FFN).reshape(t, FFN).astype(np.float32)
    return x, g, u, h16


def test_wide_prompt_steps_take_the_gate_then_the_up_product_with_the_swiglu(layer, cpu_device, monkeypatch):
    """Where 128-token tiles are many (kernel_choice.silu_up_fits), a prompt step's feed-forward norms x to f16,
    writes the Q4_K gate product (float32, matmul_mma_x16_128), then the up product whose epilogue leaves
    silu(gate) * up as f16 in b["ffn_h16"] (matmul_mma_silu_up), and the Q6_K down reads it; it needs no
    workspace. With fewer tiles the step keeps the SwiGLU pair."""
    from hipcore.ops import matmul, matmul_mma, silu_mul

    t = 130
    lw = layer.lw
    buffers, workspace, config = feed_forward_buffers(layer, cpu_device, t)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    monkeypatch.setattr(matmul, "BUSY_WORKGROUPS", 1)  # 64-token tiles for this small layer, as for a model's

    def plan_of(b):
        p = ProjectionPlanner(cpu_device, None, config, b, 1.0)
        return p.feed_forward_input(lw, t) + p.feed_forward_output(lw, t)

    try:
        # This layer's 512 rows make 8 tiles of 128 tokens: too few, unless the threshold says otherwise.
        assert matmul_mma.pick_x16_tile_tokens(FFN, t, cpu_device.arch) != matmul_mma.WIDE_TILE_TOKENS
        assert [n for n, _ in plan_of({**buffers, "matmul_workspace": workspace})][1] == "gate_up+silu"
        monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 8)
        assert matmul_mma.pick_x16_tile_tokens(FFN, t, cpu_device.arch) == matmul_mma.WIDE_TILE_TOKENS
        # 8 tiles would be split: silu_up takes no splits, so the pair stays, unless the GPU holds fewer items.
        assert [n for n, _ in plan_of({**buffers, "matmul_workspace": workspace})][1] == "gate_up+silu"
        monkeypatch.setattr(matmul_mma, "BUSY_ITEMS", 8)
        plan = plan_of(buffers)  # no workspace: the wide path has no counters
        assert [n for n, _ in plan] == ["ffn_norm", "gate_proj", "up_proj+silu", "ffn_down+residual"]

        x, g, u, h16 = run_wide_feed_forward(layer, buffers, plan, t)
        np.testing.assert_allclose(read(buffers["gate"], (t, FFN)), g, rtol=1e-5, atol=1e-5 * np.abs(g).max())
        h = silu_mul.reference(g, u)
        np.testing.assert_allclose(h16, h, rtol=2.0**-10, atol=1e-4 * np.abs(h).max())
        want = x + matmul.reference(layer.raw["ffn_down"], "q6_k", h16, HIDDEN, FFN)
        np.testing.assert_allclose(read(buffers["x"], (t, HIDDEN)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    finally:
        workspace.free()


def test_wide_prompt_steps_of_a_geglu_take_the_up_product_with_the_gelu_and_a_down_product_from_f16(
        layer, cpu_device, monkeypatch):
    """Gemma's GeGLU feed-forward on the same 128-token tiles: the gate product, then the up product whose epilogue
    leaves gelu(gate) * up as f16 in b["ffn_h16"] (matmul_mma_silu_up with its gelu argument), and Gemma's down
    product (ProjectionPlanner.product, before the post-norm) reading it as f16 into b["proj"]. Where only a SwiGLU
    pair would fit (it has no GeGLU), the step keeps float32, two products and gelu_mul."""
    from hipcore.ops import gelu_mul, matmul, matmul_mma, silu_mul

    t = 130
    lw = layer.lw
    buffers, workspace, config = feed_forward_buffers(layer, cpu_device, t)
    buffers["proj"] = layer.put(np.zeros(t * HIDDEN, np.float32))
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    monkeypatch.setattr(matmul, "BUSY_WORKGROUPS", 1)
    p = ProjectionPlanner(cpu_device, None, config, {**buffers, "matmul_workspace": workspace}, 1.0)
    try:
        assert not p.ffn_pairs(lw, t, "gelu") and p.ffn_pairs(lw, t)  # the pair's tiles: SwiGLU only
        assert [n for n, _ in p.feed_forward_input(lw, t, "gelu")] == ["ffn_norm", "gate_proj", "up_proj", "gelu_mul"]
        monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 8)
        monkeypatch.setattr(matmul_mma, "BUSY_ITEMS", 8)
        assert p.ffn_pairs(lw, t, "gelu")
        plan = p.feed_forward_input(lw, t, "gelu") + p.product("ffn_down", lw.ffn_down, buffers["ffn_h16"], FFN, t,
                                                               x_f16=True)
        assert [n for n, _ in plan] == ["ffn_norm", "gate_proj", "up_proj+gelu", "ffn_down"]

        _, g, u, h16 = run_wide_feed_forward(layer, buffers, plan, t)
        h = gelu_mul.reference(g, u)
        np.testing.assert_allclose(h16, h, rtol=2.0**-10, atol=1e-4 * np.abs(h).max())
        assert np.abs(h16 - h).max() < 0.5 * np.abs(h16 - silu_mul.reference(g, u)).max()  # GELU, not SiLU
        want = matmul.reference(layer.raw["ffn_down"], "q6_k", h16, HIDDEN, FFN)
        np.testing.assert_allclose(read(buffers["proj"], (t, HIDDEN)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    finally:
        workspace.free()


@pytest.mark.parametrize("weight_type", ["q8_0", "f16"])
def test_wide_block_format_prompt_steps_take_the_128_token_f16_path(layer, cpu_device, monkeypatch, weight_type):
    """A feed-forward of a block format or F16 (kernel_choice.mma_first's wide layers; MMA_FIRST_MIN_COLS set to 0 for
    this small layer) takes the same f16 path as the K-quants where 128-token tiles are many: the gate product, the
    up product with the SwiGLU (matmul_mma_silu_up_<type>), down reading f16; where they are not it keeps float32,
    two products and silu_mul (these types have no 64-token f16 entries and no SwiGLU pairs)."""
    from hipcore.ops import kernel_choice, matmul, matmul_mma, silu_mul

    t = 130
    lw, rng = layer.lw, layer.rng
    buffers, workspace, config = feed_forward_buffers(layer, cpu_device, t)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    monkeypatch.setattr(kernel_choice, "MMA_FIRST_MIN_COLS", 0)
    monkeypatch.setattr(matmul, "BUSY_WORKGROUPS", 1)
    raw = {name: random_weights(rng, weight_type, rows, cols)
           for name, rows, cols in (("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN))}
    for name, r in raw.items():
        monkeypatch.setattr(lw, name, Weight(layer.put(r), weight_type, (r.shape[0], HIDDEN if name != "ffn_down" else FFN)))

    def names():
        p = ProjectionPlanner(cpu_device, None, config, {**buffers, "matmul_workspace": workspace}, 1.0)
        return p, [n for n, _ in p.feed_forward_input(lw, t) + p.feed_forward_output(lw, t)]

    try:
        assert names()[1] == ["ffn_norm", "gate_proj", "up_proj", "silu_mul", "ffn_down+residual"]
        # 130 tokens: two token tiles; FFN's 512 rows make 8 tiles of 128, HIDDEN's 256 (down) 4.
        monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 8)
        monkeypatch.setattr(matmul_mma, "BUSY_ITEMS", 2)  # unsplit, as silu_up needs
        assert matmul_mma.pick_x16_tile_tokens(FFN, t, "sm_90") == matmul_mma.WIDE_TILE_TOKENS
        assert names()[1] == ["ffn_norm", "gate_proj", "up_proj", "silu_mul", "ffn_down+residual"]  # down: 64-token
        monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 4)
        p, got = names()
        assert got == ["ffn_norm", "gate_proj", "up_proj+silu", "ffn_down+residual"]
        x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
        buffers["x"].upload(x)
        run(p.feed_forward_input(lw, t) + p.feed_forward_output(lw, t))
        x16 = buffers["xn"].download(np.float16, t * HIDDEN).reshape(t, HIDDEN).astype(np.float32)
        h = silu_mul.reference(matmul.reference(raw["ffn_gate"], weight_type, x16, FFN, HIDDEN),
                               matmul.reference(raw["ffn_up"], weight_type, x16, FFN, HIDDEN))
        h16 = buffers["ffn_h16"].download(np.float16, t * FFN).reshape(t, FFN).astype(np.float32)
        np.testing.assert_allclose(h16, h, rtol=2.0**-10, atol=1e-4 * np.abs(h).max())
        want = x + matmul.reference(raw["ffn_down"], weight_type, h16, HIDDEN, FFN)
        np.testing.assert_allclose(read(buffers["x"], (t, HIDDEN)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    finally:
        workspace.free()


def test_the_wide_swiglu_refuses_what_its_kernel_cannot_take(layer, cpu_device, monkeypatch):
    """launch_silu_up's checks (a GPU without the entry, a type without it, h16 over gate, too small a gate) and
    launch's refusal of 128-token tiles where they do not exist or for float32 x."""
    from hipcore.ops import matmul_mma

    rng, put = np.random.default_rng(4), layer.put  # the fixture frees what it allocates
    rows, cols, t = 128, 256, 64
    monkeypatch.setattr(cpu_device, "arch", "gfx942")
    wu = put(random_weights(rng, "q4_k", rows, cols))
    x16, h16 = put(np.zeros(t * cols, np.float16)), put(np.zeros(t * rows, np.float16))
    gate = put(np.zeros(t * rows, np.float32))
    with pytest.raises(ValueError, match="NVIDIA sm_80 and later, not gfx942"):
        matmul_mma_swiglu.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q4_k")
    with pytest.raises(ValueError, match="NVIDIA sm_80 and later, not gfx942"):
        matmul_mma.launch(cpu_device, None, gate, wu, x16, rows, cols, t, weight_type="q4_k", x_f16=True,
                          tile_tokens=matmul_mma.WIDE_TILE_TOKENS)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    with pytest.raises(ValueError, match="up product with silu takes"):
        matmul_mma_swiglu.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q6_k")
    with pytest.raises(ValueError, match="up product with gelu takes"):  # GELU_UP_TYPES: the K-quants alone
        matmul_mma_swiglu.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q8_0",
                                         activation="gelu")
    with pytest.raises(ValueError, match="activation is one of"):
        matmul_mma_swiglu.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q4_k",
                                         activation="relu")
    with pytest.raises(ValueError, match="overlap"):
        matmul_mma_swiglu.launch_silu_up(cpu_device, None, gate, gate, wu, x16, rows, cols, t, weight_type="q4_k")
    with pytest.raises(ValueError, match="gate"):
        matmul_mma_swiglu.launch_silu_up(cpu_device, None, h16, h16, wu, x16, rows, cols, t, weight_type="q4_k")
    with pytest.raises(ValueError, match="read f16 x"):
        matmul_mma.launch(cpu_device, None, gate, wu, put(np.zeros(t * cols, np.float32)), rows, cols, t,
                          weight_type="q4_k", tile_tokens=matmul_mma.WIDE_TILE_TOKENS)
    matmul_mma_swiglu.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q4_k")
    matmul_mma.launch(cpu_device, None, gate, wu, x16, rows, cols, t, weight_type="q4_k", x_f16=True,
                      tile_tokens=matmul_mma.WIDE_TILE_TOKENS)


def test_prompt_steps_with_wide_qkv_tiles_norm_x_to_f16_for_q_k_and_v(layer, cpu_device, monkeypatch):
    """Where q, k and v all take the 128-token tiles (pick_x16_tile_tokens), the attention's norm writes f16 and
    they read it (matmul_mma.launch with x_f16); their products are those of the f16 values. Where k and v do not,
    or on a GPU without the wide tiles, x stays float32."""
    from hipcore.ops import matmul, matmul_mma

    t = 130
    lw, rng = layer.lw, layer.rng
    bufs = {name: layer.put(np.zeros(t * n, np.float32)) for name, n in (("x", HIDDEN), ("xn", HIDDEN),
                                                                         ("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM),
                                                                         ("v", KV_HEADS * HEAD_DIM))}
    config = SimpleNamespace(n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, ffn_size=FFN,
                             rms_norm_eps=1e-5, rope_dim=HEAD_DIM, rope_theta=10000.0, qkv_bias=False)
    planner = ProjectionPlanner(cpu_device, None, config, {**bufs, "matmul_workspace": layer.put(
        np.zeros(matmul_mma.WIDE_WORKSPACE_BYTES // 4, np.int32))}, 1.0)
    positions = layer.put(np.arange(t, dtype=np.int32))
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    assert not planner.qkv_f16(lw, t)  # q's 256 rows at 130 tokens: 4 tiles of 128 tokens, fewer than WIDE_MIN_TILES
    monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 3)
    assert not planner.qkv_f16(lw, t)  # k's and v's 128 rows: 2 tiles each
    monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 2)
    assert planner.qkv_f16(lw, t)
    monkeypatch.setattr(cpu_device, "arch", "gfx942")
    assert not planner.qkv_f16(lw, t)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")

    x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
    bufs["x"].upload(x)
    plan = planner.attention_input(lw, t, positions)
    run([(n, launch) for n, launch in plan if n in ("attn_norm", "q_proj", "k_proj", "v_proj")])
    g = read(layer.norms["attn_norm"].buffer, (HIDDEN,))
    xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * g
    x16 = bufs["xn"].download(np.float16, t * HIDDEN).reshape(t, HIDDEN).astype(np.float32)
    np.testing.assert_allclose(x16, xn, rtol=2.0**-10, atol=1e-6)
    for name, rows in (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM)):
        want = matmul.reference(layer.raw[f"attn_{name}"], TYPES[f"attn_{name}"], x16, rows, HIDDEN)
        np.testing.assert_allclose(read(bufs[name], (t, rows)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_o_product_reads_f16_attention_where_its_tiles_are_wide(layer, cpu_device, monkeypatch):
    """reads_f16: the o product (Q4_K here) in 128-token tiles on a GPU that has them; residual_product with x_f16
    adds attn16 @ Wo^T to x (matmul_mma_x16_128 with the residual add), and refuses where reads_f16 is false."""
    from hipcore.ops import matmul, matmul_mma

    t = 130
    lw, rng = layer.lw, layer.rng
    x_buf = layer.put(np.zeros(t * HIDDEN, np.float32))
    attn16 = rng.standard_normal((t, HEADS * HEAD_DIM)).astype(np.float16)
    attn_buf = layer.put(attn16)
    config = SimpleNamespace(hidden_size=HIDDEN)
    planner = ProjectionPlanner(cpu_device, None, config, {"x": x_buf, "matmul_workspace": layer.put(
        np.zeros(matmul_mma.WIDE_WORKSPACE_BYTES // 4, np.int32))}, 1.0)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    assert not planner.reads_f16(lw.attn_output, t)  # 256 rows: 4 tiles of 128 tokens
    with pytest.raises(ValueError, match="cannot read f16"):
        planner.residual_product("attn_output", lw.attn_output, attn_buf, HEADS * HEAD_DIM, t, x_f16=True)
    monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 4)
    assert planner.reads_f16(lw.attn_output, t)
    assert not planner.reads_f16(lw.ffn_down, 64)  # fewer tokens than WIDE_MIN_TOKENS
    monkeypatch.setattr(cpu_device, "arch", "gfx942")
    assert not planner.reads_f16(lw.attn_output, t)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")

    x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
    x_buf.upload(x)
    plan = planner.residual_product("attn_output", lw.attn_output, attn_buf, HEADS * HEAD_DIM, t, x_f16=True)
    assert [n for n, _ in plan] == ["attn_output+residual"]
    run(plan)
    want = x + matmul.reference(layer.raw["attn_output"], "q4_k", attn16.astype(np.float32), HIDDEN, HEADS * HEAD_DIM)
    np.testing.assert_allclose(read(x_buf, (t, HIDDEN)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
