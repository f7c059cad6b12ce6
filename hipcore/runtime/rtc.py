"""Run-time compilation of kernel sources: nvrtc -> CUBIN on NVIDIA, hiprtc -> code object on AMD.

The kernel loader (kernels.py) falls back to this when no precompiled code object matches the
device or the source changed; the devices expose it as `Device.jit_compile`. A rejected source is a
KernelCompileError carrying the compiler's whole log; a missing compiler library is a DeviceError
that says which library and what to do instead.
"""

from __future__ import annotations

from typing import Any, Sequence

from hipcore.runtime.errors import DeviceError, DriverCallError, KernelCompileError
from hipcore.runtime.gpu_support import count_compile_errors, library_failure_reason, release_quietly, summarize_compile_log


def _log_text(raw: Any) -> str:
    return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")


def _compile_failure(tool: str, name: str, arch: str, log: str) -> KernelCompileError:
    errors = count_compile_errors(log)
    head = f"{tool} could not compile {name} for {arch}" + (f" ({errors} error{'s' if errors != 1 else ''})" if errors else "")
    return KernelCompileError(f"{head}:\n{summarize_compile_log(log)}" if log.strip() else head, log)


# ---- NVIDIA ------------------------------------------------------------------------------------


def _nvrtc_check(nvrtc: Any, result: tuple, call: str) -> Any:
    err = result[0]
    if err:
        text = ""
        try:
            _, raw = nvrtc.nvrtcGetErrorString(err)
            text = bytes(raw).decode(errors="replace") if raw else ""
        except Exception:  # noqa: BLE001 - the enum name alone still identifies the failure
            pass
        raise DriverCallError("nvrtc", call, int(err), getattr(err, "name", str(int(err))), text)
    return None if len(result) == 1 else result[1] if len(result) == 2 else result[1:]


def nvrtc_options(arch: str, include_dirs: Sequence[str], options: Sequence[str]) -> list[bytes]:
    """`--gpu-architecture=sm_XX` makes nvrtc emit a CUBIN (compute_XX would give PTX)."""
    return [f"--gpu-architecture={arch}".encode(), *(f"--include-path={d}".encode() for d in include_dirs),
            *(o.encode() for o in options)]


def compile_with_nvrtc(source: str, name: str, arch: str, include_dirs: Sequence[str] = (),
                       options: Sequence[str] = ()) -> bytes:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise DeviceError(f"cannot compile {name} at run time: cuda-python is not installed ({exc})") from None
    try:
        prog = _nvrtc_check(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    except (RuntimeError, OSError) as exc:  # the library is loaded on first use
        raise DeviceError(f"cannot compile {name} at run time: nvrtc is not available "
                          f"({library_failure_reason(exc, 'libnvrtc.so')}); pip install nvidia-cuda-nvrtc, "
                          f"or build the precompiled kernels for {arch}") from None
    try:
        opts = nvrtc_options(arch, include_dirs, options)
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log_buf = b" " * max(int(size), 1)
        _nvrtc_check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, log_buf), "nvrtcGetProgramLog")
        if err:
            raise _compile_failure("nvrtc", name, arch, _log_text(log_buf))
        size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * int(size)
        _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        release_quietly(nvrtc.nvrtcDestroyProgram, prog)


# ---- AMD ---------------------------------------------------------------------------------------


def _hiprtc_check(hiprtc: Any, result: tuple, call: str) -> Any:
    err = result[0]
    if err:
        raise DriverCallError("hiprtc", call, int(err), getattr(err, "name", str(int(err))), "")
    return None if len(result) == 1 else result[1] if len(result) == 2 else result[1:]


def hiprtc_options(arch: str, include_dirs: Sequence[str], options: Sequence[str]) -> list[bytes]:
    return [f"--offload-arch={arch}".encode(), *(f"-I{d}".encode() for d in include_dirs), *(o.encode() for o in options)]


def compile_with_hiprtc(source: str, name: str, arch: str, include_dirs: Sequence[str] = (),
                        options: Sequence[str] = ()) -> bytes:
    try:
        from hip import hiprtc
    except ImportError as exc:
        raise DeviceError(f"cannot compile {name} at run time: hip-python is not installed ({exc})") from None
    try:
        # A bytearray, not bytes: hip-python keeps every bytes/str it converts to char* alive for the
        # life of the process, and hiprtc copies the source anyway.
        prog = _hiprtc_check(hiprtc, hiprtc.hiprtcCreateProgram(bytearray(source.encode() + b"\0"), name.encode(), 0, [], []),
                             "hiprtcCreateProgram")
    except (RuntimeError, OSError) as exc:
        raise DeviceError(f"cannot compile {name} at run time: hiprtc is not available "
                          f"({library_failure_reason(exc, 'libhiprtc.so')}); install ROCm's hiprtc, "
                          f"or build the precompiled kernels for {arch}") from None
    try:
        opts = hiprtc_options(arch, include_dirs, options)
        (err,) = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        size = _hiprtc_check(hiprtc, hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        log_buf = bytearray(max(int(size), 1))
        _hiprtc_check(hiprtc, hiprtc.hiprtcGetProgramLog(prog, log_buf), "hiprtcGetProgramLog")
        if err:
            raise _compile_failure("hiprtc", name, arch, _log_text(log_buf))
        size = _hiprtc_check(hiprtc, hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(int(size))
        _hiprtc_check(hiprtc, hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        release_quietly(hiprtc.hiprtcDestroyProgram, prog.createRef())
