"""The shared GPU device (gpu_device.py over gpu_driver.py's table) for both vendors, on a machine
without a GPU: every entry point of each column reached with arguments its real binding accepts,
out of memory, launch and capture errors, close, jit without a compiler (see unopened_gpu.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver
from hip import hip
from support.unopened_gpu import (  # noqa: F401 (collections_only_between_tests: a fixture, used by name)
    BACKENDS, CUDA_MISSING, HIP_MISSING, StandIn, answered, answering, collections_only_between_tests, driver_api,
    entry_point, failing_binding_call, fake_buffer, null_handle, succeeding, unopened,
)

from hipcore.runtime import gpu_device
from hipcore.runtime.errors import EXIT_OUT_OF_MEMORY, BackendUnavailable, DeviceError, DeviceOutOfMemory, DriverCallError
from hipcore.runtime.gpu_device import GpuDevice, GpuEvent, GpuGraph
from hipcore.runtime.gpu_driver import CONSTANTS, ENTRY_POINTS, FUNCTION_ATTRIBUTES

pytestmark = pytest.mark.usefixtures("collections_only_between_tests")


@pytest.fixture(autouse=True)
def no_device_current_after_the_test():
    yield
    gpu_device._current.key = None


def error_code(backend: str, cuda_name: str, hip_name: str):
    return getattr(driver.CUresult, cuda_name) if backend == "cuda" else getattr(hip.hipError_t, hip_name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_driver_table_names_what_the_installed_binding_has(backend):
    api = unopened(backend)._api
    missing = [name for name in api.names.values() if not callable(getattr(api.binding, name, None))]
    assert not missing, f"{backend}: entry points the binding lacks: {missing}"
    assert set(api.names) == set(ENTRY_POINTS) - ({"func_set_attribute", "launch_kernel_ex"} if backend == "hip" else set())
    for key in CONSTANTS:
        api.constant(key)  # an AttributeError names the path that does not resolve
    assert (api.constant("event_create_flags") is None) == (backend == "hip")
    # The numbering of cuda.h's CUfunction_attribute, which HIP's hipFunction_attribute keeps.
    assert [int(api.function_attribute(key)) for key in FUNCTION_ATTRIBUTES] == [4, 1, 3, 2, 0, 8]


def test_cuda_out_of_memory_names_cuda_the_arch_and_the_ledger():
    ok, oom = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    dev = unopened("cuda", StandIn(driver, cuMemAlloc=lambda n: (oom, None), cuMemGetInfo=lambda: (ok, 1 << 30, 80 << 30)))
    dev.ledger.record(0x1000, 3 << 30, "weights", "blk")
    with pytest.raises(DeviceOutOfMemory) as info:
        dev.allocate(2 << 30, "kv", label="kv pool")
    text = str(info.value)
    assert text.startswith("CUDA out of memory on sm_90: asked 2.0 GiB for kv pool (kv), 1.0 GiB free of 80.0 GiB")
    assert "the ledger holds weights 3.0 GiB (1)" in text and "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in text
    assert info.value.exit_code == EXIT_OUT_OF_MEMORY and len(dev.ledger.live()) == 1


def test_hip_out_of_memory_names_hip_never_cuda():
    ok, oom = hip.hipError_t.hipSuccess, hip.hipError_t.hipErrorOutOfMemory
    dev = unopened("hip", StandIn(hip, hipMalloc=lambda n: (oom, None), hipMemGetInfo=lambda: (ok, 512 << 20, 24 << 30)))
    with pytest.raises(DeviceOutOfMemory) as info:
        dev.allocate(1 << 30, "weights", label="output.weight")
    text = str(info.value)
    assert text.startswith("HIP out of memory on gfx1100: asked 1.0 GiB for output.weight (weights), 512.0 MiB free of 24.0 GiB")
    assert "CUDA" not in text and "hipMalloc failed: hipErrorOutOfMemory" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_allocation_that_is_not_out_of_memory_stays_a_driver_error(backend):
    code = error_code(backend, "CUDA_ERROR_INVALID_CONTEXT", "hipErrorInvalidContext")
    malloc = entry_point(backend, "malloc")
    dev = unopened(backend, StandIn(BACKENDS[backend][1], **{malloc: lambda n: (code, None)}))
    with pytest.raises(DriverCallError, match=f"{malloc} failed: {code.name}"):
        dev.allocate(64, "scratch")
    assert dev.ledger.live() == []


def driver_calls(dev: GpuDevice) -> dict:
    """How the device reaches each entry point of its column of the table, keyed by role (text after
    a space tells two ways to the same call apart). Handles are null: every call must get as far as
    loading the driver library."""
    backend, api = dev.backend, dev._api
    a, b = fake_buffer(dev, 0x10000), fake_buffer(dev, 0x20000)
    stream = dev._default
    event = answered(dev, "event_create", null_handle(backend, "CUevent"), dev.create_event)
    graph = GpuGraph(dev, null_handle(backend, "CUgraph"), null_handle(backend, "CUgraphExec"))
    mod = answered(dev, "module_load_data", null_handle(backend, "CUmodule"), lambda: dev.load_module(b"\x7fELF", "m"))
    kernel = answered(dev, "module_get_function", null_handle(backend, "CUfunction"), lambda: mod.kernel("k", "ppfil"))
    waiting = answered(dev, "module_get_function", null_handle(backend, "CUfunction"),
                       lambda: mod.kernel("k", "ppfil", programmatic=True))

    def capture(**answers):
        """A capture on a device whose calls for the roles in `answers` succeed."""
        def run():
            with unopened(backend, answering(backend, answers)).capture():
                pass
        return run

    def capture_body_raises():
        with unopened(backend, answering(backend, {"stream_begin_capture": None})).capture():
            raise ValueError("the with-block failed")

    big_shared = "func_set_attribute" if "func_set_attribute" in api.names else "launch_kernel"  # HIP: no opt-in
    return {
        "mem_get_info": dev.memory_info,
        "malloc": lambda: dev._raw_alloc(256),
        "free": lambda: dev._raw_free(0x10000),
        "memcpy_htod_async (array)": lambda: a.upload(np.arange(16, dtype=np.float32)),
        "memcpy_htod_async (bytes, stream)": lambda: a.upload(b"abcd", offset=8, stream=stream),
        "memcpy_dtoh_async": lambda: a.download(np.float32, count=4),
        "memcpy_dtod_async": lambda: dev.copy_device_to_device(b, a, 32, 8, 16),
        "memset_d8_async": lambda: a.fill(0x1FF, nbytes=8),
        "device_synchronize": dev.synchronize,
        "stream_create": dev.create_stream,
        "stream_synchronize": stream.synchronize,
        "stream_destroy": lambda: api.call("stream_destroy", stream.handle),  # what the finalizer calls
        "event_create": dev.create_event,
        "event_record": lambda: event.record(stream),
        "event_synchronize": event.synchronize,
        "event_query": event.query,
        "event_elapsed_time": lambda: event.elapsed_ms(event),
        "event_destroy": lambda: api.call("event_destroy", event.handle),
        "module_load_data": lambda: dev.load_module(b"\x7fELF" + bytes(60), "m"),
        "module_get_function": lambda: mod.kernel("rmsnorm_f32", "ppfi"),
        "module_unload": lambda: api.call("module_unload", mod.handle),
        "launch_kernel": lambda: kernel.launch((4, 2), 256, (a, 0x20000, 0.5, 7, 1 << 40)),
        "launch_kernel (stream)": lambda: kernel.launch(3, (64, 2, 1), (a, b, -1.0, 0, -1), stream=stream),
        # CUDA on sm_90: a programmatic launch; HIP has none, the kernel launches as any other
        f"{'launch_kernel_ex' if backend == 'cuda' else 'launch_kernel'} (programmatic)":
            lambda: waiting.launch(5, 128, (a, b, 2.0, 3, 4), stream=stream),
        f"{'launch_kernel_ex' if backend == 'cuda' else 'launch_kernel'} (programmatic, default stream)":
            lambda: waiting.launch((2, 3), 64, (a, b, 2.0, 3, 4), shared_mem=1024),
        f"{big_shared} (96 KiB of dynamic shared memory)": lambda: kernel.launch(1, 64, (a, b, 1.0, 1, 1), shared_mem=96 << 10),
        "func_get_attribute": kernel.attributes,
        "stream_begin_capture": capture(),
        "stream_end_capture": capture(stream_begin_capture=None),
        "stream_end_capture (the with-block raised)": capture_body_raises,
        "graph_instantiate": capture(stream_begin_capture=None, stream_end_capture=null_handle(backend, "CUgraph")),
        "graph_launch": graph.launch,
        "graph_exec_destroy": lambda: api.call("graph_exec_destroy", graph._exec),
        "graph_destroy": lambda: api.call("graph_destroy", graph._graph),
        "activate": dev._make_current,
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_driver_call_passes_arguments_the_bindings_accept(backend, monkeypatch):
    dev = unopened(backend)
    library_missing = CUDA_MISSING if backend == "cuda" else HIP_MISSING
    calls = driver_calls(dev)
    assert {key.split(" ")[0] for key in calls} == set(dev._api.names) | {"activate"}  # the whole column is checked
    for key, run in calls.items():
        role = key.split(" ")[0]
        expected = BACKENDS[backend][4] if role == "activate" else dev._api.names[role]
        gpu_device._current.key = dev._current_key
        with pytest.raises(RuntimeError, match=library_missing) as info:
            run()
        assert failing_binding_call(info.value) == expected, key


def test_programmatic_launches_only_where_the_device_has_them(monkeypatch):
    """CUDA sm_90 and later: a kernel asked for as programmatic launches through cuLaunchKernelEx with the
    programmatic-serialization attribute, the grid, block, shared memory and stream filled in; a plain kernel and
    an sm_80 device launch through cuLaunchKernel. HIP has no such launch."""
    seen = []
    binding = StandIn(driver, cuLaunchKernel=lambda *args: seen.append(("plain", args)) or (driver.CUresult.CUDA_SUCCESS,),
                      cuLaunchKernelEx=lambda config, *args: seen.append(("ex", config, args)) or (driver.CUresult.CUDA_SUCCESS,))

    def launch(arch, programmatic):
        dev = unopened("cuda", binding)
        dev.arch = arch
        mod = answered(dev, "module_load_data", null_handle("cuda", "CUmodule"), lambda: dev.load_module(b"x", "m"))
        kernel = answered(dev, "module_get_function", null_handle("cuda", "CUfunction"),
                          lambda: mod.kernel("k", "pi", programmatic=programmatic))
        stream = dev._default
        seen.clear()
        kernel.launch((3, 2), (64, 2), (0x1000, 7), shared_mem=512, stream=stream)
        return kernel, stream, seen[0]

    kernel, stream, (kind, config, args) = launch("sm_90", True)
    assert kind == "ex" and kernel.programmatic
    assert (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ,
            config.sharedMemBytes, config.numAttrs) == (3, 2, 1, 64, 2, 1, 512, 1)
    assert int(config.hStream) == int(stream.handle)
    attribute = config.attrs[0]
    assert attribute.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attribute.value.programmaticStreamSerializationAllowed == 1
    for arch, programmatic in (("sm_90", False), ("sm_80", True), ("sm_100", False)):
        kernel, _, (kind, *_) = launch(arch, programmatic)
        assert kind == "plain" and not kernel.programmatic, (arch, programmatic)
    assert launch("sm_100", True)[2][0] == "ex"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_launch_names_the_call_the_kernel_and_the_geometry(backend):
    code = error_code(backend, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue")
    launch = entry_point(backend, "launch_kernel")
    dev = unopened(backend, StandIn(BACKENDS[backend][1], **{launch: lambda *args: (code,)}))
    mod = answered(dev, "module_load_data", null_handle(backend, "CUmodule"), lambda: dev.load_module(b"x", "m"))
    kernel = answered(dev, "module_get_function", null_handle(backend, "CUfunction"), lambda: mod.kernel("axpy", "pf"))
    with pytest.raises(DriverCallError, match=rf"^{dev._api.vendor} call {launch}\(axpy, grid \(8, 1, 1\), "
                                              rf"block \(32, 4, 1\)\) failed: {code.name}"):
        kernel.launch(8, (32, 4), (0x1000, 2.0))
    mod.unload()
    with pytest.raises(DeviceError, match="launch of kernel axpy from an unloaded module"):
        kernel.launch(8, 32, (0x1000, 2.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_capture_instantiates_a_graph_and_destroys_what_a_failure_leaves(backend):
    calls: list[tuple[str, tuple]] = []

    def logged(role, *result):
        def call(*args):
            calls.append((role, args))
            return (BACKENDS[backend][2], *result)
        return entry_point(backend, role), call

    graph, graph_exec = object(), object()
    replaced = dict(logged(role) for role in ("stream_begin_capture", "graph_destroy", "graph_exec_destroy"))
    replaced.update([logged("stream_end_capture", graph), logged("graph_instantiate", graph_exec)])
    dev = unopened(backend, StandIn(BACKENDS[backend][1], **replaced))
    with dev.capture() as cap:
        pass
    assert isinstance(cap.graph, GpuGraph) and [role for role, _ in calls][:3] == [
        "stream_begin_capture", "stream_end_capture", "graph_instantiate"]
    assert calls[0][1] == (dev._default.handle, dev._api.constant("capture_thread_local"))
    cap.graph.destroy()
    assert calls[3:] == [("graph_exec_destroy", (graph_exec,)), ("graph_destroy", (graph,))]

    calls.clear()
    with pytest.raises(ValueError, match="inside the capture"):
        with dev.capture():
            raise ValueError("inside the capture")
    assert calls[1:] == [("stream_end_capture", (dev._default.handle,)), ("graph_destroy", (graph,))]

    failed = error_code(backend, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue")
    dev._api.binding.__dict__[entry_point(backend, "graph_instantiate")] = lambda *args: (failed, None)
    calls.clear()
    with pytest.raises(DriverCallError, match=f"{entry_point(backend, 'graph_instantiate')} failed"):
        with dev.capture():
            pass
    assert calls[-1] == ("graph_destroy", (graph,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_event_not_ready_is_false_and_other_errors_raise(backend):
    real, ok = BACKENDS[backend][1:3]
    api = unopened(backend)._api
    invalid = error_code(backend, "CUDA_ERROR_INVALID_HANDLE", "hipErrorInvalidHandle")
    for answer, expected in ((api.constant("not_ready"), False), (ok, True), (invalid, DriverCallError)):
        dev = unopened(backend, StandIn(real, **{api.names["event_query"]: lambda e, answer=answer: (answer,)}))
        event = answered(dev, "event_create", null_handle(backend, "CUevent"), dev.create_event)
        if expected is DriverCallError:
            with pytest.raises(DriverCallError, match=f"{api.names['event_query']} failed: {invalid.name}"):
                event.query()
        else:
            assert event.query() is expected


def test_events_and_streams_of_another_backend_are_refused():
    cuda_dev, hip_dev = unopened("cuda"), unopened("hip")
    cuda_event = answered(cuda_dev, "event_create", driver.CUevent(0), cuda_dev.create_event)
    hip_event = answered(hip_dev, "event_create", None, hip_dev.create_event)
    assert isinstance(cuda_event, GpuEvent) and isinstance(hip_event, GpuEvent)
    with pytest.raises(TypeError, match="end must be an event of the same CUDA device, got GpuEvent"):
        cuda_event.elapsed_ms(hip_event)
    with pytest.raises(DeviceError, match="a stream of another device was passed to hip:0"):
        hip_dev.copy_device_to_device(fake_buffer(hip_dev, 0x100), fake_buffer(hip_dev, 0x200), 8,
                                      stream=cuda_dev.default_stream)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_an_unopened_device_releases_quietly(backend):
    dev = unopened(backend)
    dev.loaded_code["modules"]["add"] = object()  # what the kernel loader keeps on the device: close() drops it
    dev.close()  # the synchronize and release calls fail here; close() must not raise
    assert dev.loaded_code == {"modules": {}, "kernels": {}}
    assert dev._closed and getattr(gpu_device._current, "key", None) is None
    with pytest.raises(DeviceError, match=f"{backend}:0 was closed"):
        dev._make_current()
    dev.close()  # a second close is a no-op


def test_an_index_past_the_devices_that_answer_is_refused_naming_the_vendor():
    for backend, maker in (("cuda", "NVIDIA"), ("hip", "AMD")):
        module = BACKENDS[backend][0]
        dev = object.__new__(module.CudaDevice if backend == "cuda" else module.HipDevice)
        with pytest.raises(BackendUnavailable, match=rf"^{backend}:2 asked, but 2 {maker} device\(s\) answer "
                                                     rf"\({backend}:0 to {backend}:1\)$"):
            GpuDevice.__init__(dev, driver_api(backend), 2, 2)


def test_jit_compile_without_nvrtc_says_what_is_missing(monkeypatch):
    # The library's absence made certain (a machine may have nvidia-cuda-nvrtc, as the full tier installs it):
    # cuda-python's pathfinder raises this on the first call when no libnvrtc is found.
    from cuda.bindings import nvrtc

    def not_found(*args):
        raise RuntimeError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12": No such file: libnvrtc.so.13')

    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", not_found)
    with pytest.raises(DeviceError, match=r"nvrtc is not available \(libnvrtc\.so[\w. ]* not found\); pip install nvidia-cuda-nvrtc"):
        unopened("cuda").jit_compile('extern "C" __global__ void k() {}', "k.cu", ["/tmp"], ["-DX=1"])


def test_jit_compile_without_hiprtc_says_what_is_missing():
    with pytest.raises(DeviceError, match=r"hiprtc is not available \(libhiprtc\.so[\w. ]* not found\)"):
        unopened("hip").jit_compile('extern "C" __global__ void k() {}', "k.hip", [], [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_graph_launch_names_the_call_and_a_destroyed_graph_is_refused(backend):
    code = error_code(backend, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue")
    launch = entry_point(backend, "graph_launch")
    replaced = {launch: lambda *args: (code,), entry_point(backend, "graph_exec_destroy"): succeeding(backend),
                entry_point(backend, "graph_destroy"): succeeding(backend)}
    dev = unopened(backend, StandIn(BACKENDS[backend][1], **replaced))
    graph = GpuGraph(dev, null_handle(backend, "CUgraph"), null_handle(backend, "CUgraphExec"))
    with pytest.raises(DriverCallError, match=rf"^{dev._api.vendor} call {launch} failed: {code.name}"):
        graph.launch()
    graph.destroy()
    with pytest.raises(DeviceError, match="launch of a destroyed graph"):
        graph.launch()


@pytest.mark.parametrize("backend", BACKENDS)
def test_handle_counts_follow_streams_events_graphs_and_modules_until_destroyed(backend):
    dev = unopened(backend)
    assert dev.handle_counts() == {"streams": 1, "events": 0, "graphs": 0, "modules": 0}  # the default stream
    stream = answered(dev, "stream_create", null_handle(backend, "CUstream"), dev.create_stream)
    event = answered(dev, "event_create", null_handle(backend, "CUevent"), dev.create_event)
    module = answered(dev, "module_load_data", null_handle(backend, "CUmodule"), lambda: dev.load_module(b"\0", "m"))
    graph = GpuGraph(dev, object(), object())
    assert dev.handle_counts() == {"streams": 2, "events": 1, "graphs": 1, "modules": 1}
    for handle in (stream, event, module, graph):
        handle.destroy()  # the driver call fails here and is ignored; the handle no longer counts
    assert dev.handle_counts() == {"streams": 1, "events": 0, "graphs": 0, "modules": 0}
