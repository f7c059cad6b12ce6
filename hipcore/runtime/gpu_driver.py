"""cuda-python and hip-python side by side: which entry point of each binding plays each role in the
shared GPU device (gpu_device.py), and the constants those calls take.

Both bindings return (err, *values) with 0 for success, take handles and int addresses alike, and
mostly differ only in names, which the tables below pair up. Where hip-python's calls take other
arguments than cuda-python's, the difference is a row of its own rather than code:
- hipEventCreate takes no flags (cuEventCreate takes CU_EVENT_DEFAULT);
- hipModuleLaunchKernel's `extra` is None where cuLaunchKernel's is 0; both take `kernelParams` as
  the int address of a `void *[]` (hip-python's ListOfPointer.fromPyobj turns the int into the
  pointer), see launch_args.py;
- hipStreamBeginCapture accepts only a hipStreamCaptureMode member (it type-checks the mode);
- AMD kernels need no opt-in to use more dynamic shared memory (CUDA's above 48 KiB do, through
  cuFuncSetAttribute; hipFuncSetAttribute takes a host function, not a module's function).
- Programmatic dependent launch (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
  SERIALIZATION, NVIDIA sm_90 and later) has no HIP counterpart: there every launch is cuLaunchKernel's
  plain kind. cuda.py builds the launch configuration.
What is not a table row stays in cuda.py / hip.py: opening the device (CUDA's primary context, HIP's
device selection), hipGetDeviceProperties' two forms (hip_calls.device_properties), arch names and
the run-time compilers.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from hipcore.runtime.errors import DriverCallError

VENDORS = ("CUDA", "HIP")

#  role                        cuda.bindings.driver    hip.hip
ENTRY_POINTS: dict[str, tuple[str, str | None]] = {
    "mem_get_info":           ("cuMemGetInfo",        "hipMemGetInfo"),
    "malloc":                 ("cuMemAlloc",          "hipMalloc"),
    "free":                   ("cuMemFree",           "hipFree"),
    "memcpy_htod_async":      ("cuMemcpyHtoDAsync",   "hipMemcpyHtoDAsync"),
    "memcpy_dtoh_async":      ("cuMemcpyDtoHAsync",   "hipMemcpyDtoHAsync"),
    "memcpy_dtod_async":      ("cuMemcpyDtoDAsync",   "hipMemcpyDtoDAsync"),
    "memset_d8_async":        ("cuMemsetD8Async",     "hipMemsetD8Async"),
    "device_synchronize":     ("cuCtxSynchronize",    "hipDeviceSynchronize"),
    "stream_create":          ("cuStreamCreate",      "hipStreamCreateWithFlags"),
    "stream_synchronize":     ("cuStreamSynchronize", "hipStreamSynchronize"),
    "stream_destroy":         ("cuStreamDestroy",     "hipStreamDestroy"),
    "event_create":           ("cuEventCreate",       "hipEventCreate"),
    "event_record":           ("cuEventRecord",       "hipEventRecord"),
    "event_synchronize":      ("cuEventSynchronize",  "hipEventSynchronize"),
    "event_query":            ("cuEventQuery",        "hipEventQuery"),
    "event_elapsed_time":     ("cuEventElapsedTime",  "hipEventElapsedTime"),
    "event_destroy":          ("cuEventDestroy",      "hipEventDestroy"),
    "module_load_data":       ("cuModuleLoadData",    "hipModuleLoadData"),
    "module_get_function":    ("cuModuleGetFunction", "hipModuleGetFunction"),
    "module_unload":          ("cuModuleUnload",      "hipModuleUnload"),
    "launch_kernel":          ("cuLaunchKernel",      "hipModuleLaunchKernel"),
    "launch_kernel_ex":       ("cuLaunchKernelEx",    None),  # programmatic dependent launch, see below
    "func_get_attribute":     ("cuFuncGetAttribute",  "hipFuncGetAttribute"),
    "func_set_attribute":     ("cuFuncSetAttribute",  None),  # see "no opt-in" above
    "stream_begin_capture":   ("cuStreamBeginCapture", "hipStreamBeginCapture"),
    "stream_end_capture":     ("cuStreamEndCapture",  "hipStreamEndCapture"),
    "graph_instantiate":      ("cuGraphInstantiate",  "hipGraphInstantiateWithFlags"),
    "graph_launch":           ("cuGraphLaunch",       "hipGraphLaunch"),
    "graph_exec_destroy":     ("cuGraphExecDestroy",  "hipGraphExecDestroy"),
    "graph_destroy":          ("cuGraphDestroy",      "hipGraphDestroy"),
}

# Enum members, as paths inside the binding module.
CONSTANTS: dict[str, tuple[str, str | None]] = {
    "stream_non_blocking":  ("CUstream_flags.CU_STREAM_NON_BLOCKING", "hipStreamNonBlocking"),
    "event_create_flags":   ("CUevent_flags.CU_EVENT_DEFAULT", None),  # hipEventCreate() takes none
    # Thread-local capture: this thread may not make unsafe calls (synchronize, legacy-stream work)
    # while capturing, which would silently escape the graph; other threads are not affected.
    "capture_thread_local": ("CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL",
                             "hipStreamCaptureMode.hipStreamCaptureModeThreadLocal"),
    "not_ready":            ("CUresult.CUDA_ERROR_NOT_READY", "hipError_t.hipErrorNotReady"),
    "out_of_memory":        ("CUresult.CUDA_ERROR_OUT_OF_MEMORY", "hipError_t.hipErrorOutOfMemory"),
}

# Kernel.attributes() key -> the attribute's name after CU_FUNC_ATTRIBUTE_ / HIP_FUNC_ATTRIBUTE_.
FUNCTION_ATTRIBUTES = {
    "registers": "NUM_REGS",
    "static_shared_bytes": "SHARED_SIZE_BYTES",
    "local_bytes": "LOCAL_SIZE_BYTES",
    "const_bytes": "CONST_SIZE_BYTES",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "max_dynamic_shared_bytes": "MAX_DYNAMIC_SHARED_SIZE_BYTES",
}
_FUNCTION_ATTRIBUTE_ENUMS = ("CUfunction_attribute.CU_FUNC_ATTRIBUTE_", "hipFunction_attribute.HIP_FUNC_ATTRIBUTE_")

LAUNCH_EXTRA = (0, None)  # the last argument of cuLaunchKernel / hipModuleLaunchKernel
DYNAMIC_SHARED_OPT_IN_ABOVE = (48 * 1024, math.inf)  # bytes a kernel may use before it must opt in


class DriverApi:
    """One vendor's column of the tables, bound to its binding module and its check()/call_error().

    Entry points and constants are looked up in the binding when used, so a binding release that
    lacks one breaks only what uses it, and tests can stand in for single entry points.
    """

    def __init__(self, vendor: str, binding: Any, check: Callable[[tuple, str], Any],
                 call_error: Callable[[Any, str], DriverCallError]):
        column = VENDORS.index(vendor)
        self.vendor, self.binding, self.check, self.call_error = vendor, binding, check, call_error
        self.names = {role: names[column] for role, names in ENTRY_POINTS.items() if names[column]}
        self._constants = {key: paths[column] for key, paths in CONSTANTS.items()}
        self._attribute_enum = _FUNCTION_ATTRIBUTE_ENUMS[column]
        self.launch_extra = LAUNCH_EXTRA[column]
        self.dynamic_shared_opt_in_above = DYNAMIC_SHARED_OPT_IN_ABOVE[column]

    def entry(self, role: str) -> Callable[..., tuple]:
        """The binding's function for `role`, unchecked: for the launch path and release_quietly."""
        return getattr(self.binding, self.names[role])

    def call(self, role: str, *args: Any, about: str = "") -> Any:
        """Call the entry point for `role` and check() it; errors name the call, with `about` in
        parentheses (the kernel or module concerned)."""
        name = self.names[role]
        return self.check(getattr(self.binding, name)(*args), f"{name}({about})" if about else name)

    def constant(self, key: str) -> Any:
        """The enum member named in CONSTANTS for this vendor; None where the vendor has none."""
        path = self._constants[key]
        return None if path is None else self._resolve(path)

    def function_attribute(self, key: str) -> Any:
        """The binding's function attribute enum member for a Kernel.attributes() key."""
        return self._resolve(self._attribute_enum + FUNCTION_ATTRIBUTES[key])

    def _resolve(self, path: str) -> Any:
        value = self.binding
        for part in path.split("."):
            value = getattr(value, part)
        return value
