"""Error types of the device layer, and the base error and exit codes of the whole project.

They live here because hipcore.runtime imports nothing else of the project; hipcore.errors
re-exports them next to the model-file errors.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INVALID_MODEL = 3
EXIT_UNSUPPORTED = 4
EXIT_OUT_OF_MEMORY = 5


class RocmforgeError(Exception):
    """Base of every error meant for a user: the message is one line that says what to do."""

    exit_code = EXIT_FAILURE


class UsageError(RocmforgeError):
    """Bad arguments or options (an unknown device, a prompt longer than the context ...)."""

    exit_code = EXIT_USAGE


class DeviceError(RocmforgeError):
    """A driver call failed; the message names the call and the driver's error string."""

    exit_code = EXIT_FAILURE


class DeviceOutOfMemory(RocmforgeError):
    """An allocation (or a plan) does not fit; the message says what was asked, what is free, and
    what the ledger holds by tag. Named after the backend truthfully (HIP on AMD, CUDA on NVIDIA)."""

    exit_code = EXIT_OUT_OF_MEMORY

    def __init__(self, message: str, *, requested: int = 0, free: int | None = None, tag: str = "", label: str = ""):
        super().__init__(message)
        self.requested = requested
        self.free = free
        self.tag = tag
        self.label = label


class DriverCallError(DeviceError):
    """A driver/runtime call returned an error code. Keeps the parts so that callers can react to a
    specific code (an allocation turns the out-of-memory code into DeviceOutOfMemory)."""

    def __init__(self, vendor: str, call: str, code: int, error_name: str, error_text: str):
        detail = f"{error_name} ({error_text})" if error_text and error_text != error_name else error_name
        super().__init__(f"{vendor} call {call} failed: {detail}")
        self.vendor = vendor
        self.call = call
        self.code = code
        self.error_name = error_name
        self.error_text = error_text


class BackendUnavailable(DeviceError):
    """A backend cannot be used on this machine; the message is the reason, e.g.
    "no HIP runtime (libamdhip64.so not found)". pick_device turns it into a reason or a UsageError."""


class KernelCompileError(DeviceError):
    """The run-time compiler (nvrtc / hiprtc) rejected a kernel source; `log` is its full output."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log
