"""The device layer: one small protocol (device.py), three backends behind it (hip.py on hip-python,
cuda.py on cuda-python, cpu.py on numpy), the allocation ledger, and device selection. The two GPU
backends are one device (gpu_device.py) over a table of each binding's entry points (gpu_driver.py);
they keep only opening the device, making it current, the arch name and the run-time compiler.

The GPU backends import their bindings on first use, so importing this package never needs ROCm,
CUDA or a GPU. Start with `pick_device("auto")`.
"""

from hipcore.runtime.device import (
    ARG_TYPES, Buffer, Capture, Device, DeviceChoice, Event, Graph, Kernel, MemoryInfo, Module, Stream,
)
from hipcore.runtime.errors import (
    BackendUnavailable, DeviceError, DeviceOutOfMemory, DriverCallError, KernelCompileError, UsageError,
)
from hipcore.runtime.selection import pick_device
from hipcore.runtime.ledger import TAGS, Allocation, Ledger, LedgerDelta, LedgerSnapshot, format_bytes

__all__ = [
    "ARG_TYPES", "TAGS", "Allocation", "BackendUnavailable", "Buffer", "Capture", "Device", "DeviceChoice", "DeviceError",
    "DeviceOutOfMemory", "DriverCallError", "Event", "Graph", "Kernel", "KernelCompileError", "Ledger", "LedgerDelta",
    "LedgerSnapshot", "MemoryInfo", "Module", "Stream", "UsageError", "format_bytes", "pick_device",
]
