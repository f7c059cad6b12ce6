"""How the AMD backend talks to hip-python: importing it on first use, check() for its
(err, *values) tuples, error names, device properties and probing for devices.

Kept apart from hip.py (opening a device) so that both stay readable; nothing here needs ROCm
to import.
"""

from __future__ import annotations

from typing import Any

from hipcore.runtime.errors import BackendUnavailable
from hipcore.runtime.gpu_support import BindingLoader, error_translation, library_failure_reason

VENDOR = "HIP"

_runtime_loaded = False  # hipGetErrorName prints noise instead of raising when there is no runtime

# hip.hip, imported on first use; BackendUnavailable when hip-python is missing.
load_hip_bindings = BindingLoader("hip", "hip", "hip-python", "pip install hip-python")


def as_text(value: Any) -> str:
    """hip-python hands strings back as str, bytes or its CStr type depending on the field and version."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def arch_from_gcn_name(gcn_arch_name: str) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942' (feature suffixes do not select a different code object here)."""
    return gcn_arch_name.strip().split(":", 1)[0]


def device_properties(hip: Any, index: int) -> Any:
    """hipDeviceProp_t of a device. Recent hip-python returns it (hipGetDeviceProperties(index));
    releases made for ROCm 6 and earlier fill one passed in (hipGetDeviceProperties(props, index))."""
    try:
        return check(hip.hipGetDeviceProperties(index), "hipGetDeviceProperties")
    except TypeError:
        props = hip.hipDeviceProp_t()
        check(hip.hipGetDeviceProperties(props, index), "hipGetDeviceProperties")
        return props


def describe_error(err: Any) -> tuple[str, str]:
    """(name, text) of a hipError_t from the runtime, or from the enum when the runtime cannot say."""
    name = getattr(err, "name", None) or f"hipError_t {int(err)}"
    text = ""
    if _runtime_loaded:
        try:
            hip = load_hip_bindings()
            name = as_text(hip.hipGetErrorName(err)[1]) or name
            text = as_text(hip.hipGetErrorString(err)[1])
        except Exception:  # noqa: BLE001 - the enum's name is still exact
            pass
    return name, text


call_error, check = error_translation(VENDOR, describe_error)


def probe() -> int:
    """How many AMD devices answer; BackendUnavailable saying why when none can be used."""
    global _runtime_loaded
    hip = load_hip_bindings()
    try:
        result = hip.hipInit(0)
    except (RuntimeError, OSError) as exc:
        raise BackendUnavailable(f"no HIP runtime ({library_failure_reason(exc, 'libamdhip64.so')})") from None
    _runtime_loaded = True
    err = result[0]
    if err in (hip.hipError_t.hipErrorNoDevice, hip.hipError_t.hipErrorInsufficientDriver):
        raise BackendUnavailable(f"no AMD GPU found (hipInit: {err.name})")
    if err:
        raise BackendUnavailable(f"HIP runtime unusable: {call_error(err, 'hipInit')}")
    err, count = hip.hipGetDeviceCount()
    if err == hip.hipError_t.hipErrorNoDevice or (not err and count < 1):
        raise BackendUnavailable("no AMD GPU found (hipGetDeviceCount: 0)")
    check((err,), "hipGetDeviceCount")
    return int(count)
