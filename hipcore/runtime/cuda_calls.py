"""How the NVIDIA backend talks to cuda-python: importing it on first use, check() for its
(err, *values) tuples, error names, and probing for devices.

Kept apart from cuda.py (opening a device) so that both stay readable; nothing here needs a GPU
to import.
"""

from __future__ import annotations

from typing import Any

from hipcore.runtime.errors import BackendUnavailable
from hipcore.runtime.gpu_support import BindingLoader, error_translation, library_failure_reason

VENDOR = "CUDA"

# cuda.bindings.driver, imported on first use; BackendUnavailable when cuda-python is missing.
load_driver_bindings = BindingLoader("cuda.bindings", "driver", "cuda-python", "pip install cuda-bindings")


def describe_error(err: Any) -> tuple[str, str]:
    """(name, text) of a CUresult from the driver, or from the enum when the driver cannot say."""
    name = getattr(err, "name", None) or f"CUresult {int(err)}"
    text = ""
    try:
        drv = load_driver_bindings()
        e1, raw_name = drv.cuGetErrorName(err)
        e2, raw_text = drv.cuGetErrorString(err)
        if not e1 and raw_name:
            name = raw_name.decode(errors="replace")
        if not e2 and raw_text:
            text = raw_text.decode(errors="replace")
    except Exception:  # noqa: BLE001 - no driver to ask: the enum's name is still exact
        pass
    return name, text


call_error, check = error_translation(VENDOR, describe_error)


def probe() -> int:
    """How many NVIDIA devices answer; BackendUnavailable saying why when none can be used."""
    drv = load_driver_bindings()
    try:
        result = drv.cuInit(0)
    except (RuntimeError, OSError) as exc:  # the pathfinder's DynamicLibNotFoundError is a RuntimeError
        raise BackendUnavailable(f"no NVIDIA driver ({library_failure_reason(exc, 'libcuda.so')})") from None
    err = result[0]
    if err == drv.CUresult.CUDA_ERROR_NO_DEVICE:
        raise BackendUnavailable("no NVIDIA GPU found (cuInit: CUDA_ERROR_NO_DEVICE)")
    if err:
        raise BackendUnavailable(f"NVIDIA driver unusable: {call_error(err, 'cuInit')}")
    count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    if count < 1:
        raise BackendUnavailable("no NVIDIA GPU found (cuDeviceGetCount: 0)")
    return int(count)
