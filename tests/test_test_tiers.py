"""The everyday/full split of the test suite (tests/support/tiers.py, applied in tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

from support.tiers import COMPILING_FIXTURES, EVERYDAY_TIMEOUT_S, FULL_MODULES, full_tier_reason

TESTS = Path(__file__).resolve().parent


def test_every_full_tier_pattern_names_test_files_that_exist():
    """A pattern left behind by a renamed file would quietly move that file's tests into the everyday tier."""
    names = [p.name for p in TESTS.glob("test_*.py")]
    for pattern in FULL_MODULES:
        assert any(fnmatch(name, pattern) for name in names), f"{pattern} matches no test file"


def test_a_test_that_compiles_is_in_the_full_tier_wherever_it_lives():
    for fixture in COMPILING_FIXTURES:
        assert full_tier_reason("test_engine.py", ["cpu_device", fixture]) is not None
    assert full_tier_reason("test_engine.py", ["cpu_device", "tmp_path"]) is None


def test_the_full_tier_modules_are_picked_by_name():
    assert "emulation" in full_tier_reason("test_kernels_emulated_moe.py", [])
    assert full_tier_reason("test_kernel_build.py", []) is not None
    assert full_tier_reason("test_kernel_choice.py", []) is None  # a prefix of a full module's name is not enough


def collected(*args: str) -> list[str]:
    """Test ids collected by a pytest run over two files given as testpaths (as a bare `pytest` takes tests/)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-o", "testpaths=tests/test_test_tiers.py tests/test_kernel_resources.py", *args],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_a_bare_run_leaves_the_full_tier_out_and_the_full_tier_keeps_it():
    everyday, full = collected(), collected("--tier", "full")
    assert everyday and all("test_kernel_resources.py" not in t for t in everyday)
    assert any("test_kernel_resources.py" in t for t in full) and set(everyday) < set(full)
    only_full = collected("--tier", "full", "-m", "full")  # what .ci/run adds after the everyday tier
    assert set(only_full) == set(full) - set(everyday)



def test_every_test_has_a_time_limit_by_its_tier(request, tmp_path):
    """A hanging test fails alone (pytest-timeout) instead of stopping the run: the limit is on every test, and a
    planted hang past its limit fails while the test after it still runs."""
    assert request.node.get_closest_marker("timeout").args == (EVERYDAY_TIMEOUT_S,)
    (tmp_path / "test_planted.py").write_text(
        "import time, pytest\n"
        "@pytest.mark.timeout(1)\n"
        "def test_hangs():\n    time.sleep(60)\n"
        "def test_after():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Timeout" in proc.stdout and "1 failed, 1 passed" in proc.stdout, proc.stdout[-2000:]
