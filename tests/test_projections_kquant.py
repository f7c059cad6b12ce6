"""hipcore/model/projections.py on a Q4_K_M-shaped layer (Q4_K q, k, o, gate, up; Q6_K v, down and the head),
run on the cpu backend with the weights kept in their GGUF blocks as a GPU holds them: decode steps of up to
FUSED_QMATVEC_MAX_TOKENS tokens take one fused_qmatvec launch per product group (four per layer, as a Q4_1
layer), and each launch computes what fused_qmatvec's reference says; longer steps keep the single ops. (Prompt
steps on f16 activations: tests/test_projections_f16.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.model.weights import Weight
from hipcore.ops import fused_qmatvec, kernel_choice, rope
from hipcore.ops.kernel_choice import FUSED_MATVEC_MAX_TOKENS, FUSED_QMATVEC_MAX_TOKENS
from support.kquant_layer import (FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, MAX_T, TYPES, VOCAB,  # noqa: F401 (layer: a fixture)
                                  layer, read, run)


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
    monkeypatch.setattr(kernel_choice, "FUSED_QMATVEC_MAX_TOKENS", 2)
    assert kernel_choice.FUSED_MATVEC_MAX_TOKENS == 8
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
    p, lw, b = layer.planner, layer.lw, layer.b
    head = layer.weights["output"]
    fused = ["attn_norm+qkv+rope", "ffn_norm+gate_up+silu", "attn_output+residual"]
    single = ["attn_norm", "q_proj", "k_proj", "v_proj", "rope_q", "rope_k", "ffn_norm", "gate_proj", "up_proj",
              "silu_mul", "attn_output+residual"]
    # on the fragment path q, k and v are one launch (matmul_mma_qkv.launch_qkv), gate, up and SwiGLU another
    # (matmul_mma_swiglu.launch_swiglu_fragments)
    fragments = ["attn_norm", "qkv_proj", "rope_q", "rope_k", "ffn_norm", "gate_up+silu", "attn_output+residual"]

    def names(t):
        return [n for plan in (p.attention_input(lw, t, b["q"]), p.feed_forward_input(lw, t),
                               p.residual_product("attn_output", lw.attn_output, b["attn"], HEADS * HEAD_DIM, t))
                for n, _ in plan]

    def head_names(r):
        return [n for n, _ in p.head(head, layer.norms["output_norm"], b["x"], r)]

    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    assert kernel_choice.qmatvec_limit(cpu_device, lw.attn_q, lw.attn_v) == 4
    assert names(4) == fused and names(5) == fragments
    assert head_names(4) == ["output_norm+head"] and head_names(5) == ["output_norm", "head"]
    monkeypatch.setattr(cpu_device, "arch", "gfx942")
    assert kernel_choice.qmatvec_limit(cpu_device, lw.attn_q, lw.attn_v) == FUSED_QMATVEC_MAX_TOKENS
    assert names(FUSED_QMATVEC_MAX_TOKENS) == fused and names(FUSED_QMATVEC_MAX_TOKENS + 1) == single
    assert head_names(kernel_choice.HEAD_MATVEC_MAX_ROWS) == ["output_norm+head"]

    # the one-launch entries' host kernels compute what the single ops' launches do (q, k, v; silu(gate) * up)
    t, pos = FUSED_QMATVEC_MAX_TOKENS + 1, b["rows"]
    b["x"].upload(layer.rng.standard_normal((t, HIDDEN)).astype(np.float32))
    outs = {}
    for arch in ("gfx942", "sm_90"):
        monkeypatch.setattr(cpu_device, "arch", arch)
        run([launch for launch in p.attention_input(lw, t, pos) + p.feed_forward_input(lw, t)
             if not launch[0].startswith("rope")])
        outs[arch] = [read(b[n], (t, rows)).copy() for n, rows in (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM),
                                                                      ("v", KV_HEADS * HEAD_DIM), ("gate", FFN))]
    for name, single_ops, one_launch in zip("qkvh", outs["gfx942"], outs["sm_90"]):
        assert np.array_equal(single_ops, one_launch), f"{name}: the one-launch host kernel differs"


@pytest.mark.parametrize("t", [1, 3, MAX_T])
def test_biases_ride_in_the_fused_launch_and_follow_the_single_ops(layer, t):
    """qwen2's q, k and v biases: decode steps add them in fused_qmatvec's epilogue (one launch, as llama's), longer
    steps in a launch each after the single ops' products; either way before RoPE: with biases, q and k gain the
    biases rotated (RoPE is linear at a position) and v gains its bias, against the same step without them."""
    p, lw, b, rng = layer.planner, layer.lw, layer.b, layer.rng
    rows = {"q": HEADS * HEAD_DIM, "k": KV_HEADS * HEAD_DIM, "v": KV_HEADS * HEAD_DIM}
    biases = {n: rng.normal(0, 3, r).astype(np.float32) for n, r in rows.items()}
    biased = SimpleNamespace(**vars(lw), **{f"attn_{n}_bias": Weight(layer.put(v), "f32", v.shape)
                                             for n, v in biases.items()})
    x = rng.standard_normal((t, HIDDEN)).astype(np.float32)
    positions = layer.put(rng.integers(0, 500, t).astype(np.int32))
    results = {}
    for with_bias in (False, True):
        p.config = SimpleNamespace(**{**vars(p.config), "qkv_bias": with_bias})
        b["x"].upload(x)
        plan = p.attention_input(biased, t, positions)
        names = [name for name, _ in plan]
        if t <= FUSED_QMATVEC_MAX_TOKENS:
            assert names == ["attn_norm+qkv+rope"]
        else:
            assert names == ["attn_norm", "q_proj", "k_proj", "v_proj"] + [f"{n}_bias" for n in "qkv" if with_bias] \
                + ["rope_q", "rope_k"]
        run(plan)
        results[with_bias] = {n: read(b[n], (t, r)).astype(np.float64) for n, r in rows.items()}
    pos = read(positions, (t,)).view(np.int32)
    for n, r in rows.items():
        gained = np.broadcast_to(biases[n].astype(np.float64), (t, r))
        if n != "v":
            gained = rope.reference(gained.reshape(t, -1, HEAD_DIM), pos, HEAD_DIM, 10000.0, 1.0).reshape(t, r)
        got = results[True][n] - results[False][n]
        scale = np.abs(results[True][n]).max() + np.abs(gained).max()
        np.testing.assert_allclose(got, gained, rtol=0, atol=1e-5 * scale, err_msg=f"{n}, {t} tokens")
