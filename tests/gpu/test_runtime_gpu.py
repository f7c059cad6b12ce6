"""The device runtime on a real GPU (run with `pytest -m gpu tests/gpu`; never in CI).

Vendor-neutral: the device is whatever `pick_device("auto")` takes (HIP on AMD, CUDA on NVIDIA), and
the test kernels are compiled at run time with the device's own compiler (nvrtc / hiprtc).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hipcore.runtime.selection import pick_device
from hipcore.runtime.errors import DeviceError, DeviceOutOfMemory, KernelCompileError
from hipcore.runtime.ledger import format_bytes

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void axpy_f32(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void iota_i64(long long* out, long long base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + i;
}

extern "C" __global__ void count_launches(int* counter) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(counter, 1);
}

extern "C" __global__ void empty_kernel() {}
"""


@pytest.fixture(scope="module")
def gpu():
    choice = pick_device("auto")
    dev = choice.device
    if dev.backend == "cpu":
        dev.close()
        pytest.fail("the GPU tier needs a GPU; pick_device said: " + "; ".join(choice.reasons), pytrace=False)
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def module(gpu):
    image = gpu.jit_compile(SOURCE, "runtime_test.cu", [], [])
    return gpu.load_module(image, "runtime_test")


def blocks(n: int, per_block: int = 256) -> int:
    return (n + per_block - 1) // per_block


def test_copies_round_trip(gpu):
    rng = np.random.default_rng(0)
    before = gpu.snapshot()
    for size in (1, 255, 4096, 1 << 20, 3 * (1 << 20) + 7):
        data = rng.integers(0, 256, size=size, dtype=np.uint8)
        with gpu.allocate(size, "scratch", label="a") as a, gpu.allocate(size + 64, "scratch", label="b") as b:
            a.upload(data)
            assert np.array_equal(a.download(), data)
            b.fill(0x5A)
            gpu.copy_device_to_device(b, a, size, dst_offset=64)
            out = b.download()
            assert np.array_equal(out[:64], np.full(64, 0x5A, np.uint8)) and np.array_equal(out[64:], data)
            b.fill(0, nbytes=min(size, 10), offset=64)
            assert not b.download(np.uint8, count=min(size, 10), offset=64).any()
    stream = gpu.create_stream()
    with gpu.allocate(4096, "scratch") as buf:
        values = rng.standard_normal(1024).astype(np.float32)
        buf.upload(values, stream=stream)
        stream.synchronize()
        assert np.array_equal(buf.download(np.float32), values)
    stream.destroy()
    assert (gpu.snapshot() - before).clean


def test_a_run_time_compiled_kernel_matches_numpy(gpu, module):
    axpy = module.kernel("axpy_f32", "ppfi")
    iota = module.kernel("iota_i64", "pli")
    rng = np.random.default_rng(1)
    for n in (1, 1000, 1 << 20):
        x = rng.standard_normal(n).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        with gpu.allocate(4 * n, "activations") as xb, gpu.allocate(4 * n, "activations") as yb:
            xb.upload(x)
            yb.upload(y)
            axpy.launch(blocks(n), 256, (yb, xb, 0.75, n))
            got = yb.download(np.float32)
        # One rounding (a fused multiply-add) or two: at most an ulp or two of |y| apart.
        expected = np.float32(0.75) * x + y
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    with gpu.allocate(8 * 5000, "scratch") as out:
        iota.launch(blocks(5000), 256, (out, (1 << 40) - 3, 5000))
        assert np.array_equal(out.download(np.int64), (1 << 40) - 3 + np.arange(5000, dtype=np.int64))
    attrs = axpy.attributes()
    assert attrs["registers"] > 0 and attrs["max_threads_per_block"] >= 256, attrs


def test_graph_replay_equals_eager_launches(gpu, module):
    axpy = module.kernel("axpy_f32", "ppfi")
    n, replays = 50_000, 10
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n).astype(np.float32)
    steps = [(0.5, 0), (-1.25, 1), (2.0, 0), (0.125, 1), (3.0, 0), (-0.75, 1)]

    def run_steps(y0, y1, xb, stream=None):
        for a, target in steps:
            axpy.launch(blocks(n), 256, ((y0, y1)[target], xb, a, n), stream=stream)
        gpu.copy_device_to_device(y1, y0, 4 * 1000, stream=stream)  # a copy and a memset inside the graph too
        y0.fill(0, nbytes=4 * 10, stream=stream)

    bufs = [gpu.allocate(4 * n, "activations", label=f"b{i}") for i in range(6)]
    try:
        xg, y0g, y1g, xe, y0e, y1e = bufs
        for xb in (xg, xe):
            xb.upload(x)
        for yb in (y0g, y1g, y0e, y1e):
            yb.fill(0)
        gpu.synchronize()
        stream = gpu.create_stream()
        with gpu.capture(stream) as cap:
            run_steps(y0g, y1g, xg, stream)
        graph = cap.graph
        assert graph is not None
        stream.synchronize()
        assert not y0g.download(np.float32).any() and not y1g.download(np.float32).any()  # captured, not run
        for _ in range(replays):
            graph.launch(stream)
        stream.synchronize()
        for _ in range(replays):
            run_steps(y0e, y1e, xe)
        assert np.array_equal(y0g.download(np.float32), y0e.download(np.float32))
        assert np.array_equal(y1g.download(np.float32), y1e.download(np.float32))
        assert y1g.download(np.float32).any()
        with gpu.capture() as on_default:  # the device's default stream is capturable too
            run_steps(y0g, y1g, xg)
        on_default.graph.launch()
        run_steps(y0e, y1e, xe)
        assert np.array_equal(y1g.download(np.float32), y1e.download(np.float32))
        on_default.graph.destroy()
        graph.destroy()
        with pytest.raises(DeviceError, match="destroyed graph"):
            graph.launch(stream)
        stream.destroy()
    finally:
        for b in bufs:
            b.free()


