"""hipcore/model/projections.py on a Q4_K_M-shaped layer (Q4_K q, k, o, gate, up; Q6_K v, down and the head),
run on the cpu backend with the weights kept in their GGUF blocks as a GPU holds them: decode steps of up to
FUSED_QMATVEC_MAX_TOKENS tokens take one fused_qmatvec launch per product group (four per layer, as a Q4_1
layer), and each launch computes what fused_qmatvec's reference says; longer steps keep the single ops."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.model.projections import FUSED_MATVEC_MAX_TOKENS, FUSED_QMATVEC_MAX_TOKENS, ProjectionPlanner
from hipcore.model.weights import Weight
from hipcore.ops import fused_qmatvec
from support.weight_samples import random_weights

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 256, 4, 2, 64, 512, 40
TYPES = {"attn_q": "q4_k", "attn_k": "q4_k", "attn_v": "q6_k", "attn_output": "q4_k", "ffn_gate": "q4_k",
         "ffn_up": "q4_k", "ffn_down": "q6_k", "output": "q6_k"}
SHAPES = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
          "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM), "ffn_gate": (FFN, HIDDEN),
          "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN), "output": (VOCAB, HIDDEN)}
MAX_T = 12


@pytest.fixture
def layer(cpu_device):
    rng = np.random.default_rng(5)
    allocated = []

    def put(array):
        buf = cpu_device.allocate(max(array.nbytes, 4), "activations")
        buf.upload(np.ascontiguousarray(array))
        allocated.append(buf)
        return buf

    raw = {name: random_weights(rng, TYPES[name], *SHAPES[name]) for name in TYPES}
    weights = {name: Weight(put(raw[name]), TYPES[name], SHAPES[name]) for name in TYPES}
    norms = {name: Weight(put((1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)), "f32", (HIDDEN,))
             for name in ("attn_norm", "ffn_norm", "output_norm")}
    lw = SimpleNamespace(attn_qkv=None, ffn_gate_up=None, attn_norm=norms["attn_norm"], ffn_norm=norms["ffn_norm"],
                         **{k: v for k, v in weights.items() if k != "output"})
    sizes = {"x": MAX_T * HIDDEN, "xn": MAX_T * HIDDEN, "proj": MAX_T * HIDDEN, "q": MAX_T * HEADS * HEAD_DIM,
             "k": MAX_T * KV_HEADS * HEAD_DIM, "v": MAX_T * KV_HEADS * HEAD_DIM, "attn": MAX_T * HEADS * HEAD_DIM,
             "gate": MAX_T * FFN, "up": MAX_T * FFN, "logits": MAX_T * VOCAB, "rows": MAX_T * HIDDEN}
    buffers = {name: put(np.zeros(n, np.float32)) for name, n in sizes.items()}
    config = SimpleNamespace(n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, ffn_size=FFN,
                             vocab_size=VOCAB, rms_norm_eps=1e-5, rope_dim=HEAD_DIM, rope_theta=10000.0)
    planner = ProjectionPlanner(cpu_device, None, config, buffers, 1.0)
    yield SimpleNamespace(planner=planner, lw=lw, raw=raw, weights=weights, norms=norms, b=buffers, put=put, rng=rng)
    for buf in allocated:
        buf.free()


def run(plan):
    for _, launch in plan:
        launch()


def read(buf, shape):
    return buf.download(np.float32, int(np.prod(shape))).reshape(shape)


@pytest.mark.parametrize("t", [1, 3, FUSED_QMATVEC_MAX_TOKENS])
def test_decode_steps_take_four_fused_launches_per_layer_and_one_for_the_head(layer, t):
    p, lw, b, raw, rng = layer.planner, layer.lw, layer.b, layer.raw, layer.rng
    x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
    g_attn, g_ffn, g_out = (read(layer.norms[n].buffer, (HIDDEN,)) for n in ("attn_norm", "ffn_norm", "output_norm"))
    positions = layer.put(rng.integers(0, 500, t).astype(np.int32))
    b["x"].upload(x)

    attn = p.attention_input(lw, t, positions)
    ffn = p.feed_forward_input(lw, t)
    out = p.residual_product("attn_output", lw.attn_output, b["attn"], HEADS * HEAD_DIM, t)
    down = p.residual_product("ffn_down", lw.ffn_down, b["gate"], FFN, t)
    head = p.head(layer.weights["output"], layer.norms["output_norm"], b["x"], t)
    assert [name for plan in (attn, ffn, out, down, head) for name, _ in plan] == [
        "attn_norm+qkv+rope", "ffn_norm+gate_up+silu", "attn_output+residual", "ffn_down+residual", "output_norm+head"]

    run(attn)
    pos = read(positions, (t,)).view(np.int32)
    want = fused_qmatvec.reference_norm_rope([(raw[n], TYPES[n]) for n in ("attn_q", "attn_k", "attn_v")], x, g_attn,
                                             1e-5, pos, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, HIDDEN, HEAD_DIM,
                                             HEAD_DIM, 10000.0, 1.0)
    for name, ref in zip("qkv", want):
        np.testing.assert_allclose(read(b[name], ref.shape), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)
    run(ffn)
    ref = fused_qmatvec.reference_norm_swiglu([(raw["ffn_gate"], "q4_k"), (raw["ffn_up"], "q4_k")], x, g_ffn, 1e-5,
                                              FFN, HIDDEN)
    np.testing.assert_allclose(read(b["gate"], ref.shape), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    attn_out = rng.standard_normal((t, HEADS * HEAD_DIM)).astype(np.float32)
    b["attn"].upload(attn_out)
    run(out)
    ref = fused_qmatvec.reference_add(raw["attn_output"], "q4_k", attn_out, x, HIDDEN, HEADS * HEAD_DIM)
    np.testing.assert_allclose(read(b["x"], ref.shape), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    x2 = read(b["x"], (t, HIDDEN)).copy()
    run(head)
    ref = fused_qmatvec.reference_norm(raw["output"], "q6_k", x2, g_out, 1e-5, VOCAB, HIDDEN)
    np.testing.assert_allclose(read(b["logits"], ref.shape), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_prompt_steps_keep_the_single_ops(layer):
    t = FUSED_MATVEC_MAX_TOKENS + 1
    names = [name for name, _ in layer.planner.attention_input(layer.lw, t, layer.b["q"])]
    assert names == ["attn_norm", "q_proj", "k_proj", "v_proj", "rope_q", "rope_k"]
    assert len(layer.planner.feed_forward_input(layer.lw, t)) == 4


def test_an_unsupported_type_in_the_group_keeps_the_single_ops(layer, cpu_device):
    """One f16 matrix among K-quants: no fused kernel reads that mix, so the layer takes the single ops."""
    v = layer.lw.attn_v
    layer.lw.attn_v = Weight(layer.put(np.zeros(v.rows * v.cols, np.float16)), "f16", v.shape)
    names = [name for name, _ in layer.planner.attention_input(layer.lw, 1, layer.b["q"])]
    assert names[0] == "attn_norm" and len(names) == 6


def test_the_qmatvec_limit_moves_the_k_quant_decode_steps_alone(layer, monkeypatch):
    """FUSED_QMATVEC_MAX_TOKENS, not fused_matvec's limit, decides where the separate K-quant matrices leave
    fused_qmatvec: lowered to 2, a 4-token step takes the single ops while fused_matvec's limit stays 8."""
    from hipcore.model import projections

    monkeypatch.setattr(projections, "FUSED_QMATVEC_MAX_TOKENS", 2)
    assert projections.FUSED_MATVEC_MAX_TOKENS == 8
    p, lw, b = layer.planner, layer.lw, layer.b
    assert [n for n, _ in p.attention_input(lw, 2, b["q"])] == ["attn_norm+qkv+rope"]
    assert [n for n, _ in p.attention_input(lw, 4, b["q"])] == ["attn_norm", "q_proj", "k_proj", "v_proj", "rope_q",
                                                                 "rope_k"]
    assert [n for n, _ in p.feed_forward_input(lw, 4)] == ["ffn_norm", "gate_proj", "up_proj", "silu_mul"]
    assert [n for n, _ in p.residual_product("ffn_down", lw.ffn_down, b["gate"], FFN, 4)] == ["ffn_down",
                                                                                              "ffn_down_residual"]


