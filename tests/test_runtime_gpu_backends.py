"""The HIP and CUDA backends on a machine without a GPU: imports, probing, error translation, and a
contract check of every driver call against the real bindings.

The contract check builds a device object without opening it and calls each public method. Both
bindings convert a call's arguments before they load the driver library, so on this machine every
call must fail with the library-not-found error: a TypeError instead means the backend passes the
bindings something they do not accept, which would break on a real GPU.
"""

from __future__ import annotations

import sys
import traceback
from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.runtime import cuda as cuda_backend
from hipcore.runtime import hip as hip_backend
from hipcore.runtime.device import Buffer, Device
from hipcore.runtime.errors import BackendUnavailable, DeviceError, DeviceOutOfMemory, DriverCallError, EXIT_OUT_OF_MEMORY
from hipcore.runtime.gpu_support import ResourceRegistry, allocation_failure, library_failure_reason
from hipcore.runtime.launch_args import ArgPacker
from hipcore.runtime.rtc import hiprtc_options, nvrtc_options

from cuda.bindings import driver  # noqa: E402  (importable without a driver, which is the point)
from hip import hip  # noqa: E402  (importable without ROCm, which is the point)

HIP_MISSING = r"failed to dlopen .*libamdhip64\.so"
CUDA_MISSING = r"NVIDIA driver library|libcuda"


# ---- import and probe --------------------------------------------------------------------------


def test_hip_python_imports_and_reports_no_runtime_cleanly():
    with pytest.raises(BackendUnavailable, match=r"^no HIP runtime \(libamdhip64\.so not found\)$"):
        hip_backend.probe()
    with pytest.raises(BackendUnavailable, match=r"no HIP runtime \(libamdhip64\.so not found\)"):
        hip_backend.HipDevice(0)


def test_cuda_python_imports_and_reports_no_driver_cleanly():
    with pytest.raises(BackendUnavailable, match=r"^no NVIDIA driver \(libcuda\.so not found\)$"):
        cuda_backend.probe()
    with pytest.raises(BackendUnavailable, match=r"no NVIDIA driver"):
        cuda_backend.CudaDevice(0)


def test_missing_binding_packages_are_reasons_too(monkeypatch):
    from hipcore.runtime import cuda_calls, hip_calls
    from hipcore.runtime.device import pick_device

    monkeypatch.setattr(hip_calls, "_hip", None)
    monkeypatch.setattr(cuda_calls, "_driver", None)
    monkeypatch.setitem(sys.modules, "hip", None)  # what an uninstalled package looks like to import
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(BackendUnavailable, match="hip-python is not installed"):
        hip_backend.probe()
    choice = pick_device("auto")
    assert choice.device.backend == "cpu"
    assert choice.reasons[0].startswith("hip: not taken: hip-python is not installed")
    assert choice.reasons[1].startswith("cuda: not taken: cuda-python is not installed")


def test_library_failure_reasons_name_the_library():
    hip_msg = "failed to dlopen 'b'libamdhip64.so'': b'libamdhip64.so: cannot open shared object file: No such file or directory'"
    assert library_failure_reason(RuntimeError(hip_msg), "x") == "libamdhip64.so not found"
    nvrtc_msg = 'Failure finding "libnvrtc.so.13 or libnvrtc.so.12": No such file: libnvrtc.so.13'
    assert library_failure_reason(RuntimeError(nvrtc_msg), "libnvrtc.so") == "libnvrtc.so.13 or libnvrtc.so.12 not found"
    driver_msg = '"cuda" is an NVIDIA driver library and can only be found via system search.'
    assert library_failure_reason(RuntimeError(driver_msg), "libcuda.so") == "libcuda.so not found"
    broken = RuntimeError("failed to dlopen 'libamdhip64.so': undefined symbol: hsa_init")
    assert library_failure_reason(broken, "x").startswith("libamdhip64.so could not be loaded: failed to dlopen")