def test_ten_thousand_allocations_leave_driver_free_memory_where_it_started(gpu):
    rng = np.random.default_rng(3)
    sizes = np.exp(rng.uniform(np.log(1), np.log(8 << 20), size=10_000)).astype(np.int64) + 1
    # Warm up with one batch of the same sizes, so that the baseline already includes whatever the
    # driver sets up once (docs/architecture.md, "Leak checks": warm up before the baseline).
    for b in [gpu.allocate(int(s), "scratch") for s in sizes[:500]]:
        b.free()
    gpu.synchronize()
    baseline = [gpu.driver_free_bytes() for _ in range(3)]
    ledger_before = gpu.snapshot()
    live = []
    peak_bytes = 0
    for i, size in enumerate(sizes):
        live.append(gpu.allocate(int(size), "scratch", label=f"leak-check {i}"))
        if len(live) == 500:  # free in a shuffled order, so the allocator sees holes
            peak_bytes = max(peak_bytes, sum(b.nbytes for b in live))
            for j in rng.permutation(len(live)):
                live[j].free()
            live = []
    for b in live:
        b.free()
    gpu.synchronize()
    after = [gpu.driver_free_bytes() for _ in range(3)]
    print(f"\n  driver free before {baseline}, after {after} (peak of one batch {format_bytes(peak_bytes)})")
    assert (gpu.snapshot() - ledger_before).clean
    assert after[-1] == baseline[-1], f"driver free memory moved by {after[-1] - baseline[-1]} bytes"


def test_out_of_memory_names_the_backend_and_changes_nothing(gpu):
    info = gpu.memory_info()
    before = gpu.snapshot()
    with pytest.raises(DeviceOutOfMemory) as err:
        gpu.allocate(info.total + (1 << 30), "kv", label="too big")
    text = str(err.value)
    assert text.startswith(f"{gpu.vendor_name} out of memory on {gpu.arch}: asked ")
    assert "for too big (kv)" in text and err.value.exit_code == 5
    assert (gpu.snapshot() - before).clean
    with gpu.allocate(1 << 20, "scratch"):  # the device is still usable
        pass


def test_launches_from_another_thread_and_events(gpu, module):
    iota = module.kernel("iota_i64", "pli")
    out = gpu.allocate(8 * 1024, "scratch")
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            iota.launch(4, 256, (out, 7, 1024))
            gpu.synchronize()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    assert np.array_equal(out.download(np.int64), 7 + np.arange(1024))
    start, end = gpu.create_event(), gpu.create_event()
    start.record()
    for _ in range(50):
        iota.launch(4, 256, (out, 1, 1024))
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_ms(end) > 0
    out.free()
    with pytest.raises(DeviceError, match="use of freed buffer"):
        iota.launch(4, 256, (out, 7, 1024))


def test_compile_errors_carry_the_log_and_unloaded_modules_refuse_launches(gpu, module):
    with pytest.raises(KernelCompileError) as err:
        gpu.jit_compile('extern "C" __global__ void broken(float* p) { p[0] = undefined_name; }', "broken.cu", [], [])
    assert "broken.cu" in str(err.value) and "undefined_name" in err.value.log
    other = gpu.load_module(gpu.jit_compile(SOURCE, "runtime_test_2.cu", [], []), "second")
    kernel = other.kernel("empty_kernel", "")
    kernel.launch(1, 1, ())
    other.unload()
    with pytest.raises(DeviceError, match="unloaded module"):
        kernel.launch(1, 1, ())


def test_per_launch_cost(gpu, module, capsys):
    """Python launch through Kernel.launch against one kernel inside a replayed graph."""
    empty = module.kernel("empty_kernel", "")
    count = module.kernel("count_launches", "p")
    counter = gpu.allocate(4, "scratch")
    counter.fill(0)
    for _ in range(200):
        empty.launch(1, 32, ())
    gpu.synchronize()
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        count.launch(1, 32, (counter,))
    t1 = time.perf_counter()
    gpu.synchronize()
    t2 = time.perf_counter()
    python_launch_us, python_drain_us = (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6
    per_graph, replays = 200, 50
    stream = gpu.create_stream()
    with gpu.capture(stream) as cap:
        for _ in range(per_graph):
            count.launch(1, 32, (counter,), stream=stream)
    cap.graph.launch(stream)
    stream.synchronize()
    start, end = gpu.create_event(), gpu.create_event()
    t0 = time.perf_counter()
    start.record(stream)
    for _ in range(replays):
        cap.graph.launch(stream)
    end.record(stream)
    stream.synchronize()
    t1 = time.perf_counter()
    graph_kernel_us = start.elapsed_ms(end) * 1e3 / (replays * per_graph)
    graph_wall_us = (t1 - t0) * 1e6 / (replays * per_graph)
    total = int(counter.download(np.int32)[0])
    cap.graph.destroy()
    stream.destroy()
    counter.free()
    with capsys.disabled():
        print(f"\n  {gpu.describe()}")
        print(f"  Kernel.launch (Python, 1 pointer argument): {python_launch_us:.2f} us to enqueue, "
              f"{python_drain_us:.2f} us per launch including the drain")
        print(f"  one kernel inside a replayed graph of {per_graph}: {graph_kernel_us:.2f} us GPU time, "
              f"{graph_wall_us:.2f} us wall")
    assert total == n + per_graph * (replays + 1)  # every launch and every replayed kernel ran once
    assert python_launch_us > 0 and graph_kernel_us > 0
