"""kernels/moe_experts_mma.hip on a real GPU: the sort against sort_reference, and a layer's gate, up (with the
activation) and down products with the slot sum, against float64 references within matmul_mma's error bound carried
through each epilogue, at Qwen3-30B-A3B's shape (prompts of 32 and 256 tokens: Q4_K gate|up, Q6_K or Q4_K down) and
gpt-oss-20b's (MXFP4 and F16 experts with biases, swiglu_oai), and a replay from a captured graph with the same bits
as eager launches; NVIDIA's few-pairs tiles (`_direct`, 8 pairs a tile) likewise at decode batches of 8 and 32
sequences, every expert type. Skipped where the device has no matrix cores (moe_experts_mma is never taken there)."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import matmul_mma, moe_experts, moe_experts_mma
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu
U32 = 2.0**-24
QWEN3_30B_A3B = (2048, 768, 128, 8)  # hidden, expert width, experts, used
GPT_OSS_20B = (2880, 2880, 32, 4)


@pytest.fixture(autouse=True)
def matrix_cores(gpu):
    if not matmul_mma.has_matrix_cores(gpu.arch):
        pytest.skip(f"{gpu.arch} has no matrix cores: the prompts' experts take moe_experts' grouped path")


def check(got, want, bound, what, seed):
    bad = ~(np.abs(got - want) <= bound)
    assert not bad.any(), (f"{what} (seed {seed}): {int(bad.sum())} of {bad.size} off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, want {want[bad][0]!r}")


def layer_case(gpu, mem, rng, seed, gate_type, down_type, hidden, ff, n_expert, k, tokens, activation, biases,
               x_scale=1.0, tile=None):
    """The layer's expert launches as moe_blocks makes them, each product checked against its reference. x_scale keeps
    the down product's input h within f16's range, as a model's is (random K-quant experts on inputs of 1 gave |h|
    past 65,504: an infinity in the f16 tile, as matmul_mma's prompts would make of it). x is f16, the norm's copy
    that moe_blocks gives the products (moe_experts_mma.X_BYTES)."""
    pairs, tile = tokens * k, tile or moe_experts_mma.tile_tokens(tokens * k, n_expert)
    gate, up = (random_weights(rng, gate_type, n_expert * ff, hidden) for _ in range(2))
    down = random_weights(rng, down_type, n_expert * hidden, ff)
    x = (rng.standard_normal((tokens, hidden)) * rng.choice([0.1, 1.0, 3.0], (tokens, 1)) * x_scale).astype(np.float16)
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    weights = rng.random((tokens, k)).astype(np.float32)
    bias = {n: (rng.standard_normal((n_expert, r)) * 2).astype(np.float32) if biases else None
            for n, r in (("gate", ff), ("up", ff), ("down", hidden))}
    residual = rng.standard_normal((tokens, hidden)).astype(np.float32)
    sorted_bytes, tiles_bytes = moe_experts_mma.sort_bytes(pairs, n_expert)
    b = dict(sorted=mem.poisoned(sorted_bytes), tiles=mem.poisoned(tiles_bytes), ids=mem.upload(ids),
             x=mem.upload(x), gate=mem.upload(gate, "weights"), up=mem.upload(up, "weights"),
             down=mem.upload(down, "weights"), w=mem.upload(weights),
             h=mem.poisoned(pairs * ff * moe_experts_mma.X_BYTES),
             g=mem.poisoned(pairs * max(ff, hidden) * 4), out=mem.upload(residual))
    bias_bufs = {n: mem.upload(v) if v is not None else None for n, v in bias.items()}
    shape = dict(pairs=pairs, n_expert=n_expert, tile=tile)

    moe_experts_mma.launch_sort(gpu, None, b["sorted"], b["tiles"], b["ids"], pairs, n_expert, tile)
    gpu.synchronize()
    count = int(b["tiles"].download(np.int32)[0])
    table = b["tiles"].download(np.int32)[1:1 + 3 * count].reshape(-1, 3)
    groups, want_tiles = moe_experts_mma.sort_reference(ids, n_expert, tile)
    assert [(int(e), int(n)) for e, _, n in table] == want_tiles, seed
    order = b["sorted"].download(np.int32)[:pairs]
    for e, ps in groups.items():
        assert sorted(np.concatenate([order[s:s + n] for _, s, n in table[table[:, 0] == e]]).tolist()) == ps, (e, seed)

    x_rows = x[np.arange(pairs) // k].astype(np.float64)
    moe_experts_mma.launch_products(gpu, None, "gate", b["g"], b["gate"], b["x"], b["sorted"], b["tiles"],
                                    weight_type=gate_type, rows=ff, cols=hidden, x_per=k, bias=bias_bufs["gate"], **shape)
    gpu.synchronize()
    g_want, g_bound = moe_experts_mma.products_reference(x_rows, gate, gate_type, ids, ff, hidden)
    if biases:
        g_want += bias["gate"][ids.reshape(-1)]
    g_got = b["g"].download(np.float32)[:pairs * ff].reshape(pairs, ff)
    check(g_got, g_want, g_bound + U32 * np.abs(g_want), f"gate {gate_type}", seed)

    moe_experts_mma.launch_products(gpu, None, "up", b["h"], b["up"], b["x"], b["sorted"], b["tiles"],
                                    weight_type=gate_type, rows=ff, cols=hidden, x_per=k, bias=bias_bufs["up"],
                                    g=b["g"], activation=activation, **shape)
    gpu.synchronize()
    u_want, u_bound = moe_experts_mma.products_reference(x_rows, up, gate_type, ids, ff, hidden)
    if biases:
        u_want += bias["up"][ids.reshape(-1)]
    gd = g_got.astype(np.float64)
    h_want = moe_experts.activation_reference(gd, u_want, activation)
    factor = np.abs(gd) + 1.0 if activation == "swiglu_oai" else np.abs(gd)
    h_got = b["h"].download(np.float16).reshape(pairs, ff).astype(np.float32)  # h is stored as f16: one more rounding
    check(h_got, h_want, 1.2 * factor * (u_bound + U32 * np.abs(u_want)) + 8 * U32 * np.abs(h_want)
          + 2.0**-11 * np.abs(h_want) + 2.0**-25, f"up {gate_type}", seed)

    assert np.abs(h_got).max() < matmul_mma.F16_MAX, "the test's h left f16's range (the products' precondition)"
    moe_experts_mma.launch_products(gpu, None, "down", b["g"], b["down"], b["h"], b["sorted"], b["tiles"],
                                    weight_type=down_type, rows=hidden, cols=ff, x_per=1, bias=bias_bufs["down"],
                                    weights=b["w"], **shape)
    moe_experts.launch_sum_slots(gpu, None, b["out"], b["g"], tokens, k, hidden)
    gpu.synchronize()
    y, y_bound = moe_experts_mma.products_reference(h_got.astype(np.float64), down, down_type, ids, hidden, ff)
    if biases:
        y += bias["down"][ids.reshape(-1)]
    w = weights.astype(np.float64).reshape(-1, 1)
    terms = (w * y).reshape(tokens, k, hidden)
    want = residual + terms.sum(axis=1)
    bound = (w * (y_bound + U32 * np.abs(y))).reshape(tokens, k, hidden).sum(axis=1)
    bound += (k + 3) * U32 * (np.abs(terms).sum(axis=1) + np.abs(residual))
    check(b["out"].download(np.float32).reshape(tokens, hidden), want, bound, f"down {down_type}", seed)


# (the float64 references of a 512-token layer took about a minute each: the tests stop at 256 tokens)
@pytest.mark.parametrize("tokens", [32, 256])
@pytest.mark.parametrize("gate_type,down_type", [("q4_k", "q6_k"), ("q4_k", "q4_k")])
def test_qwen3_30b_a3b_prompt(gpu, mem, rng, seed, gate_type, down_type, tokens):
    hidden, ff, n_expert, k = QWEN3_30B_A3B  # 256 tokens: 2,048 pairs, 16 an expert (32-pair tiles)
    layer_case(gpu, mem, rng, seed, gate_type, down_type, hidden, ff, n_expert, k, tokens, "swiglu", False, 0.05)


@pytest.mark.parametrize("weight_type", ["mxfp4", "f16", "q8_0"])
def test_gpt_oss_20b_prompt(gpu, mem, rng, seed, weight_type):
    hidden, ff, n_expert, k = GPT_OSS_20B  # 384 tokens: 1,536 pairs, 48 an expert (64-pair tiles)
    layer_case(gpu, mem, rng, seed, weight_type, weight_type, hidden, ff, n_expert, k, 384, "swiglu_oai", True)


def few_pairs(gpu, *types_and_widths):
    if not all(moe_experts_mma.has_direct(gpu.arch, t, c) for t, c in types_and_widths):
        pytest.skip(f"{gpu.arch} has no few-pairs entries (NVIDIA's mma.sync fragments only)")


@pytest.mark.parametrize("tokens", [8, 32])
def test_qwen3_30b_a3b_decode_batch_on_few_pairs_tiles(gpu, mem, rng, seed, tokens):
    hidden, ff, n_expert, k = QWEN3_30B_A3B  # 32 sequences: 256 pairs, 2 an expert
    few_pairs(gpu, ("q4_k", hidden), ("q6_k", ff))
    layer_case(gpu, mem, rng, seed, "q4_k", "q6_k", hidden, ff, n_expert, k, tokens, "swiglu", False, 0.05,
               tile=moe_experts_mma.DIRECT_TILE_PAIRS)


@pytest.mark.parametrize("weight_type", ["mxfp4", "f16", "bf16", "q8_0"])
def test_gpt_oss_20b_decode_batch_on_few_pairs_tiles(gpu, mem, rng, seed, weight_type):
    hidden, ff, n_expert, k = GPT_OSS_20B  # 32 sequences: 128 pairs, 4 an expert
    few_pairs(gpu, (weight_type, hidden))
    layer_case(gpu, mem, rng, seed, weight_type, weight_type, hidden, ff, n_expert, k, 32, "swiglu_oai", True,
               tile=moe_experts_mma.DIRECT_TILE_PAIRS)


@pytest.mark.parametrize("direct", [False, True])
def test_a_prompt_layer_replays_from_a_graph_as_eager(gpu, mem, rng, direct):
    """sort, gate, up, down and the slot sum captured once and replayed: the same bits as eager launches, whatever
    order the sort's atomics leave each expert's pairs in; the few-pairs tiles too (direct)."""
    hidden, ff, n_expert, k, tokens = 256, 256, 16, 4, 64
    if direct:
        few_pairs(gpu, ("q4_k", hidden))
    pairs = tokens * k
    tile = moe_experts_mma.DIRECT_TILE_PAIRS if direct else moe_experts_mma.tile_tokens(pairs, n_expert)
    gate, up, down = (random_weights(rng, "q4_k", n_expert * r, c) for r, c in ((ff, hidden), (ff, hidden), (hidden, ff)))
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    sorted_bytes, tiles_bytes = moe_experts_mma.sort_bytes(pairs, n_expert)
    b = dict(gate=mem.upload(gate, "weights"), up=mem.upload(up, "weights"), down=mem.upload(down, "weights"),
             x=mem.upload(rng.standard_normal((tokens, hidden)).astype(np.float16)), ids=mem.upload(ids),
             w=mem.upload(rng.random((tokens, k)).astype(np.float32)), sorted=mem.poisoned(sorted_bytes),
             tiles=mem.poisoned(tiles_bytes), g=mem.poisoned(pairs * hidden * 4),
             h=mem.poisoned(pairs * ff * moe_experts_mma.X_BYTES),
             out=mem.upload(np.zeros((tokens, hidden), np.float32)))
    shape = dict(pairs=pairs, n_expert=n_expert, tile=tile)

    def layer(stream):
        moe_experts_mma.launch_sort(gpu, stream, b["sorted"], b["tiles"], b["ids"], pairs, n_expert, tile)
        for mode, out, W, x, rows, cols, x_per in (("gate", "g", "gate", "x", ff, hidden, k),
                                                   ("up", "h", "up", "x", ff, hidden, k),
                                                   ("down", "g", "down", "h", hidden, ff, 1)):
            moe_experts_mma.launch_products(gpu, stream, mode, b[out], b[W], b[x], b["sorted"], b["tiles"],
                                            weight_type="q4_k", rows=rows, cols=cols, x_per=x_per,
                                            g=b["g"], weights=b["w"], **shape)
        moe_experts.launch_sum_slots(gpu, stream, b["out"], b["g"], tokens, k, hidden)

    stream = gpu.create_stream()
    layer(stream)  # loads the modules before the capture
    stream.synchronize()
    with gpu.capture(stream) as cap:
        layer(stream)
    got = {}
    for how in ("eager", "replay", "eager again"):
        b["out"].upload(np.zeros((tokens, hidden), np.float32))
        cap.graph.launch(stream) if how == "replay" else layer(stream)
        stream.synchronize()
        got[how] = b["out"].download(np.float32).copy()
    assert np.isfinite(got["eager"]).all()
    assert np.array_equal(got["replay"], got["eager"]) and np.array_equal(got["eager again"], got["eager"])