def test_the_real_pathfinder_and_dlopen_errors_become_those_reasons():
    try:
        driver.cuInit(0)
    except RuntimeError as exc:
        assert library_failure_reason(exc, "libcuda.so") == "libcuda.so not found"
    else:
        pytest.fail("this test expects a machine without an NVIDIA driver (the CI machine)")
    try:
        hip.hipInit(0)
    except RuntimeError as exc:
        assert library_failure_reason(exc, "x") == "libamdhip64.so not found"
    else:
        pytest.fail("this test expects a machine without ROCm (the CI machine)")


def test_gcn_arch_names_lose_their_feature_suffixes():
    assert hip_backend.arch_from_gcn_name("gfx942:sramecc+:xnack-") == "gfx942"
    assert hip_backend.arch_from_gcn_name("gfx1100") == "gfx1100"
    assert hip_backend.as_text(b"gfx90a:xnack-\0garbage") == "gfx90a:xnack-"


def test_device_properties_with_the_installed_binding_reaches_the_runtime():
    with pytest.raises(RuntimeError, match=HIP_MISSING) as info:
        hip_backend.device_properties(hip, 0)
    assert failing_binding_call(info.value) == "hipGetDeviceProperties"


def test_device_properties_with_an_older_binding_fills_the_struct_passed_in():
    class OldHip:  # hip-python for ROCm 6: hipGetDeviceProperties(props, deviceId) -> (err,)
        hipError_t = hip.hipError_t

        class hipDeviceProp_t:
            gcnArchName = b""

        @staticmethod
        def hipGetDeviceProperties(props, device_id):
            props.gcnArchName = b"gfx90a:sramecc+:xnack-"
            return (hip.hipError_t.hipSuccess,)

    props = hip_backend.device_properties(OldHip, 0)
    assert hip_backend.arch_from_gcn_name(hip_backend.as_text(props.gcnArchName)) == "gfx90a"


# ---- error translation ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend, code, call, text", [
    (cuda_backend, driver.CUresult.CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoDAsync", "CUDA call cuMemcpyHtoDAsync failed: CUDA_ERROR_INVALID_VALUE"),
    (hip_backend, hip.hipError_t.hipErrorInvalidValue, "hipMemcpyHtoDAsync", "HIP call hipMemcpyHtoDAsync failed: hipErrorInvalidValue"),
])
def test_check_turns_a_code_into_an_error_naming_the_call(backend, code, call, text):
    with pytest.raises(DriverCallError) as info:
        backend.check((code,), call)
    assert str(info.value).startswith(text)
    assert info.value.code == int(code) and info.value.call == call and isinstance(info.value, DeviceError)


@pytest.mark.parametrize("backend, ok", [(cuda_backend, driver.CUresult.CUDA_SUCCESS), (hip_backend, hip.hipError_t.hipSuccess)])
def test_check_unwraps_values(backend, ok):
    assert backend.check((ok,), "f") is None
    assert backend.check((ok, 42), "f") == 42
    assert backend.check((ok, 1, 2), "f") == (1, 2)


