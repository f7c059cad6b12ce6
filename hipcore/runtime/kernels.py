"""The kernel loader: finds the code object of an op for a device, or compiles it at run time.

`get_kernel(device, op, entry, signature)` returns a launchable Kernel, cached per device and op:

- cpu backend: the host implementation registered with `@cpu_kernel` (hipcore/ops registers them
  when imported), through `device.load_module().kernel(...)`.
- GPU: the precompiled code object of kernels/prebuilt/<arch>/<op>.<hsaco|cubin> when the manifest
  says it was built from the current sources (the sha256 of hip_compat.h, <op>.hip and the files it includes:
  source_files). Otherwise
  the source is compiled with the device's run-time compiler (`device.jit_compile`: hiprtc / nvrtc)
  into a disk cache, ~/.cache/rocmforge/kernels/<arch>/<op>-<digest>.bin, reused by later runs.
  The first time a process falls back to run-time compilation it says so once, as a warning of the
  `logging` logger "rocmforge" (printed on stderr even when logging is not configured).

The sources and prebuilt objects live in the package `rocmforge_kernels` (the repository's kernels/
folder), found through importlib.resources, so editable installs and wheels behave the same;
$ROCMFORGE_PREBUILT_DIR, when set, replaces the package's prebuilt/ folder (both for `rocmforge
kernels build` and for loading). The cache folder is $ROCMFORGE_CACHE_DIR/kernels when that is set, else $XDG_CACHE_HOME/rocmforge/kernels,
else ~/.cache/rocmforge/kernels.

This module also owns the manifest format, which kernels/build.py writes:
    {"format": 1,
     "sources": {"<op>": "<sha256 of source_files(op) at its latest build>"},
     "objects": {"<target>": {"<op>": {"file": "<target>/<op>.hsaco", "source_sha256": "...",
                                       "compiler": "...", "flags": [...], "elf_machine": 224, "elf_flags": "0x54c",
                                       "kernels": {"<entry>": {"registers": 12, "shared_bytes": 128, ...}}}}}}
A code object is current when its own source_sha256 equals the digest of the sources on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import logging
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from hipcore.runtime.device import Device, Kernel, Module
from hipcore.runtime.errors import DeviceError

KERNELS_PACKAGE = "rocmforge_kernels"
COMPAT_HEADER = "hip_compat.h"
SOURCE_SUFFIX = ".hip"
PREBUILT_DIR = "prebuilt"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1

log = logging.getLogger("rocmforge")


# ---- where things are ------------------------------------------------------------------------


def kernels_dir() -> Path:
    """The folder holding hip_compat.h, the <op>.hip sources and prebuilt/.

    The installed package `rocmforge_kernels`; in a source checkout used without installing (the
    repository on PYTHONPATH), the repository's kernels/ folder.
    """
    try:
        return Path(str(importlib.resources.files(KERNELS_PACKAGE)))
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2] / "kernels"
        if (checkout / COMPAT_HEADER).is_file():
            return checkout
        raise DeviceError(f"the kernel sources (package {KERNELS_PACKAGE}) are not installed; "
                          "reinstall rocmforge (pip install -e . from the repository)") from None


def prebuilt_dir() -> Path:
    """Where the precompiled code objects and their manifest are: $ROCMFORGE_PREBUILT_DIR when set (for
    installs whose package folder is read-only), else the package's prebuilt/."""
    own = os.environ.get("ROCMFORGE_PREBUILT_DIR")
    return Path(own).expanduser() if own else kernels_dir() / PREBUILT_DIR


def op_names(sources: Path | None = None) -> list[str]:
    """Every op with a source file, sorted: 'add', 'argmax', 'matvec' ..."""
    folder = sources or kernels_dir()
    return sorted(p.stem for p in folder.glob(f"*{SOURCE_SUFFIX}"))


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)


def _followed(first: Path, folder: Path, seen: set[str]) -> list[Path]:
    """`first` and each file of `folder` it includes with quotes, directly or through another, that `seen`
    does not name yet (added to it), in the order first met."""
    files, pending = [first], [first]
    seen.add(first.name)
    while pending:
        for name in _QUOTED_INCLUDE.findall(pending.pop(0).read_text(errors="replace")):
            path = folder / name  # a plain name: nothing outside the folder
            if name not in seen and "/" not in name and "\\" not in name and path.is_file():
                seen.add(name)
                files.append(path)
                pending.append(path)
    return files


