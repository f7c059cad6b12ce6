"""GPU devices built without opening a GPU, for the tests of the shared GPU device on machines with
none (tests/test_runtime_gpu_device.py, tests/test_runtime_gpu_backends.py).

Both bindings convert a call's arguments before they load the driver library. A device built here
calls the real binding, so on a machine without a driver each call must fail loading the library,
inside the binding function that was meant: a TypeError instead means the device passes the binding
something it does not accept, which would break on a real GPU. StandIn replaces single entry
points, to reach the code behind a call that would otherwise fail first.

Without a driver, cuda-python tries to load it again on every call, under a lock it does not take
again once the driver is loaded (so never on a GPU machine, where no driver resource can exist before
that). Here a garbage collection set off inside that load can run the finalizer of an unopened
device's stream, whose cuStreamDestroy then waits for the same lock: a deadlock. The tests that use
these devices therefore collect garbage only between tests (`collections_only_between_tests`).
"""

from __future__ import annotations

import gc
import traceback
from typing import Any, Callable, Iterator

import pytest
from cuda.bindings import driver  # importable without a driver, which is the point
from hip import hip  # importable without ROCm, which is the point

from hipcore.runtime import cuda as cuda_backend
from hipcore.runtime import gpu_device
from hipcore.runtime import hip as hip_backend
from hipcore.runtime.device import Buffer, Device
from hipcore.runtime.gpu_device import GpuDevice, GpuStream
from hipcore.runtime.gpu_driver import DriverApi

HIP_MISSING = r"failed to dlopen .*libamdhip64\.so"
CUDA_MISSING = r"NVIDIA driver library|libcuda"

BACKENDS = {  # backend -> (module, real binding, success code, arch, how the device becomes current)
    "cuda": (cuda_backend, driver, driver.CUresult.CUDA_SUCCESS, "sm_90", "cuCtxSetCurrent"),
    "hip": (hip_backend, hip, hip.hipError_t.hipSuccess, "gfx1100", "hipSetDevice"),
}


@pytest.fixture
def collections_only_between_tests() -> Iterator[None]:
    """No automatic garbage collection during the test; what it left is collected after it, outside
    any binding call, so that the finalizers of its driver resources cannot deadlock (see above)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


class StandIn:
    """A binding with some entry points replaced; everything else is the real binding's."""

    def __init__(self, real: Any, **replaced: Callable[..., tuple]):
        self._real = real
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def driver_api(backend: str, binding: Any = None) -> DriverApi:
    """The backend's column of the driver table, calling `binding` (default: the real binding)."""
    module, real = BACKENDS[backend][:2]
    return DriverApi(module.VENDOR, real if binding is None else binding, module.check, module.call_error)


def entry_point(backend: str, role: str) -> str:
    return driver_api(backend).names[role]


def succeeding(backend: str, value: Any = None) -> Callable[..., tuple]:
    """An entry point that returns success and `value` (nothing more when it is None)."""
    ok = BACKENDS[backend][2]
    return lambda *args: (ok,) if value is None else (ok, value)


def answering(backend: str, answers: dict[str, Any]) -> StandIn:
    """The real binding, but the entry point of each role in `answers` succeeds with that value."""
    return StandIn(BACKENDS[backend][1], **{entry_point(backend, role): succeeding(backend, value)
                                            for role, value in answers.items()})


def null_handle(backend: str, cuda_type: str) -> Any:
    """The handle a driver call gets for "none": a typed 0 for cuda-python, None for hip-python."""
    return getattr(driver, cuda_type)(0) if backend == "cuda" else None


def unopened(backend: str, binding: Any = None) -> GpuDevice:
    """A CudaDevice / HipDevice that never opened a GPU, current on this thread, calling `binding`."""
    module, real, _, arch, _ = BACKENDS[backend]
    binding = real if binding is None else binding
    dev = object.__new__(module.CudaDevice if backend == "cuda" else module.HipDevice)
    GpuDevice.__init__(dev, driver_api(backend, binding), 0, 1)
    dev.name, dev.arch = "test GPU", arch
    if backend == "cuda":
        dev._drv, dev._cu_device, dev._context = binding, driver.CUdevice(0), driver.CUcontext(0)
    else:
        dev._hip = binding
    dev._default = answered(dev, "stream_create", null_handle(backend, "CUstream"), lambda: GpuStream(dev))
    return dev


def answered(dev: GpuDevice, role: str, value: Any, make: Callable[[], Any]) -> Any:
    """make() on `dev` made current, with the entry point for `role` answering `value`: objects made
    by their own __init__, whose driver call would fail here."""
    real_api = dev._api
    dev._api = driver_api(dev.backend, StandIn(real_api.binding, **{real_api.names[role]: succeeding(dev.backend, value)}))
    gpu_device._current.key = dev._current_key
    try:
        return make()
    finally:
        dev._api = real_api


def failing_binding_call(exc: BaseException) -> str:
    """The binding function whose library load raised `exc` (the first frame inside the bindings)."""
    for frame in traceback.extract_tb(exc.__traceback__):
        for prefix in ("cuda.bindings.driver.", "rocm.bindings.hip."):
            if frame.name.startswith(prefix):
                return frame.name[len(prefix):]
    return "<no binding frame>"


def fake_buffer(dev: Device, ptr: int, nbytes: int = 64) -> Buffer:
    return Buffer(dev, ptr, nbytes, "scratch", f"b{ptr:x}", dev.ledger.record(ptr, nbytes, "scratch"))
