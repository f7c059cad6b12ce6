"""The device protocol every backend implements: Device, Buffer, Stream, Event, Module, Kernel, Graph.

Modelled on cuda.core and tinygrad's runtime, and kept small. Three backends implement it:
hip.py (AMD, hip-python), cuda.py (NVIDIA, cuda-python) and cpu.py (numpy; the numerical reference).

Conventions shared by all backends:
- Every allocation goes through `Device.allocate(nbytes, tag, label)` and is recorded in the
  device's Ledger; `Buffer.free()` is explicit, and freeing twice raises DeviceError (never a crash).
- Kernel arguments are packed from a signature string, one letter per argument:
  'p' pointer (a Buffer or an int address), 'i' int32, 'l' int64, 'f' float32.
- Work is ordered on streams. Passing `stream=None` means the device's default stream, which is a
  real (capturable) stream on GPU backends.
- A Graph is made by capturing a stream's launches (`with device.capture(stream) as cap: ...;
  graph = cap.graph`) and replayed with `graph.launch(stream)`. Kernel arguments are frozen at
  capture time, so anything that changes between replays must live in device memory.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from hipcore.runtime.errors import DeviceError, DeviceOutOfMemory
from hipcore.runtime.ledger import TAGS, Allocation, Ledger, LedgerSnapshot, _call_site, format_bytes

ARG_TYPES = {"p": "pointer", "i": "int32", "l": "int64", "f": "float32"}

Dim3 = tuple[int, int, int]


def as_dim3(v: int | Sequence[int]) -> Dim3:
    t = (int(v),) if isinstance(v, (int, np.integer)) else tuple(int(x) for x in v)
    if not 1 <= len(t) <= 3 or any(x < 1 for x in t):
        raise ValueError(f"launch dimensions must be 1 to 3 positive ints, got {v!r}")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


@dataclass(frozen=True)
class MemoryInfo:
    free: int
    total: int


class Buffer:
    """A device allocation. Free it explicitly (or use it as a context manager)."""

    __slots__ = ("device", "ptr", "nbytes", "tag", "label", "allocation", "_freed_at", "__weakref__")

    def __init__(self, device: "Device", ptr: int, nbytes: int, tag: str, label: str, allocation: Allocation):
        self.device = device
        self.ptr = ptr
        self.nbytes = nbytes
        self.tag = tag
        self.label = label
        self.allocation = allocation
        self._freed_at: str | None = None

    @property
    def freed(self) -> bool:
        return self._freed_at is not None

    def free(self) -> None:
        """Return the memory to the device. A second free is a clear error naming both places."""
        if self._freed_at is not None:
            raise DeviceError(
                f"double free of buffer {self.label or hex(self.ptr)} ({self.tag}, {self.nbytes} bytes), "
                f"allocated at {self.allocation.site}, first freed at {self._freed_at}"
            )
        self._freed_at = _call_site()
        self.device._release(self)

    def addr(self, offset: int = 0) -> int:
        """Device address at a byte offset, bounds-checked."""
        if not 0 <= offset <= self.nbytes:
            raise ValueError(f"offset {offset} outside buffer {self.label!r} of {self.nbytes} bytes")
        self._check_live()
        return self.ptr + offset

    def upload(self, src: np.ndarray | bytes | memoryview, offset: int = 0, stream: "Stream | None" = None) -> None:
        """Copy host data into this buffer at a byte offset (synchronous unless a stream is given)."""
        self.device.copy_host_to_device(self, src, offset, stream)

    def download(self, dtype: Any = np.uint8, count: int | None = None, offset: int = 0) -> np.ndarray:
        """Copy (part of) this buffer to a new host array; waits for the work queued before it."""
        dtype = np.dtype(dtype)
        if count is None:
            count = (self.nbytes - offset) // dtype.itemsize
        out = np.empty(count, dtype=dtype)
        self.device.copy_device_to_host(out, self, offset)
        return out

    def fill(self, byte_value: int = 0, nbytes: int | None = None, offset: int = 0, stream: "Stream | None" = None) -> None:
        self.device.memset(self, byte_value, self.nbytes - offset if nbytes is None else nbytes, offset, stream)

    def _check_live(self) -> None:
        if self._freed_at is not None:
            raise DeviceError(f"use of freed buffer {self.label or hex(self.ptr)} (freed at {self._freed_at})")

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.freed:
            self.free()

    def __repr__(self) -> str:
        state = "freed" if self.freed else "live"
        return f"Buffer({self.label or hex(self.ptr)}, {format_bytes(self.nbytes)}, {self.tag}, {state})"


class Stream(abc.ABC):
    device: "Device"

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    def destroy(self) -> None:
        """Release the stream's driver handle (GPU backends); the device's close() does it too."""


class Event(abc.ABC):
    @abc.abstractmethod
    def record(self, stream: Stream | None = None) -> None: ...

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    @abc.abstractmethod
    def query(self) -> bool:
        """True when the work recorded before this event has finished."""

    @abc.abstractmethod
    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (both recorded and finished)."""

    def destroy(self) -> None:
        """Release the event's driver handle (GPU backends); garbage collection does it too."""