def test_on_matrix_cores_the_residual_add_rides_in_the_product(layer, cpu_device, monkeypatch):
    """Past fused_qmatvec's limit, a device with matrix cores adds o and down to the residual stream in
    matmul_mma's epilogue (one launch, accumulate); a device without keeps the product and the add."""
    from hipcore.ops import matmul

    t = MAX_T
    p, lw, b, raw, rng = layer.planner, layer.lw, layer.b, layer.raw, layer.rng
    monkeypatch.setattr(cpu_device, "arch", "gfx1030")
    assert [n for n, _ in p.residual_product("ffn_down", lw.ffn_down, b["gate"], FFN, t)] == ["ffn_down",
                                                                                              "ffn_down_residual"]
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    plan = p.residual_product("ffn_down", lw.ffn_down, b["gate"], FFN, t)
    assert [n for n, _ in plan] == ["ffn_down+residual"]
    x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
    gate = rng.standard_normal((t, FFN)).astype(np.float32)
    b["x"].upload(x)
    b["gate"].upload(gate)
    run(plan)
    want = x + matmul.reference(raw["ffn_down"], "q6_k", gate, HIDDEN, FFN)
    bound = matmul.error_bound(raw["ffn_down"], "q6_k", gate, HIDDEN, FFN) + 2.0**-23 * np.abs(want)
    assert np.all(np.abs(read(b["x"], (t, HIDDEN)) - want) <= bound)


