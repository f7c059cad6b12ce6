"""The NVIDIA backend: the shared GPU device (gpu_device.py) on cuda-python's driver API
(cuda.bindings.driver).

The same HIP kernel sources as on AMD, compiled by nvcc (precompiled cubins) or nvrtc (jit_compile),
are loaded with cuModuleLoadData and launched with cuLaunchKernelEx as programmatic dependent launches
on sm_90 and later, for the kernels that wait for the kernel ahead of them (the launch and the kernel's
start overlap the end of the one before; fused_qmatvec prefetches its first weights into L2 before it
waits). Measured on an NVIDIA H100 with the prefetch, single-sequence decode of the 8B Q4_K_M 322 -> 340 t/s
and of the 1B 1,090 -> 1,200 against plain launches (docs/history/2026-11-27-kv-epilogue-weight-prefetch.md);
before it, they gained 1.6-2.6% (and had cost 2-5% with older kernels).

What is CUDA's own, and so lives here: one primary context per device, retained at open and released
at close(), made current with cuCtxSetCurrent on every thread that touches the device; the arch
from the compute capability (sm_XY); nvrtc. Everything else is GpuDevice over the CUDA column of the
driver table (gpu_driver.py).

cuda-python is imported on first use, so this module imports on machines without it or without a
driver; probe() says why the backend cannot be used there.
"""

from __future__ import annotations

from typing import Any, Sequence

from hipcore.runtime.cuda_calls import VENDOR, call_error, check, load_driver_bindings, probe  # noqa: F401 (probe: selection)
from hipcore.runtime.gpu_device import GpuDevice, GpuStream
from hipcore.runtime.gpu_driver import DriverApi
from hipcore.runtime.gpu_support import release_quietly


class CudaDevice(GpuDevice):
    backend = "cuda"

    def __init__(self, index: int = 0):
        count = probe()
        drv = self._drv = load_driver_bindings()
        super().__init__(DriverApi(VENDOR, drv, check, call_error), index, count)
        self._cu_device = check(drv.cuDeviceGet(index), "cuDeviceGet")
        self._context = check(drv.cuDevicePrimaryCtxRetain(self._cu_device), "cuDevicePrimaryCtxRetain")
        try:
            self._make_current()
            raw_name = check(drv.cuDeviceGetName(256, self._cu_device), "cuDeviceGetName")
            self.name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace").strip()
            A = drv.CUdevice_attribute
            major = check(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._cu_device),
                          "cuDeviceGetAttribute")
            minor = check(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._cu_device),
                          "cuDeviceGetAttribute")
            self.arch = f"sm_{major}{minor}"
            self.multiprocessors = int(check(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                                                      self._cu_device), "cuDeviceGetAttribute"))
            self._default = GpuStream(self)
        except BaseException:  # a half-opened device must not keep the primary context retained
            self._leave()
            self._release_context()
            raise

    def _programmatic_launch_config(self) -> Any:
        major = int(self.arch[3:-1]) if self.arch.startswith("sm_") and self.arch[3:].isdigit() else 0
        if major < 9:
            return None
        drv = self._drv
        attribute = drv.CUlaunchAttribute()
        attribute.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config = drv.CUlaunchConfig()
        config.attrs = [attribute]
        config.numAttrs = 1
        return config

    def _activate(self) -> None:
        check(self._drv.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")

    def _release_context(self) -> None:
        release_quietly(self._drv.cuDevicePrimaryCtxRelease, self._cu_device)

    def jit_compile(self, source: str, name: str, include_dirs: Sequence[str] = (), options: Sequence[str] = ()) -> bytes:
        """nvrtc -> a CUBIN for this device's arch; KernelCompileError with the log on failure."""
        from hipcore.runtime.rtc import compile_with_nvrtc

        return compile_with_nvrtc(source, name, self.arch, include_dirs, options)