class Kernel(abc.ABC):
    """One entry point of a loaded module, with its argument signature (see ARG_TYPES)."""

    name: str
    signature: str

    @abc.abstractmethod
    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Stream | None = None) -> None: ...

    def attributes(self) -> dict[str, int]:
        """What the compiler gave the kernel on the device: registers, static shared memory, local
        (spill) memory, max threads per block. Host kernels have none of these and return {}."""
        return {}

    def _check_args(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.signature):
            raise TypeError(f"kernel {self.name} takes {len(self.signature)} arguments ({self.signature}), got {len(args)}")


class Module(abc.ABC):
    @abc.abstractmethod
    def kernel(self, name: str, signature: str, programmatic: bool = False) -> Kernel:
        """The entry point `name`. programmatic: the kernel calls rf_grid_dependency_sync() (hip_compat.h)
        before it touches global memory, so it may be launched to start before the kernel ahead of it in
        the stream has finished, where the device can (NVIDIA sm_90 and later; elsewhere a plain launch)."""

    def unload(self) -> None:  # pragma: no cover - backends override when there is something to release
        pass


class Graph(abc.ABC):
    """An instantiated capture of a stream's launches; replay with launch()."""

    @abc.abstractmethod
    def launch(self, stream: Stream | None = None) -> None: ...

    @abc.abstractmethod
    def destroy(self) -> None: ...


class Capture:
    """Handed out by Device.capture(); `graph` is set when the with-block ends."""

    graph: Graph | None = None