def test_allocation_failure_keeps_other_errors():
    oom = DriverCallError("CUDA", "cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    other = DriverCallError("CUDA", "cuMemAlloc", 1, "CUDA_ERROR_INVALID_VALUE", "")
    assert isinstance(allocation_failure(oom, [2]), MemoryError)
    assert allocation_failure(other, [2]) is other


# ---- devices built without opening a GPU ------------------------------------------------------------


def unopened_cuda(drv=driver) -> cuda_backend.CudaDevice:
    dev = object.__new__(cuda_backend.CudaDevice)
    Device.__init__(dev)
    dev._drv, dev.index, dev.name, dev.arch = drv, 0, "test GPU", "sm_90"
    dev._resources, dev._closed = ResourceRegistry(), False
    dev._cu_device, dev._context, dev._context_key = driver.CUdevice(0), driver.CUcontext(0), object()
    cuda_backend._thread.context = dev._context_key  # as if the context were current on this thread
    dev._default = object.__new__(cuda_backend.CudaStream)
    dev._default.device, dev._default.handle = dev, driver.CUstream(0)
    return dev


def unopened_hip(hip_module=hip) -> hip_backend.HipDevice:
    dev = object.__new__(hip_backend.HipDevice)
    Device.__init__(dev)
    dev._hip, dev.index, dev.name, dev.arch = hip_module, 0, "test GPU", "gfx1100"
    dev._resources, dev._closed, dev._device_key = ResourceRegistry(), False, object()
    hip_backend._thread.device = dev._device_key
    dev._default = object.__new__(hip_backend.HipStream)
    dev._default.device, dev._default.handle = dev, None
    return dev


def failing_binding_call(exc: BaseException) -> str:
    """The binding function whose library load raised `exc` (the first frame inside the bindings)."""
    for frame in traceback.extract_tb(exc.__traceback__):
        for prefix in ("cuda.bindings.driver.", "rocm.bindings.hip."):
            if frame.name.startswith(prefix):
                return frame.name[len(prefix):]
    return "<no binding frame>"


def fake_buffer(dev: Device, ptr: int, nbytes: int = 64) -> Buffer:
    return Buffer(dev, ptr, nbytes, "scratch", f"b{ptr:x}", dev.ledger.record(ptr, nbytes, "scratch"))


def test_cuda_out_of_memory_names_cuda_the_arch_and_the_ledger():
    ok, oom = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    fake = SimpleNamespace(CUresult=driver.CUresult, cuMemAlloc=lambda n: (oom, None),
                           cuMemGetInfo=lambda: (ok, 1 << 30, 80 << 30))
    dev = unopened_cuda(fake)
    dev.ledger.record(0x1000, 3 << 30, "weights", "blk")
    with pytest.raises(DeviceOutOfMemory) as info:
        dev.allocate(2 << 30, "kv", label="kv pool")
    text = str(info.value)
    assert text.startswith("CUDA out of memory on sm_90: asked 2.0 GiB for kv pool (kv), 1.0 GiB free of 80.0 GiB")
    assert "the ledger holds weights 3.0 GiB (1)" in text and "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in text
    assert info.value.exit_code == EXIT_OUT_OF_MEMORY and len(dev.ledger.live()) == 1


def test_hip_out_of_memory_names_hip_never_cuda():
    ok, oom = hip.hipError_t.hipSuccess, hip.hipError_t.hipErrorOutOfMemory
    fake = SimpleNamespace(hipError_t=hip.hipError_t, hipMalloc=lambda n: (oom, None),
                           hipMemGetInfo=lambda: (ok, 512 << 20, 24 << 30))
    dev = unopened_hip(fake)
    with pytest.raises(DeviceOutOfMemory) as info:
        dev.allocate(1 << 30, "weights", label="output.weight")
    text = str(info.value)
    assert text.startswith("HIP out of memory on gfx1100: asked 1.0 GiB for output.weight (weights), 512.0 MiB free of 24.0 GiB")
    assert "CUDA" not in text and "hipMalloc failed: hipErrorOutOfMemory" in text


def test_a_failed_allocation_that_is_not_out_of_memory_stays_a_driver_error():
    fake = SimpleNamespace(CUresult=driver.CUresult, cuMemAlloc=lambda n: (driver.CUresult.CUDA_ERROR_INVALID_CONTEXT, None))
    dev = unopened_cuda(fake)
    with pytest.raises(DriverCallError, match="cuMemAlloc failed: CUDA_ERROR_INVALID_CONTEXT"):
        dev.allocate(64, "scratch")
    assert dev.ledger.live() == []


def _cuda_calls(dev: cuda_backend.CudaDevice) -> dict:
    a, b = fake_buffer(dev, 0x10000), fake_buffer(dev, 0x20000)
    stream = dev._default
    event = object.__new__(cuda_backend.CudaEvent)
    event.device, event.handle = dev, driver.CUevent(0)
    graph = object.__new__(cuda_backend.CudaGraph)
    graph.device, graph._exec = dev, driver.CUgraphExec(0)
    module = object.__new__(cuda_backend.CudaModule)
    module.device, module.name, module.handle = dev, "m", driver.CUmodule(0)
    kernel = object.__new__(cuda_backend.CudaKernel)
    kernel.device, kernel.module, kernel.name, kernel.signature = dev, module, "k", "ppfil"
    kernel._function, kernel._packer, kernel._launch = driver.CUfunction(0), ArgPacker("ppfil", "k"), driver.cuLaunchKernel
    kernel._dynamic_shared_limit = 48 << 10

    def capture():
        with dev.capture():
            pass

    return {
        "cuMemGetInfo": dev.memory_info,
        "cuMemAlloc": lambda: dev._raw_alloc(256),
        "cuMemFree": lambda: dev._raw_free(0x10000),
        "cuMemcpyHtoDAsync (array)": lambda: a.upload(np.arange(16, dtype=np.float32)),
        "cuMemcpyHtoDAsync (bytes, stream)": lambda: a.upload(b"abcd", offset=8, stream=stream),
        "cuMemcpyDtoHAsync": lambda: a.download(np.float32, count=4),
        "cuMemcpyDtoDAsync": lambda: dev.copy_device_to_device(b, a, 32, 8, 16),
        "cuMemsetD8Async": lambda: a.fill(0x1FF, nbytes=8),
        "cuCtxSynchronize": dev.synchronize,
        "cuStreamCreate": dev.create_stream,
        "cuStreamSynchronize": stream.synchronize,
        "cuEventCreate": dev.create_event,
        "cuEventRecord": lambda: event.record(stream),
        "cuEventSynchronize": event.synchronize,
        "cuEventQuery": event.query,
        "cuEventElapsedTime": lambda: event.elapsed_ms(event),
        "cuModuleLoadData": lambda: dev.load_module(b"\x7fELF" + bytes(60), "m"),
        "cuModuleGetFunction": lambda: module.kernel("rmsnorm_f32", "ppfi"),
        "cuLaunchKernel": lambda: kernel.launch((4, 2), 256, (a, 0x20000, 0.5, 7, 1 << 40)),
        "cuFuncSetAttribute": lambda: kernel.launch(1, 64, (a, b, 1.0, 1, 1), shared_mem=96 << 10),
        "cuFuncGetAttribute": kernel.attributes,
        "cuGraphLaunch": graph.launch,
        "cuStreamBeginCapture": capture,
        "cuCtxSetCurrent": lambda: dev._make_current(),
    }


def test_every_cuda_driver_call_passes_arguments_the_bindings_accept():
    dev = unopened_cuda()
    try:
        for call, run in _cuda_calls(dev).items():
            with pytest.raises(RuntimeError, match=CUDA_MISSING) as info:
                run()
            assert failing_binding_call(info.value) == call.split(" ")[0]
    finally:
        cuda_backend._thread.context = None


def _hip_calls(dev: hip_backend.HipDevice) -> dict:
    a, b = fake_buffer(dev, 0x10000), fake_buffer(dev, 0x20000)
    stream = dev._default
    event = object.__new__(hip_backend.HipEvent)
    event.device, event.handle = dev, None
    graph = object.__new__(hip_backend.HipGraph)
    graph.device, graph._exec = dev, None
    module = object.__new__(hip_backend.HipModule)
    module.device, module.name, module.handle = dev, "m", None
    kernel = object.__new__(hip_backend.HipKernel)
    kernel.device, kernel.module, kernel.name, kernel.signature = dev, module, "k", "ppfil"
    kernel._function, kernel._packer, kernel._launch = None, ArgPacker("ppfil", "k"), hip.hipModuleLaunchKernel

    def capture():
        with dev.capture():
            pass

    return {
        "hipMemGetInfo": dev.memory_info,
        "hipMalloc": lambda: dev._raw_alloc(256),
        "hipFree": lambda: dev._raw_free(0x10000),
        "hipMemcpyHtoDAsync (array)": lambda: a.upload(np.arange(16, dtype=np.float32)),
        "hipMemcpyHtoDAsync (bytes, stream)": lambda: a.upload(b"abcd", offset=8, stream=stream),
        "hipMemcpyDtoHAsync": lambda: a.download(np.float32, count=4),
        "hipMemcpyDtoDAsync": lambda: dev.copy_device_to_device(b, a, 32, 8, 16),
        "hipMemsetD8Async": lambda: a.fill(0x1FF, nbytes=8),
        "hipDeviceSynchronize": dev.synchronize,
        "hipStreamCreateWithFlags": dev.create_stream,
        "hipStreamSynchronize": stream.synchronize,
        "hipEventCreate": dev.create_event,
        "hipEventRecord": lambda: event.record(stream),
        "hipEventSynchronize": event.synchronize,
        "hipEventQuery": event.query,
        "hipEventElapsedTime": lambda: event.elapsed_ms(event),
        "hipModuleLoadData": lambda: dev.load_module(b"\x7fELF" + bytes(60), "m"),
        "hipModuleGetFunction": lambda: module.kernel("rmsnorm_f32", "ppfi"),
        "hipModuleLaunchKernel": lambda: kernel.launch((4, 2), 256, (a, 0x20000, 0.5, 7, 1 << 40)),
        "hipFuncGetAttribute": kernel.attributes,
        "hipGraphLaunch": graph.launch,
        "hipStreamBeginCapture": capture,
        "hipSetDevice": lambda: dev._select(),
    }


def test_every_hip_call_passes_arguments_the_bindings_accept():
    dev = unopened_hip()
    try:
        for call, run in _hip_calls(dev).items():
            with pytest.raises(RuntimeError, match=HIP_MISSING) as info:
                run()
            assert failing_binding_call(info.value) == call.split(" ")[0]
    finally:
        hip_backend._thread.device = None


def test_closing_an_unopened_device_releases_quietly():
    for dev, attr in ((unopened_cuda(), "context"), (unopened_hip(), "device")):
        dev.close()  # the synchronize and release calls fail here; close() must not raise
        assert dev._closed
        with pytest.raises(DeviceError, match="was closed"):
            dev._make_current() if attr == "context" else dev._select()


# ---- run-time compilation without a compiler ----------------------------------------------------


def test_jit_compile_without_nvrtc_says_what_is_missing():
    dev = unopened_cuda()
    try:
        with pytest.raises(DeviceError, match=r"nvrtc is not available \(libnvrtc\.so[\w. ]* not found\); pip install nvidia-cuda-nvrtc"):
            dev.jit_compile('extern "C" __global__ void k() {}', "k.cu", ["/tmp"], ["-DX=1"])
    finally:
        cuda_backend._thread.context = None


def test_jit_compile_without_hiprtc_says_what_is_missing():
    dev = unopened_hip()
    try:
        with pytest.raises(DeviceError, match=r"hiprtc is not available \(libhiprtc\.so[\w. ]* not found\)"):
            dev.jit_compile('extern "C" __global__ void k() {}', "k.hip", [], [])
    finally:
        hip_backend._thread.device = None


def test_compiler_options_target_the_device():
    assert nvrtc_options("sm_90", ["/inc"], ["-DN=4"]) == [b"--gpu-architecture=sm_90", b"--include-path=/inc", b"-DN=4"]
    assert hiprtc_options("gfx942", ["/inc"], ["-O3"]) == [b"--offload-arch=gfx942", b"-I/inc", b"-O3"]


# ---- driver handles are released exactly once ---------------------------------------------------


def test_driver_handles_are_released_once_by_destroy_collection_or_close():
    import gc

    from hipcore.runtime.gpu_support import DriverResource

    released: list[str] = []

    class Handle(DriverResource):
        def __init__(self, registry: ResourceRegistry, name: str):
            self._own(registry, released.append, name)

    registry = ResourceRegistry()
    explicit, collected, kept_1, kept_2 = (Handle(registry, n) for n in ("explicit", "collected", "kept 1", "kept 2"))
    assert len(registry) == 4
    explicit.destroy()
    explicit.destroy()  # a second destroy is a no-op, not a second release
    del collected
    gc.collect()
    assert released == ["explicit", "collected"] and len(registry) == 2
    registry.release_all()  # what Device.close() does: newest first
    assert released == ["explicit", "collected", "kept 2", "kept 1"]
    assert kept_1.destroyed and kept_2.destroyed and len(registry) == 0
    kept_1.destroy()
    assert len(released) == 4


def test_release_quietly_swallows_failures_of_destroy_calls():
    from hipcore.runtime.gpu_support import release_quietly

    def failing(handle):
        raise RuntimeError("context already destroyed")

    release_quietly(failing, 1)  # no exception: finalizers and close() must not raise
