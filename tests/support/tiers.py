"""Which tests run in the everyday tier and which only in the full one: the one place for that rule (tests/conftest.py applies it).

`pytest` runs the everyday tier: every test that needs no compiler, no long fuzzing and no model larger than the
demo; it is meant to run between two edits (its time on a 2-core machine is in the README). `pytest --tier full`
runs every test (the GPU tier aside, `pytest -m gpu` on a GPU machine); `.ci/run` runs the everyday tier, then
`pytest --tier full -m full` for the rest, so that each test runs once. Naming test files on the command line
runs them whatever their tier. The `full` marker is put on each test the rule below picks, so `-m full` and
`-m "not full"` select by tier too.
"""

from __future__ import annotations

from fnmatch import fnmatch

# Session fixtures that compile: every op for every AMD and NVIDIA target (kernel_builds.build_every_op), or the
# kernel emulation's harness per warp width (emulated_kernels.build_harnesses). A test that uses one of them is
# in the full tier: the compile alone takes minutes on two cores.
COMPILING_FIXTURES = {"built", "harnesses"}

# Test modules of the full tier, with why (each costs minutes on a 2-core machine, or compiles by itself).
FULL_MODULES = {
    "test_kernel_build.py": "every kernel built for every AMD and NVIDIA target",
    "test_kernel_resources.py": "registers and spills of every target's code objects",
    "test_kernels_emulated*.py": "the kernels run in emulation at wave 64 and wave 32 (a harness compiled per op)",
    "test_block_formats.py": "each block format's decoding compiled into the emulation harness",
    "test_compiler_gate.py": "the compilers' gates, each a real compile",
    "test_kernels_nvrtc.py": "every op compiled by nvrtc (7.5 minutes on two cores), as the loader compiles at run time",
    "test_gguf_fuzz.py": "mutation fuzzing of the GGUF reader",
    "test_gpu_plans_on_host.py": "every family's step plans on six GPU architectures through host twins",
    "test_golden_gemma3_270m.py": "the real Gemma 3 270M (240 MB) against llama.cpp on the cpu backend",
    "test_leak_check_clean.py": "leak-check's clean runs end to end, hundreds of requests on the demo model",
    "test_report_in_browser.py": "--report's page rendered by headless Chromium (the chromium package)",
}


# A test that hangs fails alone after this long instead of stopping the whole run (pytest-timeout); a full-tier
# test's first use of a compiling fixture builds every kernel for every target inside its own time (about 20
# minutes on two quiet cores; the limit leaves room for a busy machine).
EVERYDAY_TIMEOUT_S = 300
FULL_TIMEOUT_S = 3600


def full_tier_reason(module_name: str, fixturenames: list[str] | tuple[str, ...]) -> str | None:
    """Why a test of `module_name` using `fixturenames` is in the full tier, or None when it is everyday."""
    for pattern, why in FULL_MODULES.items():
        if fnmatch(module_name, pattern):
            return why
    compiling = COMPILING_FIXTURES.intersection(fixturenames)
    if compiling:
        return f"compiles kernels (fixture {', '.join(sorted(compiling))})"
    return None
