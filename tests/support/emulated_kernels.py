"""Running the HIP kernels on the CPU: tests/kernel_emulation/ holds a host emulation of the kernel
language (each GPU thread a std::thread, warps exchanging in lockstep) and a harness that runs one kernel
per process. It is compiled with g++ once per warp width, 32 (NVIDIA, RDNA) and 64 (CDNA), against the
kernel sources as they are and the vendor-neutral part of hip_compat.h (tests/conftest.py's `harnesses`
fixture). Used by tests/test_kernels_emulated*.py."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hipcore.runtime.kernels import COMPAT_HEADER, compat_files, kernels_dir, source_files

U32 = 2.0**-24  # float32 unit roundoff
EMULATION = Path(__file__).parents[1] / "kernel_emulation"
NEUTRAL_MARKER = "// Vendor-neutral from here on"
OPS = ("add", "add_bias", "argmax", "fused_matmul", "fused_matvec", "fused_qmatvec", "gelu_mul", "head_norm_rope", "matmul",
       "matvec", "qmatvec", "rmsnorm", "rope", "sample", "scale", "silu_mul", "softcap")
FORWARD_PASS_OPS = ("embedding", "kv_store", "paged_attention", "select_rows")
ARCH_FOR_WARP = {32: "sm_90", 64: "gfx942"}  # what the launchers size grids for
WARPS = (32, 64)


def own_files(op: str) -> list[Path]:
    """<op>.hip and the parts it includes: its sources but for hip_compat.h and its vendor parts."""
    return source_files(op)[len(compat_files()):]


def build_harnesses(work: Path, edit: dict | None = None, warps: tuple[int, ...] = WARPS) -> dict[int, Path]:
    """The harness compiled for each warp width in `work`, from the kernel sources of every op. edit: file name ->
    text -> text, a planted fault in that source (it must change the file)."""
    compiler = shutil.which("g++")
    assert compiler, "g++ (C++20) is needed to build the kernel emulation: apt-get install g++"
    for op in OPS + FORWARD_PASS_OPS:
        for path in own_files(op):  # hip_compat.h is made below, without its vendor parts
            shutil.copy(path, work)
    for name, change in (edit or {}).items():
        text = (work / name).read_text()
        assert change(text) != text, f"the planted edit matched nothing in {name}"
        (work / name).write_text(change(text))
    for name in ("emulation.h", "harness_io.h", "harness.cpp"):
        shutil.copy(EMULATION / name, work)
    header = (kernels_dir() / COMPAT_HEADER).read_text()
    assert header.count(NEUTRAL_MARKER) == 1, f"{COMPAT_HEADER} lost its '{NEUTRAL_MARKER}' line"
    neutral = header[header.index(NEUTRAL_MARKER):]
    (work / COMPAT_HEADER).write_text('#pragma once\n#include "emulation.h"\n' + neutral)

    def build(warp: int) -> Path:
        out = work / f"harness{warp}"
        proc = subprocess.run([compiler, "-std=c++20", "-O1", "-pthread", f"-DWARP_SIZE={warp}", "-Wno-unknown-pragmas",
                               "-o", str(out), str(work / "harness.cpp")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(warps, pool.map(build, warps)))


def build_op_harnesses(work: Path, ops: tuple[str, ...], harness: str, kernel_edit=None) -> dict[int, Path]:
    """tests/kernel_emulation/<harness> compiled in `work` per warp width, against the sources of `ops` alone (an op
    family with a harness of its own: the main one is not rebuilt for it). kernel_edit(text) -> text, when given,
    changes those sources (the tests' planted faults) and must change something."""
    compiler = shutil.which("g++")
    assert compiler, "g++ (C++20) is needed to build the kernel emulation: apt-get install g++"
    texts = {path.name: path.read_text() for op in ops for path in own_files(op)}
    if kernel_edit is not None:
        edited = {name: kernel_edit(text) for name, text in texts.items()}
        assert edited != texts, f"the planted edit matched nothing in {', '.join(texts)}"
        texts = edited
    for name, text in texts.items():
        (work / name).write_text(text)
    for name in ("emulation.h", "harness_io.h", harness):
        shutil.copy(EMULATION / name, work)
    header = (kernels_dir() / COMPAT_HEADER).read_text()
    (work / COMPAT_HEADER).write_text('#pragma once\n#include "emulation.h"\n' + header[header.index(NEUTRAL_MARKER):])

    def build(warp: int) -> Path:
        out = work / f"{Path(harness).stem}{warp}"
        proc = subprocess.run([compiler, "-std=c++20", "-O1", "-pthread", f"-DWARP_SIZE={warp}", "-Wno-unknown-pragmas",
                               "-o", str(out), str(work / harness)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(WARPS, pool.map(build, WARPS)))


def run(harnesses, warp: int, *args) -> None:
    """One kernel launch through the harness built for `warp` (its arguments: see harness.cpp)."""
    proc = subprocess.run([str(harnesses[warp]), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"harness {args[:3]} exited with {proc.returncode}: {proc.stderr[-2000:]}"


def write_inputs(tmp_path: Path, **arrays) -> list[Path]:
    """Each array to a file named after its keyword (the harness reads raw bytes); the paths in order."""
    for name, array in arrays.items():
        np.ascontiguousarray(array).tofile(tmp_path / name)
    return [tmp_path / name for name in arrays]


# The matrix-core paths (hip_compat.h's RF_MMA_KIND, matrix_cores.h's rf_mma) and the warp width each runs
# at; kernels/matmul_mma.hip is built once per path, against tests/kernel_emulation/emulation.h's emulated
# instructions.
MMA_KINDS = {"fma32": (0, 32), "fma64": (0, 64), "nvidia_mma": (1, 32), "cdna_mfma": (2, 64), "rdna3_wmma": (3, 32),
             "rdna4_wmma": (4, 32)}
MMA_OP = "matmul_mma"
# The ops on the matrix cores and the harness that runs each (tests/kernel_emulation/).
MMA_HARNESSES = {"matmul_mma": "harness_mma.cpp", "prompt_attention": "harness_prompt_attention.cpp",
                 "moe_experts_mma": "harness_moe_mma.cpp"}


def build_mma_harnesses(work: Path, kinds=tuple(MMA_KINDS), kernel_edit=None, op: str = MMA_OP) -> dict[str, Path]:
    """`op`'s harness (MMA_HARNESSES) built in `work` per matrix-core path of `kinds`. kernel_edit(text) -> text,
    when given, changes <op>.hip and the parts it includes, matrix_cores.h among them (the tests' planted
    faults)."""
    compiler = shutil.which("g++")
    assert compiler, "g++ (C++20) is needed to build the kernel emulation: apt-get install g++"
    harness = MMA_HARNESSES[op]
    own = own_files(op)
    texts = {path.name: path.read_text() for path in own}
    if kernel_edit is not None:
        edited = {name: kernel_edit(text) for name, text in texts.items()}
        assert edited != texts, f"the planted edit matched nothing in {', '.join(texts)}"
        texts = edited
    for name, text in texts.items():
        (work / name).write_text(text)
    for name in ("emulation.h", "harness_io.h", harness):
        shutil.copy(EMULATION / name, work)
    header = (kernels_dir() / COMPAT_HEADER).read_text()
    neutral = header[header.index(NEUTRAL_MARKER):]
    (work / COMPAT_HEADER).write_text('#pragma once\n#include "emulation.h"\n' + neutral)

    def build(kind: str) -> Path:
        mma_kind, warp = MMA_KINDS[kind]
        out = work / f"{Path(harness).stem}_{kind}"
        proc = subprocess.run([compiler, "-std=c++20", "-O1", "-pthread", f"-DWARP_SIZE={warp}", f"-DRF_MMA_KIND={mma_kind}",
                               "-Wno-unknown-pragmas", "-o", str(out), str(work / harness)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(kinds, pool.map(build, kinds)))


def run_mma(harness: Path, *args) -> None:
    """One kernel launch through a harness of build_mma_harnesses (arguments: see harness_mma.cpp)."""
    proc = subprocess.run([str(harness), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"harness {args[:3]} exited with {proc.returncode}: {proc.stderr[-2000:]}"


def nvidia_harness_with(old: str, new: str, work: Path) -> Path:
    """NVIDIA's matmul_mma harness built in `work` with `old` replaced by `new` in matmul_mma's sources (a planted
    fault)."""
    return build_mma_harnesses(work, ("nvidia_mma",), kernel_edit=lambda text: text.replace(old, new))["nvidia_mma"]


def assert_caught(fault: str, measure) -> None:
    """measure() -> worst excess; the planted fault must fail the ordinary check (beyond the bound, a counter
    left set, or a read past a buffer's end dying on the harness's guard page, SIGSEGV or SIGBUS: harness_io.h)."""
    with pytest.raises(AssertionError, match="x the bound|counters were not left at zero|exited with -(11|7):"):
        excess = measure()
        assert excess <= 1.0, f"{fault}: {excess:.3g} x the bound"
