"""The NVIDIA driver calls that return in microseconds, made with the GIL kept.

cuda-python lets go of the GIL around every driver call. For a call that can wait (a synchronize, an
allocation, a module load) that is right: other threads run meanwhile. For the calls of a step's hot path
(a kernel launch, an async copy, an event record, a graph launch: each returns in a few microseconds) it is
only a cost: the calling thread must then win the GIL back, and beside a busy thread it waits until that
thread blocks or the interpreter's switch interval (5 ms) runs out. In `rocmforge serve` the engine thread
makes ~8 such calls per decode step and ~240 launches per step that evaluates a prompt, beside the event loop
that streams the tokens: measured with py-spy on an NVIDIA H100, one copy's call site alone held the engine
thread ~145 us a step (docs/benchmarks.md, fourth session of 2026-11-27).

HeldGilDriver stands in for cuda.bindings.driver: the names in HELD_CALLS go to the same libcuda through
ctypes.PyDLL (which keeps the GIL) with cuda-python's arguments and (err,) results; every other name is
cuda-python's own. ROCMFORGE_DRIVER_GIL=release keeps cuda-python for every call (to measure the
difference). hip-python's calls are unchanged: nothing here runs on AMD hardware, so nothing is changed there.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

GIL_ENV = "ROCMFORGE_DRIVER_GIL"  # "release": every driver call through cuda-python, which lets the GIL go
LIBCUDA = "libcuda.so.1"

_P, _U, _S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
# cuda-python name -> (libcuda symbol: the versioned one cuda.h's macro names, argument types)
HELD_CALLS: dict[str, tuple[str, tuple]] = {
    "cuLaunchKernel": ("cuLaunchKernel", (_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P)),
    "cuMemcpyHtoDAsync": ("cuMemcpyHtoDAsync_v2", (ctypes.c_uint64, _P, _S, _P)),
    "cuMemcpyDtoDAsync": ("cuMemcpyDtoDAsync_v2", (ctypes.c_uint64, ctypes.c_uint64, _S, _P)),
    "cuEventRecord": ("cuEventRecord", (_P, _P)),
    "cuGraphLaunch": ("cuGraphLaunch", (_P, _P)),
}


def _handle(value: Any) -> int:
    """A driver handle or address as an int: cuda-python's handle objects convert with int(); None is 0."""
    return 0 if value is None else int(value)


def _host_address(data: Any) -> int:
    """The address of host bytes (a numpy array, bytes or a memoryview), without copying them."""
    if isinstance(data, np.ndarray):
        return int(data.ctypes.data)
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


class HeldGilDriver:
    """cuda.bindings.driver with HELD_CALLS made through `library` (ctypes.PyDLL of libcuda: the GIL kept).

    `library` is anything with those symbols as attributes (tests pass a stand-in)."""

    def __init__(self, binding: Any, library: Any):
        self._binding = binding
        self._error = binding.CUresult
        for name, (symbol, argtypes) in HELD_CALLS.items():
            function = getattr(library, symbol)
            function.argtypes = list(argtypes)
            function.restype = ctypes.c_int
            setattr(self, "_" + name, function)

    def __getattr__(self, name: str) -> Any:  # everything not held: cuda-python's own
        return getattr(self._binding, name)

    def _result(self, err: int) -> tuple:
        if not err:
            return (0,)
        try:
            return (self._error(err),)
        except ValueError:  # a code this cuda-python does not name: the number still says it
            return (err,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared_mem, stream, params, extra) -> tuple:
        return self._result(self._cuLaunchKernel(_handle(function), gx, gy, gz, bx, by, bz, shared_mem,
                                                 _handle(stream), params or None, extra or None))

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream) -> tuple:
        return self._result(self._cuMemcpyHtoDAsync(int(dst), _host_address(src), nbytes, _handle(stream)))

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream) -> tuple:
        return self._result(self._cuMemcpyDtoDAsync(int(dst), int(src), nbytes, _handle(stream)))

    def cuEventRecord(self, event, stream) -> tuple:
        return self._result(self._cuEventRecord(_handle(event), _handle(stream)))

    def cuGraphLaunch(self, graph_exec, stream) -> tuple:
        return self._result(self._cuGraphLaunch(_handle(graph_exec), _handle(stream)))


def driver_for_calls(binding: Any) -> Any:
    """The binding the NVIDIA device calls through: HeldGilDriver over libcuda, or cuda-python itself when
    ROCMFORGE_DRIVER_GIL=release or libcuda cannot be opened this way (then nothing changes)."""
    if os.environ.get(GIL_ENV, "").strip().lower() == "release":
        return binding
    try:
        library = ctypes.PyDLL(LIBCUDA)
        return HeldGilDriver(binding, library)
    except (OSError, AttributeError):
        return binding
