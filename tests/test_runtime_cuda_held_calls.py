"""hipcore/runtime/cuda_held_calls.py without a GPU: the held calls take cuda-python's arguments and give its
(err,) results through a library that keeps the GIL, everything else stays cuda-python's, and the device
falls back to cuda-python where libcuda cannot be opened. On a GPU every launch, copy and graph replay of the
GPU tier goes through these calls."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda.bindings import driver  # importable without a driver

from hipcore.runtime import cuda_held_calls as held
from hipcore.runtime.cuda_calls import check
from hipcore.runtime.errors import DriverCallError


class StandInLibrary:
    """libcuda's held symbols as Python callables that record their arguments and return `code`."""

    def __init__(self, code: int = 0):
        self.calls: list[tuple[str, tuple]] = []
        self.code = code
        for symbol, _ in held.HELD_CALLS.values():
            setattr(self, symbol, self._recorder(symbol))

    def _recorder(self, symbol: str):
        def call(*args):
            self.calls.append((symbol, args))
            return self.code

        call.__name__ = symbol
        return call


def test_every_held_call_passes_plain_ints_to_the_versioned_symbol():
    lib = StandInLibrary()
    drv = held.HeldGilDriver(driver, lib)
    stream, function = driver.CUstream(0x1234), driver.CUfunction(0x55)
    host = np.arange(16, dtype=np.uint8)
    assert drv.cuLaunchKernel(function, 3, 2, 1, 128, 1, 1, 4096, stream, 0xABC0, 0) == (0,)
    assert drv.cuMemcpyHtoDAsync(driver.CUdeviceptr(0x1000), host, 16, stream) == (0,)
    assert drv.cuMemcpyDtoDAsync(0x2000, 0x3000, 64, stream) == (0,)
    assert drv.cuEventRecord(driver.CUevent(7), stream) == (0,)
    assert drv.cuGraphLaunch(driver.CUgraphExec(9), 0) == (0,)
    assert lib.calls == [
        ("cuLaunchKernel", (0x55, 3, 2, 1, 128, 1, 1, 4096, 0x1234, 0xABC0, None)),
        ("cuMemcpyHtoDAsync_v2", (0x1000, host.ctypes.data, 16, 0x1234)),
        ("cuMemcpyDtoDAsync_v2", (0x2000, 0x3000, 64, 0x1234)),
        ("cuEventRecord", (7, 0x1234)),
        ("cuGraphLaunch", (9, 0)),
    ]
    # a kernel without parameters: NULL, as cuda-python passes it
    drv.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)
    assert lib.calls[-1][1][9] is None
    # ctypes converts with these types: the launch takes six unsigned dims, sizes are size_t
    argtypes = {symbol: [t.__name__ for t in getattr(lib, symbol).argtypes] for symbol, _ in held.HELD_CALLS.values()}
    assert argtypes["cuLaunchKernel"] == ["c_void_p"] + ["c_uint"] * 7 + ["c_void_p"] * 3
    assert argtypes["cuMemcpyDtoDAsync_v2"] == ["c_ulong", "c_ulong", "c_ulong", "c_void_p"]


def test_host_copies_read_the_callers_bytes_where_they_are():
    lib = StandInLibrary()
    drv = held.HeldGilDriver(driver, lib)
    data = bytes(range(32))
    view = memoryview(data)
    drv.cuMemcpyHtoDAsync(0x10, view, 32, 0)
    address = lib.calls[-1][1][1]
    assert ctypes.string_at(address, 32) == data  # no copy was made: the address is the bytes' own


def test_an_error_code_becomes_cuda_pythons_enum_and_check_names_the_call():
    drv = held.HeldGilDriver(driver, StandInLibrary(code=int(driver.CUresult.CUDA_ERROR_INVALID_HANDLE)))
    result = drv.cuGraphLaunch(driver.CUgraphExec(9), 0)
    assert result == (driver.CUresult.CUDA_ERROR_INVALID_HANDLE,)
    with pytest.raises(DriverCallError, match="cuGraphLaunch"):
        check(result, "cuGraphLaunch")
    assert held.HeldGilDriver(driver, StandInLibrary(code=987654)).cuEventRecord(0, 0) == (987654,)


def test_calls_not_held_are_cuda_pythons_own():
    drv = held.HeldGilDriver(driver, StandInLibrary())
    assert drv.cuEventQuery is driver.cuEventQuery
    assert drv.cuStreamSynchronize is driver.cuStreamSynchronize  # a wait lets the GIL go, as it should
    assert drv.CUresult is driver.CUresult


def test_the_library_is_opened_with_pydll_which_keeps_the_gil(monkeypatch):
    opened = []

    def pydll(name):
        opened.append(name)
        return StandInLibrary()

    monkeypatch.setattr(held.ctypes, "PyDLL", pydll)
    monkeypatch.delenv(held.GIL_ENV, raising=False)
    assert isinstance(held.driver_for_calls(driver), held.HeldGilDriver)
    assert opened == [held.LIBCUDA]
    monkeypatch.setenv(held.GIL_ENV, "release")
    assert held.driver_for_calls(driver) is driver


def test_without_libcuda_the_device_keeps_cuda_python(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(held.ctypes, "PyDLL", missing)
    monkeypatch.delenv(held.GIL_ENV, raising=False)
    assert held.driver_for_calls(driver) is driver
    # a library without the symbols (not libcuda after all) is refused the same way
    monkeypatch.setattr(held.ctypes, "PyDLL", lambda name: object())
    assert held.driver_for_calls(driver) is driver
