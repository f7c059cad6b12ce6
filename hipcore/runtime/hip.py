"""The AMD backend: the device protocol on hip-python (hip.hip, hip.hiprtc).

Mirrors cuda.py call for call: hipMalloc/hipFree, hipMemGetInfo, hipMemcpy*Async, hipMemsetD8Async,
a non-blocking stream as the device's default stream (capturable, unlike the null stream), events,
hipModuleLoadData/hipModuleGetFunction/hipModuleLaunchKernel with kernelParams given as the address
of a `void *[]` array (hip-python turns an int into the pointer), and stream capture into graphs.

HIP keeps the current device per thread: every thread that touches the device selects it once
(hipSetDevice), checked with one thread-local read per call.

hip-python imports without ROCm; its first call dlopens libamdhip64.so and raises RuntimeError when
that fails, which probe() turns into the reason "no HIP runtime (libamdhip64.so not found)".
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np

from hipcore.runtime.device import Buffer, Capture, Device, Event, Graph, Kernel, MemoryInfo, Module, Stream, host_bytes
from hipcore.runtime.errors import BackendUnavailable, DeviceError
from hipcore.runtime.gpu_support import DriverResource, ResourceRegistry, allocation_failure, launch_dims, release_quietly
from hipcore.runtime.hip_calls import (  # noqa: F401 (probe: selection)
    arch_from_gcn_name, as_text, call_error, check, device_properties, load_hip_bindings, probe,
)
from hipcore.runtime.hip_calls import thread_state as _thread
from hipcore.runtime.launch_args import ArgPacker, normalize_signature


class HipStream(DriverResource, Stream):
    def __init__(self, device: "HipDevice"):
        self.device = device
        device._enter()
        hip = device._hip
        self.handle = check(hip.hipStreamCreateWithFlags(hip.hipStreamNonBlocking), "hipStreamCreateWithFlags")
        self._own(device._resources, hip.hipStreamDestroy, self.handle)

    def synchronize(self) -> None:
        self.device._enter()
        check(self.device._hip.hipStreamSynchronize(self.handle), "hipStreamSynchronize")


class HipEvent(DriverResource, Event):
    def __init__(self, device: "HipDevice"):
        self.device = device
        device._enter()
        hip = device._hip
        self.handle = check(hip.hipEventCreate(), "hipEventCreate")
        self._own(device._resources, hip.hipEventDestroy, self.handle)

    def record(self, stream: Stream | None = None) -> None:
        self.device._enter()
        check(self.device._hip.hipEventRecord(self.handle, self.device._stream(stream).handle), "hipEventRecord")

    def synchronize(self) -> None:
        self.device._enter()
        check(self.device._hip.hipEventSynchronize(self.handle), "hipEventSynchronize")

    def query(self) -> bool:
        hip = self.device._hip
        self.device._enter()
        (err,) = hip.hipEventQuery(self.handle)
        if err == hip.hipError_t.hipErrorNotReady:
            return False
        check((err,), "hipEventQuery")
        return True

    def elapsed_ms(self, end: Event) -> float:
        if not isinstance(end, HipEvent):
            raise TypeError(f"elapsed_ms: end must be an event of the same HIP device, got {type(end).__name__}")
        self.device._enter()
        return float(check(self.device._hip.hipEventElapsedTime(self.handle, end.handle), "hipEventElapsedTime"))


def _destroy_graph(hip: Any, graph: Any, graph_exec: Any) -> None:
    release_quietly(hip.hipGraphExecDestroy, graph_exec)
    release_quietly(hip.hipGraphDestroy, graph)


class HipGraph(DriverResource, Graph):
    """An instantiated capture; destroy() frees both the graph and its executable."""

    def __init__(self, device: "HipDevice", graph: Any, graph_exec: Any):
        self.device, self._graph, self._exec = device, graph, graph_exec
        self._own(device._resources, _destroy_graph, device._hip, graph, graph_exec)

    def launch(self, stream: Stream | None = None) -> None:
        if self.destroyed:
            raise DeviceError("launch of a destroyed graph")
        dev = self.device
        dev._enter()
        check(dev._hip.hipGraphLaunch(self._exec, dev._stream(stream).handle), "hipGraphLaunch")


class HipKernel(Kernel):
    def __init__(self, module: "HipModule", name: str, signature: str):
        self.device, self.module, self.name = module.device, module, name
        self.signature = normalize_signature(signature)
        hip = self.device._hip
        self._function = check(hip.hipModuleGetFunction(module.handle, name.encode()), f"hipModuleGetFunction({name})")
        self._packer = ArgPacker(self.signature, name)
        self._launch = hip.hipModuleLaunchKernel

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Stream | None = None) -> None:
        dev = self.device
        if getattr(_thread, "device", None) is not dev._device_key:  # inlined _enter()
            dev._select()
        if self.module.destroyed:
            raise DeviceError(f"launch of kernel {self.name} from an unloaded module")
        handle = dev._default.handle if stream is None else dev._stream(stream).handle
        gx, gy, gz = launch_dims(grid)
        bx, by, bz = launch_dims(block)
        packer = self._packer
        with packer.lock:
            params = packer.pack(args)
            (err,) = self._launch(self._function, gx, gy, gz, bx, by, bz, shared_mem, handle, params, None)
        if err:
            raise call_error(err, f"hipModuleLaunchKernel({self.name}, grid {(gx, gy, gz)}, block {(bx, by, bz)})")

    def attributes(self) -> dict[str, int]:
        hip = self.device._hip
        self.device._enter()
        A = hip.hipFunction_attribute
        wanted = {
            "registers": A.HIP_FUNC_ATTRIBUTE_NUM_REGS,
            "static_shared_bytes": A.HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "local_bytes": A.HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            "const_bytes": A.HIP_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
            "max_threads_per_block": A.HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "max_dynamic_shared_bytes": A.HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        }
        return {key: int(check(hip.hipFuncGetAttribute(attr, self._function), f"hipFuncGetAttribute({self.name})"))
                for key, attr in wanted.items()}


class HipModule(DriverResource, Module):
    def __init__(self, device: "HipDevice", image: bytes, name: str):
        self.device, self.name = device, name
        device._enter()
        hip = device._hip
        self.handle = check(hip.hipModuleLoadData(image), f"hipModuleLoadData({name or 'code object'})")
        self._own(device._resources, hip.hipModuleUnload, self.handle)

    def kernel(self, name: str, signature: str) -> Kernel:
        if self.destroyed:
            raise DeviceError(f"module {self.name!r} was unloaded")
        self.device._enter()
        return HipKernel(self, name, signature)

    def unload(self) -> None:
        self.destroy()


class HipDevice(Device):
    backend = "hip"

    def __init__(self, index: int = 0):
        super().__init__()
        count = probe()
        if not 0 <= index < count:
            raise BackendUnavailable(f"hip:{index} asked, but {count} AMD device(s) answer (hip:0 to hip:{count - 1})")
        hip = self._hip = load_hip_bindings()
        self.index = index
        self._device_key = index
        self._resources = ResourceRegistry()
        self._closed = False
        self._select()
        props = device_properties(hip, index)
        self.name = as_text(props.name).strip() or f"AMD GPU {index}"
        self.gcn_arch_name = as_text(props.gcnArchName)
        self.arch = arch_from_gcn_name(self.gcn_arch_name)
        self._default = HipStream(self)

    # ---- current device --------------------------------------------------------------------------

    def _enter(self) -> None:
        """Select this device on the calling thread, if it is not already (one thread-local read)."""
        if getattr(_thread, "device", None) is not self._device_key:
            self._select()

    def _select(self) -> None:
        if self._closed:
            raise DeviceError(f"hip:{self.index} was closed")
        check(self._hip.hipSetDevice(self.index), "hipSetDevice")
        _thread.device = self._device_key

    def _stream(self, stream: Stream | None) -> HipStream:
        if stream is None:
            return self._default
        if not isinstance(stream, HipStream) or stream.device is not self:
            raise DeviceError(f"a stream of another device was passed to hip:{self.index}")
        return stream

    # ---- memory ----------------------------------------------------------------------------------

    def memory_info(self) -> MemoryInfo:
        self._enter()
        free, total = check(self._hip.hipMemGetInfo(), "hipMemGetInfo")
        return MemoryInfo(free=int(free), total=int(total))

    def driver_free_bytes(self) -> int | None:
        return self.memory_info().free

    def _raw_alloc(self, nbytes: int) -> int:
        self._enter()
        err, ptr = self._hip.hipMalloc(nbytes)
        if err:
            raise allocation_failure(call_error(err, "hipMalloc"), [self._hip.hipError_t.hipErrorOutOfMemory])
        return int(ptr)

    def _raw_free(self, ptr: int) -> None:
        self._enter()
        check(self._hip.hipFree(ptr), "hipFree")

    # ---- copies ----------------------------------------------------------------------------------

    def copy_host_to_device(self, dst: Buffer, src: np.ndarray | bytes | memoryview, offset: int = 0,
                            stream: Stream | None = None) -> None:
        data = host_bytes(src)
        self._check_copy(dst, offset, data.nbytes, "upload")
        if not data.nbytes:
            return
        self._enter()
        s = self._stream(stream)
        check(self._hip.hipMemcpyHtoDAsync(dst.ptr + offset, data, data.nbytes, s.handle), "hipMemcpyHtoDAsync")
        if stream is None:
            check(self._hip.hipStreamSynchronize(s.handle), "hipStreamSynchronize")

    def copy_device_to_host(self, dst: np.ndarray, src: Buffer, offset: int = 0) -> None:
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("download: the destination array must be C-contiguous and writeable")
        self._check_copy(src, offset, dst.nbytes, "download")
        if not dst.nbytes:
            return
        self._enter()
        h = self._default.handle
        check(self._hip.hipMemcpyDtoHAsync(dst.ctypes.data, src.ptr + offset, dst.nbytes, h), "hipMemcpyDtoHAsync")
        check(self._hip.hipStreamSynchronize(h), "hipStreamSynchronize")

    def copy_device_to_device(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
                              src_offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, dst_offset, nbytes, "copy (destination)")
        self._check_copy(src, src_offset, nbytes, "copy (source)")
        if not nbytes:
            return
        self._enter()
        check(self._hip.hipMemcpyDtoDAsync(dst.ptr + dst_offset, src.ptr + src_offset, nbytes, self._stream(stream).handle),
              "hipMemcpyDtoDAsync")

    def memset(self, dst: Buffer, byte_value: int, nbytes: int, offset: int = 0, stream: Stream | None = None) -> None:
        self._check_copy(dst, offset, nbytes, "memset")
        if not nbytes:
            return
        self._enter()
        check(self._hip.hipMemsetD8Async(dst.ptr + offset, byte_value & 0xFF, nbytes, self._stream(stream).handle),
              "hipMemsetD8Async")

    # ---- execution -------------------------------------------------------------------------------

    @property
    def default_stream(self) -> Stream:
        return self._default

    def create_stream(self) -> Stream:
        return HipStream(self)

    def create_event(self) -> Event:
        return HipEvent(self)

    def load_module(self, image: bytes, name: str = "") -> Module:
        return HipModule(self, image, name)

    def synchronize(self) -> None:
        self._enter()
        check(self._hip.hipDeviceSynchronize(), "hipDeviceSynchronize")

    @contextlib.contextmanager
    def capture(self, stream: Stream | None = None) -> Iterator[Capture]:
        hip = self._hip
        self._enter()
        s = self._stream(stream)
        # Thread-local mode, as on CUDA: unsafe calls from this thread fail instead of escaping the graph.
        mode = hip.hipStreamCaptureMode.hipStreamCaptureModeThreadLocal
        check(hip.hipStreamBeginCapture(s.handle, mode), "hipStreamBeginCapture")
        cap = Capture()
        try:
            yield cap
        except BaseException:
            err, graph = hip.hipStreamEndCapture(s.handle)
            if not err and graph is not None:
                release_quietly(hip.hipGraphDestroy, graph)
            raise
        graph = check(hip.hipStreamEndCapture(s.handle), "hipStreamEndCapture")
        try:
            graph_exec = check(hip.hipGraphInstantiateWithFlags(graph, 0), "hipGraphInstantiateWithFlags")
        except BaseException:
            release_quietly(hip.hipGraphDestroy, graph)
            raise
        cap.graph = HipGraph(self, graph, graph_exec)

    def jit_compile(self, source: str, name: str, include_dirs: Sequence[str] = (), options: Sequence[str] = ()) -> bytes:
        """hiprtc -> a code object for this device's gfx target; KernelCompileError with the log on failure."""
        from hipcore.runtime.rtc import compile_with_hiprtc

        return compile_with_hiprtc(source, name, self.arch, include_dirs, options)

    def close(self) -> None:
        """Destroy the streams, events, graphs and modules still alive."""
        if self._closed:
            return
        self._enter()
        release_quietly(self._hip.hipDeviceSynchronize)
        self._resources.release_all()
        self._closed = True
        if getattr(_thread, "device", None) is self._device_key:
            _thread.device = None
