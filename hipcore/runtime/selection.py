"""Which device to run on: pick_device() for --device, and discover_devices() for `rocmforge devices`.

auto takes an AMD GPU through HIP, else an NVIDIA GPU through CUDA, else the CPU, and gives one reason
per backend ("hip: not taken: no HIP runtime (libamdhip64.so not found)"). Probing a backend never
fails the program: a missing binding package, a missing driver library or a driver error becomes
that backend's reason. A backend asked for by name that cannot be used is a UsageError naming why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from hipcore.runtime.device import Device, DeviceChoice
from hipcore.runtime.errors import BackendUnavailable, DeviceError, UsageError

GPU_BACKENDS = ("hip", "cuda")  # in auto's order of preference
BACKENDS = GPU_BACKENDS + ("cpu",)
VALID_SPECS = "auto, hip, cuda, cpu (optionally with a device index, e.g. cuda:1)"
_SPEC = re.compile(r"^(auto|hip|cuda|cpu)(?::(\d+))?$")
_VENDOR = {"hip": "AMD", "cuda": "NVIDIA"}


def parse_device_spec(spec: str) -> tuple[str, int | None]:
    """'cuda:1' -> ('cuda', 1); 'auto' -> ('auto', None). UsageError for anything else."""
    text = str(spec).strip().lower()
    m = _SPEC.match(text)
    if not m:
        raise UsageError(f"unknown device {spec!r}; valid devices: {VALID_SPECS}")
    backend, index = m.group(1), m.group(2)
    if backend == "auto" and index is not None:
        raise UsageError(f"device 'auto' takes no index (got {spec!r}); name the backend instead, e.g. cuda:{index}")
    return backend, None if index is None else int(index)


def _gpu_module(backend: str):  # noqa: ANN202 - a module
    if backend == "hip":
        from hipcore.runtime import hip as module
    else:
        from hipcore.runtime import cuda as module
    return module


def _unavailable_reason(action: Callable[[], object]) -> tuple[object | None, str | None]:
    """Run a probe or an open; (result, None) or (None, why it failed), never an exception."""
    try:
        return action(), None
    except BackendUnavailable as exc:
        return None, str(exc)
    except DeviceError as exc:
        return None, f"driver error: {exc}"
    except (ImportError, RuntimeError, OSError) as exc:  # the pathfinder's DynamicLibNotFoundError is a RuntimeError
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    except Exception as exc:  # noqa: BLE001 - a broken binding must not stop the CPU fallback
        return None, f"unexpected {type(exc).__name__} while probing: {' '.join(str(exc).split())[:200]}"


def open_gpu(backend: str, index: int = 0) -> Device:
    """Open hip:N or cuda:N; BackendUnavailable (or DeviceError) saying why it cannot be used."""
    module = _gpu_module(backend)
    cls = module.HipDevice if backend == "hip" else module.CudaDevice
    return cls(index)


def _open_cpu(index: int | None, cpu_capacity: int | None) -> Device:
    from hipcore.runtime.cpu import CpuDevice

    if index not in (None, 0):
        raise UsageError(f"there is one CPU device, cpu:0 (got cpu:{index})")
    return CpuDevice(capacity=cpu_capacity)


def _taken(dev: Device, how: str) -> str:
    return f"{dev.backend}: taken: {how}: {dev.name} ({dev.arch}), {dev.backend}:{dev.index}"


def pick_device(spec: str = "auto", *, cpu_capacity: int | None = None) -> DeviceChoice:
    backend, index = parse_device_spec(spec)
    if backend == "cpu":
        dev = _open_cpu(index, cpu_capacity)
        return DeviceChoice(dev, [_taken(dev, "asked for")])  # the lines say only what was tried
    if backend in GPU_BACKENDS:
        i = index or 0
        dev, why = _unavailable_reason(lambda: open_gpu(backend, i))
        if dev is None:
            raise UsageError(f"device {str(spec).strip()} is not available: {why}; run `rocmforge devices` to see "
                             f"what was found, or use --device auto")
        return DeviceChoice(dev, [_taken(dev, "asked for")])  # type: ignore[arg-type]
    reasons: list[str] = []
    for b in GPU_BACKENDS:
        dev, why = _unavailable_reason(lambda: open_gpu(b, 0))
        if dev is not None:
            reasons.append(_taken(dev, f"first {_VENDOR[b]} GPU that answered"))  # type: ignore[arg-type]
            for later in BACKENDS[BACKENDS.index(b) + 1:]:
                reasons.append(f"{later}: not taken: {b} was found first")
            return DeviceChoice(dev, reasons)  # type: ignore[arg-type]
        reasons.append(f"{b}: not taken: {why}")
    cpu = _open_cpu(None, cpu_capacity)
    reasons.append(_taken(cpu, "no GPU answered"))
    return DeviceChoice(cpu, reasons)


@dataclass(frozen=True)
class DeviceSummary:
    """One device as `rocmforge devices` shows it."""

    backend: str
    index: int
    name: str
    arch: str
    total_bytes: int
    free_bytes: int


@dataclass
class DeviceInventory:
    """Every device that answered, and for each backend with none, the reason."""

    found: list[DeviceSummary] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def auto_choice(self) -> DeviceSummary:
        """What `--device auto` takes: the first device of the first backend in preference order."""
        for backend in BACKENDS:
            for d in self.found:
                if d.backend == backend:
                    return d
        raise AssertionError("the cpu backend is always found")

    def auto_reasons(self) -> list[str]:
        """Why auto takes its device and not the others, one line per backend."""
        choice = self.auto_choice
        lines = []
        for backend in BACKENDS:
            if backend == choice.backend:
                lines.append(f"{backend}: taken by auto: {choice.name} ({choice.arch}), {backend}:{choice.index}")
            elif backend in self.unavailable:
                lines.append(f"{backend}: not taken: {self.unavailable[backend]}")
            else:
                lines.append(f"{backend}: not taken: {choice.backend} is preferred")
        return lines


def _summarize(dev: Device) -> DeviceSummary:
    info = dev.memory_info()
    return DeviceSummary(dev.backend, dev.index, dev.name, dev.arch, info.total, info.free)


def discover_devices(cpu_capacity: int | None = None) -> DeviceInventory:
    """Open every GPU that answers (and the CPU) just long enough to read its name, arch and memory."""
    inventory = DeviceInventory()
    for backend in GPU_BACKENDS:
        module = _gpu_module(backend)
        count, why = _unavailable_reason(module.probe)
        if count is None:
            inventory.unavailable[backend] = why or "unknown reason"
            continue
        failures = []
        for i in range(int(count)):  # type: ignore[call-overload]
            dev, why = _unavailable_reason(lambda: open_gpu(backend, i))
            if dev is None:
                failures.append(f"{backend}:{i}: {why}")
                continue
            try:
                summary, why = _unavailable_reason(lambda: _summarize(dev))  # type: ignore[arg-type]
            finally:
                dev.close()  # type: ignore[union-attr]
            if summary is None:
                failures.append(f"{backend}:{i}: {why}")
            else:
                inventory.found.append(summary)  # type: ignore[arg-type]
        if failures and not any(d.backend == backend for d in inventory.found):
            inventory.unavailable[backend] = "; ".join(failures)
    cpu = _open_cpu(None, cpu_capacity)
    inventory.found.append(_summarize(cpu))
    cpu.close()
    return inventory
