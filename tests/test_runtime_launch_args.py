"""Kernel argument packing for the GPU backends, read back exactly as the driver reads it."""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest

from hipcore.runtime.errors import DeviceError
from hipcore.runtime.gpu_support import launch_dims
from hipcore.runtime.launch_args import SLOT_BYTES, ArgPacker, normalize_signature


def read_as_driver(address: int, signature: str) -> list:
    """Follow kernelParams like cuLaunchKernel does: void *args[i] -> the bytes of argument i."""
    pointers = ctypes.cast(address, ctypes.POINTER(ctypes.c_void_p))
    ctype = {"p": ctypes.c_uint64, "l": ctypes.c_int64, "i": ctypes.c_int32, "f": ctypes.c_float}
    return [ctypes.cast(pointers[i], ctypes.POINTER(ctype[k])).contents.value for i, k in enumerate(signature)]


def test_each_type_lands_in_its_own_aligned_slot(cpu_device):
    buf = cpu_device.allocate(64, "scratch")
    try:
        packer = ArgPacker("p p i f l", "k")
        address = packer.pack((buf, 0xDEAD_BEEF_0000, -7, 0.1, -(1 << 40)))
        values = read_as_driver(address, packer.signature)
        assert values[:3] == [buf.ptr, 0xDEAD_BEEF_0000, -7]
        assert values[3] == struct.unpack("<f", struct.pack("<f", 0.1))[0]
        assert values[4] == -(1 << 40)
        pointers = ctypes.cast(address, ctypes.POINTER(ctypes.c_void_p))
        assert all(pointers[i] % SLOT_BYTES == 0 for i in range(5))
        assert len({pointers[i] for i in range(5)}) == 5
    finally:
        buf.free()


def test_the_array_is_reused_and_overwritten_by_the_next_launch():
    packer = ArgPacker("il", "k")
    first = packer.pack((1, 2))
    second = packer.pack((np.int32(-3), np.int64(1 << 62)))
    assert first == second == packer.address
    assert read_as_driver(second, "il") == [-3, 1 << 62]
    assert packer.unpack() == (-3, 1 << 62)


def test_no_arguments_means_a_null_array():
    packer = ArgPacker("", "noargs")
    assert packer.pack(()) == 0


@pytest.mark.parametrize("args, error, text", [
    ((1, 2), TypeError, "takes 3 arguments"),
    ((1.5, 0, 0.0), TypeError, r"argument 0 \(int32\): expected an int, got float"),
    ((1 << 31, 0, 0.0), ValueError, r"argument 0 \(int32\): 2147483648 is outside"),
    ((0, 1 << 63, 0.0), ValueError, r"argument 1 \(int64\): 9223372036854775808 is outside"),
    ((0, 0, "x"), TypeError, r"argument 2 \(float32\): expected a float"),
    ((0, 0, 1e300), TypeError, r"argument 2 \(float32\): expected a float that fits float32"),
])
def test_bad_values_name_the_argument(args, error, text):
    with pytest.raises(error, match=text):
        ArgPacker("ilf", "mykernel").pack(args)


def test_pointer_arguments_refuse_negative_and_non_int_values():
    packer = ArgPacker("p", "k")
    with pytest.raises(ValueError, match=r"argument 0 \(pointer\): -1 is outside"):
        packer.pack((-1,))
    with pytest.raises(TypeError, match="expected a Buffer or an int address"):
        packer.pack(("0x10",))


def test_a_freed_buffer_is_refused_at_launch(cpu_device):
    buf = cpu_device.allocate(64, "scratch", label="stale")
    buf.free()
    with pytest.raises(DeviceError, match="use of freed buffer stale"):
        ArgPacker("p", "k").pack((buf,))


def test_unknown_signature_letters_are_rejected():
    with pytest.raises(ValueError, match=r"unknown letters \['d', 'x'\]"):
        normalize_signature("pdx")
    assert normalize_signature(" p i ") == "pi"


def test_threads_packing_the_same_kernel_do_not_interleave():
    packer = ArgPacker("ll", "k")
    mismatches = []

    def worker(tag: int) -> None:
        for i in range(2000):
            with packer.lock:
                address = packer.pack((tag, tag * 1000 + i))
                a, b = read_as_driver(address, "ll")
                if b != a * 1000 + i:
                    mismatches.append((a, b))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []


@pytest.mark.parametrize("value, dims", [(7, (7, 1, 1)), ((2, 3), (2, 3, 1)), ([4, 5, 6], (4, 5, 6)), (np.array([9]), (9, 1, 1))])
def test_launch_dims(value, dims):
    assert launch_dims(value) == dims


@pytest.mark.parametrize("value", [0, -1, (), (1, 2, 3, 4), (1, 0)])
def test_bad_launch_dims(value):
    with pytest.raises(ValueError, match="launch dimensions"):
        launch_dims(value)