def test_where_the_fragment_path_exists_k_quant_steps_leave_fused_qmatvec_sooner(layer, cpu_device, monkeypatch):
    """On NVIDIA sm_80+ (matmul_mma's fragment path) a layer leaves fused_qmatvec after 4 tokens and the head
    after 4 rows; elsewhere after FUSED_QMATVEC_MAX_TOKENS and HEAD_MATVEC_MAX_ROWS. The plans only: the
    cpu backend runs every entry's product."""
    from hipcore.model import projections

    p, lw, b = layer.planner, layer.lw, layer.b
    head = layer.weights["output"]
    fused = ["attn_norm+qkv+rope", "ffn_norm+gate_up+silu", "attn_output+residual"]
    single = ["attn_norm", "q_proj", "k_proj", "v_proj", "rope_q", "rope_k", "ffn_norm", "gate_proj", "up_proj",
              "silu_mul", "attn_output+residual"]

    def names(t):
        return [n for plan in (p.attention_input(lw, t, b["q"]), p.feed_forward_input(lw, t),
                               p.residual_product("attn_output", lw.attn_output, b["attn"], HEADS * HEAD_DIM, t))
                for n, _ in plan]

    def head_names(r):
        return [n for n, _ in p.head(head, layer.norms["output_norm"], b["x"], r)]

    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    assert projections.qmatvec_limit(cpu_device, lw.attn_q, lw.attn_v) == 4
    assert names(4) == fused and names(5) == single
    assert head_names(4) == ["output_norm+head"] and head_names(5) == ["output_norm", "head"]
    monkeypatch.setattr(cpu_device, "arch", "gfx942")
    assert projections.qmatvec_limit(cpu_device, lw.attn_q, lw.attn_v) == FUSED_QMATVEC_MAX_TOKENS
    assert names(FUSED_QMATVEC_MAX_TOKENS) == fused and names(FUSED_QMATVEC_MAX_TOKENS + 1) == single
    assert head_names(projections.HEAD_MATVEC_MAX_ROWS) == ["output_norm+head"]


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
    live in, with ROCMFORGE_SWIGLU_PAIRS=0, without the ffn_h16 buffer, with Q6_K gate and up, or on a device
    without matrix cores the step keeps float32, two products and silu_mul."""
    from hipcore.model import projections
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
        monkeypatch.setenv(projections.SWIGLU_PAIRS_ENV, "0")
        assert names() == single
        monkeypatch.delenv(projections.SWIGLU_PAIRS_ENV)
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
    counters, outputs overlapping; and launch's f16 x only for the K-quants."""
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
            matmul_mma.launch_swiglu(*args, weight_type="q6_k", workspace=ws)
        with pytest.raises(ValueError, match="workspace"):
            matmul_mma.launch_swiglu(*args, weight_type="q4_k", workspace=None)
        with pytest.raises(ValueError, match="counters"):
            matmul_mma.launch_swiglu(cpu_device, None, h16, gate, up, wg, wu, x16, rows * 1025, cols, t,
                                     weight_type="q4_k", workspace=ws)
        with pytest.raises(ValueError, match="overlap"):
            matmul_mma.launch_swiglu(cpu_device, None, h16, gate, gate, wg, wu, x16, rows, cols, t, weight_type="q4_k",
                                     workspace=ws)
        with pytest.raises(ValueError, match="f16 x is read for"):
            matmul_mma.launch(cpu_device, None, gate, put(random_weights(rng, "q8_0", rows, cols)), x16, rows, cols, t,
                              weight_type="q8_0", x_f16=True)
        matmul_mma.launch_swiglu(*args, weight_type="q4_k", workspace=ws)  # and the good launches run
        matmul_mma.launch(cpu_device, None, gate, wg, x16, rows, cols, t, weight_type="q4_k", x_f16=True)
    finally:
        for buf in bufs:
            buf.free()


