"""kv_store (host kernel through the device protocol) and kv_gather: round trips for every KV dtype,
the codecs against the gguf package's reference quantizers, padding slots, bad slots."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import KvCacheConfig
from hipcore.kvcache.dtypes import KV_DTYPES, kv_dtype
from hipcore.ops.kv_gather import gather_kv
from hipcore.ops import kv_store
from hipcore.runtime.errors import DeviceError

TOLERANCE = {"f32": 0.0, "f16": 2**-11, "bf16": 2**-8}  # relative: half an ulp of the format


def upload(device, array):
    buf = device.allocate(max(array.nbytes, 4), tag="scratch", label="test input")
    if array.nbytes:
        buf.upload(array)
    return buf


def store(device, cache, layer, k, v, slots):
    bufs = [upload(device, np.ascontiguousarray(a)) for a in (k, v, np.asarray(slots, np.int32))]
    try:
        kv_store.launch(device, None, cache, layer, *bufs, n_tokens=len(slots))
    finally:
        for b in bufs:
            b.free()


@pytest.mark.parametrize("dtype", list(KV_DTYPES))
def test_store_then_gather_round_trips(cpu_device, dtype):
    rng = np.random.default_rng(7)
    cfg = KvCacheConfig(n_layers=2, n_kv_heads=3, head_dim=64, num_blocks=16, block_size=8, dtype=dtype)
    with KvCache(cpu_device, cfg) as cache:
        cache.add_sequence(1)
        cache.add_sequence(2)
        k1, v1 = (rng.standard_normal((21, 3, 64)).astype(np.float32) * 3 for _ in range(2))
        k2, v2 = (rng.standard_normal((5, 3, 64)).astype(np.float32) for _ in range(2))
        # Interleave the two sequences' blocks; write sequence 1 in two steps (prompt, then decode).
        cache.reserve(1, 20)
        cache.reserve(2, 5)
        cache.reserve(1, 1)
        for layer in range(2):
            store(cpu_device, cache, layer, k1[:20] + layer, v1[:20] - layer, cache.slot_mapping(1, 0, 20))
            store(cpu_device, cache, layer, k2 + layer, v2 - layer, cache.slot_mapping(2, 0, 5))
            store(cpu_device, cache, layer, k1[20:] + layer, v1[20:] - layer, cache.slot_mapping(1, 20, 1))
        for layer in range(2):
            for seq, k, v in ((1, k1, v1), (2, k2, v2)):
                got_k, got_v = gather_kv(cache, seq, layer)
                assert got_k.shape == k.shape and got_k.dtype == np.float32
                for got, want in ((got_k, k + layer), (got_v, v - layer)):
                    if dtype == "q8_0":
                        # Half a quantization step d = amax / 127, plus the f16 rounding of the stored
                        # scale (relative 2^-11) times the largest code, 127.
                        step = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
                        err = np.abs(got - want).reshape(-1, 32)
                        assert (err <= step * (0.5 + 127 * 2**-11) + 1e-6).all()
                        assert err.max() > 0
                    else:
                        np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=1e-30)


def test_negative_slots_are_padding_and_skipped(cpu_device):
    cfg = KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=32, num_blocks=4, block_size=4, dtype="f32")
    with KvCache(cpu_device, cfg) as cache:
        cache.add_sequence(1)
        cache.reserve(1, 2)
        slots = cache.slot_mapping(1, 0, 2)
        k = np.arange(3 * 32, dtype=np.float32).reshape(3, 1, 32)
        store(cpu_device, cache, 0, k, -k, [slots[0], -1, slots[1]])
        got_k, got_v = gather_kv(cache, 1, 0)
        np.testing.assert_array_equal(got_k, k[[0, 2]])
        np.testing.assert_array_equal(got_v, -k[[0, 2]])
        # Nothing else in the pool was touched: the null block and the other blocks are still zero.
        pool = cache.k_pools[0].download(np.float32).reshape(4, 4, 32)
        written = {int(s) for s in slots}
        assert all(not pool[s // 4, s % 4].any() for s in range(16) if s not in written)


def test_a_slot_outside_the_pool_is_refused(cpu_device):
    cfg = KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=32, num_blocks=4, block_size=4)
    with KvCache(cpu_device, cfg) as cache:
        k = np.ones((1, 1, 32), np.float32)
        with pytest.raises(DeviceError, match="slot 16 is outside the pool of 16 slots"):
            store(cpu_device, cache, 0, k, k, [16])


def test_undersized_buffers_are_refused_before_launch(cpu_device):
    cfg = KvCacheConfig(n_layers=1, n_kv_heads=2, head_dim=32, num_blocks=4, block_size=4)
    with KvCache(cpu_device, cfg) as cache:
        small = cpu_device.allocate(64, tag="scratch")
        with pytest.raises(ValueError, match="k holds 64 bytes, 1 tokens need 256"):
            kv_store.launch(cpu_device, None, cache, 0, small, small, small, n_tokens=1)
        small.free()


def test_q8_0_and_bf16_bytes_equal_the_gguf_reference_quantizers():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 96)).astype(np.float32) * rng.uniform(0.01, 100, (6, 1)).astype(np.float32)
    x[0] = 0.0  # an all-zero block: scale 0, no division by zero
    x[1, :32] = np.arange(32, dtype=np.float32) - 16.5  # halves: ggml rounds half away from zero
    x[2, 5] = np.nan
    assert np.array_equal(kv_dtype("q8_0").encode(x[[0, 1, 3, 4, 5]]), quantize(x[[0, 1, 3, 4, 5]], GGMLQuantizationType.Q8_0))
    ours = kv_dtype("bf16").encode(x).view(np.uint16)
    ref = quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    assert np.array_equal(ours, ref)
    assert np.isnan(kv_dtype("bf16").decode(kv_dtype("bf16").encode(x), 96)[2, 5])


def test_every_dtype_has_a_registered_host_kernel(cpu_device):
    module = cpu_device.load_module()
    for name in KV_DTYPES:
        assert module.kernel(kv_store.kernel_name(name), kv_store.SIGNATURE).name == f"kv_store_{name}"
