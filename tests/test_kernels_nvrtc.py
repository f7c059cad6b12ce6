"""Every op's source compiles with nvrtc, as the loader compiles it at run time for an NVIDIA GPU that no
precompiled code object fits (a Blackwell card, or sources changed since the build). nvrtc is a stricter front
end than nvcc: nvrtc 13.0 knows no __builtin_offsetof, and the block formats' layout checks once failed every op
that includes them there (caught on an H100 by tests/gpu's run-time compile test). No GPU is needed to compile.

CI installs nvidia-cuda-nvrtc 13.0, the oldest nvrtc of the CUDA 13 line, and sets ROCMFORGE_REQUIRE_NVRTC=1, so
a missing library fails these tests there instead of skipping them."""

from __future__ import annotations

import subprocess

import pytest
from rocmforge_kernels import build as kbuild

from hipcore.runtime import kernels as loader
from hipcore.runtime.errors import KernelCompileError
from hipcore.runtime.rtc import compile_with_nvrtc
from support.compiler_gate import COMPILERS, require_compiler, skip_or_fail

REQUIRE_ENV = "ROCMFORGE_REQUIRE_NVRTC"
OPS = sorted(path.stem for path in loader.kernels_dir().glob("*.hip"))
# A Blackwell card's: no precompiled object fits it, so the loader compiles every op there (nvrtc's front end is the
# same for every target; the Hopper-and-later branches are the ones an sm_80 build would leave out).
ARCHS = ("sm_120",)


def require_nvrtc() -> None:
    """Skip the calling test without an nvrtc library for cuda-bindings to load, or fail it under REQUIRE_ENV."""
    try:
        from cuda.bindings import nvrtc

        err, _, _ = nvrtc.nvrtcVersion()  # loads the library: the first call is where a missing one shows
        if err:
            raise RuntimeError(f"nvrtcVersion returned {err}")
    except Exception as exc:  # noqa: BLE001 - no cuda-bindings, or no libnvrtc for it to load
        skip_or_fail(REQUIRE_ENV, "nvrtc tests", "nvrtc (pip install nvidia-cuda-nvrtc)",
                     f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", OPS)
def test_every_op_compiles_with_nvrtc(op, arch):
    require_nvrtc()
    source = (loader.kernels_dir() / f"{op}.hip").read_text()
    cubin = compile_with_nvrtc(source, f"{op}.hip", arch, [str(loader.kernels_dir())])
    assert cubin[:4] == b"\x7fELF", f"{op} for {arch}: nvrtc returned no ELF code object"


def test_a_source_nvrtc_rejects_is_reported_with_its_log():
    """The check above can fail: a source with an error is a KernelCompileError naming the file and the line, not a
    silent empty object (the planted fault: an undeclared identifier in an otherwise valid kernel)."""
    require_nvrtc()
    bad = 'extern "C" __global__ void k(float* out) { out[0] = not_declared_anywhere; }\n'
    with pytest.raises(KernelCompileError, match=rf"nvrtc could not compile planted\.hip for {ARCHS[0]}") as caught:
        compile_with_nvrtc(bad, "planted.hip", ARCHS[0])
    assert "not_declared_anywhere" in str(caught.value)


def test_the_formats_layout_checks_still_run_outside_nvrtc(tmp_path):
    """RF_MEMBER_AT is `true` under nvrtc only: a precompiled build (clang-22 for AMD, as `rocmforge kernels build`
    runs it) still fails on a format whose declared offset is not its Layout's (the planted fault: Q4_0's qs said to
    start at byte 3), and passes on the formats as they are."""
    require_compiler("amd")
    for header in loader.kernels_dir().glob("*.h"):
        (tmp_path / header.name).write_text(header.read_text())
    source = tmp_path / "formats_only.hip"
    source.write_text('#include "block_formats.h"\nextern "C" __global__ void formats_only(float* out) { out[0] = 0.0f; }\n')

    def build() -> subprocess.CompletedProcess:
        command = kbuild.amd_command(COMPILERS["amd"], "gfx942", source, tmp_path / "formats_only.hsaco")
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    as_they_are = build()
    assert as_they_are.returncode == 0, as_they_are.stderr[-2000:]
    q4_0 = tmp_path / "block_format_q4_0.h"
    text = q4_0.read_text()
    assert "kQsAt = 2," in text
    q4_0.write_text(text.replace("kQsAt = 2,", "kQsAt = 3,"))
    planted = build()
    assert planted.returncode != 0 and "Q4_0's layout" in planted.stderr, planted.stderr[-2000:]
