"""The AMD backend: the shared GPU device (gpu_device.py) on hip-python (hip.hip, hip.hiprtc).

Code objects are loaded with hipModuleLoadData and launched with hipModuleLaunchKernel; where
hip-python's calls take other arguments than cuda-python's (no flags for hipEventCreate, None for
the launch's `extra`, a hipStreamCaptureMode member for capture), the HIP column of the driver table
(gpu_driver.py) says so.

What is HIP's own, and so lives here: HIP keeps the current device per thread, so every thread that
touches the device selects it (hipSetDevice); name and arch come from hipGetDeviceProperties, whose
form depends on the hip-python release (hip_calls.device_properties), the arch being the gfx target
without its feature suffixes; hiprtc.

hip-python imports without ROCm; its first call dlopens libamdhip64.so and raises RuntimeError when
that fails, which probe() turns into the reason "no HIP runtime (libamdhip64.so not found)".
"""

from __future__ import annotations

from typing import Sequence

from hipcore.runtime.gpu_device import GpuDevice, GpuStream
from hipcore.runtime.gpu_driver import DriverApi
from hipcore.runtime.hip_calls import (  # noqa: F401 (probe: selection)
    VENDOR, arch_from_gcn_name, as_text, call_error, check, device_properties, load_hip_bindings, probe,
)


class HipDevice(GpuDevice):
    backend = "hip"

    def __init__(self, index: int = 0):
        count = probe()
        hip = self._hip = load_hip_bindings()
        super().__init__(DriverApi(VENDOR, hip, check, call_error), index, count)
        self._make_current()
        props = device_properties(hip, index)
        self.name = as_text(props.name).strip() or f"AMD GPU {index}"
        self.gcn_arch_name = as_text(props.gcnArchName)
        self.arch = arch_from_gcn_name(self.gcn_arch_name)
        self.multiprocessors = int(getattr(props, "multiProcessorCount", 0) or 0) or None
        self._default = GpuStream(self)

    def _activate(self) -> None:
        check(self._hip.hipSetDevice(self.index), "hipSetDevice")

    def jit_compile(self, source: str, name: str, include_dirs: Sequence[str] = (), options: Sequence[str] = ()) -> bytes:
        """hiprtc -> a code object for this device's gfx target; KernelCompileError with the log on failure."""
        from hipcore.runtime.rtc import compile_with_hiprtc

        return compile_with_hiprtc(source, name, self.arch, include_dirs, options)
