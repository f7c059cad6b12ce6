"""Whether the kernel-build tests can run here: a missing compiler skips them with what to install, unless
the environment makes them required (CI installs clang-22 and sets ROCMFORGE_REQUIRE_CLANG=1, so a
broken install fails the build instead of passing it silently)."""

from __future__ import annotations

import os

import pytest

from rocmforge_kernels import build as kbuild

COMPILERS = {"amd": kbuild.DEFAULT_AMD_COMPILER, "nvidia": kbuild.DEFAULT_NVCC}
TARGETS = {"amd": kbuild.DEFAULT_AMD_TARGETS, "nvidia": kbuild.DEFAULT_NVIDIA_TARGETS}
# Set to 1 to turn a missing compiler from a skip into a failure.
REQUIRE_ENV = {"amd": "ROCMFORGE_REQUIRE_CLANG", "nvidia": "ROCMFORGE_REQUIRE_NVCC"}


def compiler_problem(vendor: str) -> str:
    """'' when the vendor's default compiler can run here, else what is missing and how to install it."""
    return kbuild.find_compiler_problem(vendor, COMPILERS[vendor])


def available_vendors() -> list[str]:
    return [vendor for vendor in COMPILERS if not compiler_problem(vendor)]


def skip_or_fail(variable: str, tests: str, needs: str, problem: str) -> None:
    """Skip the calling test for `problem` (what `tests` need, `needs`, is missing), or fail it when the environment
    sets `variable` to require them."""
    if os.environ.get(variable, "") not in ("", "0"):
        pytest.fail(f"{variable} is set, so the {tests} are required: {problem}", pytrace=False)
    pytest.skip(f"{tests} need {needs}: {problem} (set {variable}=1 to require them)")


def require_compiler(vendor: str) -> None:
    """Skip the calling test when the vendor's compiler is missing, or fail it when REQUIRE_ENV says so."""
    problem = compiler_problem(vendor)
    if problem:
        skip_or_fail(REQUIRE_ENV[vendor], f"{vendor} kernel-build tests", COMPILERS[vendor], problem)
