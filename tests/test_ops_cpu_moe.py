"""The mixture-of-experts ops (moe_route, moe_experts) and MXFP4 decoding on the cpu backend: the numpy references
against values worked by hand and against products written independently here (the gguf package's dequantizer,
one (token, slot) at a time), the host kernels through the launchers against the references, and the launchers'
checks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType

from hipcore.ops import moe_experts, moe_route
from hipcore.ops.qmatvec import quantization_error
from hipcore.ops.weight_formats import BLOCK_BYTES, column_multiple, dequantize_rows, row_bytes
from support.weight_samples import random_weights

GGUF_TYPES = {"q4_k": GGMLQuantizationType.Q4_K, "q5_k": GGMLQuantizationType.Q5_K, "q6_k": GGMLQuantizationType.Q6_K,
              "q8_0": GGMLQuantizationType.Q8_0, "mxfp4": GGMLQuantizationType.MXFP4}


def to_device(dev, array: np.ndarray, tag: str = "activations"):
    buf = dev.allocate(max(array.nbytes, 1), tag)
    buf.upload(np.ascontiguousarray(array))
    return buf


def empty(dev, nbytes: int):
    buf = dev.allocate(nbytes, "activations")
    buf.fill(0xFF)  # NaN in every float: an element the kernel forgets to write shows up
    return buf


# ---- MXFP4 ---------------------------------------------------------------------------------------


def test_mxfp4_decodes_as_the_gguf_package():
    rng = np.random.default_rng(39)
    raw = rng.integers(0, 256, (6, 17 * 8), dtype=np.uint8)  # every code and every scale byte, 0 and 255 too
    raw[0, 0], raw[0, 17], raw[1, 0], raw[1, 17] = 0, 1, 2, 255
    with np.errstate(over="ignore"):
        want = gguf_quants.dequantize(raw, GGMLQuantizationType.MXFP4).reshape(6, 256)
        got = dequantize_rows(raw, "mxfp4", 256, np.float32)
    assert np.array_equal(got, want)  # the overflowing scales' infinities included
    assert BLOCK_BYTES["mxfp4"] * 256 // 32 == row_bytes("mxfp4", 256) == 136


def test_mxfp4_block_by_hand():
    block = np.zeros(17, np.uint8)
    block[0] = 128  # 2^(128 - 127) / 2 = 1: the doubled e2m1 values as they are
    block[1:17] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    got = dequantize_rows(block[None], "mxfp4", 32, np.float64)[0]
    values = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    assert got.tolist() == values + values[::-1]


# ---- moe_route --------------------------------------------------------------------------------------


def test_route_by_hand():
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 3.0]], np.float32))
    ids, weights = moe_route.reference(logits, 2, "softmax_topk", normalize=False)
    assert ids.tolist() == [[3, 2], [1, 3]]  # equal logits: the lower expert first
    np.testing.assert_allclose(weights, [[0.4, 0.3], [1 / 3, 1 / 3]], rtol=1e-6)
    _, normalized = moe_route.reference(logits, 2, "softmax_topk", normalize=True)
    np.testing.assert_allclose(normalized, [[4 / 7, 3 / 7], [0.5, 0.5]], rtol=1e-6)
    ids_oai, over_k = moe_route.reference(logits, 2, "topk_softmax", normalize=False)
    assert ids_oai.tolist() == ids.tolist()
    np.testing.assert_allclose(over_k, [[4 / 7, 3 / 7], [0.5, 0.5]], rtol=1e-6)


@pytest.mark.parametrize("mode,normalize", [("softmax_topk", True), ("softmax_topk", False), ("topk_softmax", False)])
@pytest.mark.parametrize("tokens,n_expert,k", [(1, 128, 8), (5, 32, 4), (3, 256, 32), (2, 7, 7)])
def test_route_host_kernel(cpu_device, mode, normalize, tokens, n_expert, k):
    rng = np.random.default_rng([tokens, n_expert, k, len(mode)])
    logits = (rng.standard_normal((tokens, n_expert)) * 3).astype(np.float32)
    logits[0, :3] = logits[0, 3]  # a tie
    ids, weights = empty(cpu_device, tokens * k * 4), empty(cpu_device, tokens * k * 4)
    moe_route.launch(cpu_device, None, ids, weights, to_device(cpu_device, logits), tokens, n_expert, k, mode, normalize)
    want_ids, want_weights = moe_route.reference(logits, k, mode, normalize)
    got_ids = ids.download(np.int32).reshape(tokens, k)
    assert np.array_equal(got_ids, want_ids)
    assert np.all(np.abs(weights.download(np.float32).reshape(tokens, k) - want_weights)
                  <= moe_route.error_bound(logits, want_weights))
    # Independently: each token's ids are its k largest logits, in order; the weights follow the mode.
    for t in range(tokens):
        order = sorted(range(n_expert), key=lambda e: (-float(logits[t, e]), e))[:k]
        assert got_ids[t].tolist() == order
        p = np.exp(logits[t].astype(np.float64) - logits[t].max())
        chosen = p[order] / (p[order].sum() if mode == "topk_softmax" or normalize else p.sum())
        np.testing.assert_allclose(want_weights[t], chosen, rtol=1e-12)


def test_route_launch_checks(cpu_device):
    buf = empty(cpu_device, 4096)
    with pytest.raises(ValueError, match="mode must be"):
        moe_route.launch(cpu_device, None, buf, buf, buf, 1, 8, 2, "sigmoid", False)
    with pytest.raises(ValueError, match="at most 256"):
        moe_route.launch(cpu_device, None, buf, buf, buf, 1, 512, 2, "softmax_topk", False)
    with pytest.raises(ValueError, match="k at most"):
        moe_route.launch(cpu_device, None, buf, buf, buf, 1, 4, 5, "softmax_topk", False)
    with pytest.raises(ValueError, match="overlap"):
        moe_route.launch(cpu_device, None, buf, buf, buf, 1, 8, 2, "softmax_topk", False)
    with pytest.raises(ValueError, match="logits needs"):
        moe_route.launch(cpu_device, None, buf, buf.addr() + 64, buf, 8, 256, 2, "softmax_topk", False)


# ---- moe_experts ------------------------------------------------------------------------------------


def gguf_decoded(raw: np.ndarray, weight_type: str, n_expert: int, rows: int, cols: int) -> np.ndarray:
    """float64 [n_expert, rows, cols], decoded by the gguf package (or plain numpy for the float types)."""
    if weight_type == "f32":
        return raw.view(np.float32).astype(np.float64).reshape(n_expert, rows, cols)
    if weight_type == "f16":
        return raw.view(np.float16).astype(np.float64).reshape(n_expert, rows, cols)
    if weight_type == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(n_expert, rows, cols)
    return gguf_quants.dequantize(raw, GGUF_TYPES[weight_type]).astype(np.float64).reshape(n_expert, rows, cols)


def expert_sample(rng, weight_type, n_expert, rows, cols):
    return random_weights(rng, weight_type, n_expert * rows, cols).reshape(n_expert, rows, -1)


def silu(v):
    return v / (1 + np.exp(-v))


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
@pytest.mark.parametrize("activation", list(moe_experts.ACTIVATIONS))
def test_gate_up_reference_is_the_selected_experts_product(weight_type, activation):
    rng = np.random.default_rng([len(weight_type), ord(weight_type[-1]), len(activation)])
    n_expert, tokens, k, ff, hidden = 5, 3, 2, 6, column_multiple(weight_type)
    gate, up = (expert_sample(rng, weight_type, n_expert, ff, hidden) for _ in range(2))
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.array([[0, 4], [4, 2], [1, 0]], np.int32)
    gate_bias, up_bias = (rng.standard_normal((n_expert, ff)).astype(np.float32) for _ in range(2))
    got = moe_experts.gate_up_reference(x, gate, up, weight_type, ids, ff, hidden, activation, gate_bias, up_bias)
    g_w, u_w = gguf_decoded(gate, weight_type, n_expert, ff, hidden), gguf_decoded(up, weight_type, n_expert, ff, hidden)
    # The quantized types multiply x quantized per slice: that moves each product by at most |w| . |x - xq|.
    dx = quantization_error(x, weight_type) if weight_type in moe_experts.QUANTIZED_X_TYPES else np.zeros_like(x, float)
    for t in range(tokens):
        for j in range(k):
            e = ids[t, j]
            g = g_w[e] @ x[t] + gate_bias[e]
            u = u_w[e] @ x[t] + up_bias[e]
            dg, du = np.abs(g_w[e]) @ dx[t] + 1e-9, np.abs(u_w[e]) @ dx[t] + 1e-9
            if activation == "swiglu":
                want, slack = silu(g) * u, 1.2 * dg * (np.abs(u) + du) + np.abs(silu(g)) * du
            else:
                gc, uc = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                want = gc / (1 + np.exp(-1.702 * gc)) * (uc + 1)
                slack = 1.2 * dg * (np.abs(uc) + 1 + du) + np.abs(gc) * du
            assert np.all(np.abs(got[t, j] - want) <= slack), (t, j)


def test_swiglu_oai_clamps_as_ggml():
    gate = np.array([10.0, -10.0, 1.0, 7.0])
    up = np.array([1.0, 1.0, 100.0, -100.0])
    got = moe_experts.activation_reference(gate, up, "swiglu_oai")
    want = [7 / (1 + np.exp(-1.702 * 7)) * 2, -10 / (1 + np.exp(17.02)) * 2, 1 / (1 + np.exp(-1.702)) * 8,
            7 / (1 + np.exp(-1.702 * 7)) * -6]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
def test_down_reference_is_the_weighted_sum(weight_type):
    rng = np.random.default_rng([len(weight_type), ord(weight_type[-1]), 7])
    n_expert, tokens, k, hidden, ff = 4, 2, 3, 5, column_multiple(weight_type)
    down = expert_sample(rng, weight_type, n_expert, hidden, ff)
    h = rng.standard_normal((tokens, k, ff)).astype(np.float32)
    ids = np.array([[3, 0, 1], [1, 3, 2]], np.int32)
    weights = rng.random((tokens, k)).astype(np.float32)
    bias = rng.standard_normal((n_expert, hidden)).astype(np.float32)
    got = moe_experts.down_reference(h, down, weight_type, ids, weights, hidden, ff, bias)
    d_w = gguf_decoded(down, weight_type, n_expert, hidden, ff)
    quantized = weight_type in moe_experts.QUANTIZED_X_TYPES
    for t in range(tokens):
        want, slack = np.zeros(hidden), np.full(hidden, 1e-9)
        for j in range(k):
            e = ids[t, j]
            want += weights[t, j] * (d_w[e] @ h[t, j] + bias[e])
            if quantized:
                slack += weights[t, j] * np.abs(d_w[e]) @ quantization_error(h[t, j][None], weight_type)[0]
        assert np.all(np.abs(got[t] - want) <= slack), t


def expert_buffers(dev, rng, weight_type, n_expert, rows, cols, count):
    raws = [expert_sample(rng, weight_type, n_expert, rows, cols) for _ in range(count)]
    return raws, [to_device(dev, raw, "weights") for raw in raws]


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
@pytest.mark.parametrize("tokens,biases", [(1, False), (4, True)])
def test_experts_host_kernels(cpu_device, weight_type, tokens, biases):
    rng = np.random.default_rng([tokens, len(weight_type), ord(weight_type[-1])])
    n_expert, k, ff, hidden = 6, 3, 2 * column_multiple(weight_type), column_multiple(weight_type)
    (gate, up), (g_buf, u_buf) = expert_buffers(cpu_device, rng, weight_type, n_expert, ff, hidden, 2)
    (down_t,), (d_buf,) = expert_buffers(cpu_device, rng, weight_type, n_expert, hidden, ff, 1)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    weights = rng.random((tokens, k)).astype(np.float32)
    b = [rng.standard_normal((n_expert, n)).astype(np.float32) if biases else None for n in (ff, ff, hidden)]
    b_bufs = [to_device(cpu_device, v) if v is not None else None for v in b]
    h = empty(cpu_device, tokens * k * ff * 4)
    ids_buf = to_device(cpu_device, ids)
    moe_experts.launch_gate_up(cpu_device, None, h, to_device(cpu_device, x), g_buf, u_buf, ids_buf, tokens, k,
                               "swiglu_oai", b_bufs[0], b_bufs[1], weight_type=weight_type, n_expert=n_expert, ff=ff,
                               hidden=hidden)
    want_h, bound_h = moe_experts.gate_up_reference(x, gate, up, weight_type, ids, ff, hidden, "swiglu_oai", b[0], b[1],
                                                    with_bound=True)
    got_h = h.download(np.float32).reshape(tokens, k, ff)
    assert np.all(np.abs(got_h - want_h) <= bound_h)
    residual = rng.standard_normal((tokens, hidden)).astype(np.float32)
    out = to_device(cpu_device, residual)
    moe_experts.launch_down(cpu_device, None, out, h, d_buf, ids_buf, to_device(cpu_device, weights), tokens, k, b_bufs[2],
                            weight_type=weight_type, n_expert=n_expert, hidden=hidden, ff=ff)
    added, bound = moe_experts.down_reference(got_h, down_t, weight_type, ids, weights, hidden, ff, b[2], with_bound=True)
    got = out.download(np.float32).reshape(tokens, hidden)
    assert np.all(np.abs(got - (residual + added)) <= bound + 2 * 2.0**-24 * np.abs(residual + added))
    # The check catches a product of the wrong expert (a planted fault: every id moved by one).
    wrong = moe_experts.down_reference(got_h, down_t, weight_type, (ids + 1) % n_expert, weights, hidden, ff, b[2])
    assert not np.all(np.abs(got - (residual + wrong)) <= bound)


def test_experts_launch_checks(cpu_device):
    buf = empty(cpu_device, 1 << 16)
    common = dict(weight_type="q4_k", n_expert=1, ff=256, hidden=256)
    with pytest.raises(ValueError, match="activation must be"):
        moe_experts.launch_gate_up(cpu_device, None, buf, buf, buf, buf, buf, 1, 2, "gelu", **common)
    with pytest.raises(ValueError, match="no kernel for weight type 'q4_0'"):
        moe_experts.launch_gate_up(cpu_device, None, buf, buf, buf, buf, buf, 1, 2, "swiglu", **{**common, "weight_type": "q4_0"})
    with pytest.raises(ValueError, match="multiple of 256 columns"):
        moe_experts.launch_gate_up(cpu_device, None, buf, buf, buf, buf, buf, 1, 2, "swiglu", **{**common, "hidden": 288})
    with pytest.raises(ValueError, match="gate_exps needs"):
        moe_experts.launch_gate_up(cpu_device, None, buf, buf, buf, buf, buf, 1, 2, "swiglu", **{**common, "n_expert": 512})
    with pytest.raises(ValueError, match="overlap"):
        moe_experts.launch_gate_up(cpu_device, None, buf, buf, buf, buf, buf, 1, 2, "swiglu", **common)
    with pytest.raises(ValueError, match="down_bias needs"):
        moe_experts.launch_down(cpu_device, None, buf, buf.addr() + 4096, buf, buf, buf, 1, 2, empty(cpu_device, 64),
                                weight_type="q4_k", n_expert=1, hidden=256, ff=256)


def test_host_kernel_refuses_an_expert_id_out_of_range(cpu_device):
    rng = np.random.default_rng(3)
    (gate, up), (g_buf, u_buf) = expert_buffers(cpu_device, rng, "q8_0", 2, 4, 32, 2)
    h, x = empty(cpu_device, 2 * 4 * 4), to_device(cpu_device, np.ones((1, 32), np.float32))
    with pytest.raises(ValueError, match="expert id out of range"):
        moe_experts.launch_gate_up(cpu_device, None, h, x, g_buf, u_buf, to_device(cpu_device, np.array([[0, 2]], np.int32)),
                                   1, 2, "swiglu", weight_type="q8_0", n_expert=2, ff=4, hidden=32)
        cpu_device.synchronize()


def test_grouped_path_on_the_host_kernels(cpu_device):
    """The grouped entries' host kernels (down's through its workspace and the slot sum) give the per-pair path's
    results; the launcher picks the grouped path where the pairs average one an expert, and refuses a grouped down
    without a workspace, or with one overlapping h."""
    rng = np.random.default_rng(17)
    n_expert, k, ff, hidden, tokens = 4, 2, 64, 32, 6
    (gate, up), (g_buf, u_buf) = expert_buffers(cpu_device, rng, "q8_0", n_expert, ff, hidden, 2)
    (down,), (d_buf,) = expert_buffers(cpu_device, rng, "q8_0", n_expert, hidden, ff, 1)
    x = to_device(cpu_device, rng.standard_normal((tokens, hidden)).astype(np.float32))
    ids = to_device(cpu_device, np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32))
    weights = to_device(cpu_device, rng.random((tokens, k)).astype(np.float32))
    common = dict(weight_type="q8_0", n_expert=n_expert)
    results = {}
    for path in ("pairs", "grouped"):
        h, out = empty(cpu_device, tokens * k * ff * 4), to_device(cpu_device, np.ones((tokens, hidden), np.float32))
        moe_experts.launch_gate_up(cpu_device, None, h, x, g_buf, u_buf, ids, tokens, k, "swiglu", ff=ff, hidden=hidden,
                                   path=path, **common)
        workspace = empty(cpu_device, moe_experts.down_workspace_bytes(tokens, k, hidden))
        moe_experts.launch_down(cpu_device, None, out, h, d_buf, ids, weights, tokens, k, hidden=hidden, ff=ff,
                                workspace=workspace, path=path, **common)
        results[path] = h.download(np.float32), out.download(np.float32)
    assert np.array_equal(results["pairs"][0], results["grouped"][0])
    np.testing.assert_allclose(results["grouped"][1], results["pairs"][1], rtol=1e-6, atol=1e-6)
    assert moe_experts.grouped_pays(tokens, k, n_expert) and not moe_experts.grouped_pays(1, 8, 128)
    with pytest.raises(ValueError, match="needs a workspace"):
        moe_experts.launch_down(cpu_device, None, out, h, d_buf, ids, weights, tokens, k, hidden=hidden, ff=ff,
                                path="grouped", **common)
    with pytest.raises(ValueError, match="workspace and h overlap"):
        moe_experts.launch_down(cpu_device, None, out, h, d_buf, ids, weights, tokens, k, hidden=hidden, ff=ff,
                                workspace=h, path="grouped", **common)
    with pytest.raises(ValueError, match="path must be"):
        moe_experts.launch_gate_up(cpu_device, None, h, x, g_buf, u_buf, ids, tokens, k, "swiglu", ff=ff, hidden=hidden,
                                   path="sorted", **common)


def test_wide_products_take_the_grouped_path(cpu_device, monkeypatch):
    """The per-pair path holds a quantized type's input in shared memory (MAX_STAGED_COLUMNS) and at most MAX_SLOTS
    slots: a wider gate|up goes down the grouped path (chosen, with the per-pair path's results) and a forced per-pair
    launch of one is refused; down takes the slot-serial or the slot-parallel entry (slots_pay), each without a
    workspace."""
    wide = moe_experts.MAX_STAGED_COLUMNS + 32
    assert moe_experts.pairs_fit("q8_0", 8, moe_experts.MAX_STAGED_COLUMNS)
    assert not moe_experts.pairs_fit("q8_0", 8, wide) and moe_experts.pairs_fit("f16", 8, wide)
    assert not moe_experts.pairs_fit("f16", moe_experts.MAX_SLOTS + 1, 64)
    entries = []
    get_kernel = moe_experts.get_kernel
    monkeypatch.setattr(moe_experts, "get_kernel", lambda dev, op, entry, sig: entries.append(entry) or
                        get_kernel(dev, op, entry, sig))
    rng = np.random.default_rng(23)
    n_expert, k, tokens = 3, 2, 1
    common = dict(weight_type="q8_0", n_expert=n_expert)
    ids_host = np.array([[2, 0]], np.int32)
    ids, weights = to_device(cpu_device, ids_host), to_device(cpu_device, np.array([[0.25, 0.75]], np.float32))
    (gate, up), (g_buf, u_buf) = expert_buffers(cpu_device, rng, "q8_0", n_expert, 32, wide, 2)
    x = rng.standard_normal((tokens, wide)).astype(np.float32)
    h = empty(cpu_device, tokens * k * 32 * 4)
    moe_experts.launch_gate_up(cpu_device, None, h, to_device(cpu_device, x), g_buf, u_buf, ids, tokens, k, "swiglu",
                               ff=32, hidden=wide, **common)
    assert entries == ["moe_gate_up_grouped_q8_0"]
    want = moe_experts.gate_up_reference(x, gate, up, "q8_0", ids_host, 32, wide, "swiglu")
    np.testing.assert_allclose(h.download(np.float32).reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="per-pair path takes at most"):
        moe_experts.launch_gate_up(cpu_device, None, h, to_device(cpu_device, x), g_buf, u_buf, ids, tokens, k,
                                   "swiglu", ff=32, hidden=wide, path="pairs", **common)
    # down: slot-serial where a lane walks one step of a slot (or more slots than moe_down_slots sums), with h staged
    # where the token's slices of h fit the staged slices, else each warp quantizing its own; slot-parallel where a
    # lane walks several steps; none needs the grouped path's workspace
    many = moe_experts.MAX_SLOTS + 1
    for k_, ff_, entry in [(many, 32, "moe_down_staged_q8_0"), (2, 32, "moe_down_staged_q8_0"),
                           (13, 1024, "moe_down_q8_0"), (2, 2048, "moe_down_slots_q8_0")]:
        assert moe_experts.slots_pay(cpu_device.arch, "q8_0", k_, ff_) == ("slots" in entry)
        assert moe_experts.staged_down_fits("q8_0", k_, ff_) == (entry != "moe_down_q8_0")
        (down,), (d_buf,) = expert_buffers(cpu_device, rng, "q8_0", many, 8, ff_, 1)
        ids_host = rng.permutation(many)[None, :k_].astype(np.int32)
        weights_host = rng.random((1, k_)).astype(np.float32)
        h_host = rng.standard_normal((1, k_, ff_)).astype(np.float32)
        out = to_device(cpu_device, np.zeros((1, 8), np.float32))
        entries.clear()
        moe_experts.launch_down(cpu_device, None, out, to_device(cpu_device, h_host), d_buf, to_device(cpu_device, ids_host),
                                to_device(cpu_device, weights_host), 1, k_, hidden=8, ff=ff_, weight_type="q8_0",
                                n_expert=many)
        assert entries == [entry]
        want = moe_experts.down_reference(h_host, down, "q8_0", ids_host, weights_host, 8, ff_)
        np.testing.assert_allclose(out.download(np.float32).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