def compat_files(sources: Path | None = None) -> list[Path]:
    """hip_compat.h and its vendor parts (hip_compat_nvidia.h, ...): what every op is built from."""
    folder = sources or kernels_dir()
    return _followed(folder / COMPAT_HEADER, folder, set())


def source_files(op: str, sources: Path | None = None) -> list[Path]:
    """What a code object of `op` is built from: compat_files(), then <op>.hip and each file of the sources
    folder that it includes with quotes, directly or through another, once each in the order first met
    (fused_qmatvec.hip includes qmatvec_formats.h: an edit there must make fused_qmatvec's objects stale too)."""
    folder = sources or kernels_dir()
    compat = compat_files(folder)
    seen = {f.name for f in compat}
    return compat + _followed(folder / f"{op}{SOURCE_SUFFIX}", folder, seen)


def source_digest(op: str, sources: Path | None = None) -> str:
    """sha256 of source_files(op): each file's name, length and bytes (an op that includes nothing of its
    own has the digest of compat_files() and <op>.hip alone)."""
    digest = hashlib.sha256()
    for part in source_files(op, sources):
        data = part.read_bytes()
        digest.update(f"{part.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def code_object_suffix(target: str) -> str:
    """'hsaco' for AMD targets (gfx...), 'cubin' for NVIDIA ones (sm_...)."""
    if target.startswith("gfx"):
        return "hsaco"
    if target.startswith("sm_"):
        return "cubin"
    raise ValueError(f"unknown kernel target {target!r}: expected gfx... (AMD) or sm_... (NVIDIA)")


def wavefront_size(arch: str) -> int:
    """Lanes per warp / wavefront: 64 on GCN and CDNA (gfx6 .. gfx9), 32 on RDNA (gfx10+) and NVIDIA.

    Launchers use it to size grids; the kernels are correct whatever grid they get.
    """
    match = re.match(r"gfx(\d+)", arch)
    if match:
        family = match.group(1)
        return 64 if len(family) <= 3 else 32  # gfx90a, gfx942 -> 64; gfx1030, gfx1100, gfx1201 -> 32
    return 32


def cache_dir() -> Path:
    """Where run-time compiled code objects are kept (see the module docstring)."""
    own = os.environ.get("ROCMFORGE_CACHE_DIR")
    if own:
        return Path(own).expanduser() / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "rocmforge" / "kernels"


# ---- the manifest ------------------------------------------------------------------------------


def empty_manifest() -> dict[str, Any]:
    return {"format": MANIFEST_FORMAT, "objects": {}}


def read_manifest(folder: Path | None = None) -> dict[str, Any]:
    """The manifest of a prebuilt folder; an empty one when there is none or it is unreadable
    (a damaged manifest only costs run-time compilation, it must not stop a run)."""
    path = (folder or prebuilt_dir()) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return empty_manifest()
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("objects"), dict):
        return empty_manifest()
    return data


