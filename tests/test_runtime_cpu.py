"""The cpu backend through the device protocol: memory, copies, errors, events, kernels, graphs."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer
from hipcore.runtime.errors import EXIT_OUT_OF_MEMORY, DeviceError, DeviceOutOfMemory


@cpu_kernel("test_runtime_axpy_f32", "ppfi")
def _axpy(dev, grid, block, y_ptr, x_ptr, a, n):
    y = dev.view(y_ptr, np.float32, n)
    y += np.float32(a) * dev.view(x_ptr, np.float32, n)


@cpu_kernel("test_runtime_fill_i64", "pli")
def _fill(dev, grid, block, out_ptr, base, n):
    dev.view(out_ptr, np.int64, n)[:] = base + np.arange(n, dtype=np.int64)


def test_allocate_and_free_keep_the_ledger_and_capacity_exact(cpu_device):
    free0 = cpu_device.memory_info().free
    a = cpu_device.allocate(1000, "weights", label="w")
    b = cpu_device.allocate(24, "kv", label="k")
    assert isinstance(a, Buffer) and a.ptr % 256 == 0 and b.ptr % 256 == 0
    assert cpu_device.memory_info().free == free0 - 1024
    assert cpu_device.ledger.bytes_by_tag()["weights"] == 1000 and cpu_device.ledger.count_by_tag()["kv"] == 1
    a.free()
    b.free()
    assert cpu_device.ledger.live() == [] and cpu_device.memory_info().free == free0


@pytest.mark.parametrize("nbytes", [0, -1, 1.5, True, "8"])
def test_bad_allocation_sizes_are_rejected(cpu_device, nbytes):
    with pytest.raises(ValueError, match="positive int"):
        cpu_device.allocate(nbytes, "scratch")


def test_unknown_tag_is_rejected(cpu_device):
    with pytest.raises(ValueError, match="unknown allocation tag"):
        cpu_device.allocate(8, "model")


def test_double_free_names_where_it_was_allocated_and_first_freed(cpu_device):
    buf = cpu_device.allocate(64, "scratch", label="tmp")
    buf.free()
    with pytest.raises(DeviceError, match=r"double free of buffer tmp \(scratch, 64 bytes\), allocated at .*test_runtime_cpu.py:\d+.*first freed at .*test_runtime_cpu.py"):
        buf.free()
    assert cpu_device.ledger.live() == []


def test_use_after_free_is_an_error_not_corruption(cpu_device):
    buf = cpu_device.allocate(64, "scratch", label="gone")
    ptr = buf.ptr
    buf.free()
    with pytest.raises(DeviceError, match="use of freed buffer gone"):
        buf.download()
    with pytest.raises(DeviceError, match="use of freed buffer gone"):
        buf.upload(np.zeros(4, np.uint8))
    with pytest.raises(DeviceError, match="outside every live allocation"):
        cpu_device.view(ptr, np.uint8, 8)  # a stale raw pointer, as a kernel would hold it


def test_out_of_range_accesses_are_errors(cpu_device):
    buf = cpu_device.allocate(64, "scratch", label="small")
    try:
        with pytest.raises(ValueError, match="do not fit"):
            buf.upload(np.zeros(65, np.uint8))
        with pytest.raises(ValueError, match="do not fit"):
            buf.download(np.uint8, count=8, offset=60)
        with pytest.raises(ValueError, match="outside buffer"):
            buf.addr(65)
        with pytest.raises(DeviceError, match="outside every live allocation"):
            cpu_device.view(buf.ptr + 60, np.float32, 2)  # a kernel overrunning by 4 bytes
    finally:
        buf.free()


def test_capacity_out_of_memory_names_the_ask_the_free_and_the_ledger_by_tag():
    dev = CpuDevice(capacity=1 << 20)
    w = dev.allocate(600 << 10, "weights", label="tok_embd")
    k = dev.allocate(300 << 10, "kv", label="kv pool")
    with pytest.raises(DeviceOutOfMemory) as info:
        dev.allocate(200 << 10, "activations", label="logits")
    err = info.value
    text = str(err)
    assert text.startswith("CPU backend out of memory on cpu: asked 200.0 KiB for logits (activations)")
    assert "124.0 KiB free of 1.0 MiB" in text
    assert "the ledger holds weights 600.0 KiB (1), kv 300.0 KiB (1)" in text
    assert err.exit_code == EXIT_OUT_OF_MEMORY and err.requested == 200 << 10 and err.free == 124 << 10
    assert err.tag == "activations" and err.label == "logits"
    assert [a.label for a in dev.ledger.live()] == ["tok_embd", "kv pool"]  # nothing half-allocated
    w.free()
    k.free()


def test_injected_failure_hits_exactly_the_kth_allocation(cpu_device):
    cpu_device.inject_allocation_failure(3)
    first = [cpu_device.allocate(16, "scratch") for _ in range(2)]
    with pytest.raises(DeviceOutOfMemory, match="injected"):
        cpu_device.allocate(16, "scratch", label="third")
    after = cpu_device.allocate(16, "scratch")  # the hook fires once
    for b in first + [after]:
        b.free()
    assert cpu_device.ledger.live() == []


def test_copies_and_memset_round_trip(cpu_device):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, size=4096, dtype=np.uint8)
    with cpu_device.allocate(4096, "scratch") as a, cpu_device.allocate(4096, "scratch") as b:
        a.upload(data)
        assert np.array_equal(a.download(), data)
        b.fill(0xAB)
        cpu_device.copy_device_to_device(b, a, 1000, dst_offset=96, src_offset=3000)
        out = b.download()
        expected = np.full(4096, 0xAB, np.uint8)
        expected[96:1096] = data[3000:4000]
        assert np.array_equal(out, expected)
        b.fill(7, nbytes=10, offset=5)
        assert np.array_equal(b.download(np.uint8, count=20), np.r_[expected[:5], np.full(10, 7, np.uint8), expected[15:20]])
        floats = rng.standard_normal(16).astype(np.float32)
        a.upload(floats, offset=64)
        assert np.array_equal(a.download(np.float32, count=16, offset=64), floats)
    assert cpu_device.ledger.live() == []


def test_download_into_a_strided_array_is_refused_not_lost(cpu_device):
    with cpu_device.allocate(64, "scratch") as buf:
        target = np.zeros((4, 4), np.float32)
        with pytest.raises(ValueError, match="C-contiguous"):
            cpu_device.copy_device_to_host(target[:, ::2], buf)
        frozen = np.zeros(16, np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            cpu_device.copy_device_to_host(frozen, buf)


def test_stream_ordered_upload_reads_the_source_when_the_stream_gets_there(cpu_device):
    stream = cpu_device.create_stream()
    with cpu_device.allocate(16, "scratch") as buf:
        buf.upload(np.arange(16, dtype=np.uint8), stream=stream)
        stream.synchronize()
        assert np.array_equal(buf.download(), np.arange(16, dtype=np.uint8))


def test_events_time_work_and_refuse_unrecorded_ones(cpu_device):
    start, end = cpu_device.create_event(), cpu_device.create_event()
    with pytest.raises(DeviceError, match="recorded first"):
        start.elapsed_ms(end)
    start.record()
    np.linalg.svd(np.random.default_rng(0).standard_normal((120, 120)))
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_ms(end) > 0.0
    start.destroy()  # a no-op on the host, part of the protocol


def test_kernels_launch_with_packed_arguments_and_check_signatures(cpu_device):
    module = cpu_device.load_module(b"", "test")
    axpy = module.kernel("test_runtime_axpy_f32", "ppfi")
    x = np.arange(8, dtype=np.float32)
    with cpu_device.allocate(32, "activations") as yb, cpu_device.allocate(32, "activations") as xb:
        yb.upload(np.ones(8, np.float32))
        xb.upload(x)
        axpy.launch(1, 8, (yb, xb, 0.5, 8))
        assert np.array_equal(yb.download(np.float32), 1 + 0.5 * x)
        with pytest.raises(TypeError, match="takes 4 arguments"):
            axpy.launch(1, 8, (yb, xb, 0.5))
    with pytest.raises(DeviceError, match="signature 'ppf' asked, host implementation takes 'ppfi'"):
        module.kernel("test_runtime_axpy_f32", "ppf")
    with pytest.raises(DeviceError, match="no host implementation registered"):
        module.kernel("no_such_kernel", "p")
    assert axpy.attributes() == {}
    with pytest.raises(DeviceError, match="no run-time compiler"):
        cpu_device.jit_compile("__global__ void k() {}", "k")


def test_capture_and_replay_equal_eager_launches(cpu_device):
    module = cpu_device.load_module(b"", "test")
    axpy = module.kernel("test_runtime_axpy_f32", "ppfi")
    fill = module.kernel("test_runtime_fill_i64", "pli")
    n = 64
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    with cpu_device.allocate(4 * n, "activations") as yb, cpu_device.allocate(4 * n, "activations") as xb, \
            cpu_device.allocate(8 * n, "scratch") as ib:
        xb.upload(x)
        yb.upload(np.zeros(n, np.float32))
        with cpu_device.capture() as cap:
            for a in (1.0, 2.0, -0.5):
                axpy.launch(1, n, (yb, xb, a, n))
            fill.launch(1, n, (ib, 1 << 40, n))
        # Captured, not run.
        assert np.array_equal(yb.download(np.float32), np.zeros(n, np.float32))
        assert cap.graph is not None
        replays = 5
        for _ in range(replays):
            cap.graph.launch()
        eager = np.zeros(n, np.float32)
        for _ in range(replays):
            for a in (1.0, 2.0, -0.5):
                eager += np.float32(a) * x
        assert np.array_equal(yb.download(np.float32), eager)
        assert np.array_equal(ib.download(np.int64), (1 << 40) + np.arange(n))
        cap.graph.destroy()
        with pytest.raises(DeviceError, match="destroyed graph"):
            cap.graph.launch()


def test_nested_capture_is_refused_and_a_failed_capture_leaves_the_stream_usable(cpu_device):
    with cpu_device.capture():
        with pytest.raises(DeviceError, match="already being captured"):
            with cpu_device.capture():
                pass
    with pytest.raises(RuntimeError, match="boom"):
        with cpu_device.capture():
            raise RuntimeError("boom")
    with cpu_device.allocate(4, "scratch") as buf:
        buf.fill(3)  # runs now: the stream is no longer recording
        assert buf.download().tolist() == [3, 3, 3, 3]


def test_handle_counts_follow_streams_events_graphs_and_modules_until_destroyed_or_collected(cpu_device):
    base = cpu_device.handle_counts()
    assert base == {"streams": 1, "events": 0, "graphs": 0, "modules": 0}  # the default stream
    stream, event, module = cpu_device.create_stream(), cpu_device.create_event(), cpu_device.load_module()
    with cpu_device.capture() as cap:
        pass
    assert cpu_device.handle_counts() == {"streams": 2, "events": 1, "graphs": 1, "modules": 1}
    stream.destroy(), event.destroy(), module.unload(), cap.graph.destroy()
    assert cpu_device.handle_counts() == base
    kept = cpu_device.create_event()
    dropped = cpu_device.create_event()
    del dropped  # collected: no handle left behind on this backend
    import gc
    gc.collect()
    assert cpu_device.handle_counts()["events"] == 1 and kept is not None