class Device(abc.ABC):
    """A compute device. Subclasses implement the _raw_* primitives; allocation bookkeeping is here."""

    backend: str  # "hip" | "cuda" | "cpu"
    name: str
    arch: str  # "gfx942", "sm_90", "cpu" ...
    index: int = 0
    multiprocessors: int | None = None  # SMs / CUs, where the driver says (launch geometries size grids by it)

    def __init__(self) -> None:
        self.ledger = Ledger()
        self._alloc_lock = threading.Lock()
        self._fail_at: int | None = None  # test hook: make the k-th allocation from now fail
        self._alloc_attempts = 0
        # The modules and kernels hipcore/runtime/kernels.py loaded for this device ({"modules": {op: Module},
        # "kernels": {key: Kernel}}): kept on the device, not in a table of the process, because they refer to
        # it; a process-wide table would keep every device alive. close() empties it.
        self.loaded_code: dict[str, dict] = {"modules": {}, "kernels": {}}

    # ---- memory -------------------------------------------------------------------------------

    @abc.abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Free and total bytes as the driver (or the cpu backend's capacity) sees them."""

    @abc.abstractmethod
    def _raw_alloc(self, nbytes: int) -> int:
        """Allocate and return an address; raise MemoryError when the device is out of memory."""

    @abc.abstractmethod
    def _raw_free(self, ptr: int) -> None: ...

    def allocate(self, nbytes: int, tag: str = "other", label: str = "", owner: str = "") -> Buffer:
        """Allocate device memory, recorded in the ledger under `tag`."""
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise ValueError(f"allocation size must be a positive int, got {nbytes!r} for {label or tag}")
        if tag not in TAGS:
            raise ValueError(f"unknown allocation tag {tag!r}; expected one of {', '.join(TAGS)}")
        nbytes = int(nbytes)
        site = _call_site()
        with self._alloc_lock:
            self._alloc_attempts += 1
            injected = self._fail_at is not None and self._alloc_attempts >= self._fail_at
            if injected:
                self._fail_at = None
            try:
                if injected:
                    raise MemoryError("injected allocation failure (test hook)")
                ptr = self._raw_alloc(nbytes)
            except MemoryError as exc:
                raise self._oom(nbytes, tag, label, str(exc)) from None
            alloc = self.ledger.record(ptr, nbytes, tag, label, owner, site)
        return Buffer(self, ptr, nbytes, tag, label, alloc)

    def _release(self, buf: Buffer) -> None:
        with self._alloc_lock:
            self.ledger.release(buf.ptr)
            self._raw_free(buf.ptr)

    def inject_allocation_failure(self, k: int | None) -> None:
        """Test hook: the k-th allocation from now (1 = the next) fails as out of memory."""
        self._fail_at = None if k is None else self._alloc_attempts + k

    def _oom(self, nbytes: int, tag: str, label: str, detail: str) -> DeviceOutOfMemory:
        try:
            info: MemoryInfo | None = self.memory_info()
        except Exception:  # the driver may be unusable after the failure; report without it
            info = None
        free_txt = f"{format_bytes(info.free)} free of {format_bytes(info.total)}" if info else "free memory unknown"
        what = f"{label} ({tag})" if label else tag
        return DeviceOutOfMemory(
            f"{self.vendor_name} out of memory on {self.arch}: asked {format_bytes(nbytes)} for {what}, "
            f"{free_txt}; the ledger holds {self.ledger.summary()} [{detail}]",
            requested=nbytes, free=info.free if info else None, tag=tag, label=label,
        )

    @property
    def vendor_name(self) -> str:
        return {"hip": "HIP", "cuda": "CUDA", "cpu": "CPU backend"}[self.backend]

    def snapshot(self) -> LedgerSnapshot:
        """Ledger state plus the driver's free bytes (None on the cpu backend)."""
        return self.ledger.snapshot(self.driver_free_bytes())

    def driver_free_bytes(self) -> int | None:
        return None

    def handle_counts(self) -> dict[str, int]:
        """Live streams, events, graphs and modules (handles.HANDLE_KINDS), which the ledger does not
        hold; the default stream counts. Each backend keeps its own count."""
        return {}

    # ---- copies -------------------------------------------------------------------------------

    @abc.abstractmethod
    def copy_host_to_device(self, dst: Buffer, src: np.ndarray | bytes | memoryview, offset: int = 0,
                            stream: Stream | None = None) -> None: ...

    @abc.abstractmethod
    def copy_device_to_host(self, dst: np.ndarray, src: Buffer, offset: int = 0, stream: Stream | None = None) -> None:
        """Copy into `dst` and wait for it: for the work queued on `stream` (the default stream when None)
        before the copy, and the copy itself."""

    @abc.abstractmethod
    def copy_device_to_device(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
                              src_offset: int = 0, stream: Stream | None = None) -> None: ...

    @abc.abstractmethod
    def memset(self, dst: Buffer, byte_value: int, nbytes: int, offset: int = 0, stream: Stream | None = None) -> None: ...

    # ---- execution ----------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def default_stream(self) -> Stream: ...

    @abc.abstractmethod
    def create_stream(self) -> Stream: ...

    @abc.abstractmethod
    def create_event(self) -> Event: ...

    @abc.abstractmethod
    def load_module(self, image: bytes, name: str = "") -> Module:
        """Load a code object (AMDGPU ELF for HIP, cubin/PTX for CUDA)."""

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    @abc.abstractmethod
    @contextlib.contextmanager
    def capture(self, stream: Stream | None = None) -> Iterator[Capture]:
        """Capture the launches made on `stream` inside the with-block into an instantiated Graph."""

    def close(self) -> None:
        """Release backend resources (contexts, modules). Live buffers are the caller's to free."""
        self._forget_loaded_code()

    def _forget_loaded_code(self) -> None:
        """Drop the kernel loader's modules and kernels of this device (its close path calls this)."""
        for table in self.loaded_code.values():
            table.clear()

    def jit_compile(self, source: str, name: str, include_dirs: Sequence[str] = (), options: Sequence[str] = ()) -> bytes:
        """Compile kernel source at run time into a code object for this device (nvrtc on NVIDIA,
        hiprtc on AMD). Raises KernelCompileError with the compiler's log when the source is rejected."""
        raise DeviceError(f"the {self.backend} backend has no run-time compiler: its kernels are host functions")

    # ---- helpers shared by the backends -------------------------------------------------------

    @staticmethod
    def _check_copy(buf: Buffer, offset: int, nbytes: int, what: str) -> None:
        buf._check_live()
        if offset < 0 or nbytes < 0 or offset + nbytes > buf.nbytes:
            raise ValueError(f"{what}: {nbytes} bytes at offset {offset} do not fit in {buf!r}")

    def describe(self) -> str:
        info = self.memory_info()
        return f"{self.backend}:{self.index} {self.name} ({self.arch}), {format_bytes(info.total)} total, {format_bytes(info.free)} free"


@dataclass
class DeviceChoice:
    """What pick_device() took, and one line per backend saying why it was or was not taken."""

    device: "Device"
    reasons: list[str]



def host_bytes(src: np.ndarray | bytes | memoryview) -> memoryview:
    """A contiguous byte view of host data, without copying when it is already contiguous."""
    if isinstance(src, np.ndarray):
        return memoryview(np.ascontiguousarray(src)).cast("B")
    return memoryview(src).cast("B")