def test_wide_prompt_steps_take_the_gate_then_the_up_product_with_the_swiglu(layer, cpu_device, monkeypatch):
    """Where 128-token tiles are many (matmul_mma.silu_up_fits), a prompt step's feed-forward norms x to f16,
    writes the Q4_K gate product (float32, matmul_mma_x16_128), then the up product whose epilogue leaves
    silu(gate) * up as f16 in b["ffn_h16"] (matmul_mma_silu_up), and the Q6_K down reads it; it needs no
    workspace. With fewer tiles the step keeps the SwiGLU pair."""
    from hipcore.ops import matmul, matmul_mma, silu_mul

    t = 130
    lw, rng = layer.lw, layer.rng
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

        x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
        buffers["x"].upload(x)
        run(plan)
        x16 = buffers["xn"].download(np.float16, t * HIDDEN).reshape(t, HIDDEN).astype(np.float32)
        g = matmul.reference(layer.raw["ffn_gate"], "q4_k", x16, FFN, HIDDEN)
        u = matmul.reference(layer.raw["ffn_up"], "q4_k", x16, FFN, HIDDEN)
        np.testing.assert_allclose(read(buffers["gate"], (t, FFN)), g, rtol=1e-5, atol=1e-5 * np.abs(g).max())
        h = silu_mul.reference(g, u)
        h16 = buffers["ffn_h16"].download(np.float16, t * FFN).reshape(t, FFN).astype(np.float32)
        np.testing.assert_allclose(h16, h, rtol=2.0**-10, atol=1e-4 * np.abs(h).max())
        want = x + matmul.reference(layer.raw["ffn_down"], "q6_k", h16, HIDDEN, FFN)
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
        matmul_mma.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q4_k")
    with pytest.raises(ValueError, match="NVIDIA sm_80 and later, not gfx942"):
        matmul_mma.launch(cpu_device, None, gate, wu, x16, rows, cols, t, weight_type="q4_k", x_f16=True,
                          tile_tokens=matmul_mma.WIDE_TILE_TOKENS)
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    with pytest.raises(ValueError, match="up product takes"):
        matmul_mma.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q6_k")
    with pytest.raises(ValueError, match="overlap"):
        matmul_mma.launch_silu_up(cpu_device, None, gate, gate, wu, x16, rows, cols, t, weight_type="q4_k")
    with pytest.raises(ValueError, match="gate"):
        matmul_mma.launch_silu_up(cpu_device, None, h16, h16, wu, x16, rows, cols, t, weight_type="q4_k")
    with pytest.raises(ValueError, match="read f16 x"):
        matmul_mma.launch(cpu_device, None, gate, wu, put(np.zeros(t * cols, np.float32)), rows, cols, t,
                          weight_type="q4_k", tile_tokens=matmul_mma.WIDE_TILE_TOKENS)
    matmul_mma.launch_silu_up(cpu_device, None, h16, gate, wu, x16, rows, cols, t, weight_type="q4_k")
    matmul_mma.launch(cpu_device, None, gate, wu, x16, rows, cols, t, weight_type="q4_k", x_f16=True,
                      tile_tokens=matmul_mma.WIDE_TILE_TOKENS)


def test_prompt_steps_with_wide_qkv_tiles_norm_x_to_f16_for_q_k_and_v(layer, cpu_device, monkeypatch):
    """Where q, k and v all take the 128-token tiles (pick_x16_tile_tokens), the attention's norm writes f16 and
    they read it (matmul_mma.launch with x_f16); their products are those of the f16 values. Where k and v do not,
    without the wide tiles (ROCMFORGE_WIDE_TILES=0) or on a GPU without them, x stays float32."""
    from hipcore.ops import matmul, matmul_mma

    t = 130
    lw, rng, b = layer.lw, layer.rng, layer.b
    bufs = {name: layer.put(np.zeros(t * n, np.float32)) for name, n in (("x", HIDDEN), ("xn", HIDDEN),
                                                                         ("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM),
                                                                         ("v", KV_HEADS * HEAD_DIM))}
    config = SimpleNamespace(n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, ffn_size=FFN,
                             rms_norm_eps=1e-5, rope_dim=HEAD_DIM, rope_theta=10000.0)
    planner = ProjectionPlanner(cpu_device, None, config, {**bufs, "matmul_workspace": layer.put(
        np.zeros(matmul_mma.WIDE_WORKSPACE_BYTES // 4, np.int32))}, 1.0)
    positions = layer.put(np.arange(t, dtype=np.int32))
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    assert not planner.qkv_f16(lw, t)  # q's 256 rows at 130 tokens: 4 tiles of 128 tokens, fewer than WIDE_MIN_TILES
    monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 3)
    assert not planner.qkv_f16(lw, t)  # k's and v's 128 rows: 2 tiles each
    monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 2)
    assert planner.qkv_f16(lw, t)
    monkeypatch.setenv(matmul_mma.WIDE_TILES_ENV, "0")
    assert not planner.qkv_f16(lw, t)
    monkeypatch.delenv(matmul_mma.WIDE_TILES_ENV)
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
