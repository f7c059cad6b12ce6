"""The mixture-of-experts kernels (kernels/moe_route.hip, kernels/moe_experts.hip) on a real GPU, against
hipcore/ops/moe_route.py's and moe_experts.py's float64 references and bounds, on fresh random inputs (the seed is
printed on failure), poisoned outputs, small shapes and the real ones (Qwen3-30B-A3B: hidden 2048, 128 experts, 8
used, expert width 768, Q4_K gate|up and Q6_K down; gpt-oss-20b: hidden 2880, 32 experts, 4 used, width 2880, MXFP4),
every expert type; and the three launches of a layer replayed from a captured graph with the same bits as eager."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import add_bias, moe_experts, moe_route
from hipcore.ops.weight_formats import column_multiple
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu

QWEN3_30B_A3B = (2048, 768, 128, 8)  # hidden, expert width, experts, used
GPT_OSS_20B = (2880, 2880, 32, 4)


def check(got, want, bound, what, seed):
    bad = ~(np.abs(got - want) <= bound)
    assert not bad.any(), (f"{what} (seed {seed}): {int(bad.sum())} of {bad.size} off; first at {np.argwhere(bad)[0].tolist()}: "
                           f"got {got[bad][0]!r}, want {want[bad][0]!r}")


@pytest.mark.parametrize("mode,normalize", [("softmax_topk", True), ("softmax_topk", False), ("topk_softmax", False)])
@pytest.mark.parametrize("tokens,n_expert,k", [(1, 128, 8), (7, 32, 4), (64, 128, 8), (3, 256, 32), (5, 60, 6)])
def test_route(gpu, mem, rng, seed, mode, normalize, tokens, n_expert, k):
    logits = (rng.standard_normal((tokens, n_expert)) * 3).astype(np.float32)
    logits[0, 1] = logits[0, 4] = logits[0].max() + 0.5  # a tie for first place: the lower expert first
    ids, weights = mem.poisoned(tokens * k * 4), mem.poisoned(tokens * k * 4)
    moe_route.launch(gpu, None, ids, weights, mem.upload(logits), tokens, n_expert, k, mode, normalize)
    gpu.synchronize()
    want_ids, want_weights = moe_route.reference(logits, k, mode, normalize)
    got_ids = ids.download(np.int32).reshape(tokens, k)
    assert np.array_equal(got_ids, want_ids), f"seed {seed}"
    check(weights.download(np.float32).reshape(tokens, k), want_weights, moe_route.error_bound(logits, want_weights),
          "weights", seed)


@pytest.mark.parametrize("tokens", [1, 8, 512])
def test_route_with_the_router_bias(gpu, mem, rng, seed, tokens):
    """gpt-oss-20b's router (32 experts, 4 chosen, topk_softmax) with its bias: the ids and weight bytes of routing
    logits to which add_bias added it, on this GPU."""
    n_expert, k = 32, 4
    logits = (rng.standard_normal((tokens, n_expert)) * 3).astype(np.float32)
    bias = (rng.standard_normal(n_expert) * 3).astype(np.float32)
    outputs = []
    for with_bias in (True, False):
        ids, weights, rows = mem.poisoned(tokens * k * 4), mem.poisoned(tokens * k * 4), mem.upload(logits)
        bs = mem.upload(bias)
        if not with_bias:
            add_bias.launch(gpu, None, rows, bs, tokens, n_expert)
        moe_route.launch(gpu, None, ids, weights, rows, tokens, n_expert, k, "topk_softmax", False,
                         bias=bs if with_bias else None)
        gpu.synchronize()
        outputs.append((ids.download(np.uint8), weights.download(np.uint8)))
        if with_bias:
            assert np.array_equal(rows.download(np.float32).reshape(tokens, n_expert), logits), "logits written"
    for got, want in zip(*outputs):
        assert np.array_equal(got, want), f"seed {seed}"
    want_ids, _ = moe_route.reference(logits + bias, k, "topk_softmax", False)
    assert np.array_equal(outputs[0][0].view(np.int32).reshape(tokens, k), want_ids), f"seed {seed}"


def experts(rng, weight_type, n_expert, rows, cols):
    return random_weights(rng, weight_type, n_expert * rows, cols)


def gate_up_case(gpu, mem, rng, seed, weight_type, hidden, ff, n_expert, k, tokens, activation, biases, path=None):
    gate, up = experts(rng, weight_type, n_expert, ff, hidden), experts(rng, weight_type, n_expert, ff, hidden)
    x = (rng.standard_normal((tokens, hidden)) * rng.choice([1e-2, 1.0, 4.0], (tokens, hidden))).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    bias = [(rng.standard_normal((n_expert, ff)) * 2).astype(np.float32) if biases else None for _ in range(2)]
    h = mem.poisoned(tokens * k * ff * 4)
    moe_experts.launch_gate_up(gpu, None, h, mem.upload(x), mem.upload(gate, "weights"), mem.upload(up, "weights"),
                               mem.upload(ids), tokens, k, activation,
                               *[mem.upload(b) if b is not None else None for b in bias],
                               weight_type=weight_type, n_expert=n_expert, ff=ff, hidden=hidden, path=path)
    gpu.synchronize()
    want, bound = moe_experts.gate_up_reference(x, gate, up, weight_type, ids, ff, hidden, activation, *bias,
                                                with_bound=True)
    check(h.download(np.float32).reshape(tokens, k, ff), want, bound, f"gate_up {weight_type}", seed)


def down_case(gpu, mem, rng, seed, weight_type, hidden, ff, n_expert, k, tokens, biases, path=None):
    down = experts(rng, weight_type, n_expert, hidden, ff)
    h = (rng.standard_normal((tokens, k, ff)) * rng.choice([1e-2, 1.0, 4.0], (tokens, k, ff))).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    weights = rng.random((tokens, k)).astype(np.float32)
    bias = rng.standard_normal((n_expert, hidden)).astype(np.float32) if biases else None
    residual = rng.standard_normal((tokens, hidden)).astype(np.float32)
    out = mem.upload(residual)
    moe_experts.launch_down(gpu, None, out, mem.upload(h), mem.upload(down, "weights"), mem.upload(ids),
                            mem.upload(weights), tokens, k, mem.upload(bias) if biases else None,
                            weight_type=weight_type, n_expert=n_expert, hidden=hidden, ff=ff, path=path,
                            workspace=mem.poisoned(moe_experts.down_workspace_bytes(tokens, k, hidden)))
    gpu.synchronize()
    added, bound = moe_experts.down_reference(h, down, weight_type, ids, weights, hidden, ff, bias, with_bound=True)
    want = residual + added
    check(out.download(np.float32).reshape(tokens, hidden), want, bound + 2.0**-24 * np.abs(want), f"down {weight_type}",
          seed)


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("path", ["pairs", "grouped"])
def test_small_shapes(gpu, mem, rng, seed, weight_type, tokens, path):
    block = column_multiple(weight_type)
    gate_up_case(gpu, mem, rng, seed, weight_type, 2 * block, 13, 6, 3, tokens, "swiglu", False, path)
    gate_up_case(gpu, mem, rng, seed, weight_type, block, 70, 5, 2, tokens, "swiglu_oai", True, path)
    down_case(gpu, mem, rng, seed, weight_type, 11, 2 * block, 6, 3, tokens, True, path)


@pytest.mark.parametrize("tokens", [1, 4, 64])
@pytest.mark.parametrize("gate_up_type,down_type", [("q4_k", "q6_k"), ("q4_k", "q4_k"), ("q8_0", "q8_0")])
def test_qwen3_30b_a3b_shapes(gpu, mem, rng, seed, gate_up_type, down_type, tokens):
    hidden, ff, n_expert, k = QWEN3_30B_A3B  # 64 tokens: the grouped path
    gate_up_case(gpu, mem, rng, seed, gate_up_type, hidden, ff, n_expert, k, tokens, "swiglu", False)
    down_case(gpu, mem, rng, seed, down_type, hidden, ff, n_expert, k, tokens, False)


def test_qwen3_30b_a3b_prompt_past_one_gathering_segment(gpu, mem, rng, seed):
    """300 tokens x 8 slots = 2,400 pairs: the grouped entries gather them in two segments of at most 2,048."""
    hidden, ff, n_expert, k = QWEN3_30B_A3B
    gate_up_case(gpu, mem, rng, seed, "q4_k", hidden, ff, n_expert, k, 300, "swiglu", False, "grouped")
    down_case(gpu, mem, rng, seed, "q6_k", hidden, ff, n_expert, k, 300, False, "grouped")


@pytest.mark.parametrize("weight_type", ["mxfp4", "f16"])
@pytest.mark.parametrize("tokens", [2, 16])
def test_gpt_oss_20b_shapes(gpu, mem, rng, seed, weight_type, tokens):
    hidden, ff, n_expert, k = GPT_OSS_20B  # 16 tokens: the grouped path
    gate_up_case(gpu, mem, rng, seed, weight_type, hidden, ff, n_expert, k, tokens, "swiglu_oai", True)
    down_case(gpu, mem, rng, seed, weight_type, hidden, ff, n_expert, k, tokens, True)


def test_a_layer_replays_from_a_graph_as_eager(gpu, mem, rng):
    """route, gate|up and down captured once and replayed: the same bits as eager launches (the down sum has a fixed
    order: no atomics), and a replay reads new logits from device memory."""
    hidden, ff, n_expert, k, tokens = 256, 256, 16, 4, 3
    gate, up, down = (experts(rng, "q4_k", n_expert, rows, cols) for rows, cols in ((ff, hidden), (ff, hidden), (hidden, ff)))
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    bufs = dict(gate=mem.upload(gate, "weights"), up=mem.upload(up, "weights"), down=mem.upload(down, "weights"),
                x=mem.upload(x), logits=mem.upload(np.zeros((tokens, n_expert), np.float32)),
                ids=mem.poisoned(tokens * k * 4), w=mem.poisoned(tokens * k * 4), h=mem.poisoned(tokens * k * ff * 4),
                out=mem.poisoned(tokens * hidden * 4))
    types = dict(weight_type="q4_k", n_expert=n_expert)

    def layer(stream):
        moe_route.launch(gpu, stream, bufs["ids"], bufs["w"], bufs["logits"], tokens, n_expert, k, "softmax_topk", True)
        moe_experts.launch_gate_up(gpu, stream, bufs["h"], bufs["x"], bufs["gate"], bufs["up"], bufs["ids"], tokens, k,
                                   "swiglu", ff=ff, hidden=hidden, **types)
        moe_experts.launch_down(gpu, stream, bufs["out"], bufs["h"], bufs["down"], bufs["ids"], bufs["w"], tokens, k,
                                hidden=hidden, ff=ff, **types)

    stream = gpu.create_stream()
    layer(stream)  # loads the modules before the capture
    stream.synchronize()
    with gpu.capture(stream) as cap:
        layer(stream)
    chosen = []
    for _ in range(2):
        logits = rng.standard_normal((tokens, n_expert)).astype(np.float32)
        bufs["logits"].upload(logits)
        got = {}
        for how in ("replay", "eager"):
            bufs["out"].upload(np.zeros((tokens, hidden), np.float32))
            cap.graph.launch(stream) if how == "replay" else layer(stream)
            stream.synchronize()
            got[how] = bufs["out"].download(np.float32).copy()
        assert np.array_equal(got["replay"], got["eager"])
        ids = bufs["ids"].download(np.int32).reshape(tokens, k)
        assert np.array_equal(ids, moe_route.select(logits, k))
        chosen.append(ids)
    assert not np.array_equal(chosen[0], chosen[1])  # the replays routed by their own logits
