"""The device protocol once for both GPU vendors: streams, events, modules, kernels, graphs, copies,
memset, stream capture, close, the context current on each thread, and driver errors.

CudaDevice (cuda.py) and HipDevice (hip.py) are GpuDevice over a DriverApi (gpu_driver.py), the
table of their bindings' entry points and constants. They add only what truly differs: opening the
device (CUDA's primary context, HIP's device selection) and making it current on a thread, the arch
name (sm_XY, gfxNNN) and the run-time compiler (nvrtc, hiprtc).

- The device's default stream is a non-blocking stream of its own, not the legacy NULL stream,
  because the legacy stream cannot be captured into a graph. "Synchronous" copies are queued on it
  and waited for, so they stay ordered with the kernels queued before them.
- Every call first makes the device current on the calling thread if it is not already (one
  thread-local read; Kernel.launch inlines it).
- Streams, events, modules and graphs are DriverResources: released once, explicitly, when
  collected, or at close(), whichever comes first.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from hipcore.runtime.device import Buffer, Capture, Device, Event, Graph, Kernel, MemoryInfo, Module, Stream, host_bytes
from hipcore.runtime.errors import BackendUnavailable, DeviceError
from hipcore.runtime.gpu_driver import FUNCTION_ATTRIBUTES, DriverApi
from hipcore.runtime.gpu_support import DriverResource, ResourceRegistry, allocation_failure, launch_dims, release_quietly
from hipcore.runtime.launch_args import ArgPacker, normalize_signature

_current = threading.local()  # .key: the _current_key of the device made current on this thread

_GPU_MAKERS = {"CUDA": "NVIDIA", "HIP": "AMD"}


class GpuStream(DriverResource, Stream):
    handle_kind = "streams"

    def __init__(self, device: "GpuDevice"):
        self.device = device
        device._enter()
        api = device._api
        self.handle = api.call("stream_create", api.constant("stream_non_blocking"))
        self._own(device._resources, api.entry("stream_destroy"), self.handle)

    def synchronize(self) -> None:
        self.device._enter()
        self.device._api.call("stream_synchronize", self.handle)


class GpuEvent(DriverResource, Event):
    handle_kind = "events"

    def __init__(self, device: "GpuDevice"):
        self.device = device
        device._enter()
        api = device._api
        flags = api.constant("event_create_flags")
        self.handle = api.call("event_create", *(() if flags is None else (flags,)))
        self._own(device._resources, api.entry("event_destroy"), self.handle)

    def record(self, stream: Stream | None = None) -> None:
        self.device._enter()
        self.device._api.call("event_record", self.handle, self.device._stream(stream).handle)

    def synchronize(self) -> None:
        self.device._enter()
        self.device._api.call("event_synchronize", self.handle)

    def query(self) -> bool:
        api = self.device._api
        self.device._enter()
        (err,) = api.entry("event_query")(self.handle)
        if err == api.constant("not_ready"):
            return False
        api.check((err,), api.names["event_query"])
        return True

    def elapsed_ms(self, end: Event) -> float:
        if not isinstance(end, GpuEvent) or end.device.backend != self.device.backend:
            raise TypeError(f"elapsed_ms: end must be an event of the same {self.device._api.vendor} device, "
                            f"got {type(end).__name__}")
        self.device._enter()
        return float(self.device._api.call("event_elapsed_time", self.handle, end.handle))


def _destroy_graph(api: DriverApi, graph: Any, graph_exec: Any) -> None:
    release_quietly(api.entry("graph_exec_destroy"), graph_exec)
    release_quietly(api.entry("graph_destroy"), graph)


class GpuGraph(DriverResource, Graph):
    """An instantiated capture; destroy() frees both the graph and its executable."""

    handle_kind = "graphs"

    def __init__(self, device: "GpuDevice", graph: Any, graph_exec: Any):
        self.device, self._graph, self._exec = device, graph, graph_exec
        api = device._api
        self._launch, self._launch_name, self._check = api.entry("graph_launch"), api.names["graph_launch"], api.check
        self._own(device._resources, _destroy_graph, api, graph, graph_exec)

    def launch(self, stream: Stream | None = None) -> None:
        # Bound at instantiation, as Kernel.launch is: a replayed graph is the decode step's hot path.
        if self.destroyed:
            raise DeviceError("launch of a destroyed graph")
        dev = self.device
        dev._enter()
        self._check(self._launch(self._exec, dev._stream(stream).handle), self._launch_name)


class GpuKernel(Kernel):
    def __init__(self, module: "GpuModule", name: str, signature: str, programmatic: bool = False):
        self.device, self.module, self.name = module.device, module, name
        self.signature = normalize_signature(signature)
        api = self.device._api
        self._function = api.call("module_get_function", module.handle, name.encode(), about=name)
        self._packer = ArgPacker(self.signature, name)
        self._launch = api.entry("launch_kernel")  # bound once: launch is the hot path
        self._launch_extra = api.launch_extra
        self._dynamic_shared_limit = api.dynamic_shared_opt_in_above
        # A programmatic launch may start before the kernel ahead of it in the stream has finished: only
        # for kernels that wait for it first (Module.kernel), on devices that have it (_programmatic_launch_config).
        self._launch_config = self.device._programmatic_launch_config() if programmatic else None
        self.programmatic = self._launch_config is not None
        if self.programmatic:
            self._launch_ex = api.entry("launch_kernel_ex")

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Stream | None = None) -> None:
        dev = self.device
        if getattr(_current, "key", None) is not dev._current_key:  # inlined _enter()
            dev._make_current()
        if self.module.destroyed:
            raise DeviceError(f"launch of kernel {self.name} from an unloaded module")
        handle = dev._default.handle if stream is None else dev._stream(stream).handle
        gx, gy, gz = launch_dims(grid)
        bx, by, bz = launch_dims(block)
        if shared_mem > self._dynamic_shared_limit:
            self._allow_dynamic_shared(shared_mem)
        packer = self._packer
        config = self._launch_config
        with packer.lock:
            params = packer.pack(args)
            if config is None:
                (err,) = self._launch(self._function, gx, gy, gz, bx, by, bz, shared_mem, handle, params,
                                      self._launch_extra)
            else:  # one configuration per kernel, filled in under the packer's lock
                config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
                config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
                config.sharedMemBytes, config.hStream = shared_mem, handle
                (err,) = self._launch_ex(config, self._function, params, self._launch_extra)
        if err:
            api = dev._api
            role = "launch_kernel" if config is None else "launch_kernel_ex"
            raise api.call_error(err, f"{api.names[role]}({self.name}, grid {(gx, gy, gz)}, block {(bx, by, bz)})")

    def _allow_dynamic_shared(self, nbytes: int) -> None:
        api = self.device._api
        attr = api.function_attribute("max_dynamic_shared_bytes")
        api.call("func_set_attribute", self._function, attr, int(nbytes), about=self.name)
        self._dynamic_shared_limit = int(nbytes)

    def attributes(self) -> dict[str, int]:
        api = self.device._api
        self.device._enter()
        return {key: int(api.call("func_get_attribute", api.function_attribute(key), self._function, about=self.name))
                for key in FUNCTION_ATTRIBUTES}


class GpuModule(DriverResource, Module):
    handle_kind = "modules"

    def __init__(self, device: "GpuDevice", image: bytes, name: str):
        self.device, self.name = device, name
        device._enter()
        api = device._api
        self.handle = api.call("module_load_data", image, about=name or "code object")
        self._own(device._resources, api.entry("module_unload"), self.handle)

    def kernel(self, name: str, signature: str, programmatic: bool = False) -> Kernel:
        if self.destroyed:
            raise DeviceError(f"module {self.name!r} was unloaded")
        self.device._enter()
        return GpuKernel(self, name, signature, programmatic)

    def unload(self) -> None:
        self.destroy()


class GpuDevice(Device):
    """A GPU of either vendor. Subclasses open it: they call this __init__, make the device current
    (_make_current -> their _activate), set name and arch, then create `_default = GpuStream(self)`."""

    _default: GpuStream

    def __init__(self, api: DriverApi, index: int, device_count: int):
        super().__init__()
        if not 0 <= index < device_count:
            raise BackendUnavailable(f"{self.backend}:{index} asked, but {device_count} {_GPU_MAKERS[api.vendor]} "
                                     f"device(s) answer ({self.backend}:0 to {self.backend}:{device_count - 1})")
        self._api = api
        self.index = index
        self._resources = ResourceRegistry()
        self._closed = False
        self._current_key = object()  # identity compared on every call: cheaper than ==

    def _programmatic_launch_config(self) -> Any:
        """A launch configuration that lets a kernel start before the one ahead of it in the stream ends
        (programmatic dependent launch), or None where the device has no such launch (see cuda.py)."""
        return None

    # ---- the device current on this thread ---------------------------------------------------------

    @abc.abstractmethod
    def _activate(self) -> None:
        """Make this device current on the calling thread (cuCtxSetCurrent / hipSetDevice)."""

    def _release_context(self) -> None:
        """Give back what opening the device took from the driver (CUDA's primary context)."""

    def _enter(self) -> None:
        """Make this device current on the calling thread, if it is not already."""
        if getattr(_current, "key", None) is not self._current_key:
            self._make_current()

    def _make_current(self) -> None:
        if self._closed:
            raise DeviceError(f"{self.backend}:{self.index} was closed")
        self._activate()
        _current.key = self._current_key

    def _leave(self) -> None:
        """Forget that this device is current on the calling thread (it is being closed)."""
        if getattr(_current, "key", None) is self._current_key:
            _current.key = None

    def _stream(self, stream: Stream | None) -> GpuStream:
        if stream is None:
            return self._default
        if not isinstance(stream, GpuStream) or stream.device is not self:
            raise DeviceError(f"a stream of another device was passed to {self.backend}:{self.index}")
        return stream

    # ---- memory ------------------------------------------------------------------------------------

    def memory_info(self) -> MemoryInfo:
        self._enter()
        free, total = self._api.call("mem_get_info")
        return MemoryInfo(free=int(free), total=int(total))

    def driver_free_bytes(self) -> int | None:
        return self.memory_info().free

    def handle_counts(self) -> dict[str, int]:
        return self._resources.counts()

    def _raw_alloc(self, nbytes: int) -> int:
        self._enter()
        api = self._api
        err, ptr = api.entry("malloc")(nbytes)
        if err:
            raise allocation_failure(api.call_error(err, api.names["malloc"]), [api.constant("out_of_memory")])
        return int(ptr)

    def _raw_free(self, ptr: int) -> None:
        self._enter()
        self._api.call("free", ptr)

    # ---- copies ------------------------------------------------------------------------------------

    def copy_host_to_device(self, dst: Buffer, src: np.ndarray | bytes | memoryview, offset: int = 0,
                            stream: Stream | None = None) -> None:
        data = host_bytes(src)
        self._check_copy(dst, offset, data.nbytes, "upload")
        if not data.nbytes:
            return
        self._enter()
        s = self._stream(stream)
        # From pageable memory the driver stages the bytes before returning, so `src` may be reused at once.
        self._api.call("memcpy_htod_async", dst.ptr + offset, data, data.nbytes, s.handle)
        if stream is None:
            self._api.call("stream_synchronize", s.handle)

    def copy_device_to_host(self, dst: np.ndarray, src: Buffer, offset: int = 0, stream: Stream | None = None) -> None:
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("download: the destination array must be C-contiguous and writeable")
        self._check_copy(src, offset, dst.nbytes, "download")
        if not dst.nbytes:
            return
        self._enter()
        handle = self._stream(stream).handle
        self._api.call("memcpy_dtoh_async", dst.ctypes.data, src.ptr + offset, dst.nbytes, handle)
        self._api.call("stream_synchronize", handle)

    def copy_device_to_device(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
                              src_offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, dst_offset, nbytes, "copy (destination)")
        self._check_copy(src, src_offset, nbytes, "copy (source)")
        if not nbytes:
            return
        self._enter()
        self._api.call("memcpy_dtod_async", dst.ptr + dst_offset, src.ptr + src_offset, nbytes, self._stream(stream).handle)

    def memset(self, dst: Buffer, byte_value: int, nbytes: int, offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, offset, nbytes, "memset")
        if not nbytes:
            return
        self._enter()
        self._api.call("memset_d8_async", dst.ptr + offset, byte_value & 0xFF, nbytes, self._stream(stream).handle)

    # ---- execution ---------------------------------------------------------------------------------

    @property
    def default_stream(self) -> Stream:
        return self._default

    def create_stream(self) -> Stream:
        return GpuStream(self)

    def create_event(self) -> Event:
        return GpuEvent(self)

    def load_module(self, image: bytes, name: str = "") -> Module:
        return GpuModule(self, image, name)

    def synchronize(self) -> None:
        self._enter()
        self._api.call("device_synchronize")

    @contextlib.contextmanager
    def capture(self, stream: Stream | None = None) -> Iterator[Capture]:
        api = self._api
        self._enter()
        s = self._stream(stream)
        api.call("stream_begin_capture", s.handle, api.constant("capture_thread_local"))
        cap = Capture()
        try:
            yield cap
        except BaseException:
            err, graph = api.entry("stream_end_capture")(s.handle)
            if not err and graph is not None:
                release_quietly(api.entry("graph_destroy"), graph)
            raise
        graph = api.call("stream_end_capture", s.handle)
        try:
            graph_exec = api.call("graph_instantiate", graph, 0)
        except BaseException:
            release_quietly(api.entry("graph_destroy"), graph)
            raise
        cap.graph = GpuGraph(self, graph, graph_exec)

    def close(self) -> None:
        """Destroy the streams, events, graphs and modules still alive, then release the context."""
        if self._closed:
            return
        self._enter()
        release_quietly(self._api.entry("device_synchronize"))
        self._resources.release_all()
        self._forget_loaded_code()
        self._closed = True
        self._leave()
        self._release_context()
