"""The paged KV cache on a real GPU (run with `pytest -m gpu tests/gpu`; never in CI): pools in device
memory under the ledger, zeroed at creation, copy-on-write done by device copies (on the default
stream and on a stream of the caller's), and every byte back after close."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache import KvCache, KvCacheConfig
from hipcore.ops.kv_gather import gather_kv
from hipcore.runtime.selection import pick_device

pytestmark = pytest.mark.gpu

CONFIG = KvCacheConfig(n_layers=3, n_kv_heads=2, head_dim=64, num_blocks=64, block_size=16, dtype="f32")


@pytest.fixture(scope="module")
def gpu():
    choice = pick_device("auto")
    dev = choice.device
    if dev.backend == "cpu":
        dev.close()
        pytest.fail("the GPU tier needs a GPU; pick_device said: " + "; ".join(choice.reasons), pytrace=False)
    yield dev
    dev.close()


def write_tokens(cache: KvCache, seq_id: int, start: int, values: np.ndarray) -> None:
    """Upload f32 rows [n, n_kv_heads, head_dim] for tokens start.. of seq_id into every pool."""
    cfg = cache.config
    block_bytes = cfg.block_bytes_per_pool
    for i, slot in enumerate(cache.slot_mapping(seq_id, start, len(values)).tolist()):
        block, offset = divmod(slot, cfg.block_size)
        for layer in range(cfg.n_layers):
            for sign, pool in ((1, cache.k_pools[layer]), (-1, cache.v_pools[layer])):
                for head in range(cfg.n_kv_heads):
                    row = (sign * (values[i, head] + layer)).astype(np.float32)
                    at = block * block_bytes + (head * cfg.block_size + offset) * cfg.row_bytes
                    pool.upload(row, offset=at)


def test_pools_live_in_device_memory_and_come_back(gpu):
    before = gpu.snapshot()
    cache = KvCache(gpu, CONFIG)
    assert gpu.ledger.bytes_by_tag()["kv"] - before.bytes_by_tag["kv"] == CONFIG.cache_bytes
    assert all(not p.download(np.uint8).any() for p in cache.k_pools + cache.v_pools)  # zeroed
    cache.close()
    gpu.synchronize()
    delta = gpu.snapshot() - before
    assert delta.clean, delta


@pytest.mark.parametrize("own_stream", [False, True])
def test_copy_on_write_copies_on_the_device(gpu, own_stream):
    rng = np.random.default_rng(1)
    stream = gpu.create_stream() if own_stream else None
    with KvCache(gpu, CONFIG) as cache:
        cache.add_sequence(1)
        assert cache.reserve(1, 21)
        prompt = rng.standard_normal((21, 2, 64)).astype(np.float32)
        write_tokens(cache, 1, 0, prompt)
        cache.fork(1, 2)
        assert cache.reserve(2, 1, stream=stream)  # copies the shared block of 5 tokens
        assert cache.block_table(2)[1] != cache.block_table(1)[1]
        (stream or gpu.default_stream).synchronize()
        extra = rng.standard_normal((1, 2, 64)).astype(np.float32)
        write_tokens(cache, 2, 21, extra)
        for layer in range(CONFIG.n_layers):
            k1, v1 = gather_kv(cache, 1, layer)
            k2, v2 = gather_kv(cache, 2, layer)
            np.testing.assert_array_equal(k1, prompt + layer)
            np.testing.assert_array_equal(v1, -(prompt + layer))
            np.testing.assert_array_equal(k2, np.concatenate([prompt, extra]) + layer)
            np.testing.assert_array_equal(v2, -(np.concatenate([prompt, extra]) + layer))
        cache.free_sequence(1)
        cache.free_sequence(2)
        gpu.synchronize()
        cache.release_fenced()
        cache.check_invariants(quiescent=True)
