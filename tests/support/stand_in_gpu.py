"""A cpu device that says it is a GPU, for tests of what depends only on the backend or the architecture.

StandInGpu(backend) or StandInGpu(arch=...): weights take that backend's storage formats (hipcore/model/weights.py)
and the launchers the architecture's paths (matrix cores, NVIDIA's fragment path and wide tiles, prompt attention),
while the bytes live in host memory. With host_kernels_for_stand_ins(monkeypatch), a launch on a stand-in runs the
cpu backend's host kernel registered under the entry's name (each GPU entry's host twin: the same product, the
same activation, the same f16 rounding of what the entry writes as f16), so a whole model steps through a GPU
architecture's plan on the CPU: which buffers, shapes and entries each launch gets is checked, the kernels' own
arithmetic is not (the kernel emulation and the GPU tier check that). An entry with no host twin fails the launch.
"""

from __future__ import annotations

from hipcore.runtime import kernels
from hipcore.runtime.cpu import CpuDevice, CpuModule
from hipcore.runtime.device import Kernel, Module

DEFAULT_ARCH = {"cuda": "sm_90", "hip": "gfx942"}


class StandInGpu(CpuDevice):
    """A cpu device of `backend` ("cuda" or "hip") at `arch` (default: sm_90 or gfx942; an arch alone names its
    backend: sm_* is cuda, gfx* hip)."""

    def __init__(self, backend: str | None = None, *, arch: str | None = None, capacity: int = 1 << 30):
        super().__init__(capacity=capacity)
        if backend is None:
            if arch is None:
                raise ValueError("StandInGpu needs a backend or an arch")
            backend = "cuda" if arch.startswith("sm_") else "hip"
        self.backend, self.arch = backend, arch or DEFAULT_ARCH[backend]
        self.entries: set[str] = set()  # every entry a kernel was asked for (host_kernels_for_stand_ins)

    def load_module(self, image: bytes = b"", name: str = "") -> Module:
        return _RecordingModule(self)


class _RecordingModule(CpuModule):
    def kernel(self, name: str, signature: str, programmatic: bool = False) -> Kernel:
        self.device.entries.add(name)
        return super().kernel(name, signature, programmatic)


def host_kernels_for_stand_ins(monkeypatch) -> None:
    """Kernels of a StandInGpu come from the cpu backend's host kernels (no code object is looked for)."""
    load = kernels._load_module

    def load_module(device, op):
        return device.load_module(b"", op) if isinstance(device, StandInGpu) else load(device, op)

    monkeypatch.setattr(kernels, "_load_module", load_module)
