"""The cpu backend's cache of decoded experts (hipcore/ops/moe_expert_cache.py): a hit is the decoding itself, bytes
rewritten at the same address are decoded again, the budget holds, and moe_experts' host kernels give the
references' float64 results rounded to float32, bit for bit, before and after the cache is warm."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from test_ops_cpu_moe import empty, expert_buffers, expert_sample, to_device

from hipcore.ops import moe_experts
from hipcore.ops.moe_expert_cache import EXPERTS, ExpertCache
from hipcore.ops.weight_formats import column_multiple, dequantize_rows, row_bytes


def raw_rows(rng, weight_type: str, rows: int, cols: int) -> np.ndarray:
    return expert_sample(rng, weight_type, 1, rows, cols).reshape(rows, row_bytes(weight_type, cols))


def test_a_hit_is_the_decoding_and_rewritten_bytes_are_decoded_again():
    rng = np.random.default_rng(3)
    cache = ExpertCache()
    raw = raw_rows(rng, "q4_k", 8, 256)
    first = cache.matrix((1, 0x1000), raw, "q4_k", 256)
    assert np.array_equal(first, dequantize_rows(raw, "q4_k", 256, np.float64))
    assert cache.matrix((1, 0x1000), raw, "q4_k", 256) is first and (cache.hits, cache.misses) == (1, 1)
    # A planted fault: new weights written at the same address must not be served the old decoding.
    raw[:] = raw_rows(rng, "q4_k", 8, 256)
    again = cache.matrix((1, 0x1000), raw, "q4_k", 256)
    assert np.array_equal(again, dequantize_rows(raw, "q4_k", 256, np.float64))
    assert not np.array_equal(again, first) and (cache.hits, cache.misses) == (1, 2)
    assert cache.held_bytes == again.nbytes + raw.nbytes


def test_the_budget_holds_the_most_recently_used():
    rng = np.random.default_rng(4)
    raws = [raw_rows(rng, "q8_0", 16, 64) for _ in range(4)]
    one = 16 * 64 * 8 + raws[0].nbytes
    cache = ExpertCache(budget_bytes=2 * one + one // 2)
    for i, raw in enumerate(raws):
        cache.matrix((1, i), raw, "q8_0", 64)
    assert cache.held_bytes == 2 * one and cache.misses == 4
    cache.matrix((1, 3), raws[3], "q8_0", 64)
    cache.matrix((1, 2), raws[2], "q8_0", 64)
    assert cache.hits == 2
    cache.matrix((1, 0), raws[0], "q8_0", 64)  # evicted: decoded again
    assert cache.misses == 5 and cache.held_bytes == 2 * one
    small = ExpertCache(budget_bytes=one - 1)  # an expert past the budget is decoded every time, never kept
    small.matrix((1, 0), raws[0], "q8_0", 64)
    assert small.held_bytes == 0


@pytest.mark.parametrize("weight_type, rows, cols", [("f32", 64, 64), ("q4_k", 256, 256), ("f16", 32, 64)])
def test_accounted_bytes_are_what_tracemalloc_finds_the_entries_hold(weight_type, rows, cols):
    """leak-check subtracts accounted_bytes() from host memory: within 200 bytes an entry of what they hold."""
    rng = np.random.default_rng(5)
    raws = [raw_rows(rng, weight_type, rows, cols) for _ in range(32)]
    cache = ExpertCache()
    gc.collect()
    tracing = tracemalloc.is_tracing()
    tracemalloc.start(1)
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, raw in enumerate(raws):
            cache.matrix((1, 0x1000 + i * raw.nbytes), raw, weight_type, cols)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        assert abs(cache.accounted_bytes() - held) <= 200 * cache.entries, (cache.accounted_bytes(), held)
        assert cache.peak_bytes == cache.held_bytes > 0
        cache.clear()
        gc.collect()
        assert cache.entries == cache.held_bytes == cache.peak_bytes == cache.accounted_bytes() == 0
        assert tracemalloc.get_traced_memory()[0] - before < 200 * len(raws)
    finally:
        if not tracing:
            tracemalloc.stop()


@pytest.mark.parametrize("weight_type", moe_experts.EXPERT_TYPES)
@pytest.mark.parametrize("tokens,path", [(1, "pairs"), (24, "grouped")])
def test_host_kernels_are_the_references_rounded_to_float32(cpu_device, weight_type, tokens, path):
    rng = np.random.default_rng([tokens, ord(weight_type[0]), ord(weight_type[-1])])
    n_expert, k, ff, hidden = 6, 3, 2 * column_multiple(weight_type), column_multiple(weight_type)
    (gate, up), (g_buf, u_buf) = expert_buffers(cpu_device, rng, weight_type, n_expert, ff, hidden, 2)
    (down,), (d_buf,) = expert_buffers(cpu_device, rng, weight_type, n_expert, hidden, ff, 1)
    biases = [rng.standard_normal((n_expert, n)).astype(np.float32) for n in (ff, ff, hidden)]
    bias_bufs = [to_device(cpu_device, b) for b in biases]
    hits_before = EXPERTS.hits
    for step in range(3):  # a cold cache, a warm one, then the up experts rewritten in place
        if step == 2:
            up = expert_sample(rng, weight_type, n_expert, ff, hidden)
            u_buf.upload(up)
        x = rng.standard_normal((tokens, hidden)).astype(np.float32)
        ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
        weights = rng.random((tokens, k)).astype(np.float32)
        h, ids_buf = empty(cpu_device, tokens * k * ff * 4), to_device(cpu_device, ids)
        moe_experts.launch_gate_up(cpu_device, None, h, to_device(cpu_device, x), g_buf, u_buf, ids_buf, tokens, k,
                                   "swiglu", bias_bufs[0], bias_bufs[1], weight_type=weight_type, n_expert=n_expert,
                                   ff=ff, hidden=hidden, path=path)
        got_h = h.download(np.float32).reshape(tokens, k, ff)
        want_h = moe_experts.gate_up_reference(x, gate, up, weight_type, ids, ff, hidden, "swiglu", *biases[:2])
        assert np.array_equal(got_h, want_h.astype(np.float32)), step
        out = to_device(cpu_device, np.zeros((tokens, hidden), np.float32))
        moe_experts.launch_down(cpu_device, None, out, h, d_buf, ids_buf, to_device(cpu_device, weights), tokens, k,
                                bias_bufs[2], weight_type=weight_type, n_expert=n_expert, hidden=hidden, ff=ff,
                                workspace=empty(cpu_device, tokens * k * hidden * 4), path=path)
        if path == "pairs":
            want = moe_experts.down_reference(got_h, down, weight_type, ids, weights, hidden, ff, biases[2])
        else:  # each pair's weighted term rounded to float32, then the slots summed in float32 (moe_sum_slots_f32)
            fresh = moe_experts._raw_experts(down, weight_type, hidden, ff)  # decoded on every call, no cache
            y, _ = moe_experts._down_products(got_h, fresh, weight_type, ids, hidden, ff, biases[2], False)
            y = y.reshape(tokens, k, hidden)
            want = (weights.astype(np.float64)[..., None] * y).astype(np.float32).sum(axis=1, dtype=np.float32)
        assert np.array_equal(out.download(np.float32).reshape(tokens, hidden), np.asarray(want, np.float32)), step
    assert EXPERTS.hits > hits_before
