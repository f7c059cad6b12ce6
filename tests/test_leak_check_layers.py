"""The leak check's readings, layer by layer, on hand-made states: what each one sees and names."""

from __future__ import annotations

import numpy as np

from hipcore.kvcache import KvCache, KvCacheConfig
from profiles.leak_layers import HostMonitor, read_blocks, read_driver, read_ledger, read_rss
from profiles.leak_report import MIN_HOST_SPAN


def test_the_ledger_reading_names_each_allocation_made_since_the_baseline(cpu_device):
    keep = cpu_device.allocate(4096, tag="weights", label="kept")
    baseline = cpu_device.ledger.snapshot()
    leaked = cpu_device.allocate(1000, tag="scratch", label="forgotten")  # this line is the site
    returned = cpu_device.allocate(512, tag="activations", label="returned")
    returned.free()
    reading = read_ledger(cpu_device.ledger, baseline, {leaked.allocation.serial: "step 3 of run phase 1, requests 7"})
    assert reading.growth_bytes["scratch"] == 1000 and reading.growth_count["scratch"] == 1
    assert reading.growth_bytes["weights"] == reading.growth_bytes["activations"] == 0
    assert reading.leaked_bytes == 1000 and reading.leaked_count == 1 and not reading.clean
    item = reading.not_returned[0]
    assert (item["tag"], item["bytes"], item["label"]) == ("scratch", 1000, "forgotten")
    assert "test_leak_check_layers.py" in item["site"] and item["owner"] == "step 3 of run phase 1, requests 7"
    leaked.free()
    assert read_ledger(cpu_device.ledger, baseline, {}).clean
    after_close = read_ledger(cpu_device.ledger, None, {})  # no baseline: everything live counts
    assert after_close.leaked_count == 1 and after_close.bytes_by_tag["weights"] == 4096
    keep.free()


def test_the_ledger_is_byte_exact_a_same_size_replacement_is_not_a_leak(cpu_device):
    a = cpu_device.allocate(100, tag="scratch")
    baseline = cpu_device.ledger.snapshot()
    a.free()
    b = cpu_device.allocate(100, tag="scratch")
    reading = read_ledger(cpu_device.ledger, baseline, {})
    assert reading.clean and reading.leaked_bytes == 0
    c = cpu_device.allocate(1, tag="scratch")
    assert read_ledger(cpu_device.ledger, baseline, {}).leaked_bytes == 1  # one byte is seen
    b.free(), c.free()


def test_the_block_reading_names_the_owner_of_every_block_not_free(cpu_device):
    cfg = KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=8, num_blocks=9, block_size=4)
    with KvCache(cpu_device, cfg) as cache:
        clean = read_blocks(cache, lambda s: None)
        assert clean.not_free == 0 and clean.free == 8 and clean.invariant_error is None and not clean.leaked
        cache.add_sequence(5)
        assert cache.reserve(5, 6)  # two blocks
        cache.fork(5, 6)
        reading = read_blocks(cache, lambda s: {"request_id": 100 + s})
        assert reading.not_free == 2 and reading.leaked_bytes == 2 * cfg.bytes_per_block
        assert [(b["refcount"], b["sequences"]) for b in reading.leaked] == [(2, [5, 6]), (2, [5, 6])]
        assert reading.leaked[0]["owners"] == [{"request_id": 105}, {"request_id": 106}]
        assert "still live" in reading.invariant_error  # quiescence is part of the reading
        cache.free_sequence(5), cache.free_sequence(6)
        assert read_blocks(cache, lambda s: None).pending == 2  # freed, waiting for the step fence
        cache.release_fenced()
        assert read_blocks(cache, lambda s: None).not_free == 0


def test_a_broken_reference_count_is_read_as_a_broken_invariant(cpu_device):
    cfg = KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=8, num_blocks=5, block_size=4)
    with KvCache(cpu_device, cfg) as cache:
        cache.add_sequence(1)
        assert cache.reserve(1, 4)
        cache.fork(1, 2)
        block = cache.block_table(1)[0]
        cache._pool._refcount[block] -= 1  # what a double decrement leaves behind
        reading = read_blocks(cache, lambda s: None)
        assert f"block {block} has reference count 1 but 2 tables hold it" in reading.invariant_error
        cache._pool._refcount[block] += 1


def test_the_driver_layer_is_absent_on_the_cpu_backend(cpu_device):
    assert read_driver(cpu_device) is None


def test_host_rss_is_read_and_a_slope_is_fitted_by_least_squares():
    assert read_rss() > 1 << 20
    m = HostMonitor(capacity=8)
    for i in range(20):  # more samples than capacity: thinned, the span is kept
        m.sample(i * 100)
    assert m.count <= 8 and m.values("requests")[0] == 0 and m.values("requests")[-1] == 1900
    m.requests[:5] = [0, 100, 200, 300, 400]
    m.rss[:5] = [10_000, 10_000 + 512, 10_000 + 1024, 10_000 + 1536, 10_000 + 2048]  # 5.12 B per request
    m.count = 5
    slope, samples, span = m.slope("rss")
    assert np.isclose(slope, 5.12) and samples == 5 and span == 400
    slope, samples, span = m.slope("rss", from_requests=200)
    assert np.isclose(slope, 5.12) and samples == 3 and span == 200
    assert m.slope("rss", from_requests=350)[0] is None  # two samples fit no slope
    assert MIN_HOST_SPAN >= 100  # a slope over fewer requests is not judged


def test_tracemalloc_growth_counts_what_was_kept_since_the_baseline():
    import tracemalloc

    tracemalloc.start(1)
    try:
        m = HostMonitor()
        m.take_baseline()
        kept = [bytearray(10_000) for _ in range(30)]  # this line should top the growth
        total, count, top = m.tracemalloc_growth()
        assert total >= 300_000 and count >= 30
        assert top[0]["where"].endswith("test_leak_check_layers.py:" + str(_line_of("kept = [bytearray")))
        del kept
    finally:
        tracemalloc.stop()


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)