def write_manifest(manifest: dict[str, Any], folder: Path) -> None:
    """Write atomically, so a reader never sees half a manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / MANIFEST_NAME, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def current_object(arch: str, op: str, folder: Path | None = None,
                   manifest: dict[str, Any] | None = None) -> Path | None:
    """The prebuilt code object of `op` usable on `arch`, if one was built from the current sources.

    NVIDIA code objects run on any later minor revision of the same major architecture (an sm_80 cubin
    runs on sm_86 and sm_89), so for sm_XY the newest built sm_XZ with Z <= Y is taken. AMD ones match
    their exact target only.
    """
    folder = folder or prebuilt_dir()
    manifest = manifest if manifest is not None else read_manifest(folder)
    digest = source_digest(op)
    for target in _compatible_targets(arch.split(":", 1)[0], manifest["objects"].keys()):
        entry = manifest["objects"].get(target, {}).get(op)
        if isinstance(entry, dict) and entry.get("source_sha256") == digest:
            path = folder / str(entry.get("file", ""))
            if path.is_file():
                return path
    return None


def _compatible_targets(arch: str, built: Any) -> list[str]:
    match = re.fullmatch(r"sm_(\d+)(\d)", arch)
    if not match:
        return [arch]
    major, minor = match.group(1), int(match.group(2))
    same_major = [t for t in built if re.fullmatch(rf"sm_{major}\d", t) and int(t[-1]) <= minor]
    return sorted(set(same_major) | {arch}, key=lambda t: (t != arch, -int(t[-1])))


def available_code_objects(arch: str) -> list[str]:
    """Ops with a precompiled code object for `arch` that matches the current sources."""
    folder = prebuilt_dir()
    manifest = read_manifest(folder)
    return [op for op in op_names() if current_object(arch, op, folder, manifest) is not None]


# ---- loading -----------------------------------------------------------------------------------

_lock = threading.Lock()
_warned_runtime_compile = False
_runtime_compiled_ops: set[tuple[str, str]] = set()  # (arch, op) loaded from a run-time compile


def get_kernel(device: Device, op: str, entry: str, signature: str, *, programmatic: bool = False) -> Kernel:
    """The kernel `entry` of `op` on `device` (see the module docstring for where it comes from).
    programmatic: the entry calls rf_grid_dependency_sync() first (Module.kernel)."""
    key = (op, entry, signature, programmatic)
    with _lock:
        modules, kernels = _loaded_code(device)
        cached = kernels.get(key)
        if cached is not None:
            return cached
        module = modules.get(op)
        if module is None:
            module = _load_module(device, op)
            modules[op] = module
        kernel = module.kernel(entry, signature, programmatic)
        kernels[key] = kernel
        return kernel


def _loaded_code(device: Device) -> tuple[dict[str, Module], dict[tuple, Kernel]]:
    """The device's own tables of loaded modules (by op) and kernels (Device.loaded_code): on the device, so
    that they are collected with it and its close() empties them."""
    return device.loaded_code["modules"], device.loaded_code["kernels"]


def cached_module_count(device: Device) -> int:
    """Modules the cache holds for `device`: one an op, loaded at the op's first launch and kept until the
    device closes or forget_device (leak-check counts the device's modules beyond these: profiles/leak_handles.py)."""
    with _lock:
        return len(_loaded_code(device)[0])


def forget_device(device: Device) -> None:
    """Drop the cached modules and kernels of a device (its close() does this too)."""
    with _lock:
        device._forget_loaded_code()


def _load_module(device: Device, op: str) -> Module:
    if device.backend == "cpu":
        return device.load_module(b"", op)
    sources = kernels_dir()
    if not (sources / f"{op}{SOURCE_SUFFIX}").is_file():
        raise DeviceError(f"no kernel source for op {op!r} in {sources} (known ops: {', '.join(op_names(sources))})")
    prebuilt = current_object(device.arch, op)
    if prebuilt is not None:
        return device.load_module(prebuilt.read_bytes(), op)
    module = device.load_module(_runtime_compiled(device, op, sources), op)
    _runtime_compiled_ops.add((device.arch.split(":", 1)[0], op))
    return module


def runtime_compiled_ops(arch: str) -> list[str]:
    """The ops this process loaded for `arch` from a run-time compile (no prebuilt object of their current
    sources), sorted. Their code comes from hiprtc / nvrtc, whose objects can run slower than the build
    script's (10-20% on the 8B: docs/history/2026-11-25-split-residual-programmatic-launch.md): a measurement
    should say when it ran any."""
    arch = arch.split(":", 1)[0]
    with _lock:
        return sorted(op for a, op in _runtime_compiled_ops if a == arch)


def _runtime_compiled(device: Device, op: str, sources: Path) -> bytes:
    arch = device.arch.split(":", 1)[0]
    digest = source_digest(op, sources)
    cached = cache_dir() / arch / f"{op}-{digest[:16]}.bin"
    _say_once(arch)
    try:
        return cached.read_bytes()
    except OSError:
        pass
    source = (sources / f"{op}{SOURCE_SUFFIX}").read_text()
    image = device.jit_compile(source, f"{op}{SOURCE_SUFFIX}", [str(sources)], [])
    try:
        write_atomically(cached, image)
    except OSError as exc:  # an unwritable cache costs a recompile next run, nothing more
        log.warning("could not keep the compiled kernel %s in %s: %s", op, cached.parent, exc)
    return image


def _say_once(arch: str) -> None:
    global _warned_runtime_compile
    if _warned_runtime_compile:
        return
    _warned_runtime_compile = True
    option = "--amd-targets" if arch.startswith("gfx") else "--nvidia-targets"
    log.warning(
        "no precompiled kernel matching the current sources for %s: compiling at run time into %s "
        "(a one-time cost per kernel; `rocmforge kernels build %s %s` precompiles them)",
        arch, cache_dir() / arch, option, arch,
    )
