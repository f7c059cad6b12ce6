"""The allocation ledger: tags, counts, peaks, call sites, snapshots that subtract."""

from __future__ import annotations

import threading

import pytest

from hipcore.runtime.cpu import CpuDevice
from hipcore.runtime.ledger import TAGS, Ledger, format_allocations, format_bytes


def test_record_and_release_count_bytes_per_tag():
    ledger = Ledger()
    ledger.record(0x1000, 100, "weights", "w0")
    ledger.record(0x2000, 50, "weights", "w1")
    ledger.record(0x3000, 7, "kv", "k")
    assert ledger.bytes_by_tag() == {**dict.fromkeys(TAGS, 0), "weights": 150, "kv": 7}
    assert ledger.count_by_tag()["weights"] == 2 and ledger.total_bytes == 157
    released = ledger.release(0x2000)
    assert released.label == "w1" and ledger.bytes_by_tag()["weights"] == 100
    assert [a.label for a in ledger.live()] == ["w0", "k"]
    assert [a.label for a in ledger.live("kv")] == ["k"]


def test_unknown_tag_duplicate_address_and_unknown_release_are_errors():
    ledger = Ledger()
    with pytest.raises(ValueError, match="unknown allocation tag 'gpu'"):
        ledger.record(0x1, 1, "gpu")
    ledger.record(0x10, 8, "scratch", "a")
    with pytest.raises(RuntimeError, match="handed out twice"):
        ledger.record(0x10, 8, "scratch", "b")
    with pytest.raises(KeyError, match="no live allocation"):
        ledger.release(0x99)


def test_peaks_follow_the_high_water_mark_and_reset():
    ledger = Ledger()
    ledger.record(1, 100, "activations")
    ledger.record(2, 300, "activations")
    ledger.record(3, 50, "kv")
    ledger.release(2)
    ledger.record(4, 10, "activations")
    assert ledger.peak_by_tag()["activations"] == 400
    assert ledger.peak_by_tag()["kv"] == 50
    assert ledger.peak_total == 450
    assert ledger.total_bytes == 160
    ledger.reset_peaks()
    assert ledger.peak_total == 160 and ledger.peak_by_tag()["activations"] == 110
    ledger.record(5, 1000, "scratch")
    snap = ledger.snapshot()
    assert snap.peak_total == 1160 and snap.peak_by_tag["scratch"] == 1000


def test_snapshots_subtract_into_new_and_gone_allocations():
    ledger = Ledger()
    ledger.record(1, 64, "weights", "kept")
    ledger.record(2, 32, "scratch", "freed later")
    before = ledger.snapshot(driver_free=10_000)
    ledger.release(2)
    ledger.record(3, 128, "kv", "leaked")
    after = ledger.snapshot(driver_free=9_000)
    delta = after - before
    assert delta.bytes_by_tag["kv"] == 128 and delta.bytes_by_tag["scratch"] == -32
    assert delta.count_by_tag["kv"] == 1 and delta.count_by_tag["scratch"] == -1
    assert [a.label for a in delta.new] == ["leaked"]
    assert [a.label for a in delta.gone] == ["freed later"]
    assert delta.driver_free_delta == -1000
    assert not delta.clean and delta.total_bytes == 96
    assert "leaked" in delta.describe()[0]
    ledger.release(3)
    ledger.record(2, 32, "scratch", "same size again")
    # Same bytes per tag, but a different allocation: a leak check must still see it as new.
    later = ledger.snapshot() - before
    assert all(v == 0 for v in later.bytes_by_tag.values())
    assert [a.label for a in later.new] == ["same size again"] and not later.clean


def test_call_sites_point_at_the_caller_outside_the_runtime(cpu_device):
    buf = cpu_device.allocate(256, "activations", label="act")  # the line the site must name
    line = test_call_sites_point_at_the_caller_outside_the_runtime.__code__.co_firstlineno + 1
    try:
        site = cpu_device.ledger.find(buf.ptr).site
        assert site.endswith(f"test_ledger.py:{line} in test_call_sites_point_at_the_caller_outside_the_runtime")
        assert "activations" in format_allocations(cpu_device.ledger.live())[0]
        assert f"test_ledger.py:{line}" in format_allocations(cpu_device.ledger.live())[0]
    finally:
        buf.free()


def test_format_allocations_lists_largest_first_and_counts_the_rest():
    ledger = Ledger()
    for i, size in enumerate([10, 5000, 300, 7]):
        ledger.record(0x100 * (i + 1), size, "scratch", f"s{i}", owner=f"request {i}")
    lines = format_allocations(ledger.live(), limit=2)
    assert lines[0].startswith('scratch 4.9 KiB "s1" (request 1)')
    assert lines[1].startswith('scratch 300 B "s2"')
    assert lines[2] == "... and 2 more (17 B)"


def test_summary_names_only_tags_with_live_allocations():
    ledger = Ledger()
    assert ledger.summary() == "nothing"
    ledger.record(1, 3 << 20, "weights")
    ledger.record(2, 1 << 10, "kv")
    ledger.record(3, 1 << 10, "kv")
    assert ledger.summary() == "weights 3.0 MiB (1), kv 2.0 KiB (2)"


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 << 30, "3.0 GiB"), (-2048, "-2.0 KiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_concurrent_allocations_keep_the_ledger_exact():
    device = CpuDevice(capacity=1 << 30)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            bufs = [device.allocate(64 + (seed * 7 + i) % 512, "scratch", label=f"t{seed}") for i in range(200)]
            for b in bufs[::2]:
                b.free()
            for b in bufs[1::2]:
                b.free()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert device.ledger.live() == [] and device.ledger.total_bytes == 0
    assert device.ledger.peak_total > 0
