"""The host backend: the device protocol on numpy. It is what CI runs and the numerical reference.

Memory is host memory, one numpy array per allocation, with a configurable capacity so that a user
can emulate a card's size (allocations past it fail as out of memory, as on a GPU). Addresses are
the arrays' real host addresses, so kernels receive plain integer pointers exactly as on a GPU; the
backend resolves every pointer to the allocation it falls in and refuses any access outside a live
allocation (a use-after-free or an overrun is an error here, not silent corruption).

Kernels are Python functions registered by name (`@cpu_kernel("rmsnorm_f32", "ppp if")`, usually
next to the op's numpy reference in hipcore/ops). They run synchronously when launched, or are
recorded when the stream is being captured, so graphs replay on this backend too.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from hipcore.runtime.device import (
    Buffer, Capture, Device, Event, Graph, Kernel, MemoryInfo, Module, Stream, as_dim3, host_bytes,
)
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.handles import LiveHandles

ALIGNMENT = 256  # same base alignment the GPU allocators give

CpuKernelFn = Callable[..., None]  # fn(mem: CpuDevice, grid: Dim3, block: Dim3, *args)
_CPU_KERNELS: dict[str, tuple[str, CpuKernelFn]] = {}


def cpu_kernel(name: str, signature: str) -> Callable[[CpuKernelFn], CpuKernelFn]:
    """Register the host implementation of kernel `name`; it gets (device, grid, block, *args)."""
    sig = signature.replace(" ", "")

    def register(fn: CpuKernelFn) -> CpuKernelFn:
        _CPU_KERNELS[name] = (sig, fn)
        return fn

    return register


def registered_cpu_kernels() -> dict[str, str]:
    return {name: sig for name, (sig, _) in _CPU_KERNELS.items()}


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume 16 GiB
        return 16 << 30


class CpuStream(Stream):
    destroyed = False  # counted by handle_counts() until destroyed or collected

    def __init__(self, device: "CpuDevice"):
        self.device = device
        self._recording: list[Callable[[], None]] | None = None

    def destroy(self) -> None:
        self.destroyed = True

    def submit(self, fn: Callable[[], None]) -> None:
        if self._recording is not None:
            self._recording.append(fn)
        else:
            fn()

    def synchronize(self) -> None:
        pass


class CpuEvent(Event):
    destroyed = False

    def __init__(self) -> None:
        self._t: float | None = None

    def destroy(self) -> None:
        self.destroyed = True

    def record(self, stream: Stream | None = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_ms(self, end: Event) -> float:
        assert isinstance(end, CpuEvent)
        if self._t is None or end._t is None:
            raise DeviceError("elapsed_ms: both events must be recorded first")
        return (end._t - self._t) * 1e3


class CpuKernel(Kernel):
    def __init__(self, device: "CpuDevice", name: str, signature: str, fn: CpuKernelFn):
        self.device, self.name, self.signature, self._fn = device, name, signature, fn

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Stream | None = None) -> None:
        self._check_args(args)
        values = []
        for kind, a in zip(self.signature, args):
            if kind == "p":
                values.append(a.addr() if isinstance(a, Buffer) else int(a))
            elif kind in "il":
                values.append(int(a))
            else:
                values.append(float(np.float32(a)))
        g, b, fn, dev = as_dim3(grid), as_dim3(block), self._fn, self.device
        dev._stream(stream).submit(lambda: fn(dev, g, b, *values))


class CpuModule(Module):
    """All registered host kernels; `image` is ignored on this backend."""

    destroyed = False

    def __init__(self, device: "CpuDevice"):
        self.device = device

    def unload(self) -> None:
        self.destroyed = True

    def kernel(self, name: str, signature: str, programmatic: bool = False) -> Kernel:
        entry = _CPU_KERNELS.get(name)  # host kernels run in order: `programmatic` changes nothing
        if entry is None:
            raise DeviceError(f"no host implementation registered for kernel {name!r}")
        sig, fn = entry
        if sig != signature.replace(" ", ""):
            raise DeviceError(f"kernel {name}: signature {signature!r} asked, host implementation takes {sig!r}")
        return CpuKernel(self.device, name, sig, fn)


class CpuGraph(Graph):
    def __init__(self, device: "CpuDevice", steps: list[Callable[[], None]]):
        self.device, self._steps = device, steps

    def launch(self, stream: Stream | None = None) -> None:
        if self._steps is None:
            raise DeviceError("launch of a destroyed graph")
        for fn in self._steps:
            fn()

    def destroy(self) -> None:
        self._steps = None  # type: ignore[assignment]

    @property
    def destroyed(self) -> bool:
        return self._steps is None


class CpuDevice(Device):
    backend = "cpu"
    arch = "cpu"

    def __init__(self, capacity: int | None = None, index: int = 0):
        super().__init__()
        self.index = index
        self.name = "host CPU (numpy)"
        self.capacity = int(capacity) if capacity else _physical_memory()
        self._arrays: dict[int, np.ndarray] = {}  # aligned address -> backing array
        self._starts: list[int] = []  # sorted aligned addresses, for pointer resolution
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()
        self._handles = LiveHandles()  # no driver handles here, but the same objects a GPU would count
        self._default = CpuStream(self)
        self._handles.add("streams", self._default)

    # ---- memory --------------------------------------------------------------------------------

    def memory_info(self) -> MemoryInfo:
        used = self.ledger.total_bytes
        return MemoryInfo(free=max(0, self.capacity - used), total=self.capacity)

    def _raw_alloc(self, nbytes: int) -> int:
        if self.ledger.total_bytes + nbytes > self.capacity:
            raise MemoryError(f"capacity {self.capacity} bytes exceeded")
        backing = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        base = backing.ctypes.data
        ptr = (base + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        arr = backing[ptr - base: ptr - base + nbytes]
        with self._lock:
            self._arrays[ptr] = arr
            self._sizes[ptr] = nbytes
            bisect.insort(self._starts, ptr)
        return ptr

    def _raw_free(self, ptr: int) -> None:
        with self._lock:
            self._arrays.pop(ptr)
            self._sizes.pop(ptr)
            self._starts.pop(bisect.bisect_left(self._starts, ptr))

    def bytes_at(self, ptr: int, nbytes: int) -> np.ndarray:
        """The uint8 view of [ptr, ptr + nbytes), which must lie inside one live allocation."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i >= 0:
                start = self._starts[i]
                if ptr + nbytes <= start + self._sizes[start]:
                    return self._arrays[start][ptr - start: ptr - start + nbytes]
        raise DeviceError(f"cpu backend: access of {nbytes} bytes at {ptr:#x} is outside every live allocation")

    def view(self, ptr: int, dtype: Any, shape: int | Sequence[int]) -> np.ndarray:
        """A typed numpy view of device memory (what host kernels read and write)."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        count = int(math.prod(shape))  # not np.prod: ~10x its speed on a short tuple, and every host kernel calls it
        return self.bytes_at(ptr, count * dtype.itemsize).view(dtype).reshape(shape)

    # ---- copies --------------------------------------------------------------------------------

    def copy_host_to_device(self, dst: Buffer, src: np.ndarray | bytes | memoryview, offset: int = 0,
                            stream: Stream | None = None) -> None:
        data = np.frombuffer(host_bytes(src), dtype=np.uint8)
        self._check_copy(dst, offset, data.nbytes, "upload")
        if stream is None:
            self.bytes_at(dst.ptr + offset, data.nbytes)[:] = data
        else:  # asynchronous semantics: the source is read when the stream gets there
            ptr = dst.ptr + offset
            self._stream(stream).submit(lambda: self.bytes_at(ptr, data.nbytes).__setitem__(slice(None), data))

    def copy_device_to_host(self, dst: np.ndarray, src: Buffer, offset: int = 0, stream: Stream | None = None) -> None:
        self._stream(stream)  # (checked: every stream's work has run by now on this backend)
        if not dst.flags.c_contiguous or not dst.flags.writeable:  # reshape would copy and drop the data
            raise ValueError("download: the destination array must be C-contiguous and writeable")
        out = dst.reshape(-1).view(np.uint8)
        self._check_copy(src, offset, out.nbytes, "download")
        out[:] = self.bytes_at(src.ptr + offset, out.nbytes)

    def copy_device_to_device(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
                              src_offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, dst_offset, nbytes, "copy (destination)")
        self._check_copy(src, src_offset, nbytes, "copy (source)")
        d, s = dst.ptr + dst_offset, src.ptr + src_offset
        self._stream(stream).submit(lambda: self.bytes_at(d, nbytes).__setitem__(slice(None), self.bytes_at(s, nbytes)))

    def memset(self, dst: Buffer, byte_value: int, nbytes: int, offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, offset, nbytes, "memset")
        p = dst.ptr + offset
        self._stream(stream).submit(lambda: self.bytes_at(p, nbytes).fill(byte_value & 0xFF))

    # ---- execution -----------------------------------------------------------------------------

    @property
    def default_stream(self) -> Stream:
        return self._default

    def _stream(self, stream: Stream | None) -> CpuStream:
        s = stream or self._default
        assert isinstance(s, CpuStream), "a stream of another device was passed to the cpu backend"
        return s

    def create_stream(self) -> Stream:
        return self._track("streams", CpuStream(self))

    def create_event(self) -> Event:
        return self._track("events", CpuEvent())

    def load_module(self, image: bytes = b"", name: str = "") -> Module:
        return self._track("modules", CpuModule(self))

    def _track(self, kind: str, obj: Any) -> Any:
        self._handles.add(kind, obj)
        return obj

    def handle_counts(self) -> dict[str, int]:
        return self._handles.counts()

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def capture(self, stream: Stream | None = None) -> Iterator[Capture]:
        s = self._stream(stream)
        if s._recording is not None:
            raise DeviceError("stream is already being captured")
        cap = Capture()
        s._recording = []
        try:
            yield cap
        finally:
            steps, s._recording = s._recording, None
        cap.graph = self._track("graphs", CpuGraph(self, steps))
