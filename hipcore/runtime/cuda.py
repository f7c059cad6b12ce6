"""The NVIDIA backend: the device protocol on cuda-python's driver API (cuda.bindings.driver).

The same HIP kernel sources as on AMD, compiled by nvcc (precompiled cubins) or nvrtc (jit_compile),
are loaded with cuModuleLoadData and launched with cuLaunchKernel.

- One primary context per device, retained at open and released at close(). It is made current on
  every thread that touches the device, checked with one thread-local read per call.
- The device's default stream is a non-blocking stream of its own, not the legacy NULL stream,
  because the legacy stream cannot be captured into a graph. "Synchronous" copies are queued on it
  and waited for, so they stay ordered with the kernels queued before them.
- cuda-python is imported on first use, so this module imports on machines without it or without a
  driver; probe() says why the backend cannot be used there.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np

from hipcore.runtime.device import Buffer, Capture, Device, Event, Graph, Kernel, MemoryInfo, Module, Stream, host_bytes
from hipcore.runtime.cuda_calls import call_error, check, load_driver_bindings, probe  # noqa: F401 (probe: selection)
from hipcore.runtime.cuda_calls import thread_state as _thread
from hipcore.runtime.errors import BackendUnavailable, DeviceError
from hipcore.runtime.gpu_support import DriverResource, ResourceRegistry, allocation_failure, launch_dims, release_quietly
from hipcore.runtime.launch_args import ArgPacker, normalize_signature

_DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)


class CudaStream(DriverResource, Stream):
    def __init__(self, device: "CudaDevice"):
        self.device = device
        device._enter()
        drv = device._drv
        self.handle = check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._own(device._resources, drv.cuStreamDestroy, self.handle)

    def synchronize(self) -> None:
        self.device._enter()
        check(self.device._drv.cuStreamSynchronize(self.handle), "cuStreamSynchronize")


class CudaEvent(DriverResource, Event):
    def __init__(self, device: "CudaDevice"):
        self.device = device
        device._enter()
        drv = device._drv
        self.handle = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        self._own(device._resources, drv.cuEventDestroy, self.handle)

    def record(self, stream: Stream | None = None) -> None:
        self.device._enter()
        check(self.device._drv.cuEventRecord(self.handle, self.device._stream(stream).handle), "cuEventRecord")

    def synchronize(self) -> None:
        check(self.device._drv.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def query(self) -> bool:
        drv = self.device._drv
        (err,) = drv.cuEventQuery(self.handle)
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        return True

    def elapsed_ms(self, end: Event) -> float:
        if not isinstance(end, CudaEvent):
            raise TypeError(f"elapsed_ms: end must be an event of the same CUDA device, got {type(end).__name__}")
        return float(check(self.device._drv.cuEventElapsedTime(self.handle, end.handle), "cuEventElapsedTime"))


def _destroy_graph(drv: Any, graph: Any, graph_exec: Any) -> None:
    release_quietly(drv.cuGraphExecDestroy, graph_exec)
    release_quietly(drv.cuGraphDestroy, graph)


class CudaGraph(DriverResource, Graph):
    """An instantiated capture; destroy() frees both the graph and its executable."""

    def __init__(self, device: "CudaDevice", graph: Any, graph_exec: Any):
        self.device, self._graph, self._exec = device, graph, graph_exec
        self._own(device._resources, _destroy_graph, device._drv, graph, graph_exec)

    def launch(self, stream: Stream | None = None) -> None:
        if self.destroyed:
            raise DeviceError("launch of a destroyed graph")
        dev = self.device
        dev._enter()
        check(dev._drv.cuGraphLaunch(self._exec, dev._stream(stream).handle), "cuGraphLaunch")


class CudaKernel(Kernel):
    def __init__(self, module: "CudaModule", name: str, signature: str):
        self.device, self.module, self.name = module.device, module, name
        self.signature = normalize_signature(signature)
        drv = self.device._drv
        self._function = check(drv.cuModuleGetFunction(module.handle, name.encode()), f"cuModuleGetFunction({name})")
        self._packer = ArgPacker(self.signature, name)
        self._launch = drv.cuLaunchKernel
        self._dynamic_shared_limit = _DEFAULT_DYNAMIC_SHARED_LIMIT

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Stream | None = None) -> None:
        dev = self.device
        if getattr(_thread, "context", None) is not dev._context_key:  # inlined _enter()
            dev._make_current()
        if self.module.destroyed:
            raise DeviceError(f"launch of kernel {self.name} from an unloaded module")
        handle = dev._default.handle if stream is None else dev._stream(stream).handle
        gx, gy, gz = launch_dims(grid)
        bx, by, bz = launch_dims(block)
        if shared_mem > self._dynamic_shared_limit:
            self._allow_dynamic_shared(shared_mem)
        packer = self._packer
        with packer.lock:
            params = packer.pack(args)
            (err,) = self._launch(self._function, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0)
        if err:
            raise call_error(err, f"cuLaunchKernel({self.name}, grid {(gx, gy, gz)}, block {(bx, by, bz)})")

    def _allow_dynamic_shared(self, nbytes: int) -> None:
        drv = self.device._drv
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(self._function, attr, int(nbytes)), f"cuFuncSetAttribute({self.name})")
        self._dynamic_shared_limit = int(nbytes)

    def attributes(self) -> dict[str, int]:
        drv = self.device._drv
        self.device._enter()
        A = drv.CUfunction_attribute
        wanted = {
            "registers": A.CU_FUNC_ATTRIBUTE_NUM_REGS,
            "static_shared_bytes": A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "local_bytes": A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            "const_bytes": A.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
            "max_threads_per_block": A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "max_dynamic_shared_bytes": A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        }
        return {key: int(check(drv.cuFuncGetAttribute(attr, self._function), f"cuFuncGetAttribute({self.name})"))
                for key, attr in wanted.items()}


class CudaModule(DriverResource, Module):
    def __init__(self, device: "CudaDevice", image: bytes, name: str):
        self.device, self.name = device, name
        device._enter()
        drv = device._drv
        self.handle = check(drv.cuModuleLoadData(image), f"cuModuleLoadData({name or 'code object'})")
        self._own(device._resources, drv.cuModuleUnload, self.handle)

    def kernel(self, name: str, signature: str) -> Kernel:
        if self.destroyed:
            raise DeviceError(f"module {self.name!r} was unloaded")
        self.device._enter()
        return CudaKernel(self, name, signature)

    def unload(self) -> None:
        self.destroy()


class CudaDevice(Device):
    backend = "cuda"

    def __init__(self, index: int = 0):
        super().__init__()
        count = probe()
        if not 0 <= index < count:
            raise BackendUnavailable(f"cuda:{index} asked, but {count} NVIDIA device(s) answer (cuda:0 to cuda:{count - 1})")
        drv = self._drv = load_driver_bindings()
        self.index = index
        self._resources = ResourceRegistry()
        self._closed = False
        self._cu_device = check(drv.cuDeviceGet(index), "cuDeviceGet")
        self._context = check(drv.cuDevicePrimaryCtxRetain(self._cu_device), "cuDevicePrimaryCtxRetain")
        self._context_key = int(self._context)
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
            self._default = CudaStream(self)
        except BaseException:  # a half-opened device must not keep the primary context retained
            _thread.context = None
            release_quietly(drv.cuDevicePrimaryCtxRelease, self._cu_device)
            raise

    # ---- context ---------------------------------------------------------------------------------

    def _enter(self) -> None:
        """Make this device's context current on the calling thread, if it is not already.

        Compares by identity with the key _make_current stored (cheaper than ==); a miss only costs
        one more cuCtxSetCurrent."""
        if getattr(_thread, "context", None) is not self._context_key:
            self._make_current()

    def _make_current(self) -> None:
        if self._closed:
            raise DeviceError(f"cuda:{self.index} was closed")
        check(self._drv.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
        _thread.context = self._context_key

    def _stream(self, stream: Stream | None) -> CudaStream:
        if stream is None:
            return self._default
        if not isinstance(stream, CudaStream) or stream.device is not self:
            raise DeviceError(f"a stream of another device was passed to cuda:{self.index}")
        return stream

    # ---- memory ----------------------------------------------------------------------------------

    def memory_info(self) -> MemoryInfo:
        self._enter()
        free, total = check(self._drv.cuMemGetInfo(), "cuMemGetInfo")
        return MemoryInfo(free=int(free), total=int(total))

    def driver_free_bytes(self) -> int | None:
        return self.memory_info().free

    def _raw_alloc(self, nbytes: int) -> int:
        self._enter()
        err, ptr = self._drv.cuMemAlloc(nbytes)
        if err:
            raise allocation_failure(call_error(err, "cuMemAlloc"), [self._drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY])
        return int(ptr)

    def _raw_free(self, ptr: int) -> None:
        self._enter()
        check(self._drv.cuMemFree(ptr), "cuMemFree")

    # ---- copies ----------------------------------------------------------------------------------

    def copy_host_to_device(self, dst: Buffer, src: np.ndarray | bytes | memoryview, offset: int = 0,
                            stream: Stream | None = None) -> None:
        data = host_bytes(src)
        self._check_copy(dst, offset, data.nbytes, "upload")
        if not data.nbytes:
            return
        self._enter()
        s = self._stream(stream)
        # From pageable memory the driver stages the bytes before returning, so `src` may be reused at once.
        check(self._drv.cuMemcpyHtoDAsync(dst.ptr + offset, data, data.nbytes, s.handle), "cuMemcpyHtoDAsync")
        if stream is None:
            check(self._drv.cuStreamSynchronize(s.handle), "cuStreamSynchronize")

    def copy_device_to_host(self, dst: np.ndarray, src: Buffer, offset: int = 0) -> None:
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("download: the destination array must be C-contiguous and writeable")
        self._check_copy(src, offset, dst.nbytes, "download")
        if not dst.nbytes:
            return
        self._enter()
        h = self._default.handle
        check(self._drv.cuMemcpyDtoHAsync(dst.ctypes.data, src.ptr + offset, dst.nbytes, h), "cuMemcpyDtoHAsync")
        check(self._drv.cuStreamSynchronize(h), "cuStreamSynchronize")

    def copy_device_to_device(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
                              src_offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, dst_offset, nbytes, "copy (destination)")
        self._check_copy(src, src_offset, nbytes, "copy (source)")
        if not nbytes:
            return
        self._enter()
        check(self._drv.cuMemcpyDtoDAsync(dst.ptr + dst_offset, src.ptr + src_offset, nbytes, self._stream(stream).handle),
              "cuMemcpyDtoDAsync")

    def memset(self, dst: Buffer, byte_value: int, nbytes: int, offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, offset, nbytes, "memset")
        if not nbytes:
            return
        self._enter()
        check(self._drv.cuMemsetD8Async(dst.ptr + offset, byte_value & 0xFF, nbytes, self._stream(stream).handle),
              "cuMemsetD8Async")

    # ---- execution -------------------------------------------------------------------------------

    @property
    def default_stream(self) -> Stream:
        return self._default

    def create_stream(self) -> Stream:
        return CudaStream(self)

    def create_event(self) -> Event:
        return CudaEvent(self)

    def load_module(self, image: bytes, name: str = "") -> Module:
        return CudaModule(self, image, name)

    def synchronize(self) -> None:
        self._enter()
        check(self._drv.cuCtxSynchronize(), "cuCtxSynchronize")

    @contextlib.contextmanager
    def capture(self, stream: Stream | None = None) -> Iterator[Capture]:
        drv = self._drv
        self._enter()
        s = self._stream(stream)
        # Thread-local mode: this thread may not make unsafe calls (synchronize, legacy-stream work)
        # while capturing, which would silently escape the graph; other threads are not affected.
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(s.handle, mode), "cuStreamBeginCapture")
        cap = Capture()
        try:
            yield cap
        except BaseException:
            err, graph = drv.cuStreamEndCapture(s.handle)
            if not err and graph is not None:
                release_quietly(drv.cuGraphDestroy, graph)
            raise
        graph = check(drv.cuStreamEndCapture(s.handle), "cuStreamEndCapture")
        try:
            graph_exec = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BaseException:
            release_quietly(drv.cuGraphDestroy, graph)
            raise
        cap.graph = CudaGraph(self, graph, graph_exec)

    def jit_compile(self, source: str, name: str, include_dirs: Sequence[str] = (), options: Sequence[str] = ()) -> bytes:
        """nvrtc -> a CUBIN for this device's arch; KernelCompileError with the log on failure."""
        from hipcore.runtime.rtc import compile_with_nvrtc

        return compile_with_nvrtc(source, name, self.arch, include_dirs, options)

    def close(self) -> None:
        """Destroy the streams, events, graphs and modules still alive, then release the context."""
        if self._closed:
            return
        self._enter()
        release_quietly(self._drv.cuCtxSynchronize)
        self._resources.release_all()
        self._closed = True
        if getattr(_thread, "context", None) is self._context_key:
            _thread.context = None
        release_quietly(self._drv.cuDevicePrimaryCtxRelease, self._cu_device)
