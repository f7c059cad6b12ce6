"""The HIP and CUDA backends on a machine without a GPU: imports, probing, error translation,
compiler options and the release of driver handles. The shared device's driver calls are checked
against the real bindings in test_runtime_gpu_device.py.
"""

from __future__ import annotations

import sys

import pytest
from cuda.bindings import driver  # importable without a driver, which is the point
from hip import hip  # importable without ROCm, which is the point
from support.unopened_gpu import HIP_MISSING, failing_binding_call

from hipcore.runtime import cuda as cuda_backend
from hipcore.runtime import hip as hip_backend
from hipcore.runtime.errors import BackendUnavailable, DeviceError, DriverCallError
from hipcore.runtime.gpu_support import ResourceRegistry, allocation_failure, library_failure_reason
from hipcore.runtime.rtc import hiprtc_options, nvrtc_options


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
    from hipcore.runtime.selection import pick_device

    monkeypatch.setattr(hip_calls.load_hip_bindings, "loaded", None)
    monkeypatch.setattr(cuda_calls.load_driver_bindings, "loaded", None)
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


@pytest.mark.parametrize("first_call, library, reason", [
    (lambda: driver.cuInit(0), "libcuda.so", "libcuda.so not found"),
    (lambda: hip.hipInit(0), "x", "libamdhip64.so not found"),
])
def test_the_real_pathfinder_and_dlopen_errors_become_those_reasons(first_call, library, reason):
    try:
        first_call()
    except RuntimeError as exc:
        assert library_failure_reason(exc, library) == reason
    else:
        pytest.fail("this test expects a machine without an NVIDIA driver and without ROCm (the CI machine)")


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


# ---- run-time compiler options ------------------------------------------------------------------


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
