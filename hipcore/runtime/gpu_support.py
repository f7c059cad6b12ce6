"""What the two GPU backends (hip.py, cuda.py) share, as plain functions that run without a GPU.

- importing a binding package on first use, and check() for its (err, *values) tuples,
- reasons for a driver library that cannot be loaded ("libamdhip64.so not found"),
- turning an allocation's out-of-memory error code into MemoryError (Device.allocate then reports
  DeviceOutOfMemory naming the backend, what was asked, what is free and the ledger by tag),
- launch dimensions, checked cheaply on the launch path,
- driver handles (streams, events, modules, graphs) released exactly once: explicitly, when the
  Python object is collected, or when the device is closed, whichever comes first.
"""

from __future__ import annotations

import importlib
import itertools
import re
import weakref
from typing import Any, Callable, Iterable

from hipcore.runtime.errors import BackendUnavailable, DriverCallError
from hipcore.runtime.handles import HANDLE_KINDS

_LIBRARY = re.compile(r"(lib[\w+\-]+\.so[\w.]*(?:\s+or\s+lib[\w+\-]+\.so[\w.]*)*)")
_NOT_FOUND_HINTS = ("no such file", "cannot open", "not found", "can only be found")


class BindingLoader:
    """`from <package> import <module>` on first call, kept; BackendUnavailable when the package is
    missing (hip-python's `hip.hip` is an attribute of its package, cuda-python's `driver` a submodule)."""

    def __init__(self, package: str, module: str, project: str, install: str):
        self.package, self.module, self.project, self.install = package, module, project, install
        self.loaded: Any = None

    def __call__(self) -> Any:
        if self.loaded is None:
            try:
                package = importlib.import_module(self.package)
                found = getattr(package, self.module, None)
                self.loaded = importlib.import_module(f"{self.package}.{self.module}") if found is None else found
            except ImportError as exc:
                raise BackendUnavailable(f"{self.project} is not installed ({exc}); {self.install}") from None
        return self.loaded


def error_translation(vendor: str, describe_error: Callable[[Any], tuple[str, str]]) -> tuple[
        Callable[[Any, str], DriverCallError], Callable[[tuple, str], Any]]:
    """call_error() and check() for a binding whose calls return (err, *values), err an int enum with
    0 for success; describe_error(err) gives the error's (name, text)."""

    def call_error(err: Any, call: str) -> DriverCallError:
        name, text = describe_error(err)
        return DriverCallError(vendor, call, int(err), name, text)

    def check(result: tuple, call: str) -> Any:
        """Unwrap an (err, *values) tuple: the value(s), or DriverCallError naming `call`."""
        err = result[0]
        if err:
            raise call_error(err, call)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    return call_error, check


def library_failure_reason(exc: BaseException, library: str) -> str:
    """'<library> not found' when the loader could not find it, else what went wrong loading it.

    hip-python raises RuntimeError("failed to dlopen 'b'libamdhip64.so'': ... No such file ...") on the
    first call; cuda-python's pathfinder raises DynamicLibNotFoundError (a RuntimeError) whose message
    names the library loosely ("cuda" is an NVIDIA driver library ...), hence the `library` fallback.
    """
    message = " ".join(str(exc).split())
    found = _LIBRARY.search(message)
    name = found.group(1) if found else library
    if "NotFound" in type(exc).__name__ or any(h in message.lower() for h in _NOT_FOUND_HINTS):
        return f"{name} not found"
    return f"{name} could not be loaded: {message[:200]}"


def allocation_failure(error: DriverCallError, out_of_memory_codes: Iterable[int]) -> Exception:
    """MemoryError for the driver's out-of-memory code (Device.allocate turns it into
    DeviceOutOfMemory with the ledger); any other failed allocation stays a DriverCallError."""
    if error.code in set(int(c) for c in out_of_memory_codes):
        return MemoryError(str(error))
    return error


def launch_dims(value: Any) -> tuple[int, int, int]:
    """(x, y, z) from an int or a sequence of 1 to 3 positive ints; the common int case is fast."""
    if type(value) is int:
        if value < 1:
            raise ValueError(f"launch dimensions must be positive, got {value}")
        return value, 1, 1
    if type(value) is tuple and len(value) == 3:
        x, y, z = value
        if type(x) is int and type(y) is int and type(z) is int and x > 0 and y > 0 and z > 0:
            return value  # type: ignore[return-value]
    dims = tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError(f"launch dimensions must be 1 to 3 positive ints, got {value!r}")
    return (dims + (1, 1))[:3]  # type: ignore[return-value]


def release_quietly(destroy: Callable[..., Any], *handles: Any) -> None:
    """Call a driver destroy function, ignoring failures: it runs from finalizers and close(), where
    the context may already be gone and raising would only hide the error that got us there."""
    try:
        destroy(*handles)
    except Exception:  # noqa: BLE001 - see the docstring
        pass


class ResourceRegistry:
    """The driver resources of one device that are still alive, in creation order (weakly held)."""

    def __init__(self) -> None:
        self._live: "weakref.WeakValueDictionary[int, DriverResource]" = weakref.WeakValueDictionary()
        self._serials = itertools.count()

    def add(self, resource: "DriverResource") -> None:
        self._live[next(self._serials)] = resource

    def release_all(self) -> None:
        """Destroy every resource still alive, newest first (graphs before the streams they ran on)."""
        for _, resource in sorted(self._live.items(), reverse=True):
            resource.destroy()

    def __len__(self) -> int:
        return sum(1 for r in self._live.values() if not r.destroyed)

    def counts(self) -> dict[str, int]:
        """Live resources by kind (handles.HANDLE_KINDS), for Device.handle_counts()."""
        counts = dict.fromkeys(HANDLE_KINDS, 0)
        for resource in list(self._live.values()):
            if not resource.destroyed:
                counts[resource.handle_kind] += 1
        return counts


class DriverResource:
    """Base of objects that own a driver handle: `destroy()` releases it once; so do garbage
    collection and the owning device's close()."""

    destroyed = False  # a plain attribute: the launch path reads it
    handle_kind: str  # one of handles.HANDLE_KINDS
    _finalizer: "weakref.finalize | None" = None

    def _own(self, registry: ResourceRegistry, destroy: Callable[..., Any], *handles: Any) -> None:
        # The finalizer holds the handles, never `self`, so that collection can run it.
        self._finalizer = weakref.finalize(self, release_quietly, destroy, *handles)
        registry.add(self)

    def destroy(self) -> None:
        self.destroyed = True
        if self._finalizer is not None:
            self._finalizer()


def summarize_compile_log(log: str, limit: int = 60) -> str:
    """The compiler's log, trimmed to `limit` lines (the first errors are the useful ones)."""
    lines = [line.rstrip() for line in log.strip().splitlines()]
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
    return "\n".join(lines)


def count_compile_errors(log: str) -> int:
    return sum(1 for line in log.splitlines() if re.search(r"\berror\b", line))
